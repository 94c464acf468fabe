"""Issue 18: the optimiser's implementation is a variable of the step (``_optim``).

A plain training loop's optimiser (SGD, Adam: the per-parameter loop on a CPU) is offered its
``foreach`` and ``fused`` implementations, set around each step only (the user's flags come
back after every step, a rolled-back one included), under the step guard (a fused trial that
raises in the optimiser step is rolled back and the step repeated), never over a choice the user
made, and committed like any other variable: kept in the tuned-configuration record and replayed
by the next run, on the direct path too. Behaviour only: no test asserts a timing."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from microco.clients.compiler._optim import OPTIMIZER, implementations
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))


class _Sparse(nn.Module):
    """A sparse embedding (its gradient is a sparse tensor: the fused SGD kernel refuses it,
    ``RuntimeError: `_fused_sgd` does not support sparse gradients``) under a dense head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.head = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


def _explorer() -> LocalExplorer:
    # Every trial runs (a long run, one measured step each, no interleaved A/B): behaviour only.
    return LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0))


def _astra(model: nn.Module, explorer=None, total_steps: int = 100_000) -> AstraTorch:
    return AstraTorch(
        model,
        explorer if explorer is not None else _explorer(),
        total_steps=total_steps,
        threads=("1",),
        compile_choices=("eager",),
        background=False,
    )


def _step(model, opt, x, y, inside):
    def step():
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        inside.append([(g["foreach"], g.get("fused")) for g in opt.param_groups])
        return loss.item()

    return step


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam])
def test_a_plain_loops_optimiser_is_offered_its_foreach_and_fused_implementations(opt_cls):
    model = _mlp()
    opt = opt_cls(model.parameters(), lr=0.01)
    astra = _astra(model)
    x, y = _batch()
    astra.run(_step(model, opt, x, y, []))  # the probe step finds the optimiser
    variables = {v.name: v for v in astra.spec().variables}
    assert variables[OPTIMIZER].choices == ("loop", "foreach", "fused")
    assert variables[OPTIMIZER].choices[0] == "loop"  # the baseline: the optimiser as built
    assert not variables[OPTIMIZER].compiles
    astra.restore()


def test_the_users_flags_come_back_after_every_step():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    astra = _astra(model)
    x, y = _batch()
    inside: list[list[tuple]] = []
    step = _step(model, opt, x, y, inside)
    for i in range(40):
        if i % 2:
            astra.run(step)
        else:
            with astra.step():
                step()
        # after each step, the groups as the user built them
        assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [(None, None)]
    ran = {flags[0] for flags in inside}
    assert (True, None) in ran and (None, True) in ran  # foreach and fused trials ran in steps
    astra.restore()


class _FusedRefuses(torch.optim.SGD):
    """An SGD whose fused update raises after writing the parameters (a kernel refusing its
    inputs half-way)."""

    def step(self, closure=None):
        out = super().step(closure)
        if any(g.get("fused") for g in self.param_groups):
            raise RuntimeError("injected: the fused kernel refused its inputs")
        return out


def test_a_fused_trial_that_raises_is_rolled_back_and_training_equals_eager():
    x, y = _batch()

    def train(with_astra: bool) -> tuple[list[float], AstraTorch | None, nn.Module, torch.optim.Optimizer]:
        model = _mlp()
        opt = _FusedRefuses(model.parameters(), lr=0.05)
        astra = _astra(model) if with_astra else None
        step = _step(model, opt, x, y, [])
        losses = [astra.run(step) if astra is not None else step() for _ in range(30)]
        return losses, astra, model, opt

    losses, astra, model, opt = train(True)
    assert astra is not None
    state = astra.session.explorer.core.get(astra.spec().key)
    fused = [t for t in state.trials if t.values.get(OPTIMIZER) == "fused"]
    assert fused and all(t.failed and "refused" in t.error for t in fused)
    assert astra.rolled_back >= 1 and astra.skipped_steps == 0
    assert astra.running[OPTIMIZER] != "fused"
    assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [(None, None)]
    ref_losses, _, ref, _ = train(False)
    # The same update rule: the loss curve of a run without the compiler, to float rounding
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    astra.restore()


@pytest.mark.parametrize("form", ["with", "run"])
def test_a_sparse_gradient_is_not_offered_the_fused_update_and_no_batch_is_lost(form):
    """Held out (session 40): an ``EmbeddingBag(sparse=True)`` text classifier with SGD was
    offered the fused update, which refuses a sparse gradient ("`_fused_sgd` does not support
    sparse gradients"): its trial failed, and under ``with astra.step()`` the mini-batch was
    skipped, one batch fewer than the run without the compiler. The probe now sees the sparse
    gradient at the optimiser's step and offers the loop and ``foreach`` only."""
    ids = torch.randint(0, 50, (16, 4), generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))

    def train(with_astra: bool) -> tuple[list[float], AstraTorch | None, nn.Module]:
        model = _Sparse()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        astra = _astra(model) if with_astra else None
        step = _step(model, opt, ids, y, [])
        losses = []
        for _ in range(24):
            if astra is None:
                losses.append(step())
            elif form == "run":
                losses.append(astra.run(step))
            else:
                with astra.step():
                    losses.append(step())
        return losses, astra, model

    losses, astra, model = train(True)
    assert astra is not None
    assert {v.name: v for v in astra.spec().variables}[OPTIMIZER].choices == ("loop", "foreach")
    assert astra.rolled_back == 0 and astra.skipped_steps == 0
    ref_losses, _, ref = train(False)
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().to_dense(), q.detach().to_dense(), rtol=1e-6, atol=1e-7)
    astra.restore()


def test_a_users_explicit_choice_is_not_overridden():
    x, y = _batch()
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    assert implementations(opt) == ()
    astra = _astra(model)
    inside: list[list[tuple]] = []
    for _ in range(20):
        astra.run(_step(model, opt, x, y, inside))
    assert OPTIMIZER not in {v.name for v in astra.spec().variables}
    assert all(flags == [(False, None)] for flags in inside)  # the user's loop in every step
    astra.restore()
    # ... where the same optimiser built with the defaults is offered the variable
    model = _mlp()
    astra = _astra(model)
    astra.run(_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y, []))
    assert OPTIMIZER in {v.name for v in astra.spec().variables}
    astra.restore()


def test_a_run_too_short_to_repay_exploring_it_is_not_offered_it_and_keeps_the_key():
    x, y = _batch()
    specs = {}
    for n in (10, 100_000):
        model = _mlp()
        astra = _astra(model, total_steps=n)
        astra.run(_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y, []))
        specs[n] = astra.spec()
        astra.restore()
    # 10 steps cannot repay the ~48 steps its exploration takes; 100,000 can
    assert OPTIMIZER not in {v.name for v in specs[10].variables}
    assert OPTIMIZER in {v.name for v in specs[100_000].variables}
    # one key: what the optimisers allow enters it, not what the run's length offers
    assert specs[10].key == specs[100_000].key


# A fake cost model for the commit (behaviour, not timing): ms per step of each implementation.
COST = {"loop": 10.0, "foreach": 5.0, "fused": 8.0}


def test_a_committed_implementation_is_recorded_and_replayed_by_the_next_run(monkeypatch):
    x, y = _batch()
    finish = AstraTorch._finish_step

    def priced(self, ok, ms):
        impl = self._applied.get(OPTIMIZER)
        if impl is not None and self._probe_calls is None:
            ms, self._step_cpu_ms = COST[impl], math.nan
        return finish(self, ok, ms)

    # First run: the in-process explorer on this host's record (conftest: a temporary file),
    # with its default policy (the interleaved A/B against the baseline before the commit).
    with monkeypatch.context() as m:
        m.setattr(AstraTorch, "_finish_step", priced)
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        first = AstraTorch(model, name="mlp", total_steps=100_000, threads=("1",), compile_choices=("eager",))
        for _ in range(120):
            first.run(_step(model, opt, x, y, []))
            if first.committed:
                break
        assert first.committed and first.config[OPTIMIZER] == "foreach"
        first.restore()

    # Second run, same host: tuned from its first step after the probe, foreach inside each
    # step (on the direct path too, once settled) and the user's flags after each.
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    second = AstraTorch(model, name="mlp", total_steps=100_000, threads=("1",), compile_choices=("eager",))
    inside: list[list[tuple]] = []
    for _ in range(8):
        second.run(_step(model, opt, x, y, inside))
        assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [(None, None)]
    assert second.committed and second.running[OPTIMIZER] == "foreach"
    assert second.session.trials_run == 0  # nothing explored again
    assert inside[0] == [(None, None)]  # the probe step: as built
    assert all(flags == [(True, None)] for flags in inside[1:])
    assert second.direct
    with second.step():
        _step(model, opt, x, y, inside)()
    assert inside[-1] == [(True, None)]
    assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [(None, None)]
    second.restore()
