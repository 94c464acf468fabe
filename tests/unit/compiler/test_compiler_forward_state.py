"""Issue 18, held out (session 39): a model whose ``forward`` keeps Python state of its own.

Training code counts its forward calls on the module (``self.calls += 1``) and reads schedules
from the count (a noise or temperature annealing, a warm-up gate). Astra runs the model's
forward for its own purposes during the probe step: the whole-step cache probe and the graph
capture (a dynamo trace that runs the forward), and the channels-last draw check. Each must
leave the module's plain attributes as it found them, as it leaves buffers and random streams.
Before the fix the counter was one ahead of the run without the compiler after the probe step,
and every later loss was off (4e-3 relative on the scratch probe)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn
from torch.nn import functional as F

from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)


class _Counted(nn.Module):
    """An MLP whose forward anneals a scale by the number of its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.b(torch.tanh(self.a(x) * (1.0 + 1.0 / self.calls)))


class _CountedConv(nn.Module):
    """A conv net drawing a dropout over its feature maps (so the probe checks channels-last's
    draws with a forward of its own), counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(2, 4, 3, padding=1), nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = F.dropout(torch.relu(self.conv(x)), 0.2, training=self.training) * (1.0 + 1.0 / self.calls)
        return self.head(h.mean((2, 3)))


def _train(make, shape, astra_on: bool, steps: int, choices: tuple[str, ...]):
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    astra = (
        AstraTorch(
            model,
            LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
            total_steps=1_000_000,  # every probe is worth its price
            threads=("1",),
            compile_choices=choices,
            background=False,
        )
        if astra_on
        else None
    )
    losses = []
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(*shape, generator=g), torch.randint(0, 3, (shape[0],), generator=g)

        def step(x=x, y=y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()

        losses.append(astra.run(step) if astra is not None else step())
    if astra is not None:
        astra.restore()
    return losses, model.calls


@pytest.mark.parametrize(
    "make, shape, choices",
    [
        # the whole-step cache probe and the capture (dynamo runs the forward)
        (_Counted, (6, 8), ("eager", "inductor")),
        # the channels-last draw check (a functional_call of the forward)
        (_CountedConv, (2, 2, 5, 5), ("eager",)),
    ],
    ids=["whole_step_probe", "layout_check"],
)
def test_the_probes_own_forwards_leave_a_counter_the_forward_keeps_as_it_was(make, shape, choices):
    steps = 3
    eager, eager_calls = _train(make, shape, False, steps, choices)
    astra, astra_calls = _train(make, shape, True, steps, choices)
    assert astra_calls == eager_calls == steps
    assert astra == pytest.approx(eager, rel=1e-6)
