"""A Keras user's own ``model.fit`` through Astra (``attach_fit``, issue 18, session 34): Keras'
train step, metrics, validation, regularisers, callbacks and ``stop_training`` as without Astra;
a trial that fails mid-fit neither stops ``fit`` nor applies an update twice; what exploring did
is in ``summary()``. (New API: before it, none of these could run.)"""

from __future__ import annotations

import numpy as np
import pytest
from _support import lazy_import, needs

from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.common import MemoryKV

tf = lazy_import("tensorflow")
keras = lazy_import("keras")
compiler = lazy_import("microco.clients.compiler")
_keras_fit = lazy_import("microco.clients.compiler._keras_fit")
_tf_cost = lazy_import("microco.clients.compiler._tf_cost")

pytestmark = [pytest.mark.tensorflow, needs("tensorflow")]


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.05)),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(48, 6)).astype("float32"), rng.integers(0, 3, 48)


def _attach(model, tmp_path, **options):
    """Every candidate earns its trial (told a million steps), XLA compiled in line."""
    explorer = LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0))
    options.setdefault("total_steps", 10**6)
    options.setdefault("background", False)
    options.setdefault("cost_model", _tf_cost.XlaCostModel("hw", tmp_path / "rate.json"))
    return compiler.attach_fit(model, explorer, **options)


def _fit(model, tmp_path, name, **kw):
    x, y = _data()
    kw.setdefault("epochs", 3)
    ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / f"{name}.weights.h5"), save_weights_only=True)
    return model.fit(
        x,
        y,
        batch_size=8,
        verbose=0,
        shuffle=False,
        validation_data=(x[:16], y[:16]),
        callbacks=[ckpt, *kw.pop("callbacks", [])],
        **kw,
    )


def _same_weights(a, b, tol=0.0):
    for p, q in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(p, q, rtol=tol, atol=tol)


def test_fit_through_astra_on_the_plain_step_is_fits_own_run(tmp_path):
    """History (loss, accuracy, val_*) and the final weights (the checkpoint's too) equal plain
    ``fit``'s, with an L2 regulariser, metrics, validation, class weights and a callback."""
    want_model = _model()
    want = _fit(want_model, tmp_path, "plain", class_weight={0: 1.0, 1: 2.0, 2: 0.5})
    model = _model()
    astra = _attach(model, tmp_path, xla=False)
    got = _fit(model, tmp_path, "astra", class_weight={0: 1.0, 1: 2.0, 2: 0.5})
    assert astra.astra is not None and astra.committed
    assert got.history == want.history
    assert set(got.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    _same_weights(model, want_model)
    kept = _model()
    kept.load_weights(str(tmp_path / "astra.weights.h5"))
    _same_weights(kept, want_model)


def test_steps_per_execution_runs_as_keras_loops_it(tmp_path):
    want_model = _model()
    want_model.steps_per_execution = 4
    want = _fit(want_model, tmp_path, "plain")
    model = _model()
    model.steps_per_execution = 4
    astra = _attach(model, tmp_path, xla=False)
    got = _fit(model, tmp_path, "astra")
    assert astra.committed
    assert got.history == want.history
    _same_weights(model, want_model)


class _FailsAfterUpdate:
    """A variant that runs its step (the update applied) and then raises: the worst place for a
    trial to fail, where repeating the step would apply the update twice."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        self.fn(*args)
        raise tf.errors.InternalError(None, None, "injected failure after the update")

    def __getattr__(self, name):
        return getattr(self.fn, name)


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_trial_that_fails_mid_fit_neither_stops_fit_nor_updates_twice(tmp_path, monkeypatch, where):
    """The XLA trial raises (before it runs anything, or after its update): ``fit`` goes on, the
    step is repeated on the plain step from the state before the trial, and the run is plain
    ``fit``'s: history and weights equal."""
    original = _keras_fit.AstraKerasFit.variant
    failing = []

    def variant(self, hoist, batch, xla, xla_cell=False, loop=False):
        fn = original(self, hoist, batch, xla, xla_cell, loop)
        if not xla:
            return fn
        if not failing:
            if where == "after":
                failing.append(_FailsAfterUpdate(fn))
            else:

                def raises(*args):
                    raise ValueError("injected failure before the step")

                failing.append(raises)
        return failing[0]

    # (its module is counted on the real XLA variant; the trial runs the failing one)
    monkeypatch.setattr(_keras_fit.AstraKerasFit, "variant", variant)
    monkeypatch.setattr(
        _keras_fit.AstraKerasFit, "_hlo_profiles", lambda self, x, y: {"unrolled": (200, "dot")}
    )
    want_model = _model()
    want = _fit(want_model, tmp_path, "plain")
    model = _model()
    astra = _attach(model, tmp_path)
    got = _fit(model, tmp_path, "astra")
    summary = astra.summary()
    assert summary["failures"], summary  # the trial ran and failed
    assert summary["config"] == {"xla": "off"} and summary["committed"]
    assert any(t["failed"] and t["values"] == {"xla": "plain"} for t in summary["trials"])
    assert got.history == want.history
    _same_weights(model, want_model)


def test_early_stopping_still_stops_fit(tmp_path):
    stop = dict(monitor="loss", min_delta=10.0, patience=0)
    want = _fit(_model(), tmp_path, "plain", epochs=6, callbacks=[keras.callbacks.EarlyStopping(**stop)])
    model = _model()
    _attach(model, tmp_path, xla=False)
    got = _fit(model, tmp_path, "astra", epochs=6, callbacks=[keras.callbacks.EarlyStopping(**stop)])
    assert len(want.history["loss"]) == 2
    assert got.history == want.history


def test_what_exploring_did_is_in_the_summary_and_fit_runs_keras_own_function_after(tmp_path):
    """Told a million steps, XLA earns its trial here: the summary names Keras' own step as the
    baseline, each trial, and the configuration committed; once settled, ``fit`` calls Keras'
    own train function around the committed variant (no wrapper per step). The run equals plain
    ``fit``'s within XLA's float order."""
    want_model = _model()
    want = _fit(want_model, tmp_path, "plain")
    model = _model()
    astra = _attach(model, tmp_path)
    got = _fit(model, tmp_path, "astra")
    summary = astra.summary()
    assert summary["baseline"] == {"jit_compile": False}  # Keras' "auto" on a CPU-only host
    assert summary["committed"] and summary["settled"]
    tried = [t["values"] for t in summary["trials"]]
    assert {"xla": "off"} in tried and {"xla": "plain"} in tried
    assert summary["config"] in tried
    assert model.train_function is not astra.astra.train_function  # Keras' own, settled
    assert summary["explore_steps"] > 0
    for k in want.history:
        np.testing.assert_allclose(got.history[k], want.history[k], rtol=1e-4, atol=1e-5)
    _same_weights(model, want_model, tol=1e-4)
    astra.detach()
    assert "make_train_function" not in model.__dict__ and model.train_function is None


def test_a_dataset_of_unknown_batch_size_settles_without_a_second_trace(tmp_path):
    """A ``tf.data`` pipeline's ``batch(8)`` has no static batch size: Keras' own function around
    the committed variant would call it on the general shape and trace it (and compile XLA)
    again. Settled, the variant keeps its one trace, the run is plain ``fit``'s."""
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    want_model = _model()
    want = want_model.fit(ds, epochs=3, verbose=0)
    model = _model()
    astra = _attach(model, tmp_path)
    seen = {}

    class Traces(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            direct = astra.astra.direct
            if direct is not None and "at_commit" not in seen:
                seen["at_commit"] = direct.experimental_get_tracing_count()

    got = model.fit(ds, epochs=3, verbose=0, callbacks=[Traces()])
    assert astra.summary()["settled"] and "at_commit" in seen
    assert astra.astra.direct.experimental_get_tracing_count() == seen["at_commit"]
    assert model.train_function is not astra.astra.train_function
    for k in want.history:
        np.testing.assert_allclose(got.history[k], want.history[k], rtol=1e-4, atol=1e-5)
    _same_weights(model, want_model, tol=1e-4)


def test_a_loss_scale_optimizer_and_a_short_last_batch_train_as_plain_fit(tmp_path):
    """Mixed precision's ``LossScaleOptimizer`` (its scale in the step), and a last batch of each
    epoch shorter than the others: Keras' own function around the settled variant traces it
    again for that shape, inside Keras' replica context (before, the variant ran the strategy
    again there and the ``LossScaleOptimizer`` refused it: ``fit`` stopped)."""

    def build():
        model = _model()
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    x, y = _data()
    want_model = build()
    want = want_model.fit(x[:44], y[:44], batch_size=8, epochs=3, verbose=0, shuffle=False)
    model = build()
    astra = _attach(model, tmp_path, xla=False)
    got = model.fit(x[:44], y[:44], batch_size=8, epochs=3, verbose=0, shuffle=False)
    assert astra.summary()["settled"]
    assert got.history == want.history
    _same_weights(model, want_model)


def test_a_two_output_models_per_output_losses_with_a_short_last_batch_are_plain_fits(tmp_path):
    """Held out (session 39): Keras weighs each batch's per-output loss (``reg_loss``,
    ``cls_loss``) by ``y_pred.shape[0]``, a static shape: None in Keras' own trace (the
    iterator's batch dimension), so every batch weighs one. Astra traced its plain step for the
    first batch's shapes, a short last batch then weighed its size, and the History's per-output
    losses of every epoch left plain ``fit``'s (the weights and the total loss equal). The step
    is now traced for the iterator's ``element_spec`` only."""

    def build():
        keras.utils.set_random_seed(0)
        a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
        h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
        out = {"reg": keras.layers.Dense(1, name="reg")(h), "cls": keras.layers.Dense(3, name="cls")(h)}
        model = keras.Model({"a": a, "b": b}, out)
        model.compile(
            keras.optimizers.RMSprop(1e-2),
            loss={"reg": "mse", "cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
            loss_weights={"reg": 1.0, "cls": 0.2},
        )
        return model

    x, y = _data()
    inputs = {"a": x[:44], "b": x[:44, :3] * 2.0}
    targets = {"reg": x[:44, :1], "cls": y[:44]}
    kw = dict(batch_size=8, epochs=2, verbose=0, shuffle=False)  # (44 = 5 x 8 + 4)
    want_model = build()
    want = want_model.fit(inputs, targets, **kw)
    model = build()
    astra = _attach(model, tmp_path, xla=False)
    got = model.fit(inputs, targets, **kw)
    assert astra.summary()["settled"]
    assert sorted(got.history) == sorted(want.history) == ["cls_loss", "loss", "reg_loss"]
    for k in want.history:
        np.testing.assert_allclose(got.history[k], want.history[k], rtol=1e-6)
    _same_weights(model, want_model)
    traced = astra.astra.direct.pretty_printed_concrete_signatures()
    assert "shape=(None, 6)" in traced and "shape=(8" not in traced and "shape=(4" not in traced


def _two_optimizer_model():
    """A ``train_step`` stepping the body with the compiled optimiser and the head with its own
    (a learning rate per part, as users write it): the second optimiser is no variable of the
    model's nor of ``model.optimizer``'s."""

    class TwoOptimizers(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(8, activation="relu")
            self.head = keras.layers.Dense(3)
            self.head_optimizer = keras.optimizers.Adam(3e-3)

        def call(self, x, training=False):
            return self.head(self.body(x))

        def build(self, shape):
            self.body.build(shape)
            self.head.build((None, 8))
            super().build(shape)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=pred)
            body, head = self.body.trainable_variables, self.head.trainable_variables
            grads = tape.gradient(loss, body + head)
            self.optimizer.apply_gradients(zip(grads[: len(body)], body))
            self.head_optimizer.apply_gradients(zip(grads[len(body) :], head))
            return self.compute_metrics(x, y, pred)

    keras.utils.set_random_seed(0)
    model = TwoOptimizers()
    model.build((None, 6))
    model.head_optimizer.build(model.head.trainable_variables)
    model.compile(
        keras.optimizers.SGD(1e-2, momentum=0.9),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_a_trial_failing_after_a_second_optimisers_update_is_undone_with_it(tmp_path, monkeypatch):
    """Held out (session 42): the XLA trial of a ``train_step`` that steps two optimisers fails
    after its updates. The guard put back the model's variables and ``model.optimizer``'s, not the
    head's optimiser: the plain step's repeat stepped it a second time (its iteration count one
    ahead of plain ``fit``'s, its moments and the head's weights elsewhere), silently."""
    original = _keras_fit.AstraKerasFit.variant
    failing = []

    def variant(self, hoist, batch, xla, xla_cell=False, loop=False):
        fn = original(self, hoist, batch, xla, xla_cell, loop)
        if xla and not failing:
            failing.append(_FailsAfterUpdate(fn))
        return failing[0] if xla else fn

    monkeypatch.setattr(_keras_fit.AstraKerasFit, "variant", variant)
    monkeypatch.setattr(
        _keras_fit.AstraKerasFit, "_hlo_profiles", lambda self, x, y: {"unrolled": (200, "dot")}
    )
    x, y = _data()
    want_model = _two_optimizer_model()
    want = want_model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    model = _two_optimizer_model()
    astra = _attach(model, tmp_path)
    got = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    assert failing and failing[0].calls == 1 and astra.summary()["failures"]
    assert (
        int(model.head_optimizer.iterations.numpy())
        == int(want_model.head_optimizer.iterations.numpy())
        == 18
    )
    assert got.history == want.history
    _same_weights(model, want_model)
    for a, b in zip(model.head_optimizer.variables, want_model.head_optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_generator_yielding_none_for_its_sample_weights_trains_as_plain_fit(tmp_path):
    """Held out (session 42): a generator yielding ``(x, y, None)`` (``None`` reaches ``fit``'s
    iterator as an empty ``tf.experimental.Optional``, which Keras turns back into ``None`` before
    ``train_step``). Before, Astra's step handed ``train_step`` the ``Optional`` itself: the loss
    refused it, and ``fit`` stopped at its first step."""
    x, y = _data()

    def batches():
        while True:
            for i in range(0, 48, 8):
                yield x[i : i + 8], y[i : i + 8], None

    want_model = _model()
    want = want_model.fit(batches(), steps_per_epoch=6, epochs=3, verbose=0)
    model = _model()
    astra = _attach(model, tmp_path)
    got = model.fit(batches(), steps_per_epoch=6, epochs=3, verbose=0)
    summary = astra.summary()
    assert summary["settled"] and not summary["abandoned"] and not summary["failures"], summary
    for k in want.history:
        np.testing.assert_allclose(got.history[k], want.history[k], rtol=1e-4, atol=1e-5)
    _same_weights(model, want_model, tol=1e-4)


def test_a_stateful_lstms_xla_trial_is_checked_from_the_states_it_started_from(tmp_path):
    """Held out (session 42): a stateful ``LSTM`` (a fixed batch, its states carried from batch to
    batch) keeps its states in variables ``model.variables`` does not list. The check of the XLA
    trial put back the model's variables, not the states: the plain step ran from the states the
    trial had moved on, its loss differed, and the XLA step was refused for computing otherwise
    while the run itself left plain ``fit``'s (weights 0.04 apart after three epochs)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 5, 4)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5, 4), batch_size=8)
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(8, stateful=True)(inputs)))
        model.compile(keras.optimizers.Adam(1e-2), "mse")
        return model

    want_model = build()
    want = want_model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    model = build()
    astra = _attach(model, tmp_path)
    got = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    assert not astra.astra._refused, astra.astra._refused
    assert any(t["values"] == {"xla": "plain"} and not t["failed"] for t in astra.summary()["trials"])
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-5)
    _same_weights(model, want_model, tol=1e-5)


def _normalised(norm):
    """Two models of the same weights' shapes computing otherwise: a ``BatchNormalization`` or a
    ``LayerNormalization`` (both a scale and an offset per feature) after a ``Dense``."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            norm(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_model_of_the_same_shapes_computing_otherwise_explores_its_own_step(tmp_path):
    """Issue 18, session 43 (held out: the same ``Sequential`` with ``BatchNormalization`` and then
    with ``LayerNormalization``, a user's change of architecture): the exploration's key was the
    model's class and its trainable shapes, so the second program found the first's exploration,
    started "tuned" on a decision measured on another step (no step of its own explored, the
    first's trials shown as its own) and would read the first's XLA gain, profile and module
    size. The key now holds what the step computes (its ops' kinds); the same program built again
    (its layers named otherwise) still finds its own exploration."""
    explorer = LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0))
    cost = _tf_cost.XlaCostModel("hw", tmp_path / "rate.json")
    x, y = _data()

    def fit(norm):
        model = _normalised(norm)
        handle = compiler.attach_fit(model, explorer, total_steps=10**6, background=False, cost_model=cost)
        model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
        return handle

    first = fit(keras.layers.BatchNormalization)
    assert first.committed and first.astra.session.spec is not None
    again = fit(keras.layers.BatchNormalization)
    assert again.astra.session.spec.key == first.astra.session.spec.key
    assert again.summary()["explore_steps"] == 0  # the same step: it starts tuned
    other = fit(keras.layers.LayerNormalization)
    assert other.astra.session.spec.key != first.astra.session.spec.key
    assert other.summary()["explore_steps"] > 0  # its own step explored


def test_an_xla_trials_steps_after_its_first_run_without_a_copy_of_the_variables(tmp_path, monkeypatch):
    """Issue 18, session 43 (held out: ``keras.applications.ConvNeXtTiny`` at 32x32, AdamW, 318 MB
    of variables): before each XLA trial step the guard kept a copy of every variable, and the
    step that then wrote them paid the copy (TensorFlow copies a variable's buffer on its first
    write while a read of it is held): 812 ms a step against 775 ms, 5% on every XLA trial step
    and none on the baseline's, so XLA was judged slower than it runs. The copy is what a failing
    first step needs (a trace, a lowering, a compile that fails); a variant that completed a step
    runs as one XLA cluster, which writes its variables at its end or not at all."""
    kept, xla_steps = [], []
    snapshot, run = _keras_fit.AstraKerasFit._snapshot, _keras_fit.AstraKerasFit._run

    def counting_snapshot(self, *args):
        got = snapshot(self, *args)
        kept.append(got is not None)
        return got

    def counting_run(self, fn, x, y):
        if fn is not self.variant(False, False, False):
            xla_steps.append(fn)
        return run(self, fn, x, y)

    monkeypatch.setattr(_keras_fit.AstraKerasFit, "_snapshot", counting_snapshot)
    monkeypatch.setattr(_keras_fit.AstraKerasFit, "_run", counting_run)
    want_model = _model()
    want = _fit(want_model, tmp_path, "plain")
    model = _model()
    explorer = LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=3, retime_rounds=0))
    cost = _tf_cost.XlaCostModel("hw", tmp_path / "rate.json")
    astra = compiler.attach_fit(model, explorer, total_steps=10**6, background=False, cost_model=cost)
    got = _fit(model, tmp_path, "astra")
    assert len(xla_steps) >= 3, astra.summary()  # the XLA trial ran several steps
    assert sum(kept) == 1  # the copy before its first only
    np.testing.assert_allclose(got.history["loss"], want.history["loss"], rtol=1e-5)
