"""Long-tail recurrent models written from primitive PyTorch operators.

Each cell is an ``nn.Module`` called once per time step as ``cell(x_t, state) -> (h, state)``
with one ``nn.Linear`` per gate, the way a researcher writes a new cell before any library
hand-tunes it. The models loop over time in plain Python; microco's wrapper finds the
repeated cells and decides at run time how they execute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LSTMCell(nn.Module):
    """Classic LSTM: four gates, each ``sigma(W x + U h)``."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wi, self.wf, self.wg, self.wo = (nn.Linear(input_size, hidden) for _ in range(4))
        self.ui, self.uf, self.ug, self.uo = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        h, c = state
        i = torch.sigmoid(self.wi(x) + self.ui(h))
        f = torch.sigmoid(self.wf(x) + self.uf(h))
        g = torch.tanh(self.wg(x) + self.ug(h))
        o = torch.sigmoid(self.wo(x) + self.uo(h))
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h, (h, c)


class MILSTMCell(nn.Module):
    """Multiplicative-integration LSTM (Wu et al. 2016): ``alpha*Wx*Uh + beta1*Uh + beta2*Wx + b``."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wi, self.wf, self.wg, self.wo = (nn.Linear(input_size, hidden) for _ in range(4))
        self.ui, self.uf, self.ug, self.uo = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.alpha = nn.Parameter(torch.ones(4, hidden))
        self.beta1 = nn.Parameter(torch.full((4, hidden), 0.5))
        self.beta2 = nn.Parameter(torch.full((4, hidden), 0.5))

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        h, c = state
        wx = (self.wi(x), self.wf(x), self.wg(x), self.wo(x))
        uh = (self.ui(h), self.uf(h), self.ug(h), self.uo(h))
        pre = [
            self.alpha[k] * wx[k] * uh[k] + self.beta1[k] * uh[k] + self.beta2[k] * wx[k] for k in range(4)
        ]
        i, f, o = torch.sigmoid(pre[0]), torch.sigmoid(pre[1]), torch.sigmoid(pre[3])
        g = torch.tanh(pre[2])
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h, (h, c)


class GRUCell(nn.Module):
    """GRU with a reset gate applied to the recurrent candidate projection."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wr, self.wz, self.wn = (nn.Linear(input_size, hidden) for _ in range(3))
        self.ur, self.uz, self.un = (nn.Linear(hidden, hidden, bias=False) for _ in range(3))

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        (h,) = state
        r = torch.sigmoid(self.wr(x) + self.ur(h))
        z = torch.sigmoid(self.wz(x) + self.uz(h))
        n = torch.tanh(self.wn(x) + r * self.un(h))
        h = (1 - z) * n + z * h
        return h, (h,)


class LayerNormLSTMCell(nn.Module):
    """LSTM with layer normalisation of every gate pre-activation and of the cell state."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wi, self.wf, self.wg, self.wo = (nn.Linear(input_size, hidden, bias=False) for _ in range(4))
        self.ui, self.uf, self.ug, self.uo = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.lni, self.lnf, self.lng, self.lno, self.lnc = (nn.LayerNorm(hidden) for _ in range(5))

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        h, c = state
        i = torch.sigmoid(self.lni(self.wi(x) + self.ui(h)))
        f = torch.sigmoid(self.lnf(self.wf(x) + self.uf(h)))
        g = torch.tanh(self.lng(self.wg(x) + self.ug(h)))
        o = torch.sigmoid(self.lno(self.wo(x) + self.uo(h)))
        c = f * c + i * g
        h = o * torch.tanh(self.lnc(c))
        return h, (h, c)


class SRUCell(nn.Module):
    """Simple Recurrent Unit (Lei et al. 2018): every matrix product reads only the input."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wx, self.wf, self.wr = (nn.Linear(input_size, hidden) for _ in range(3))
        self.skip = nn.Linear(input_size, hidden, bias=False)
        self.vf = nn.Parameter(torch.zeros(hidden))
        self.vr = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        (c,) = state
        f = torch.sigmoid(self.wf(x) + self.vf * c)
        r = torch.sigmoid(self.wr(x) + self.vr * c)
        c = f * c + (1 - f) * self.wx(x)
        h = r * torch.tanh(c) + (1 - r) * self.skip(x)
        return h, (c,)


CELLS: dict[str, type[nn.Module]] = {
    "lstm": LSTMCell,
    "milstm": MILSTMCell,
    "gru": GRUCell,
    "lnlstm": LayerNormLSTMCell,
    "sru": SRUCell,
}
_STATE_SIZE = {"lstm": 2, "milstm": 2, "gru": 1, "lnlstm": 2, "sru": 1}


class RecurrentClassifier(nn.Module):
    """Stacked recurrent layers over a time-major sequence, then a linear classifier.

    ``forward(x)`` takes ``x`` of shape ``[T, B, input_size]`` and returns logits ``[B, classes]``.
    """

    def __init__(self, cell: str, input_size: int, hidden: int, layers: int = 1, classes: int = 10) -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; choose one of {sorted(CELLS)}")
        self.cell_name = cell
        self.hidden = hidden
        self.cells = nn.ModuleList(
            CELLS[cell](input_size if k == 0 else hidden, hidden) for k in range(layers)
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor) -> Tensor:
        seq = x
        for cell in self.cells:
            zeros = seq.new_zeros(seq.shape[1], self.hidden)
            state = tuple(zeros for _ in range(_STATE_SIZE[self.cell_name]))
            outs = []
            for t in range(seq.shape[0]):
                h, state = cell(seq[t], state)
                outs.append(h)
            seq = torch.stack(outs)
        logits: Tensor = self.head(seq[-1])
        return logits


def make_model(
    cell: str, input_size: int = 32, hidden: int = 64, layers: int = 1, classes: int = 10, seed: int = 0
) -> RecurrentClassifier:
    """A zoo model with deterministic initial weights."""
    torch.manual_seed(seed)
    return RecurrentClassifier(cell, input_size, hidden, layers, classes)


def synthetic_batch(
    steps: int, batch: int, input_size: int, classes: int = 10, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """A synthetic ``(x, y)`` batch: ``x`` ``[steps, batch, input_size]``, labels ``[batch]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, batch, input_size, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return x, y


def loss_fn(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits, y)
