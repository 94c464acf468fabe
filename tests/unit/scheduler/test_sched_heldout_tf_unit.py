"""Session 42: a TensorFlow custom training loop, as TensorFlow's guides write one (a
``tf.function`` train step with ``tf.GradientTape``, ``optimizer.apply``, a shuffling and
repeating ``tf.data`` pipeline read through one iterator, dropout with a seed, noise from a
``tf.random.Generator``, batch normalisation, a ``tf.train.Checkpoint`` of model, optimizer,
iterator and generator).
The platform had a hook for Keras' ``fit`` only: such a loop could report its steps through
``JobContext`` but had no checkpoint the scheduler could take (the Keras callback needs
``fit``). ``TFHook`` takes the loop's own ``tf.train.Checkpoint``; stopped mid-epoch (checkpoint
and exit) and restarted, the run goes on with every loss and every weight of an uninterrupted
one. (TensorFlow's checkpoint alone was not enough: of a Keras 3 model it holds only the weights
the optimizer refers to, so the resumed run's dropout masks started over and its losses differed
from the first step after the restore; the hook keeps the Keras objects' variables too.)"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.tensorflow]

STEPS = 30  # 12 batches an epoch: the stops below fall mid-epoch and in the third epoch


def _run(tmp_path, stop_at: int | None = None, build: bool = True, attempt: int = 1):
    """Train to STEPS (or until the stop at ``stop_at``); returns (losses, weights, hook)."""
    import keras
    import tensorflow as tf

    from microco.clients.scheduler import ControlChannel
    from microco.clients.scheduler.tf import TFHook

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rs = np.random.RandomState(0)
    x = rs.rand(200, 8).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(64, seed=1, reshuffle_each_iteration=True)
        .batch(16, drop_remainder=True)
        .repeat()
    )
    iterator = iter(ds)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3, seed=2),
            keras.layers.Dense(2),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-2)
    if build:
        optimizer.build(model.trainable_variables)
    noise = tf.random.Generator.from_seed(3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        xb = xb + noise.normal(tf.shape(xb), stddev=0.01)
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    def exit_fn(code: int) -> None:
        raise SystemExit(code)

    state: dict = {"losses": []}
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, data=iterator, noise=noise)
    hook = TFHook(
        ckpt,
        extra_state=state,
        control_dir=tmp_path / f"attempt-{attempt}",  # each attempt its own, as the agent makes them
        checkpoint_dir=tmp_path / "ckpt",
        exit_fn=exit_fn,
    )
    start = hook.restore()
    for step in range(start, STEPS):
        if step + 1 == stop_at:
            ControlChannel(tmp_path / f"attempt-{attempt}").send("stop")
        loss = train_step(*next(iterator))
        state["losses"].append(float(loss))
        hook.step_end(step + 1)
    hook.finish()
    return state["losses"], [np.array(v.numpy()) for v in model.variables], hook


def test_a_tf_custom_loop_moved_mid_epoch_resumes_bit_for_bit(tmp_path):
    ref_losses, ref_weights, _ = _run(tmp_path / "ref")
    assert len(ref_losses) == STEPS
    for stop_at in (7, 29):  # mid-epoch 0; mid-epoch 2, the shuffle buffer reshuffled twice
        where = tmp_path / f"stop-{stop_at}"
        with pytest.raises(SystemExit) as exited:
            _run(where, stop_at=stop_at)
        assert exited.value.code == 75
        losses, weights, hook = _run(where, attempt=2)  # the same script, restored
        assert hook.context.restored_from_step == stop_at
        assert losses == ref_losses, stop_at
        for a, b in zip(weights, ref_weights, strict=True):
            assert np.array_equal(a, b), stop_at


def test_a_restore_into_an_optimizer_not_built_yet_is_refused_with_the_reason(tmp_path):
    from microco.clients.scheduler.tf import TFHook

    with pytest.raises(SystemExit):
        _run(tmp_path, stop_at=3)
    with pytest.raises(RuntimeError, match=r"at step 3 was not wholly restored .*build the optimizer"):
        _run(tmp_path, build=False, attempt=2)
    with pytest.raises(TypeError, match="tf.train.Checkpoint"):
        TFHook({"model": None})
