"""Issue 18: once the exploration commits the model's own code, each step calls the user's step
directly, with the committed thread count around it and none of the wrapper's per-step work
(no rollback copies, no trial bookkeeping, no hooks or cell runners, no telemetry subscription).
Behaviour, not timing: what runs in a step is checked, not how long it takes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from microco.clients import telemetry
from microco.clients.compiler import _torch
from microco.clients.compiler._torch import AstraTorch, CellRunner
from microco.clients.compiler.explore.types import Config
from microco.clients.compiler.zoo import torch_models as zm

pytestmark = pytest.mark.torch


class _Committed:
    """An explorer whose answer is a commit at once: every variable at its baseline but
    ``overrides`` (a thread count: still the model's own code). A committed thread count is
    load-dependent: the run's first two steps under it are reported once (trial -1)."""

    def __init__(self, **overrides: str) -> None:
        self.overrides = overrides
        self.cfg: Config | None = None

    def register(self, spec):
        values = {v.name: v.choices[0] for v in spec.variables}
        for k, v in self.overrides.items():
            values[next(n for n in values if n.endswith(k))] = v
        self.cfg = Config(spec.key, values, trial=-1, committed=True, steps=0)
        return self.cfg

    def report(self, key, rep):
        assert rep.trial == -1, "a committed run reports its first steps only"
        return self.cfg


def _make(explorer):
    torch.manual_seed(0)
    model = zm.make_model("lstm", 6, 8)
    astra = AstraTorch(
        model, explorer, name="lstm", total_steps=100, threads=("2", "1"), compile_choices=("eager",)
    )
    return model, astra


def _train_step(model, opt, x, y, seen):
    seen.append(torch.get_num_threads())
    loss = zm.loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_a_committed_eager_step_calls_the_users_step_and_nothing_else(two_threads, monkeypatch):
    model, astra = _make(_Committed(threads="1"))
    ref = zm.make_model("lstm", 6, 8)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    x, y = zm.synthetic_batch(4, 8, 6, seed=0)
    seen: list[int] = []
    for _ in range(3):  # the probe step, then two under the commit (reported), which settle it
        astra.run(_train_step, model, opt, x, y, seen)
    assert astra.direct and astra.config["threads"] == "1"
    assert astra.runners  # the cell was found, and its runner taken off again:
    cell = model.get_submodule(next(iter(astra.runners)))
    assert "forward" not in cell.__dict__ and not isinstance(cell.forward, CellRunner)
    assert not model._forward_pre_hooks

    # From here on: none of the per-step work.
    def forbidden(*a, **k):
        raise AssertionError("per-step work in a direct step")

    monkeypatch.setattr(astra.session, "record", forbidden)
    monkeypatch.setattr(astra, "_before", forbidden)
    monkeypatch.setattr(astra, "_after", forbidden)
    monkeypatch.setattr(_torch, "StepSnapshot", forbidden)
    monkeypatch.setattr(telemetry, "current", forbidden)
    calls = len(seen)
    out = astra.run(_train_step, model, opt, x, y, seen)
    assert len(seen) == calls + 1 and isinstance(out, torch.Tensor)  # called once, its result back
    with astra.step():
        _train_step(model, opt, x, y, seen)
    # The committed thread count inside each step, the user's own after it.
    assert seen[-2:] == [1, 1] and torch.get_num_threads() == 2
    # The user's own error is the user's: raised, the thread count still put back.
    with pytest.raises(ZeroDivisionError):
        astra.run(lambda: 1 / 0)
    assert torch.get_num_threads() == 2
    # The same training as without the wrapper.
    for _ in range(5):
        _train_step(ref, ref_opt, x, y, [])
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    astra.restore()


def test_a_commit_that_changes_the_models_code_keeps_the_wrapper(two_threads):
    model, astra = _make(_Committed(hoist="on"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = zm.synthetic_batch(4, 8, 6, seed=0)
    for _ in range(3):
        astra.run(_train_step, model, opt, x, y, [])
    assert astra.committed and not astra.direct
    cell = model.get_submodule(next(iter(astra.runners)))
    assert isinstance(cell.forward, CellRunner)  # the hoisted variant runs through its runner
    astra.restore()
