"""Hugging Face ``Trainer`` under the scheduler: one call in place of ``trainer.train()``.

    from microco.clients.scheduler.hf import train

    trainer = Trainer(model=model, args=args, train_dataset=ds, ...)
    train(trainer)          # resumes from the job's last checkpoint, if any; obeys the scheduler

Importing this module imports ``transformers`` (``microco.clients.scheduler`` does not).

``train`` adds a ``MicrocoTrainerCallback`` and runs ``trainer.train(resume_from_checkpoint=...)``
with the checkpoint this job last wrote (None on a first start). The callback reports each
optimisation step's time to the scheduler (with gradient accumulation a mini-batch of the
scheduler is one optimiser step) and obeys suspend / resume / stop / resize through
``TorchHook`` (so the ranks of a multi-process job agree on each command) at the point where
the Trainer logs and saves its own checkpoints: right after its ``_maybe_log_save_evaluate`` of
the step. Earlier (``on_step_end``) a stop would come before the step's loss is logged, and
the restored run's log would miss it. (A Trainer without that method: at ``on_step_end``.)

The checkpoint is the Trainer's own (``Trainer._save_checkpoint``: model, optimizer, LR
scheduler, grad scaler, every RNG state, ``TrainerState`` with the step and the log history),
written under the job's checkpoint directory (``<checkpoint_dir>/hf/checkpoint-<step>``, which
the platform keeps across a move; the user's ``output_dir`` is left alone), and the job's
checkpoint file names it (JSON: step and folder; replaced atomically once the folder is
complete, so a job killed mid-save resumes from the one before, whose folder is kept until then).
The Trainer's resume puts back the model, optimizer, scheduler, RNG states and the step, and
skips the restored epoch's trained batches (``ignore_data_skip=False``, its default); the
callback puts back the loss accumulated since the last log (``logging_steps`` > 1), which the
Trainer's own checkpoint leaves out. So the run goes on as an uninterrupted one would, its log
included; the final ``train_loss`` is the Trainer's, the mean over the steps of this call (as
after the Trainer's own resume).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ._job import JobContext
from ._torch import TorchHook

FOLDER = "hf"  # under the job's checkpoint directory


class MicrocoTrainerCallback(TrainerCallback):
    """Reports each optimiser step to the scheduler and obeys it at step ends; ``train`` (the
    module's) is the one line a script needs. ``attach(trainer)`` is what ``train`` calls: the
    callback saves through the Trainer."""

    def __init__(self, *, context: JobContext | None = None, **context_kwargs: Any) -> None:
        super().__init__()
        self.context = context or JobContext(**context_kwargs)
        self.trainer: Any = None
        self.hook: TorchHook | None = None
        self._reported = -1  # the last step told to the hook
        self._after_log = False  # obeying after the Trainer's log and save of each step

    def attach(self, trainer: Any) -> MicrocoTrainerCallback:
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        original = getattr(trainer, "_maybe_log_save_evaluate", None)
        if original is not None and not getattr(original, "_microco", False):

            def after_log_save_evaluate(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                self._boundary()
                return out

            after_log_save_evaluate._microco = True  # type: ignore[attr-defined]
            trainer._maybe_log_save_evaluate = after_log_save_evaluate
        self._after_log = original is not None
        return self

    # ---- what the script uses
    @property
    def resume_from_checkpoint(self) -> str | None:
        """The Trainer checkpoint folder this job last completed, for ``trainer.train(
        resume_from_checkpoint=...)``; None when there is none."""
        saved = self._pointer()
        return saved["dir"] if saved is not None else None

    @property
    def step(self) -> int:
        return self.context.step

    # ---- Trainer events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.trainer is None:
            raise RuntimeError(
                "MicrocoTrainerCallback needs its Trainer: call microco.clients.scheduler.hf.train(trainer) "
                "(or callback.attach(trainer)) rather than passing it in callbacks=[...] alone"
            )
        self.hook = TorchHook(model, kwargs.get("optimizer"), context=self.context)
        self.context.save = self._save
        self.context.load = self._load
        self.context.restore()  # the status, the step it resumed at; partial files of killed writers
        self._reported = int(state.global_step)
        saved = self._pointer()
        if self.context.restored_from_step and saved is not None and "tr_loss" in saved:
            # What the Trainer's checkpoint leaves out (its resume starts them at zero).
            import torch

            t = self.trainer
            t._tr_loss = torch.tensor(saved["tr_loss"], dtype=t._tr_loss.dtype, device=t._tr_loss.device)
            t._globalstep_last_logged = int(saved["last_logged"])
            # ``train_loss`` stays the Trainer's: the mean over the steps this call ran (what its
            # own resume reports), so the carried loss of earlier steps is not counted in it.
            t._total_loss_scalar = -float(saved["tr_loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._after_log:
            self._boundary()

    def _boundary(self) -> None:
        step = int(self.trainer.state.global_step)
        if self.hook is not None and step > self._reported:  # (the epoch end's call repeats a step)
            self._reported = step
            self.hook.step_end(step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = self._pointer()
        self._prune(Path(saved["dir"]).name if saved else "")  # the folders no file names
        if self.hook is not None:
            self.hook.finish()

    # ---- the hook's save / load
    def _root(self) -> Path | None:
        d = self.context.checkpoint_dir
        return Path(d) / FOLDER if d else None

    def _pointer(self) -> dict[str, Any] | None:
        path = self.context.checkpoint_path
        if path is None or not path.exists():
            return None
        saved: dict[str, Any] = json.loads(path.read_bytes())
        return saved if Path(saved["dir"]).is_dir() else None

    def _save(self, step: int) -> bytes:
        """The Trainer's checkpoint of now, under the job's checkpoint directory (every rank
        calls it: the Trainer's save is collective where its strategy needs it)."""
        root, trainer = self._root(), self.trainer
        assert root is not None
        kept = self._pointer()
        args = trainer.args
        output_dir = args.output_dir
        args.output_dir = str(root)
        try:
            trainer._save_checkpoint(trainer.model, trial=None)
        finally:
            args.output_dir = output_dir
        folder = root / f"checkpoint-{trainer.state.global_step}"
        # (this save's folder is not named until the job's file is replaced, after this returns)
        self._prune(folder.name, Path(kept["dir"]).name if kept else "")
        doc: dict[str, Any] = {"step": step, "dir": str(folder)}
        if hasattr(trainer, "_tr_loss"):
            doc.update(tr_loss=float(trainer._tr_loss), last_logged=int(trainer._globalstep_last_logged))
        return json.dumps(doc).encode()

    def _prune(self, *keep: str) -> None:
        """Remove the checkpoint folders but ``keep`` (rank 0: the one that writes)."""
        root = self._root()
        if root is None or self.context.rank != 0:
            return
        for old in root.glob("checkpoint-*"):
            if old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def _load(self, blob: bytes) -> int:
        # The Trainer loaded a checkpoint itself (``resume_from_checkpoint``) before
        # ``on_train_begin``: the step is the one it restored, whichever it was (the job's file's
        # folder, one the script named, or none when that folder is gone: then 0, not the
        # file's step).
        return int(self.trainer.state.global_step)


def train(trainer: Any, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` under the scheduler: from this job's last checkpoint
    (unless ``resume_from_checkpoint`` is given), obeying the scheduler at every step's end.
    Returns what ``trainer.train`` returns. Without the platform (no job environment) it only
    counts steps."""
    cb = next((c for c in trainer.callback_handler.callbacks if isinstance(c, MicrocoTrainerCallback)), None)
    cb = (cb or MicrocoTrainerCallback()).attach(trainer)
    train_kwargs.setdefault("resume_from_checkpoint", cb.resume_from_checkpoint)
    return trainer.train(**train_kwargs)


__all__ = ["MicrocoTrainerCallback", "train"]
