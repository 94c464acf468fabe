"""The probe's costly reads of a step (its op count and op-level profile, what a whole-step
compile is priced by) are paid only where some whole-step compile could be repaid by the run
(issue 18, session 40: torch-lstmcell-loop's 300 steps of 2.9 ms, 0.87 s in all, paid 24-60 ms
of them for a compile no 300-step run could repay, and ran 1.06-1.12x eager). The first probe
step is timed without them; a second counts and profiles where the first says a compile may
pay. No timing is asserted: a run of two steps can repay no compile whatever the machine's
load, a run of ten million steps repays any."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from microco.clients.compiler import AstraTorch
from microco.clients.compiler.explore import LocalExplorer

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _steps(total_steps: int, n: int) -> tuple[AstraTorch, list[float], list[bool]]:
    """``n`` steps of an MLP through a wrapper for a run of ``total_steps``: the losses, and
    after each step whether the wrapper had registered its space (the probe over)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    astra = AstraTorch(model, LocalExplorer(), threads=("1",), total_steps=total_steps, background=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    losses, registered = [], []
    try:
        for _ in range(n):
            with astra.step():
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            losses.append(loss.item())
            registered.append(astra.spec() is not None)
    finally:
        astra.restore()
    return astra, losses, registered


def test_a_run_no_compile_could_repay_counts_and_profiles_nothing():
    astra, _, registered = _steps(total_steps=2, n=2)
    assert astra.compile_choices and "inductor" in astra.compile_choices  # (offered, priced out)
    assert astra._step_ops == 0  # no op counted
    assert astra.step_profile is None  # no profile read
    assert registered == [True, True]  # one probe step, as before


def test_a_run_a_compile_could_repay_counts_and_profiles_its_second_step():
    astra, losses, registered = _steps(total_steps=10**7, n=3)
    assert registered == [False, True, True]  # the first step timed alone, the second read
    assert astra._step_ops > 0
    assert astra.step_profile is not None


def test_the_second_probe_step_trains_as_the_user_wrote_it():
    """The deferred reads change no number: the losses are those of the same loop without the
    wrapper."""
    _, with_astra, _ = _steps(total_steps=10**7, n=4)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    plain = []
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        plain.append(loss.item())
    assert with_astra == pytest.approx(plain, rel=1e-6)
