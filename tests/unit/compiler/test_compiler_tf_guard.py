"""Issue 18, session 30: training never stops for a failure of TensorFlow's wrapper itself.

The wrapper's own work around a step (its analysis of the step at registration, the
exploration's bookkeeping after it) ran outside the guard that covers the step's variants, so
an error there ended the user's loop. Now the step as written runs from then on."""

from __future__ import annotations

import numpy as np
import pytest
from _support import lazy_import

from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

tf = lazy_import("tensorflow")
_tf = lazy_import("microco.clients.compiler._tf")
zt = lazy_import("microco.clients.compiler.zoo._tf_models")

pytestmark = pytest.mark.tensorflow


def _mlp():
    tf.random.set_seed(0)
    return tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh"), tf.keras.layers.Dense(10)])


def _reference(weights, steps, x, y):
    model, opt = _mlp(), tf.keras.optimizers.SGD(0.05)
    model(x)
    model.set_weights(weights)  # the wrapped model's initial weights

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = zt.loss_fn(model(x, training=True), y)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return [float(step(x, y).numpy()) for _ in range(steps)]


@pytest.mark.parametrize("where", ["register", "record"])
def test_a_failure_of_the_wrappers_own_work_leaves_the_step_as_written(monkeypatch, where):
    x = tf.random.normal([8, 12], seed=1)
    y = tf.constant(np.arange(8) % 10)
    model = _mlp()
    model(x)  # built: its initial weights are the reference's
    weights = model.get_weights()
    astra = _tf.AstraTF(
        model,
        tf.keras.optimizers.SGD(0.05),
        zt.loss_fn,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1)),
        total_steps=300,
        xla=False,
    )

    def broken(*a, **k):
        raise RuntimeError(f"injected: the wrapper's {where} failed")

    if where == "register":
        monkeypatch.setattr(astra, "_register", broken)
    else:
        monkeypatch.setattr(astra.session, "record", broken)
    losses = [astra.step(x, y) for _ in range(6)]  # raised the injected error before
    assert "injected" in astra.abandoned and astra.direct is not None
    assert losses == pytest.approx(_reference(weights, 6, x, y), rel=1e-5, abs=1e-6)
