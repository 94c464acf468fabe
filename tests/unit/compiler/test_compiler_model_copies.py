"""A copy of a model Astra trains (``copy.deepcopy``, ``torch.save(model)``: a "best model"
snapshot, an EMA teacher) is the model as it was at the copy, running its own code (held out,
issue 18, session 38: a deep copy raised once a cell's hoisting was committed, and a copy of a
model whose whole step was compiled ran the original's compiled code, silently)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from _support import needs
from torch import nn

from microco.clients.compiler import AstraTorch
from microco.clients.compiler.explore import Config

pytestmark = needs("torch")


class Commits:
    """An explorer that commits ``values`` (each variable named by its suffix) at once."""

    def __init__(self, **values: str) -> None:
        self.values = values

    def register(self, spec):
        values = {v.name: v.choices[0] for v in spec.variables}
        for name in values:
            suffix = name.rsplit(".", 1)[-1]
            if suffix in self.values:
                values[name] = self.values[suffix]
        return Config(spec.key, values, trial=-1, committed=True)

    def report(self, key, report):
        return None


def _lstm():
    from microco.clients.compiler.zoo import torch_models as zm

    torch.manual_seed(0)
    return zm.make_model("lstm", 6, 8)


def _steps(model, run, x, loss, n):
    opt = torch.optim.SGD(model.parameters(), 0.1)

    def one():
        out = loss(model(x))
        opt.zero_grad()
        out.backward()
        opt.step()
        return out.item()

    for _ in range(n):
        run(one)


def _snapshot_then_train(model, fresh, astra, x, loss):
    """Three steps, a deep copy and a pickled copy, three more steps: the copies and a
    ``state_dict`` snapshot taken with them."""
    _steps(model, astra.run, x, loss, 3)
    best = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    ref = fresh()
    ref.load_state_dict(model.state_dict())
    _steps(model, astra.run, x, loss, 3)
    buf.seek(0)
    return best, torch.load(buf, weights_only=False), ref


def test_a_copy_of_a_model_with_a_committed_hoisted_cell_is_the_model_at_the_copy():
    from microco.clients.compiler.zoo import torch_models as zm

    model = _lstm()
    astra = AstraTorch(
        model, Commits(hoist="on"), threads=("1",), compile_choices=("eager",), background=False
    )
    x, y = zm.synthetic_batch(4, 5, 6)
    best, loaded, ref = _snapshot_then_train(model, _lstm, astra, x, lambda out: zm.loss_fn(out, y))
    assert any(k.endswith(".hoist") and v == "on" for k, v in astra.config.items())
    with torch.no_grad():
        want, now = ref(x), model(x)
        assert not torch.allclose(want, now)  # (the model trained on after the copy)
        for copied in (best, loaded):
            assert torch.allclose(copied(x), want, rtol=1e-5, atol=1e-6)
    # ... and the copy's cells run their own code, not the original's runners.
    assert not any(type(m.__dict__.get("forward")).__name__ == "CellRunner" for m in best.modules())


def test_a_copy_of_a_model_whose_whole_step_is_compiled_runs_its_own_weights(
    monkeypatch, whole_compile_trial
):
    monkeypatch.setattr(AstraTorch, "WHOLE_COMPILE_BACKEND", "eager")  # (dynamo's capture, no compile)
    torch._dynamo.reset()

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))

    model = mlp()
    astra = AstraTorch(
        model, whole_compile_trial(commit="inductor"), threads=("1",), total_steps=10**6, background=False
    )
    x = torch.randn(8, 6)
    best, loaded, ref = _snapshot_then_train(model, mlp, astra, x, lambda out: out.pow(2).mean())
    torch._dynamo.reset()
    assert astra.config.get("model.compile") == "inductor" and not astra.whole_failed
    with torch.no_grad():
        want, now = ref(x), model(x)
        assert not torch.allclose(want, now)
        for copied in (best, loaded):
            assert torch.allclose(copied(x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("own", [False, True], ids=["the class's forward", "an instance's own forward"])
def test_a_copy_made_alone_or_with_its_module_keeps_the_right_forward(own):
    """The installed forward copied with its module is that module's code bound to the copy (or
    the instance's own ``forward``, copied as any attribute); pickled, the same."""
    from microco.clients.compiler._torch import InstalledForward

    m = nn.Linear(3, 2)
    mine = (lambda x: x * 2) if own else None
    m.forward = InstalledForward(lambda x: x * 0, m, mine)
    c = copy.deepcopy(m)
    x = torch.randn(4, 3)
    want = x * 2 if own else nn.functional.linear(x, m.weight, m.bias)
    if not own:
        with torch.no_grad():
            m.weight.add_(1.0)  # (the copy's weights are its own)
    assert torch.allclose(c(x), want)
