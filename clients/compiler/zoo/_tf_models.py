"""The zoo's recurrent cells in TensorFlow, written from primitive operators.

A TensorFlow cell states its matrix products (``x_kernels`` read the step input, ``h_kernels``
read the recurrent state) and its element-wise remainder (``combine``); how the products run
(one per gate or batched, per step or hoisted out of the time loop, under XLA or not) is
decided by the executor in :mod:`microco.clients.compiler._tf`, per training step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> tf.Variable:
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return tf.Variable(rng.uniform(-lim, lim, (fan_in, fan_out)).astype(np.float32))


def _zeros(n: int, value: float = 0.0) -> tf.Variable:
    return tf.Variable(np.full((n,), value, np.float32))


class TFCell(tf.Module):
    """Base: ``x_kernels`` name -> (W, b or None); ``h_kernels`` name -> W; ``combine`` the rest."""

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
        self.x_kernels = {
            g: (_glorot(rng, input_size, hidden), _zeros(hidden) if x_bias else None) for g in gates
        }
        self.h_kernels = {g: _glorot(rng, hidden, hidden) for g in (gates if h_gates is None else h_gates)}

    def zero_state(self, batch: int) -> tuple[tf.Tensor, ...]:
        z = tf.zeros((batch, self.hidden))
        return tuple(z for _ in range(self.state_size))

    def h_input(self, state):
        return state[0]

    def combine(self, xp, hp, state, x):
        """The cell's gate arithmetic from its input and hidden projections; every zoo cell
        (LSTM, MI-LSTM, GRU, LN-LSTM, SRU) defines its own, the base class has none."""
        raise NotImplementedError(f"{type(self).__name__} must define combine()")


class LSTMCell(TFCell):
    def __init__(self, input_size, hidden, rng):
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"))

    def combine(self, xp, hp, state, x):
        _, c = state
        i = tf.sigmoid(xp["i"] + hp["i"])
        f = tf.sigmoid(xp["f"] + hp["f"])
        g = tf.tanh(xp["g"] + hp["g"])
        o = tf.sigmoid(xp["o"] + hp["o"])
        c = f * c + i * g
        h = o * tf.tanh(c)
        return h, (h, c)


class MILSTMCell(TFCell):
    def __init__(self, input_size, hidden, rng):
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"))
        self.alpha = tf.Variable(np.ones((4, hidden), np.float32))
        self.beta1 = tf.Variable(np.full((4, hidden), 0.5, np.float32))
        self.beta2 = tf.Variable(np.full((4, hidden), 0.5, np.float32))

    def combine(self, xp, hp, state, x):
        _, c = state
        pre = [
            self.alpha[k] * xp[g] * hp[g] + self.beta1[k] * hp[g] + self.beta2[k] * xp[g]
            for k, g in enumerate(("i", "f", "g", "o"))
        ]
        i, f, o = tf.sigmoid(pre[0]), tf.sigmoid(pre[1]), tf.sigmoid(pre[3])
        c = f * c + i * tf.tanh(pre[2])
        h = o * tf.tanh(c)
        return h, (h, c)


class GRUCell(TFCell):
    state_size = 1

    def __init__(self, input_size, hidden, rng):
        super().__init__(input_size, hidden, rng, ("r", "z", "n"))

    def combine(self, xp, hp, state, x):
        (h,) = state
        r = tf.sigmoid(xp["r"] + hp["r"])
        z = tf.sigmoid(xp["z"] + hp["z"])
        n = tf.tanh(xp["n"] + r * hp["n"])
        h = (1 - z) * n + z * h
        return h, (h,)


def _layer_norm(v, gamma, beta, eps=1e-5):
    mean, var = tf.nn.moments(v, axes=[-1], keepdims=True)
    return (v - mean) * tf.math.rsqrt(var + eps) * gamma + beta


class LayerNormLSTMCell(TFCell):
    def __init__(self, input_size, hidden, rng):
        super().__init__(input_size, hidden, rng, ("i", "f", "g", "o"), x_bias=False)
        self.gamma = {k: _zeros(hidden, 1.0) for k in ("i", "f", "g", "o", "c")}
        self.beta = {k: _zeros(hidden) for k in ("i", "f", "g", "o", "c")}

    def combine(self, xp, hp, state, x):
        _, c = state

        def ln(k, v):
            return _layer_norm(v, self.gamma[k], self.beta[k])

        i = tf.sigmoid(ln("i", xp["i"] + hp["i"]))
        f = tf.sigmoid(ln("f", xp["f"] + hp["f"]))
        g = tf.tanh(ln("g", xp["g"] + hp["g"]))
        o = tf.sigmoid(ln("o", xp["o"] + hp["o"]))
        c = f * c + i * g
        h = o * tf.tanh(ln("c", c))
        return h, (h, c)


class SRUCell(TFCell):
    state_size = 1

    def __init__(self, input_size, hidden, rng):
        super().__init__(input_size, hidden, rng, ("x", "f", "r", "skip"), h_gates=())
        self.x_kernels["skip"] = (self.x_kernels["skip"][0], None)
        self.vf = _zeros(hidden)
        self.vr = _zeros(hidden)

    def combine(self, xp, hp, state, x):
        (c,) = state
        f = tf.sigmoid(xp["f"] + self.vf * c)
        r = tf.sigmoid(xp["r"] + self.vr * c)
        c = f * c + (1 - f) * xp["x"]
        h = r * tf.tanh(c) + (1 - r) * xp["skip"]
        return h, (c,)


CELLS = {"lstm": LSTMCell, "milstm": MILSTMCell, "gru": GRUCell, "lnlstm": LayerNormLSTMCell, "sru": SRUCell}


class RecurrentClassifier(tf.Module):
    """Stacked recurrent layers over ``[T, B, input_size]``, then a linear classifier."""

    def __init__(
        self, cell: str, input_size: int, hidden: int, layers: int = 1, classes: int = 10, seed: int = 0
    ):
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; choose one of {sorted(CELLS)}")
        rng = np.random.default_rng(seed)
        self.cell_name = cell
        self.cells = [CELLS[cell](input_size if k == 0 else hidden, hidden, rng) for k in range(layers)]
        self.head_w = _glorot(rng, hidden, classes)
        self.head_b = _zeros(classes)

    def head(self, h):
        return tf.matmul(h, self.head_w) + self.head_b

    def __call__(self, x):
        """Plain eager semantics: one product per gate, per step."""
        from microco.clients.compiler._tf import run_model

        return run_model(self, x, hoist=False, batch=False)


def make_model(
    cell: str, input_size: int = 32, hidden: int = 64, layers: int = 1, classes: int = 10, seed: int = 0
):
    return RecurrentClassifier(cell, input_size, hidden, layers, classes, seed)


def synthetic_batch(steps: int, batch: int, input_size: int, classes: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((steps, batch, input_size)).astype(np.float32))
    y = tf.constant(rng.integers(0, classes, (batch,)).astype(np.int32))
    return x, y


def loss_fn(logits, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
