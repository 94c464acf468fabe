"""A probe step runs at the intra-op threads the machine has room for (issue 18, session 40):
with the user's count more than the idle cores allow and the thread count a choice, the probe
prices every compile and cache ask by a step of threads waiting for cores (torch's default two
threads on the 2-core VM at load 5-6: 80-2,300 ms against 6-20 at one thread, and a cache ask of
3-4 s opened by them in a 300-step run). The machine's idle cores are set by the test."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from microco.clients.compiler import AstraTorch, _session
from microco.clients.compiler.explore import LocalExplorer

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("two_threads")]  # (conftest)


def _probe_threads(idle: float, threads: tuple[str, ...] | None = None) -> tuple[list[int], int]:
    """The intra-op thread counts the model's forward saw in each step until the probe ended,
    and the count after it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    seen: list[int] = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    astra = AstraTorch(
        model, LocalExplorer(), total_steps=2, threads=threads, compile_choices=("eager",), background=False
    )
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_session, "idle_cores", lambda: idle)
        while astra.spec() is None:
            with astra.step():
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    after = torch.get_num_threads()
    astra.restore()
    return seen, after


def test_no_idle_core_the_probe_runs_one_thread_and_the_users_count_comes_back():
    seen, after = _probe_threads(idle=-3.0)
    assert seen == [1]
    assert after == 2


def test_an_idle_core_the_probe_runs_the_users_two_threads():
    seen, after = _probe_threads(idle=1.0)
    assert seen == [2] and after == 2


def test_a_count_the_user_fixed_is_left_as_set():
    seen, _ = _probe_threads(idle=-3.0, threads=("2",))
    assert seen == [2]
