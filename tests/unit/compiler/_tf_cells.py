"""Hand-written TensorFlow cells for ``test_compiler_tf_graph.py``, in a module of their own so
that TensorFlow is imported when those tests run, not when each xdist worker collects them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from microco.clients.compiler.zoo import tf_models as zt


def _var(rng, *shape, scale=0.3):
    return tf.Variable((rng.standard_normal(shape) * scale).astype(np.float32))


class MinimalGatedCell(tf.Module):
    """A user's own cell: a gated unit whose candidate reads ``r * h`` (a product of an
    intermediate, which stays in the replayed graph), with the input projection used twice."""

    def __init__(self, inp, hidden, rng):
        super().__init__()
        self.hidden = hidden
        self.w_gate, self.b_gate = _var(rng, inp, hidden), _var(rng, hidden)
        self.u_gate = _var(rng, hidden, hidden)
        self.w_cand = _var(rng, inp, hidden)
        self.u_cand = _var(rng, hidden, hidden)
        self.peep = _var(rng, hidden)

    def zero_state(self, batch):
        return (tf.zeros((batch, self.hidden)),)

    def __call__(self, x, state):
        (h,) = state
        gate = tf.sigmoid(tf.matmul(x, self.w_gate) + self.b_gate + tf.matmul(h, self.u_gate) + self.peep * h)
        cand = tf.tanh(tf.matmul(x, self.w_cand) + tf.matmul(gate * h, self.u_cand))
        skip = tf.matmul(x, self.w_cand)  # the same product again: one product, two uses
        h = (1 - gate) * h + gate * cand + 0.1 * skip
        return h, (h,)


class Stack(zt.RecurrentClassifier):
    """The zoo model's own forward (each cell called once per time step, then the head) over
    cells of the test's class."""

    def __init__(self, cell_cls, inp=5, hidden=7, layers=2, classes=3, seed=0):
        tf.Module.__init__(self)
        rng = np.random.default_rng(seed)
        self.cells = [cell_cls(inp if k == 0 else hidden, hidden, rng) for k in range(layers)]
        self.head_w, self.head_b = _var(rng, hidden, classes), _var(rng, classes)


class RandomCell(MinimalGatedCell):
    """A cell drawing random numbers in its step (a stateful op the replay would redraw)."""

    def __call__(self, x, state):
        h, state = super().__call__(x, state)
        return h + tf.random.uniform(tf.shape(h), maxval=1e-3), state


class NoProductCell(tf.Module):
    def __init__(self, inp, hidden, rng):
        super().__init__()
        self.hidden, self.scale = hidden, _var(rng, hidden)

    def zero_state(self, batch):
        return (tf.zeros((batch, self.hidden)),)

    def __call__(self, x, state):
        h = tf.tanh(state[0] * self.scale + tf.reduce_sum(x, -1, keepdims=True))
        return h, (h,)
