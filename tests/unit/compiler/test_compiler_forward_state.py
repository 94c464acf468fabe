"""Issue 18, held out (session 39): a model whose ``forward`` keeps Python state of its own, or
draws from Python's or NumPy's global random streams.

Training code counts its forward calls on the module (``self.calls += 1``) and reads schedules
from the count (a noise or temperature annealing, a warm-up gate). Astra runs the model's
forward for its own purposes during the probe step: the whole-step cache probe and the graph
capture (a dynamo trace that runs the forward), and the channels-last draw check. Each must
leave the module's plain attributes as it found them, as it leaves buffers and random streams.
Before the fix the counter was one ahead of the run without the compiler after the probe step,
and every later loss was off (4e-3 relative on the scratch probe).

Likewise the streams outside torch: a forward drawing its masks from ``np.random`` (Hugging
Face's SpecAugment does) or skipping layers by ``random.random()`` (a LayerDrop) saw other
numbers than the run without the compiler after the probe step's own forwards, and a
rolled-back step's repeat drew on from where the failed attempt left them."""

from __future__ import annotations

import random

import pytest
from _support import fails_once_under_a_trial, seeded_steps

torch = pytest.importorskip("torch")
from torch import nn
from torch.nn import functional as F

from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

np = pytest.importorskip("numpy")

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)


def _astra(model, choices):
    """A wrapper that explores at once (every probe is worth its price: a run of a million
    steps), one thread, the given compile choices, compiles in line."""
    return AstraTorch(
        model,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
        total_steps=1_000_000,
        threads=("1",),
        compile_choices=choices,
        background=False,
    )


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
    astra = _astra(model, choices) if astra_on else None
    losses = seeded_steps(model, opt, astra.run if astra is not None else None, steps, shape)
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


class _HostRandom(nn.Module):
    """A time mask drawn with NumPy's global generator and a LayerDrop by Python's ``random``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.masked = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        h = self.a(x)
        keep = torch.from_numpy(np.random.rand(h.shape[0]) < 0.7)
        h = torch.where(keep[:, None], h, self.masked.expand_as(h))
        if random.random() < 0.5:  # (a skipped layer)
            h = h + torch.tanh(self.b(h))
        return self.c(torch.relu(h))


_FailsOnceUnderATrial = fails_once_under_a_trial(torch.optim.SGD)


def _train_host_random(astra_on: bool, steps: int, choices: tuple[str, ...], opt_cls=None):
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = _HostRandom()
    opt = (opt_cls or torch.optim.SGD)(model.parameters(), 0.1)
    astra = _astra(model, choices) if astra_on else None
    if opt_cls is not None:
        opt_cls.astra = astra
    try:
        losses = seeded_steps(model, opt, astra.run if astra is not None else None, steps, (6, 8))
    finally:
        if opt_cls is not None:
            opt_cls.astra = None
    rolled_back = astra.rolled_back if astra is not None else 0
    if astra is not None:
        astra.restore()
    return losses, (float(np.random.rand()), random.random()), rolled_back


def test_the_probes_own_forwards_leave_pythons_and_numpys_random_streams_as_they_were():
    eager, eager_next, _ = _train_host_random(False, 3, ("eager", "inductor"))
    astra, astra_next, _ = _train_host_random(True, 3, ("eager", "inductor"))
    assert astra_next == eager_next  # the next draws of both streams: the run without the compiler's
    assert astra == pytest.approx(eager, rel=1e-6)


def test_a_rolled_back_steps_repeat_draws_pythons_and_numpys_numbers_again():
    _FailsOnceUnderATrial.failed = 0
    astra, astra_next, rolled_back = _train_host_random(True, 12, ("eager",), opt_cls=_FailsOnceUnderATrial)
    assert rolled_back == 1
    eager, eager_next, _ = _train_host_random(False, 12, ("eager",))
    assert astra_next == eager_next
    assert astra == pytest.approx(eager, rel=1e-6)


class _NormalisesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        x.sub_(x.mean(-1, keepdim=True)).mul_(2.0)  # (the input normalised in place)
        return self.b(torch.relu(self.a(x)))


class _ScalesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x / 2.0)))


def _train_in_place(astra_on: bool, steps: int, make=_NormalisesItsInput, inference_inputs=False):
    torch.manual_seed(0)
    model = make()
    opt = _FailsOnceUnderATrial(model.parameters(), 0.1)
    astra = _astra(model, ("eager",)) if astra_on else None
    _FailsOnceUnderATrial.astra, _FailsOnceUnderATrial.failed = astra, 0
    try:
        run = astra.run if astra is not None else None
        losses = seeded_steps(model, opt, run, steps, (6, 8), inference_inputs=inference_inputs)
    finally:
        _FailsOnceUnderATrial.astra = None
    return losses, (astra.rolled_back if astra is not None else 0)


def test_a_rolled_back_steps_repeat_gets_the_input_the_forward_wrote_in_place_as_it_was():
    astra, rolled_back = _train_in_place(True, 12)
    assert rolled_back == 1
    eager, _ = _train_in_place(False, 12)
    assert astra == pytest.approx(eager, rel=1e-6)


def test_an_input_made_in_inference_mode_is_not_kept_and_the_step_still_rolls_back():
    """(The inputs kept above are read by their version counter, which an inference-mode tensor
    has none of: a batch made under ``torch.inference_mode()`` that the forward reads, not
    writes, must not make the guard raise inside the user's forward.)"""
    astra, rolled_back = _train_in_place(True, 12, _ScalesItsInput, inference_inputs=True)
    assert rolled_back == 1
    eager, _ = _train_in_place(False, 12, _ScalesItsInput, inference_inputs=True)
    assert astra == pytest.approx(eager, rel=1e-6)


class _CollectsItsAuxLoss(nn.Module):
    """A mixture-of-experts layer that appends its load-balancing loss to a list of its own,
    which the training loop sums into the loss and clears."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 3)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 3)
        self.aux_losses: list = []

    def forward(self, x):
        p = torch.softmax(self.gate(x), -1)
        self.aux_losses.append((p.mean(0) ** 2).sum() * 3)
        h = sum(p[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))
        return self.head(torch.relu(h))


def test_the_probes_own_forwards_leave_a_list_the_forward_appends_to_as_it_was():
    def train(astra_on: bool):
        torch.manual_seed(0)
        model = _CollectsItsAuxLoss()
        aux = model.aux_losses
        opt = torch.optim.SGD(model.parameters(), 0.1)
        # (inductor among the choices: the whole-step cache probe's forward)
        astra = _astra(model, ("eager", "inductor")) if astra_on else None

        def aux_term(m):
            term = 0.1 * sum(m.aux_losses)
            m.aux_losses.clear()
            return term

        # (two steps: the probe's forward ends the first)
        losses = seeded_steps(model, opt, astra.run if astra is not None else None, 2, (6, 8), extra=aux_term)
        assert model.aux_losses is aux and aux == []  # (the user's own list, emptied by the loop)
        if astra is not None:
            astra.restore()
        return losses

    assert train(True) == pytest.approx(train(False), rel=1e-6)
