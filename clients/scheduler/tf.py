"""A TensorFlow custom training loop (``tf.GradientTape``, a ``tf.data`` pipeline) under the
scheduler; the checkpoint is the loop's own ``tf.train.Checkpoint``.

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, data=iterator)
    hook = TFHook(ckpt, extra_state={"losses": losses})
    start = hook.restore()            # 0, or the step the job's last checkpoint left off at
    for step in range(start, total_steps):
        loss = train_step(*next(iterator))
        losses.append(float(loss))
        hook.step_end(step + 1)       # reports the time; obeys control at the boundary
    hook.finish()

Importing this module imports TensorFlow (``microco.clients.scheduler`` does not).

What the ``tf.train.Checkpoint`` tracks is what resumes, as TensorFlow writes it
(``Checkpoint.write``; its files are carried inside the job's one checkpoint file): a
``tf.data`` iterator's position (mid-epoch, its shuffle buffer included), any
``tf.random.Generator``, the optimizer's state (build it before ``restore``:
``optimizer.build(model.trainable_variables)``, so its slots exist to be restored into). For the
Keras 3 models, layers and optimizers among its attributes the hook also keeps every one of
their ``variables``: TensorFlow's checkpoint of a Keras 3 model holds only the weights its
optimizer refers to, not a dropout layer's seed generator state (the masks started over at a
restart) nor non-trainable weights such as batch-norm statistics. The hook adds Python's and NumPy's RNG states, TF's
global generator's and ``extra_state`` (restored in place). A restore that would leave part of
the checkpoint unread (an optimizer not built yet) is refused with the reason. Random ops with
an op-level seed (``tf.random.uniform(..., seed=1)``) keep hidden counters no checkpoint holds:
draw from a ``tf.random.Generator`` the checkpoint tracks instead. Parked on a GPU, TensorFlow
keeps its device memory (it has no way to give it back): not handled.
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import tensorflow as tf

from ._job import ContextDelegates, JobContext
from ._keras import _tf_global_generator_state

_PREFIX = "ckpt"


class TFHook(ContextDelegates):
    """Scheduler hook for a TensorFlow custom training loop; see the module docstring."""

    def __init__(
        self,
        checkpoint: Any,
        *,
        extra_state: dict[str, Any] | None = None,
        context: JobContext | None = None,
        **context_kwargs: Any,
    ) -> None:
        if not isinstance(checkpoint, tf.train.Checkpoint):
            raise TypeError(
                "TFHook takes the loop's tf.train.Checkpoint (tf.train.Checkpoint(model=model, "
                f"optimizer=optimizer, data=iterator)), not a {type(checkpoint).__name__}"
            )
        self.checkpoint = checkpoint
        self.extra_state = extra_state if extra_state is not None else {}
        self.context = context or JobContext(**context_kwargs)
        self.context.save = self._save
        self.context.load = self._load

    def restore(self) -> int:
        """Load the job's latest checkpoint, if any; returns the step to continue from."""
        return self.context.restore()

    def step_end(self, step: int | None = None) -> None:
        self.context.step_end(step)

    def checkpoint_now(self) -> int:
        return self.context.write_checkpoint()

    def finish(self) -> None:
        self.context.finish()

    def _scratch(self) -> str | None:
        d = self.context.checkpoint_dir
        if d is None:
            return None
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    def _keras_objects(self) -> dict[str, Any]:
        """The Keras 3 models, layers and optimizers the checkpoint tracks, by name. TensorFlow's
        checkpoint of a Keras 3 model holds only what its optimizer refers to (the trainable
        weights): not a layer's seed generator state (dropout masks started over), nor
        non-trainable weights (batch-norm statistics). Their ``variables`` are kept beside it."""
        import keras

        kinds = (keras.layers.Layer, keras.optimizers.Optimizer)
        return {
            name: value
            for name, value in sorted(vars(self.checkpoint).items())
            if not name.startswith("_") and isinstance(value, kinds)
        }

    def _save(self, step: int) -> bytes:
        import numpy as np

        with tempfile.TemporaryDirectory(prefix=".tf-", dir=self._scratch()) as d:
            self.checkpoint.write(os.path.join(d, _PREFIX))
            files = {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}
        state = {
            "step": step,
            "tf_checkpoint": files,
            "keras": {
                n: [np.array(v.numpy()) for v in o.variables] for n, o in self._keras_objects().items()
            },
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

        state = pickle.loads(blob)
        with tempfile.TemporaryDirectory(prefix=".tf-", dir=self._scratch()) as d:
            for name, data in state["tf_checkpoint"].items():
                Path(d, name).write_bytes(data)
            status = self.checkpoint.read(os.path.join(d, _PREFIX))
            try:
                status.assert_consumed()
            except AssertionError as exc:
                raise RuntimeError(
                    f"the job's checkpoint at step {state['step']} was not wholly restored into "
                    "the tf.train.Checkpoint (build the optimizer before restore(): "
                    "optimizer.build(model.trainable_variables); and track the same objects as "
                    f"when it was written): {str(exc).splitlines()[0]}"
                ) from None
        for name, obj in self._keras_objects().items():
            saved = state["keras"].get(name)
            if saved is None or len(saved) != len(obj.variables):
                raise RuntimeError(
                    f"the job's checkpoint at step {state['step']} holds "
                    f"{'no' if saved is None else len(saved)} variables for {name!r}, which has "
                    f"{len(obj.variables)} (build the optimizer before restore(): "
                    "optimizer.build(model.trainable_variables); and track the same objects as "
                    "when it was written)"
                )
            for var, value in zip(obj.variables, saved, strict=True):
                var.assign(value)
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["tf"] is not None:
            tf.random.get_global_generator().reset(state["rng"]["tf"])
        self.extra_state.clear()
        self.extra_state.update(state["extra"])
        return int(state["step"])
