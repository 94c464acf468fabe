"""Held-out round (session 39), Keras: ``fit`` with epochs and Keras' own stateful callbacks
(EarlyStopping, ReduceLROnPlateau), stopped mid-run and restarted from the checkpoint in
process; the restarted run must end as an uninterrupted one."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("tensorflow")

from microco.clients.scheduler import ControlChannel, SchedulerCallback

pytestmark = [pytest.mark.tensorflow]


class _Stopped(Exception):
    pass


def _raise(code):
    raise _Stopped(code)


def _fit(ctl, ckpt, stop_at=None, name_them=True):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype("float32")
    y = (x[:, :1] * 2 + rng.normal(size=(200, 1))).astype("float32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=2, factor=0.5, min_delta=0.05)
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=4, min_delta=0.05)
    named = {"plateau": plateau, "early": early} if name_them else {}
    cb = SchedulerCallback(
        control_dir=str(ctl), checkpoint_dir=str(ckpt), checkpoint_every_s=0, exit_fn=_raise, callbacks=named
    )
    lrs: list[float] = []

    class Lr(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stop_at is not None and cb.step + 1 == stop_at:
                ControlChannel(ctl).send("stop")

    cb.restore(model)
    hist = model.fit(x, y, epochs=20, batch_size=40, callbacks=[Stop(), plateau, early, Lr(), cb], verbose=0)
    cb.finish()
    return (
        hist.history["loss"],
        hist.history.get("learning_rate"),
        cb.step,
        [float(np.sum(w)) for w in model.get_weights()],
    )


def test_keras_fit_with_plateau_and_early_stopping_moved_ends_as_an_uninterrupted_run(tmp_path):
    """Stopped in epoch 9, when ReduceLROnPlateau and EarlyStopping each count one epoch
    without improvement: unnamed, their counters restarted and the LR was not reduced at epoch 9
    (the losses differed from epoch 10 on, and EarlyStopping stopped later)."""
    whole = _fit(tmp_path / "w", tmp_path / "wc")
    assert len(whole[0]) == 15 and whole[1][-1] < whole[1][0]  # stopped early, LR reduced
    with pytest.raises(_Stopped):
        _fit(tmp_path / "a0", tmp_path / "c", stop_at=47)
    moved = _fit(tmp_path / "a1", tmp_path / "c")
    assert moved == whole


def test_keras_checkpoint_older_than_the_callbacks_state_resumes_and_says_what_is_lost(tmp_path, caplog):
    """Session 40: a checkpoint written before the hook saved Keras callbacks' state (no
    ``callbacks`` entry at all, as the hook of session 38 wrote; and one written while the
    callbacks were not named) raised ``ValueError`` at ``restore()``, so the job failed at every
    restart. It must resume, from the checkpoint's step, and say in one log line which
    callbacks' counters start over."""
    import pickle

    with pytest.raises(_Stopped):
        _fit(tmp_path / "a0", tmp_path / "c", stop_at=47)
    path = tmp_path / "c" / "checkpoint"
    state = pickle.loads(path.read_bytes())
    del state["callbacks"]  # the older hook's checkpoint
    path.write_bytes(pickle.dumps(state))
    with caplog.at_level("WARNING", logger="microco.clients.scheduler._keras"):
        resumed = _fit(tmp_path / "a1", tmp_path / "c")
    assert resumed[2] >= 47  # continued from the checkpoint: not started over, not failed
    said = [r.getMessage() for r in caplog.records if "callbacks" in r.getMessage()]
    assert len(said) == 1 and "'early'" in said[0] and "'plateau'" in said[0] and "step 47" in said[0], said

    with pytest.raises(_Stopped):
        _fit(tmp_path / "b0", tmp_path / "d", stop_at=47, name_them=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="microco.clients.scheduler._keras"):
        resumed = _fit(tmp_path / "b1", tmp_path / "d")
    assert resumed[2] >= 47
    assert any("'plateau'" in r.getMessage() for r in caplog.records)
