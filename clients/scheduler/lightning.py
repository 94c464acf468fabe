"""The PyTorch Lightning callback: obeys the scheduler at every training batch end.

    from microco.clients.scheduler.lightning import MicrocoCallback

    cb = MicrocoCallback()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, callbacks=[cb])
    trainer.fit(model, train_loader, ckpt_path=cb.ckpt_path)   # None on a first start

Importing this module imports ``pytorch_lightning`` (``microco.clients.scheduler`` does not).

The checkpoint is Lightning's own, taken where Lightning's ``ModelCheckpoint`` takes a
mid-epoch one (``on_train_batch_end``, after the step's LR-scheduler update): the
LightningModule, every optimizer and LR scheduler, the fit loop's position (epoch, batch, global
step), the precision plugin's and every callback's state, and what the module adds in
``on_save_checkpoint``. The callback's own state in it is every rank's RNG states (torch, NumPy,
Python; gathered at the boundary), now and at the epoch's start, every rank's gradients when
the checkpoint falls between two optimiser steps of ``accumulate_grad_batches`` (Lightning's
own leaves them out), and the scheduler's step.
Restored by ``trainer.fit(..., ckpt_path=cb.ckpt_path)``, Lightning puts the module, optimizers,
schedulers and loops back; the callback then remakes the restored epoch's data iterator from
the epoch's starting RNG states, advances it past the batches the checkpoint already trained on
(a plain ``DataLoader`` restarts an epoch at its first batch; nothing is trained) and sets the
RNG states, so the run continues as an uninterrupted one would, bit for bit.

Under ``strategy="ddp"`` Lightning re-runs the script once per extra rank; every rank has its
callback, and the ranks agree on each control command at one boundary (``TorchHook``'s
broadcast over the process group). The job's first process is rank 0 and the launcher at once:
a checkpoint-and-exit ends it with ``EXIT_CHECKPOINTED`` (or with SIGKILL, when Lightning's
child-process observer sees rank 1 exit first), and either way the ranks' records make it
"checkpointed" for the node agent.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytorch_lightning as pl

from ._job import ContextDelegates, JobContext
from ._torch import TorchHook, _rng_state, _set_rng_state


class MicrocoCallback(ContextDelegates, pl.Callback):
    """Reports each training batch's time to the scheduler and obeys suspend / resume / stop /
    resize at batch ends; see the module docstring for the lines a script adds."""

    def __init__(self, *, context: JobContext | None = None, **context_kwargs: Any) -> None:
        super().__init__()
        self.context = context or JobContext(**context_kwargs)
        self.hook: TorchHook | None = None
        self._trainer: Any = None
        self._gathered: Any = None  # every rank's RNG states, gathered for the checkpoint being written
        self._loaded: dict[str, Any] | None = None  # the callback's state from a restored checkpoint
        self._restored_step = 0
        self._epoch_rng: tuple[int, dict[str, Any]] | None = None  # (epoch, RNG states at its start)

    # ---- what the script uses
    @property
    def ckpt_path(self) -> str | None:
        """The job's checkpoint for ``trainer.fit(..., ckpt_path=...)``: None when there is none."""
        path = self.context.checkpoint_path
        return str(path) if path is not None and path.exists() else None

    # ---- Lightning hooks
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The process group exists now (the hook joins it and learns this process's rank),
        # the optimizers too, and Lightning has restored the module, optimizers and loops.
        self._trainer = trainer
        optimizer = trainer.optimizers[0] if len(trainer.optimizers) == 1 else None
        self.hook = TorchHook(pl_module, optimizer, context=self.context)
        self.context.save = self._save
        self.context.load = self._load_step
        loaded, self._loaded = self._loaded, None
        self._restored_step = 0
        if loaded is not None:
            rank = self.context.rank
            self._continue(trainer, _pick(loaded["rng"], rank), _pick(loaded.get("epoch_rng"), rank))
            # Gradients accumulated in the window the checkpoint was taken in
            # (``accumulate_grad_batches``): Lightning's checkpoint leaves them out.
            self.hook._set_grads(_pick(loaded.get("grads"), rank))
            self._restored_step = int(loaded["step"])
        self.context.restore()  # the status (step, checkpoint) and partial files of killed writers

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The RNG states the epoch's data iterator is about to draw its seeds from (a shuffling
        # sampler without a generator of its own draws its order from torch's global RNG).
        if self._epoch_rng is None or self._epoch_rng[0] != trainer.current_epoch:
            self._epoch_rng = (trainer.current_epoch, _rng_state())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.hook is not None:
            self.hook.step_end(int(trainer.fit_loop.epoch_loop.total_batch_idx) + 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hook is not None:
            self.hook.finish()

    # ---- the callback's part of Lightning's checkpoint
    def state_dict(self) -> dict[str, Any]:
        # Plain types only: Lightning loads checkpoints with ``weights_only`` by default.
        gathered = self._gathered if self._gathered is not None else [self._rank_state()]
        return {
            "step": self.context.step,
            "rng": [_encode_rng(now) for now, _, _ in gathered],
            "epoch_rng": [_encode_rng(epoch) if epoch is not None else None for _, epoch, _ in gathered],
            "grads": [grads for _, _, grads in gathered],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)

    # ---- the hook's save / load
    def _rank_state(self) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
        """This rank's RNG states (now, at the epoch's start) and the gradients its parameters
        hold (between two optimiser steps of ``accumulate_grad_batches``; None at a step's)."""
        grads = self.hook._grads() if self.hook is not None else None
        return _rng_state(), (self._epoch_rng[1] if self._epoch_rng is not None else None), grads

    def _save(self, step: int) -> bytes:
        import torch

        pair = self._rank_state()
        if self.hook is not None and self.hook._group is not None:  # every rank's (every rank is here)
            import torch.distributed as dist

            gathered: list[Any] = [None] * self.hook._group[1]
            dist.all_gather_object(gathered, pair)
            self._gathered = gathered
        else:
            self._gathered = [pair]
        try:
            # On every rank, as ``Trainer.save_checkpoint`` does (a sharded strategy gathers).
            ckpt = self._trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        finally:
            self._gathered = None
        if self.context.rank != 0:
            return b""  # rank 0 writes
        buf = io.BytesIO()
        torch.save(ckpt, buf)
        return buf.getvalue()

    def _load_step(self, blob: bytes) -> int:
        # Lightning loaded the checkpoint already (``ckpt_path``); the hook's restore only
        # needs the step it was taken at.
        return self._restored_step

    def _continue(self, trainer: pl.Trainer, rng: dict[str, Any], epoch_rng: dict[str, Any] | None) -> None:
        """Put the training data where the checkpoint left it and set the RNG states.

        Lightning restores the loops' position, but a plain ``DataLoader`` restarts an epoch at
        its first batch (only a loader with ``state_dict`` / ``load_state_dict`` resumes by
        itself). The restored epoch's iterator is made again from the RNG states the epoch
        started with (epoch 0's is this process's own: the script's seeding made it the same),
        advanced past the batches already trained on (nothing is trained), and then the RNG
        states of the checkpoint are set. A checkpoint at an epoch's last batch goes on with
        the next epoch, whose iterator is made after the checkpoint's RNG states are set, as an
        uninterrupted run makes it."""
        from lightning_fabric.utilities.data import _set_sampler_epoch
        from lightning_fabric.utilities.types import _Stateful
        from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher

        loop = trainer.fit_loop
        fetcher, loader = loop._data_fetcher, loop._combined_loader
        epoch = int(trainer.current_epoch)  # the epoch training goes on with
        done = int(loop.epoch_loop.batch_progress.current.ready)
        stateful = loader is not None and all(isinstance(dl, _Stateful) for dl in loader.flattened)
        if fetcher is None or loader is None or stateful or done == 0:
            _set_rng_state(_decode_rng(rng))
            return
        if done >= trainer.num_training_batches:
            # At an epoch's end: Lightning has moved on to the next epoch (``current_epoch``)
            # and calls no ``on_train_epoch_start`` for it.
            _set_rng_state(_decode_rng(rng))
            self._epoch_rng = (epoch, _rng_state())
            iter(fetcher)
            return
        if isinstance(fetcher, _DataLoaderIterDataFetcher):
            warnings.warn(
                "microco: a training_step that takes the dataloader iterator restarts a restored "
                "epoch at its first batch",
                stacklevel=2,
            )
            _set_rng_state(_decode_rng(rng))
            return
        if epoch > 0 and epoch_rng is not None:
            _set_rng_state(_decode_rng(epoch_rng))
            self._epoch_rng = (epoch, _rng_state())
            iter(fetcher)
        for dl in loader.flattened:  # the restored epoch's order (Lightning sets it again later)
            _set_sampler_epoch(dl, epoch)
        for _ in range(done):
            next(fetcher)
        fetcher.fetched -= done  # the epoch loop adds the restored batch count itself
        _set_rng_state(_decode_rng(rng))
        # Lightning's warning that a plain loader restarted mid-epoch is unreliable is answered.
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")


def _pick(per_rank: list[Any] | None, rank: int) -> Any:
    if not per_rank:
        return None
    return per_rank[rank] if rank < len(per_rank) else per_rank[0]


def _encode_rng(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states as tensors, lists and numbers (what ``torch.load(weights_only=True)`` reads)."""
    np_state = state["numpy"]
    version, internal, gauss = state["python"]
    out = {
        "torch": state["torch"],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [version, list(internal), gauss],
    }
    if "cuda" in state:
        out["cuda"] = state["cuda"]
    return out


def _decode_rng(state: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    n = state["numpy"]
    version, internal, gauss = state["python"]
    out = {
        "torch": state["torch"],
        "numpy": (n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]),
        "python": (version, tuple(internal), gauss),
    }
    if "cuda" in state:
        out["cuda"] = state["cuda"]
    return out


__all__ = ["MicrocoCallback"]
