"""TensorFlow: a step variant that trains otherwise than the plain step is refused (issue 18,
session 39; ``_tf_equiv``).

XLA and TensorFlow's own kernels disagree on a float -> int cast out of range: TensorFlow's CPU
kernel gives INT_MIN, XLA saturates. A model that buckets a large float feature (a timestamp, an
id carried as a float) through such a cast looks up other embedding rows under XLA and trains
otherwise, silently. Astra offers XLA on its own initiative, so that step must not run.
"""

from __future__ import annotations

import numpy as np
import pytest
from _support import lazy_import, needs

tf = lazy_import("tensorflow")
_tf = lazy_import("microco.clients.compiler._tf")
_tf_equiv = lazy_import("microco.clients.compiler._tf_equiv")

pytestmark = [pytest.mark.tensorflow, needs("tensorflow")]

BUCKETS = 97


def _bucketed_model():
    """A feature bucketed by a cast that overflows int32 for large values, its bucket's embedding
    beside a dense view of the features."""
    tf.keras.utils.set_random_seed(3)
    inputs = tf.keras.Input((4,))
    bucket = tf.keras.layers.Lambda(
        lambda x: tf.math.floormod(tf.cast(x[:, 0] * 1000.0, tf.int32), BUCKETS), output_shape=()
    )(inputs)
    emb = tf.keras.layers.Embedding(BUCKETS, 8)(bucket)
    rest = tf.keras.layers.Lambda(lambda x: x[:, 1:], output_shape=(3,))(inputs)
    dense = tf.keras.layers.Dense(8)(rest)
    out = tf.keras.layers.Dense(1)(tf.keras.layers.Concatenate()([emb, dense]))
    return tf.keras.Model(inputs, out)


def _batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    x[:, 0] = rng.uniform(3e6, 9e6, size=16)  # x1000: beyond int32
    y = rng.normal(size=(16, 1)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _mse(out, y):
    return tf.reduce_mean(tf.square(out - y))


class _CommittedTo:
    """A second run that starts tuned: every registration answered with ``values``, committed."""

    def __init__(self, **values):
        self.values = values

    def register(self, spec):
        from microco.clients.compiler.explore import Config

        values = {v.name: self.values.get(v.name, v.choices[0]) for v in spec.variables}
        return Config(spec.key, values, trial=-1, committed=True)

    def report(self, key, report):  # a tuned run's first steps, reported: it stays committed
        from microco.clients.compiler.explore import Config

        return Config(key, dict(self.values), trial=-1, committed=True)


# Steps enough for a run that starts tuned to settle: up to three plain steps first where this
# host never counted the model's XLA module (``AstraTF.PRE_STEPS``), the checked step, the
# tuned run's reported steps.
STEPS = 10


def _train(explorer, optimizer, **kw):
    x, y = _batch()
    model = _bucketed_model()
    astra = _tf.AstraTF(model, optimizer, _mse, explorer, total_steps=10**6, background=False, **kw)
    losses = [astra.step(x, y) for _ in range(STEPS)]
    return astra, losses, model.get_weights()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_committed_xla_step_that_trains_otherwise_is_refused_and_training_is_the_plain_steps(optimizer):
    def opt():
        return tf.keras.optimizers.SGD(0.05) if optimizer == "sgd" else tf.keras.optimizers.Adam(1e-2)

    # The premise: under XLA this model's step is another step.
    x, _ = _batch()
    cast = lambda v: tf.cast(v[:, 0] * 1000.0, tf.int32)  # noqa: E731
    assert not np.array_equal(tf.function(cast)(x).numpy(), tf.function(cast, jit_compile=True)(x).numpy())

    plain, plain_losses, plain_weights = _train(_CommittedTo(xla="off"), opt())
    astra, losses, weights = _train(_CommittedTo(xla="plain"), opt())
    assert astra.committed and astra.config == {"xla": "plain"}
    xla_step = astra.variant(False, False, True)
    assert id(xla_step) in astra._refused and "computes otherwise" in astra._refused[id(xla_step)]
    # Refused once, then the plain step directly: no check repeated each step.
    assert astra.direct is astra.variant(False, False, False)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for a, b in zip(weights, plain_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_an_xla_step_that_trains_as_the_plain_step_is_kept():
    """Where XLA computes the same step (no cast out of range), the check passes and the
    committed XLA step is the one that runs."""
    x, y = _batch()
    x = tf.concat([x[:, :1] / 1e6, x[:, 1:]], axis=1)  # x1000 within int32
    model = _bucketed_model()
    astra = _tf.AstraTF(
        model,
        tf.keras.optimizers.Adam(1e-2),
        _mse,
        _CommittedTo(xla="plain"),
        total_steps=10**6,
        background=False,
    )
    losses = [astra.step(x, y) for _ in range(STEPS)]
    xla_step = astra.variant(False, False, True)
    assert not astra._refused and id(xla_step) in astra._equivalent
    assert astra.direct is xla_step and losses[-1] < losses[0]


def test_the_judge_refuses_other_changes_and_passes_float_noise():
    rng = np.random.default_rng(1)
    before = [rng.normal(size=(5, 3)).astype(np.float32), np.zeros((5, 3), np.float32), np.array(3, np.int64)]
    kinds = ["trainable", "slot", "other"]
    grad = rng.normal(size=(5, 3)).astype(np.float32)
    plain_after = [before[0] - 0.1 * grad, 0.1 * grad, np.array(4, np.int64)]
    noisy = [plain_after[0], plain_after[1] * (1 + 1e-6), plain_after[2]]
    assert _tf_equiv.differs(kinds, before, plain_after, noisy, 1.0, 1.0 + 1e-7) == ""
    # With slots, a weight's own change is not judged (Adam's update of a noise gradient)...
    other_weight = [before[0] + 0.1 * grad, plain_after[1], plain_after[2]]
    assert _tf_equiv.differs(kinds, before, plain_after, other_weight, 1.0, 1.0) == ""
    # ... the slot is.
    other_slot = [plain_after[0], 0.2 * grad, plain_after[2]]
    assert "slot" in _tf_equiv.differs(kinds, before, plain_after, other_slot, 1.0, 1.0)
    # Without slots (plain SGD) the weights' changes are.
    sgd = ["trainable", "other", "other"]
    assert "trainable" in _tf_equiv.differs(sgd, before, plain_after, other_weight, 1.0, 1.0)
    # Integers must be equal; the loss within its precision.
    assert "integer" in _tf_equiv.differs(kinds, before, plain_after, [*noisy[:2], np.array(5)], 1.0, 1.0)
    assert "result" in _tf_equiv.differs(kinds, before, plain_after, noisy, 1.0, 1.1)


def test_a_users_fit_with_a_committed_xla_step_that_trains_otherwise_trains_as_fit_does():
    from microco.clients import compiler

    def fit(explorer):
        x, y = _batch()
        model = _bucketed_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False)
        handle = compiler.attach_fit(model, explorer, background=False) if explorer else None
        history = model.fit(x, y, batch_size=16, epochs=5, verbose=0, shuffle=False)
        return history.history["loss"], model.get_weights(), handle

    own_losses, own_weights, _ = fit(None)
    losses, weights, handle = fit(_CommittedTo(xla="plain"))
    assert handle.astra._refused
    np.testing.assert_allclose(losses, own_losses, rtol=1e-6)
    for a, b in zip(weights, own_weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_check_that_cannot_read_the_variables_leaves_the_variants_step_and_training_goes_on(monkeypatch):
    """The check is the wrapper's own work: where it fails, training does not stop."""

    def unreadable(self):
        raise RuntimeError("cannot read")

    monkeypatch.setattr(_tf_equiv.StepState, "read", unreadable)
    astra, losses, _ = _train(_CommittedTo(xla="plain"), tf.keras.optimizers.SGD(0.05))
    xla_step = astra.variant(False, False, True)
    assert id(xla_step) in astra._equivalent and not astra._refused and not astra.abandoned
    assert len(losses) == STEPS and all(np.isfinite(losses))


# -- the step's own variables (held out, session 42)


def _accumulating_model(k=3):
    """A ``train_step`` that accumulates its gradients over ``k`` batches in its own
    ``tf.Variable``s and applies them on every ``k``-th (TF 2's recipe for gradient
    accumulation): Keras lists none of those variables in ``model.variables``."""

    class Accumulating(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(8, activation="relu")
            self.out = tf.keras.layers.Dense(1)
            self.tracker = tf.keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.tracker]

        def call(self, x, training=False):
            return self.out(self.hidden(x))

        def build(self, input_shape):
            super().build(input_shape)
            self.hidden.build(input_shape)
            self.out.build((None, 8))
            self.seen = tf.Variable(0, trainable=False)
            self.sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.trainable_variables]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.seen.assign_add(1)
            for s, g in zip(self.sums, grads):
                s.assign_add(g / k)

            def apply():
                self.optimizer.apply_gradients(zip([s.value() for s in self.sums], self.trainable_variables))
                for s in self.sums:
                    s.assign(tf.zeros_like(s))
                return tf.constant(True)

            tf.cond(tf.equal(self.seen % k, 0), apply, lambda: tf.constant(False))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    tf.keras.utils.set_random_seed(3)
    model = Accumulating()
    model.build((None, 4))
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False)
    return model


def test_a_tuned_fit_whose_train_step_keeps_its_own_variables_trains_as_fit_does():
    """The checked XLA step writes the ``train_step``'s own counter and sums; the check puts them
    back with the model's before the plain step runs. Before, it did not: the plain step counted
    and accumulated the checked batch a second time, and the run left plain ``fit``'s (the
    counter one ahead, the update applied a batch early), silently."""
    from microco.clients import compiler

    x, y = _batch()
    x = tf.concat([x[:, :1] / 1e6, x[:, 1:]], axis=1)

    def fit(explorer):
        model = _accumulating_model()
        handle = compiler.attach_fit(model, explorer, background=False) if explorer else None
        history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False)
        return model, history.history["loss"], handle

    own, own_losses, _ = fit(None)
    model, losses, handle = fit(_CommittedTo(xla="plain"))
    xla_step = handle.astra.variant(False, False, True)
    assert id(xla_step) in handle.astra._equivalent  # checked, kept
    assert int(model.seen.numpy()) == int(own.seen.numpy()) == 12
    np.testing.assert_allclose(losses, own_losses, rtol=1e-5)
    for a, b in zip(
        model.get_weights() + [s.numpy() for s in model.sums],
        own.get_weights() + [s.numpy() for s in own.sums],
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_tuned_astra_tf_step_over_a_layer_keeping_its_own_variables_trains_as_the_plain_step():
    """A layer keeping a running mean in a raw ``tf.Variable`` it updates in training: the check
    of the XLA step put back the model's and the optimiser's variables and not it, and the plain
    step updated it again (its count one ahead of the run without Astra)."""

    class RunningCentre(tf.keras.layers.Layer):
        def build(self, shape):
            self.mean = tf.Variable(tf.zeros(shape[-1:]), trainable=False)
            self.count = tf.Variable(0.0, trainable=False)

        def call(self, x, training=False):
            if training:
                self.count.assign_add(1.0)
                self.mean.assign(self.mean + (tf.reduce_mean(x, 0) - self.mean) / self.count)
            return x - self.mean

    def model():
        tf.keras.utils.set_random_seed(3)
        return tf.keras.Sequential([tf.keras.Input((4,)), RunningCentre(), tf.keras.layers.Dense(1)])

    x, y = _batch()
    x = tf.concat([x[:, :1] / 1e6, x[:, 1:]], axis=1)
    runs = []
    for explorer in (_CommittedTo(xla="off"), _CommittedTo(xla="plain")):
        m = model()
        astra = _tf.AstraTF(
            m, tf.keras.optimizers.Adam(1e-2), _mse, explorer, total_steps=10**6, background=False
        )
        runs.append((m, [astra.step(x, y) for _ in range(STEPS)], astra))
    (plain, plain_losses, _), (m, losses, astra) = runs
    assert id(astra.variant(False, False, True)) in astra._equivalent
    # the layer's two raw variables, and none of Keras' own (the Dense layer's, Adam's): those are
    # Keras 3 variables, known by their handles (by object identity every one read as extra)
    layer = m.layers[0]
    assert sorted(id(v.handle) for v in astra._step_extra) == sorted(
        [id(layer.count.handle), id(layer.mean.handle)]
    )
    assert float(m.layers[0].count.numpy()) == float(plain.layers[0].count.numpy()) == STEPS
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for a, b in zip(m.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
