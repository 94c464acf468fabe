"""The loss AstraTF's step minimises is Keras's own: a ``keras.losses.Loss`` object called as
Keras calls it (``y_true, y_pred``), and the losses the model adds itself (an L2 weight
regulariser) included. A Keras model nobody here wrote, with a regulariser and a loss object,
failed its first step (the object's arguments swapped) and, with a lambda, trained without its
regulariser (weights 0.011 from ``model.fit``'s after 30 steps)."""

from __future__ import annotations

import numpy as np
import pytest
from _support import lazy_import, needs

from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

tf = lazy_import("tensorflow")
keras = lazy_import("keras")
_tf = lazy_import("microco.clients.compiler._tf")

pytestmark = [pytest.mark.tensorflow, needs("tensorflow")]


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.l2(0.05)),
            keras.layers.Dense(3, activity_regularizer=keras.regularizers.l1(0.01)),
        ]
    )


def _batches():
    rng = np.random.default_rng(1)
    return [
        (tf.constant(rng.normal(size=(8, 6)).astype("float32")), tf.constant(rng.integers(0, 3, 8)))
        for _ in range(5)
    ]


@pytest.mark.parametrize("as_object", [True, False])
def test_the_step_minimises_what_keras_fit_minimises(as_object):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ref = _model()
    ref.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=False
    )  # (fit's own step, not XLA)
    want = [ref.train_on_batch(x, y) for x, y in _batches()]

    model = _model()
    fn = loss if as_object else (lambda out, y: loss(y, out))  # (AstraTF's own order: prediction first)
    astra = _tf.AstraTF(
        model,
        keras.optimizers.SGD(0.1),
        fn,
        LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
        total_steps=5,
        xla=False,
    )
    got = [astra.step(x, y) for x, y in _batches()]
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        assert np.allclose(a, b, atol=1e-6)


def test_a_step_that_draws_random_numbers_is_not_offered_xla_unless_allowed():
    """XLA draws other numbers than TensorFlow's kernels for one seed tensor: with
    ``Dropout(0.3)`` a step under XLA (a trial is enough) moved the weights 0.03 from the plain
    step's. Such a step is run without XLA, and its weights are the plain loop's."""

    def dropout_model():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(3),
            ]
        )

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ref, opt = dropout_model(), keras.optimizers.SGD(0.1)

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, ref(x, training=True))
        opt.apply_gradients(zip(tape.gradient(value, ref.trainable_variables), ref.trainable_variables))
        return value

    want = [float(plain(x, y)) for x, y in _batches()]

    def astra(model, **kw):
        return _tf.AstraTF(
            model,
            keras.optimizers.SGD(0.1),
            loss,
            LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
            total_steps=5,
            **kw,
        )

    model = dropout_model()
    exact = astra(model)
    got = [exact.step(x, y) for x, y in _batches()]
    assert not exact.xla  # (not offered)
    assert got == pytest.approx(want, rel=1e-6)
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(model.get_weights(), ref.get_weights()))
    allowed = astra(dropout_model(), exact_random=False)
    allowed.step(*_batches()[0])
    assert allowed.xla  # (the user allowed XLA's own numbers)
    plain_model = astra(_model())  # (no random operator: XLA offered as before)
    plain_model.step(*_batches()[0])
    assert plain_model.xla
