"""The Keras callback: obeys the scheduler at every batch end of ``model.fit``.

    cb = SchedulerCallback(extra_state={"losses": losses})
    start = cb.restore(model)              # model compiled; 0 or the step to continue from
    model.fit(batches_from(start), steps_per_epoch=total - start, epochs=1, callbacks=[cb])
    cb.finish()

The checkpoint holds every model variable (weights, non-trainable state, seed-generator
state), every optimizer variable (iteration count, moments), the NumPy / Python / TensorFlow
global RNG states, the step and a user ``extra_state`` dict.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

from ._job import JobContext


def _callback_base() -> type:
    import keras

    return keras.callbacks.Callback


def _make_class() -> type:
    Base = _callback_base()

    class SchedulerCallback(Base):  # type: ignore[misc, valid-type]
        """Reports each batch's time to the scheduler and obeys suspend / resume / stop / resize
        at batch ends; see the module docstring for the few lines a script adds."""

        def __init__(
            self,
            *,
            extra_state: dict[str, Any] | None = None,
            context: JobContext | None = None,
            **context_kwargs: Any,
        ) -> None:
            super().__init__()
            self.extra_state = extra_state if extra_state is not None else {}
            self.context = context or JobContext(**context_kwargs)
            self.context.save = self._save
            self.context.load = self._load
            self.start_step = 0
            self._target: Any = None

        @property
        def devices(self) -> list[str]:
            return self.context.devices

        def restore(self, model: Any) -> int:
            """Bind ``model`` (compiled) and load the latest checkpoint; returns the start step."""
            self._target = model
            _build_optimizer(model)
            self.start_step = self.context.restore()
            return self.start_step

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.context.step_end(self.start_step + batch + 1)

        def finish(self) -> None:
            self.context.finish()

        def _save(self, step: int) -> bytes:
            import numpy as np
            import tensorflow as tf

            model = self._target if self._target is not None else self.model
            state = {
                "step": step,
                "model": [np.array(v.numpy()) for v in model.variables],
                "optimizer": [np.array(v.numpy()) for v in model.optimizer.variables],
                "rng": {
                    "numpy": np.random.get_state(),
                    "python": random.getstate(),
                    "tf": _tf_global_generator_state(tf),
                },
                "extra": self.extra_state,
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
            return int(state["step"])

    return SchedulerCallback


def _tf_global_generator_state(tf: Any) -> Any:
    """TF's global generator state, or None when the job never created one (with op
    determinism on, TF refuses to create it implicitly, and then nothing drew from it)."""
    try:
        return tf.random.get_global_generator().state.numpy()
    except RuntimeError:
        return None


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
