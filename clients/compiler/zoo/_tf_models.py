"""The zoo's recurrent cells in TensorFlow, written from primitive operators.

Each cell is a plain ``cell(x_t, state) -> (h, new_state)`` over its own variables, as a user
would write it: nothing in it states its structure. Astra finds its products (of the step input
and of the state by the cell's variables) by analysing the cell's captured graph
(:mod:`microco.clients.compiler._tf_graph`), and decides how they run (one per gate or batched,
per step or hoisted out of the time loop, under XLA or not) per training step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> tf.Variable:
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return tf.Variable(rng.uniform(-lim, lim, (fan_in, fan_out)).astype(np.float32))


def _zeros(n: int, value: float = 0.0) -> tf.Variable:
    return tf.Variable(np.full((n,), value, np.float32))


class TFCell(tf.Module):  # type: ignore[misc]
    """Base: per gate an input kernel ``wx[g]`` (with bias ``bx[g]`` unless ``x_bias`` is
    false) and a recurrent kernel ``wh[g]``; each cell's ``__call__`` is its step."""

    state_size = 2

    def __init__(
        self,
        input_size: int,
        hidden: int,
        rng: np.random.Generator,
        gates: tuple[str, ...],
        h_gates: tuple[str, ...] | None = None,
        x_bias: bool = True,
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.wx, self.bx = {}, {}
        for g in gates:
            self.wx[g] = _glorot(rng, input_size, hidden)
            if x_bias:
                self.bx[g] = _zeros(hidden)
        self.wh = {g: _glorot(rng, hidden, hidden) for g in (gates if h_gates is None else h_gates)}

    def zero_state(self, batch: int) -> tuple[tf.Tensor, ...]:
        z = tf.zeros((batch, self.hidden))
        return tuple(z for _ in range(self.state_size))

    def xw(self, x: tf.Tensor, g: str) -> tf.Tensor:
        """The input projection of gate ``g``: ``x @ W + b``."""
        y = tf.matmul(x, self.wx[g])
        return y + self.bx[g] if g in self.bx else y

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        raise NotImplementedError(f"{type(self).__name__} must define its step")


class LSTMCell(TFCell):
    def __init__(self, input_size: int, hidden: int, rng: np.random.Generator) -> None:
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"))

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        h, c = state
        i = tf.sigmoid(self.xw(x, "i") + tf.matmul(h, self.wh["i"]))
        f = tf.sigmoid(self.xw(x, "f") + tf.matmul(h, self.wh["f"]))
        g = tf.tanh(self.xw(x, "g") + tf.matmul(h, self.wh["g"]))
        o = tf.sigmoid(self.xw(x, "o") + tf.matmul(h, self.wh["o"]))
        c = f * c + i * g
        h = o * tf.tanh(c)
        return h, (h, c)


class MILSTMCell(TFCell):
    def __init__(self, input_size: int, hidden: int, rng: np.random.Generator) -> None:
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"))
        self.alpha = tf.Variable(np.ones((4, hidden), np.float32))
        self.beta1 = tf.Variable(np.full((4, hidden), 0.5, np.float32))
        self.beta2 = tf.Variable(np.full((4, hidden), 0.5, np.float32))

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        h, c = state
        pre = []
        for k, g in enumerate(("i", "f", "g", "o")):
            xp, hp = self.xw(x, g), tf.matmul(h, self.wh[g])
            pre.append(self.alpha[k] * xp * hp + self.beta1[k] * hp + self.beta2[k] * xp)
        i, f, o = tf.sigmoid(pre[0]), tf.sigmoid(pre[1]), tf.sigmoid(pre[3])
        c = f * c + i * tf.tanh(pre[2])
        h = o * tf.tanh(c)
        return h, (h, c)


class GRUCell(TFCell):
    state_size = 1

    def __init__(self, input_size: int, hidden: int, rng: np.random.Generator) -> None:
        super().__init__(input_size, hidden, rng, ("r", "z", "n"))

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        (h,) = state
        r = tf.sigmoid(self.xw(x, "r") + tf.matmul(h, self.wh["r"]))
        z = tf.sigmoid(self.xw(x, "z") + tf.matmul(h, self.wh["z"]))
        n = tf.tanh(self.xw(x, "n") + r * tf.matmul(h, self.wh["n"]))
        h = (1 - z) * n + z * h
        return h, (h,)


def _layer_norm(v: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, eps: float = 1e-5) -> tf.Tensor:
    mean, var = tf.nn.moments(v, axes=[-1], keepdims=True)
    return (v - mean) * tf.math.rsqrt(var + eps) * gamma + beta


class LayerNormLSTMCell(TFCell):
    def __init__(self, input_size: int, hidden: int, rng: np.random.Generator) -> None:
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"), x_bias=False)
        self.gamma = {k: _zeros(hidden, 1.0) for k in ("i", "f", "g", "o", "c")}
        self.beta = {k: _zeros(hidden) for k in ("i", "f", "g", "o", "c")}

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        h, c = state

        def gate(k: str) -> tf.Tensor:
            return _layer_norm(self.xw(x, k) + tf.matmul(h, self.wh[k]), self.gamma[k], self.beta[k])

        i, f, g, o = tf.sigmoid(gate("i")), tf.sigmoid(gate("f")), tf.tanh(gate("g")), tf.sigmoid(gate("o"))
        c = f * c + i * g
        h = o * tf.tanh(_layer_norm(c, self.gamma["c"], self.beta["c"]))
        return h, (h, c)


class SRUCell(TFCell):
    state_size = 1

    def __init__(self, input_size: int, hidden: int, rng: np.random.Generator) -> None:
        super().__init__(input_size, hidden, rng, ("x", "f", "r", "skip"), h_gates=())
        del self.bx["skip"]
        self.vf = _zeros(hidden)
        self.vr = _zeros(hidden)

    def __call__(self, x: tf.Tensor, state: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        (c,) = state
        f = tf.sigmoid(self.xw(x, "f") + self.vf * c)
        r = tf.sigmoid(self.xw(x, "r") + self.vr * c)
        c = f * c + (1 - f) * self.xw(x, "x")
        h = r * tf.tanh(c) + (1 - r) * self.xw(x, "skip")
        return h, (c,)


CELLS = {"lstm": LSTMCell, "milstm": MILSTMCell, "gru": GRUCell, "lnlstm": LayerNormLSTMCell, "sru": SRUCell}


class RecurrentClassifier(tf.Module):  # type: ignore[misc]
    """Stacked recurrent layers over ``[T, B, input_size]``, then a linear classifier."""

    def __init__(
        self, cell: str, input_size: int, hidden: int, layers: int = 1, classes: int = 10, seed: int = 0
    ) -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; choose one of {sorted(CELLS)}")
        rng = np.random.default_rng(seed)
        self.cell_name = cell
        self.cells = [CELLS[cell](input_size if k == 0 else hidden, hidden, rng) for k in range(layers)]
        self.head_w = _glorot(rng, hidden, classes)
        self.head_b = _zeros(classes)

    def head(self, h: tf.Tensor) -> tf.Tensor:
        return tf.matmul(h, self.head_w) + self.head_b

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The user's own forward: each cell called once per time step."""
        seq = x
        for cell in self.cells:
            state = cell.zero_state(tf.shape(seq)[1])
            outs = []
            for t in range(seq.shape[0]):
                h, state = cell(seq[t], state)
                outs.append(h)
            seq = tf.stack(outs)
        return self.head(seq[-1])


def make_model(
    cell: str, input_size: int = 32, hidden: int = 64, layers: int = 1, classes: int = 10, seed: int = 0
) -> RecurrentClassifier:
    return RecurrentClassifier(cell, input_size, hidden, layers, classes, seed)


def synthetic_batch(
    steps: int, batch: int, input_size: int, classes: int = 10, seed: int = 0
) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((steps, batch, input_size)).astype(np.float32))
    y = tf.constant(rng.integers(0, classes, (batch,)).astype(np.int32))
    return x, y


def loss_fn(logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
