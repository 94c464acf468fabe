"""An optimiser's state follows its parameters' layout (issue 18, session 36).

Held out: Hugging Face's ResNet and ConvNeXt (small configs, AdamW) through ``AstraTorch``
committed channels-last, then tried the fused AdamW, and the loss left the eager run's by 0.5-4%
within two steps. The moments (``exp_avg``, ``exp_avg_sq``), made in the probe step when the
weights were contiguous, stayed contiguous when the weights went channels-last; the loop and
``foreach`` updates pair elements by index, the fused kernel by position in memory, so each
weight was updated from another element's moments. Now a change of the model's memory format
lays the state and the gradients out as the parameters (``StepOptimizers.follow_layouts``).

The exploration's choices are scripted here (each step priced by its configuration) so that the
run goes through channels-last and the fused update as the held-out runs did; no test asserts a
timing."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from microco.clients.compiler._optim import FUSED, OPTIMIZER, StepOptimizers
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _data():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(4, 3, 10, 10, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(3)
    ]


# ms a step by configuration: channels-last and the fused update cheapest, so both are committed
PRICE = {
    "memory_format": {"contiguous": 10.0, "channels_last": 6.0},
    OPTIMIZER: {"loop": 4.0, "foreach": 3.0, FUSED: 1.0},
}


def _train(
    astra: bool, monkeypatch, steps: int = 40, every: int = 1, fused: bool | None = None
) -> tuple[list[float], dict[str, str]]:
    """``every``: the optimiser steps every ``every``-th training step (gradients accumulated
    over the others); ``fused``: the user's own choice of the optimiser's implementation."""
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, fused=fused)
    wrapped = None
    if astra:
        finish = AstraTorch._finish_step

        def priced(self, ok, ms):
            if self._probe_calls is None:
                ms = sum(PRICE[k].get(v, 0.0) for k, v in self._applied.items() if k in PRICE)
                self._step_cpu_ms = math.nan
            return finish(self, ok, ms)

        monkeypatch.setattr(AstraTorch, "_finish_step", priced)
        wrapped = AstraTorch(
            model,
            LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
            total_steps=100_000,
            threads=("1",),
            compile_choices=("eager",),
            background=False,
        )

    def step(i, x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        (loss / every).backward()
        if (i + 1) % every == 0:
            opt.step()
            opt.zero_grad()
        return loss.item()

    data, losses = _data(), []
    for i in range(steps):
        x, y = data[i % len(data)]
        losses.append(wrapped.run(step, i, x, y) if wrapped else step(i, x, y))
    ran = dict(wrapped.running) if wrapped else {}
    if wrapped:
        wrapped.restore()
    return losses, ran


def test_a_fused_update_after_a_channels_last_commit_trains_as_eager(monkeypatch):
    eager, _ = _train(False, monkeypatch)
    astra, ran = _train(True, monkeypatch)
    assert ran.get("memory_format") == "channels_last" and ran.get(OPTIMIZER) == FUSED  # the held-out path
    # the same updates: the losses differ by float order at most (channels-last convolutions)
    assert astra == pytest.approx(eager, rel=1e-4)


def test_an_optimiser_first_stepping_after_the_probe_step_has_its_state_moved_too(monkeypatch):
    """Gradients accumulated over two training steps, each run by the wrapper: the probe step
    (the first) runs no optimiser step, so the probe finds no optimiser (and offers no
    implementation of it); the user's own fused AdamW steps from the second on. Its state must
    follow the layout all the same: before, a channels-last commit left it contiguous, and the
    user's fused update paired each weight with another element's moments."""
    eager, _ = _train(False, monkeypatch, every=2, fused=True)
    astra, ran = _train(True, monkeypatch, every=2, fused=True)
    assert ran.get("memory_format") == "channels_last" and OPTIMIZER not in ran
    assert astra == pytest.approx(eager, rel=1e-4)


def test_the_state_follows_the_parameters_layout():
    model = _net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    found = StepOptimizers(model)
    found.watch()
    x, y = _data()[0]
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # the moments made contiguous, as the weights were
    found.stop()
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    model.to(memory_format=torch.channels_last)
    moved = found.follow_layouts()
    conv = [p for p in model.parameters() if p.dim() == 4]
    # the two moments of each convolution's weight (``Module.to`` moves the gradients itself)
    assert moved == 2 * len(conv)
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert v.stride() == p.stride() or v.dim() <= 1
            assert torch.equal(v, before[id(p)][k])  # only the layout moved
        assert p.grad.stride() == p.stride()
    assert found.follow_layouts() == 0
