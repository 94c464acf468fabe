"""The Keras callback: obeys the scheduler at every batch end of ``model.fit``.

    cb = SchedulerCallback(extra_state={"losses": losses})
    start = cb.restore(model)              # model compiled; 0 or the step to continue from
    model.fit(batches_from(start), steps_per_epoch=total - start, epochs=1, callbacks=[cb])
    cb.finish()

Or ``fit`` as users write it, with epochs (arrays or a dataset whose order is a function of
the epoch, as Keras gives with ``keras.utils.set_random_seed`` and op determinism):

    cb = SchedulerCallback()
    cb.restore(model)
    history = model.fit(x, y, epochs=6, batch_size=32, callbacks=[cb])
    cb.finish()

The callback keeps the global step (not Keras' per-epoch batch index), the epoch and the batch
within it. A restored ``fit`` starts at the checkpoint's epoch (the callback sets it, as
Keras' ``BackupAndRestore`` does), skips the batches of that epoch the checkpoint already
consumed (the input iterator is advanced, nothing is trained), re-seeds the metrics' running
state, and puts the earlier epochs back into the returned ``History``: the logged loss and
metrics, EarlyStopping's and ReduceLROnPlateau's inputs, equal an uninterrupted run's.

The checkpoint holds every model variable (weights, non-trainable state, seed-generator
state), every optimizer variable (iteration count, moments), the metrics' variables, the
NumPy / Python / TensorFlow global RNG states, the step, epoch and batch, the earlier
epochs' History, a user ``extra_state`` dict, and the counters of the Keras callbacks named
in ``callbacks={"early": early_stopping, "plateau": reduce_lr}`` (not their configuration).
"""

from __future__ import annotations

import logging
import pickle
import random
from typing import Any

from ._job import ContextDelegates, JobContext

log = logging.getLogger(__name__)


def _callback_base() -> type:
    import keras

    base: type = keras.callbacks.Callback
    return base


def _make_class() -> type:
    Base = _callback_base()

    class SchedulerCallback(ContextDelegates, Base):  # type: ignore[misc, valid-type]
        """Reports each batch's time to the scheduler and obeys suspend / resume / stop / resize
        at batch ends; see the module docstring for the few lines a script adds."""

        def __init__(
            self,
            *,
            extra_state: dict[str, Any] | None = None,
            callbacks: dict[str, Any] | None = None,
            context: JobContext | None = None,
            **context_kwargs: Any,
        ) -> None:
            super().__init__()
            self.extra_state = extra_state if extra_state is not None else {}
            # Other callbacks whose counters the checkpoint keeps (EarlyStopping's and
            # ReduceLROnPlateau's wait / best / cooldown, ModelCheckpoint's best), by name.
            self.callbacks = dict(callbacks or {})
            self._restore_callbacks: dict[str, dict[str, Any]] | None = None
            self.context = context or JobContext(**context_kwargs)
            self.context.save = self._save
            self.context.load = self._load
            self.start_step = 0
            self._target: Any = None
            self._resume: dict[str, Any] | None = None  # where the checkpoint left ``fit``
            self._fit_steps = 0  # batches trained by this process's fit calls
            self._epoch = 0
            self._batch = 0  # batches of the current epoch done (skipped ones included)
            self._skip = 0  # batches of the first epoch to skip (consumed before the restart)
            self._steps_per_epoch: int | None = None
            self._restore_metrics: list[Any] | None = None
            # History of the epochs so far (checkpointed; put back into a restored fit's)
            self._history: dict[str, list[Any]] = {}
            self._history_epochs: list[int] = []
            self._carried: tuple[dict[str, list[Any]], list[int]] | None = None

        def restore(self, model: Any) -> int:
            """Bind ``model`` (compiled) and load the latest checkpoint; returns the start step."""
            self._target = model
            _build_optimizer(model)
            self.start_step = self.context.restore()
            return self.start_step

        # ---- fit with epochs
        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            self._steps_per_epoch = (self.params or {}).get("steps")
            r = self._resume
            self._skip = 0
            if r is not None and r.get("steps_per_epoch") and r["steps_per_epoch"] == self._steps_per_epoch:
                # The same fit as the checkpointed one: continue at its epoch and batch. (A
                # script that feeds ``fit`` from the restored step itself, epochs=1 with
                # steps_per_epoch = total - start, has other steps per epoch: nothing to skip.)
                epoch, batch = int(r["epoch"]), int(r["batch"])
                if batch >= self._steps_per_epoch:
                    epoch, batch = epoch + 1, 0
                    self._restore_metrics = None
                if epoch > 0:
                    self.model._initial_epoch = epoch  # what Keras' BackupAndRestore sets
                    self._set_initial_epoch = True
                self._skip = batch
                self._history = {k: list(v) for k, v in (r.get("history") or {}).items()}
                self._history_epochs = list(r.get("history_epochs") or [])
                self._carried = ({k: list(v) for k, v in self._history.items()}, list(self._history_epochs))
            self._resume = None

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if self._restore_callbacks is not None:
                # After every callback's ``on_train_begin`` (which resets their counters).
                for name, cb in self.callbacks.items():
                    for k, v in self._restore_callbacks.get(name, {}).items():
                        setattr(cb, k, v)
                self._restore_callbacks = None
            self._epoch = int(epoch)
            self._batch = 0
            if self._skip:
                self._skip_batches(self._skip)
                self._batch = self._skip
                self._skip = 0

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            for k, v in (logs or {}).items():
                self._history.setdefault(k, []).append(_plain(v))
            self._history_epochs.append(int(epoch))

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._fit_steps += 1
            self._batch += 1
            self.context.step_end(self.start_step + self._fit_steps)

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            # The History this fit returns gets the epochs run before the restart first.
            hist = getattr(self.model, "history", None)
            if self._carried is not None and hist is not None and hasattr(hist, "history"):
                history, epochs = self._carried
                for k, v in history.items():
                    hist.history[k] = list(v) + list(hist.history.get(k, []))
                hist.epoch = list(epochs) + list(getattr(hist, "epoch", []))
            self._carried = None
            if getattr(self, "_set_initial_epoch", False):
                self.model._initial_epoch = None  # a later fit in this process starts as asked
                self._set_initial_epoch = False

        def _skip_batches(self, n: int) -> None:
            """For the restored epoch: advance the input past the ``n`` batches the checkpoint
            already trained on (nothing is trained), set the metrics' running state to the
            checkpoint's (this epoch's logs continue its means), and end the epoch after the
            batches it has left, before the input runs dry (Keras' own end of data there
            still counts an empty step in the metrics and the optimizer's iterations)."""
            model = self.model
            train = model.train_function
            metrics = self._restore_metrics
            left = (self._steps_per_epoch or 0) - n
            calls = [0]

            def restored_epoch(iterator: Any) -> Any:
                if calls[0] == 0:
                    data = None
                    for _ in range(n):
                        data = next(iterator)
                    if metrics is not None:
                        if len(_metric_variables(model)) != len(metrics) and data is not None:
                            _build_metrics(model, data)  # Keras builds them at a first step
                        _assign(_metric_variables(model), metrics)
                calls[0] += 1
                if calls[0] > left:
                    model.train_function = train
                    raise StopIteration  # the epoch's batches are done (Keras ends the epoch)
                return train(iterator)

            model.train_function = restored_epoch
            # The epoch ends ``n`` batches early by Keras' count: expected, not a warning.
            import warnings

            warnings.filterwarnings("ignore", message="Your input ran out of data")

        def finish(self) -> None:
            self.context.finish()

        def _save(self, step: int) -> bytes:
            import numpy as np
            import tensorflow as tf

            model = self._target if self._target is not None else self.model
            state = {
                "step": step,
                "epoch": self._epoch,
                "batch": self._batch,
                "steps_per_epoch": self._steps_per_epoch,
                "metrics": [np.array(v.numpy()) for v in _metric_variables(model)],
                "history": self._history,
                "history_epochs": list(self._history_epochs),
                "model": [np.array(v.numpy()) for v in model.variables],
                "optimizer": [np.array(v.numpy()) for v in model.optimizer.variables],
                "rng": {
                    "numpy": np.random.get_state(),
                    "python": random.getstate(),
                    "tf": _tf_global_generator_state(tf),
                },
                "extra": self.extra_state,
                "callbacks": {name: _callback_state(cb) for name, cb in self.callbacks.items()},
            }
            return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

        def _load(self, blob: bytes) -> int:
            import numpy as np
            import tensorflow as tf

            state = pickle.loads(blob)
            model = self._target
            for var, value in zip(model.variables, state["model"], strict=True):
                var.assign(value)
            for var, value in zip(model.optimizer.variables, state["optimizer"], strict=True):
                var.assign(value)
            np.random.set_state(state["rng"]["numpy"])
            random.setstate(state["rng"]["python"])
            if state["rng"]["tf"] is not None:
                tf.random.get_global_generator().reset(state["rng"]["tf"])
            self.extra_state.clear()
            self.extra_state.update(state["extra"])
            saved = state.get("callbacks") or {}
            missing = [name for name in self.callbacks if name not in saved]
            if missing:
                # A checkpoint older than the callbacks' state (the hook before session 39
                # saved none) or written while they were not named: the job carries on, the
                # counters of those callbacks start over as in a fresh ``fit``, and it says so.
                log.warning(
                    "microco: the checkpoint at step %s holds no state for Keras callbacks %s "
                    "(it has state for %s; written by an older hook or before they were named in "
                    "SchedulerCallback(callbacks=...)): resuming with their counters (wait, best, "
                    "cooldown) started over",
                    int(state["step"]),
                    missing,
                    sorted(saved) or "none",
                )
            self._restore_callbacks = {name: saved[name] for name in self.callbacks if name in saved}
            if "epoch" in state:
                keys = ("epoch", "batch", "steps_per_epoch", "history", "history_epochs")
                self._resume = {k: state[k] for k in keys}
                self._restore_metrics = state["metrics"]
            return int(state["step"])

    return SchedulerCallback


def _callback_state(cb: Any) -> dict[str, Any]:
    """A Keras callback's counters: its plain attributes (numbers, strings, None, arrays and
    lists of them: EarlyStopping's ``wait``, ``best``, ``best_weights``, ...), not its model,
    functions or configuration. Configuration (an attribute named as an ``__init__`` argument)
    comes from the script: Keras rewrites some of it when training starts (``min_delta``'s sign
    in ``_set_monitor_op``), and a saved copy put back would be rewritten twice."""
    import inspect

    import numpy as np

    config = {"params", "_model", "model"}
    for klass in type(cb).__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            try:
                config.update(inspect.signature(init).parameters)
            except (TypeError, ValueError):
                pass

    def plain(v: Any) -> bool:
        if v is None or isinstance(v, (bool, int, float, str, np.generic, np.ndarray)):
            return True
        return isinstance(v, (list, tuple)) and all(plain(x) for x in v)

    return {k: v for k, v in vars(cb).items() if k not in config and plain(v)}


def _tf_global_generator_state(tf: Any) -> Any:
    """TF's global generator state, or None when the job never created one (with op
    determinism on, TF refuses to create it implicitly, and then nothing drew from it)."""
    try:
        return tf.random.get_global_generator().state.numpy()
    except RuntimeError:
        return None


def _metric_variables(model: Any) -> list[Any]:
    """The running state of the compiled metrics (the loss tracker's total and count, ...)."""
    return [v for m in getattr(model, "metrics", []) for v in m.variables]


def _build_metrics(model: Any, data: Any) -> None:
    """Build the compiled metrics (Keras builds them at the first train step, from a batch's
    targets and predictions) so their state can be assigned before that step. The model is
    called in inference mode: no layer or RNG state changes."""
    import keras

    x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
    if y is None:
        return
    y_pred = model(x, training=False)
    for m in getattr(model, "metrics", []):
        if not getattr(m, "built", True) and hasattr(m, "build"):
            try:
                m.build(y, y_pred)
            except (TypeError, ValueError):
                pass  # left to Keras: its state then starts from zero for this epoch


def _assign(variables: list[Any], values: list[Any]) -> None:
    if len(variables) != len(values):
        return  # another model's metrics: leave them as Keras reset them
    for var, value in zip(variables, values, strict=True):
        var.assign(value)


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _build_optimizer(model: Any) -> None:
    """Create the optimizer's slot variables now, so a checkpoint can be assigned into them."""
    opt = model.optimizer
    if opt is None:
        raise ValueError("compile the model before restore(): the optimizer state is part of the checkpoint")
    if not getattr(opt, "built", False):
        opt.build(model.trainable_variables)


_cls: type | None = None


def scheduler_callback_class() -> type:
    global _cls
    if _cls is None:
        _cls = _make_class()
    return _cls


def SchedulerCallback(**kwargs: Any) -> Any:
    """A ``keras.callbacks.Callback`` for the scheduler (built lazily; see module docstring)."""
    return scheduler_callback_class()(**kwargs)
