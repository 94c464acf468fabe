"""The PyTorch hook: a few lines in a training loop.

hook = TorchHook(model, optimizer, extra_state={"losses": losses})
start = hook.restore()                 # 0, or the step a checkpoint left off at
for step in range(start, total_steps):
    x, y = batches.batch(step)         # data position is a function of the step
    ...forward, backward, optimizer.step()...
    hook.step_end(step + 1)            # reports the time; obeys control at the boundary
hook.finish()

A loop over its own ``DataLoader`` (shuffling or not): ``for x, y in hook.epoch(loader)`` in
place of ``for x, y in loader`` resumes a restored epoch at its next batch, in its order.
"""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

from ._job import ContextDelegates, JobContext


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TorchHook(ContextDelegates):
    """Scheduler hook for a PyTorch training loop.

    The checkpoint holds the model's and optimizer's state dicts, every RNG the loop may draw
    from (torch, CUDA, NumPy, Python), the step (which is the data position when batches are
    a function of the step, see ``StepBatches``), the ``state_dict`` of an optional ``sampler``,
    of every object in ``stateful`` (LR schedulers, a GradScaler: ``{"sched": scheduler}``)
    and a user ``extra_state`` dict (restored in place), e.g. the loss history; and the
    parameters' gradients when any is not zero (a loop accumulating them over several
    mini-batches, checkpointed between two optimiser steps). Under a process group the RNG
    states, the gradients and ``extra_state`` are every rank's own.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any | None = None,
        *,
        extra_state: dict[str, Any] | None = None,
        sampler: Any | None = None,
        stateful: dict[str, Any] | None = None,
        on_devices: Callable[[list[str]], None] | None = None,
        context: JobContext | None = None,
        **context_kwargs: Any,
    ) -> None:
        for what, obj in (("model", model), ("optimizer", optimizer)):
            if obj is not None and not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                # (found at the first checkpoint otherwise, minutes in, as an AttributeError)
                raise TypeError(
                    f"TorchHook's {what} is a {type(obj).__name__}, without state_dict/load_state_dict: "
                    f"pass one {what} and name the others, e.g. TorchHook(netG, optimizerG, "
                    "stateful={'netD': netD, 'optimizerD': optimizerD})"
                )
        if sampler is not None and not (
            hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")
        ):
            raise TypeError(
                f"TorchHook's sampler is a {type(sampler).__name__}, without state_dict/load_state_dict "
                "(a data position to checkpoint): for a torch DataLoader leave sampler= out and iterate "
                "hook.epoch(loader); Quiver's loader and samplers with state_dict go in sampler="
            )
        self.model = model
        self.optimizer = optimizer
        self.extra_state = extra_state if extra_state is not None else {}
        self.sampler = sampler
        # Other objects with ``state_dict`` / ``load_state_dict`` (LR schedulers, a GradScaler,
        # an EMA, ...), saved and restored by name.
        self.stateful = dict(stateful or {})
        for name, obj in self.stateful.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"stateful[{name!r}] has no state_dict/load_state_dict")
        self.context = context or JobContext(**context_kwargs)
        self.context.save = self._save
        self.context.load = self._load
        self.context.on_park = self._park
        self.context.on_unpark = self._unpark
        # A resize changes the compute threads too (OMP_NUM_THREADS only counts at start):
        # on virtual devices (CPU shares) one thread per device, shared by the ranks.
        self.context.on_devices = on_devices or self._set_threads
        self._device: Any = None
        self._group: tuple[int, int] | None = None
        # ``epoch(loader)``: the RNG states the current epoch's iterator was made from (and the
        # loader's own generator's), saved with every checkpoint, and those a checkpoint held.
        self._epoch_rng: dict[str, Any] | None = None
        self._loaded_epoch_rng: dict[str, Any] | None = None
        self._epoch_end: int | None = None  # the step of the current epoch's last boundary
        self._join_group()

    def _join_group(self) -> None:
        """With ``torch.distributed`` initialised over several processes (however launched:
        torchrun, ``mp.spawn``, Lightning, Accelerate, ``init_distributed``), the ranks agree
        on control at each boundary and the checkpoint holds every rank's RNG state. Checked
        again at the first boundaries, for a hook made before ``init_process_group``."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = (dist.get_rank(), dist.get_world_size())
            self.context.use_group(*self._group, _broadcast_from_rank0)

    def restore(self) -> int:
        self._check_schedulers()
        return self.context.restore()

    def _check_schedulers(self) -> None:
        """An LR scheduler drives the optimizer (it set ``initial_lr`` in its param groups) but
        is not in ``stateful``: its position would be lost at every restart, the schedule
        starting over while the optimizer's learning rate is restored. Said, not ignored."""
        import torch

        groups = getattr(self.optimizer, "param_groups", None) or []
        if not any("initial_lr" in g for g in groups):
            return
        kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if any(isinstance(obj, kinds) for obj in self.stateful.values()):
            return
        raise ValueError(
            "the optimizer is driven by an LR scheduler (its param groups have 'initial_lr') that "
            "the hook does not checkpoint: pass it as TorchHook(..., stateful={'sched': scheduler}), "
            "or a resumed job starts its schedule over"
        )

    def step_end(self, step: int | None = None) -> None:
        if self._group is None and self.context.step < 2:
            self._join_group()
        step = self.context.step + 1 if step is None else int(step)
        # An epoch's last boundary under ``epoch(loader)`` waits for the next epoch's start, so
        # a checkpoint there holds the loop's end-of-epoch work (validation, an LR step).
        self.context.step_end(step, obey=step != self._epoch_end)

    def checkpoint(self) -> int:
        return self.context.write_checkpoint()

    def epoch(self, loader: Any) -> Iterator[Any]:
        """The mini-batches of the current epoch of ``loader`` (a ``torch.utils.data.DataLoader``,
        shuffling or not, with workers or not), starting where the checkpoint left it::

            step = hook.restore()
            for epoch in range(step // len(loader), epochs):
                for x, y in hook.epoch(loader):
                    ...train...
                    step += 1
                    hook.step_end(step)

        The step must count the loader's batches (``len(loader)`` a step per epoch). A plain
        ``DataLoader`` restarts an epoch at its first batch and draws the epoch's order (and its
        workers' seeds) from torch's RNG when iterated, so a job restored mid-epoch would train
        on a new order from its start. Here the restored epoch's iterator is made again from
        the RNG states the epoch started with (the checkpoint holds them, and the state of the
        loader's ``generator`` if it has one), advanced past the batches already trained on
        (they are loaded, not trained), and then the checkpoint's RNG states are set back."""
        n = len(loader)
        if n <= 0:
            raise ValueError("hook.epoch(loader) needs a loader with at least one batch")
        if self._epoch_end is not None and self._epoch_end == self.context.step:
            self.context.boundary()  # the previous epoch's last, after its end-of-epoch work
        self._epoch_end = (self.context.step // n + 1) * n
        done = self.context.step % n
        saved = self._loaded_epoch_rng
        self._loaded_epoch_rng = None
        generator = getattr(loader, "generator", None)
        if done and saved is None:
            raise ValueError(
                f"the job was restored at step {self.context.step}, batch {done} of an epoch of {n}, "
                "from a checkpoint without the epoch's RNG states (taken without hook.epoch(loader), "
                "or the step does not count this loader's batches): the epoch's order cannot be made again"
            )
        if (
            getattr(loader, "persistent_workers", False)
            and getattr(loader, "_iterator", "absent") is None
            and self.context.step >= n
        ):
            # A loader with persistent workers draws its workers' base seed from torch's RNG at
            # its first iterator only, then each epoch just the order: made first in a process
            # restarted past epoch 0, it would draw one number more than the uninterrupted run
            # did at this epoch, and shuffle differently. Its first iterator is made here with
            # the RNG states put back after; the epoch's is then a reset, as in that run.
            before = _rng_state(), generator.get_state() if generator is not None else None
            iter(loader)
            _set_rng_state(before[0])
            if generator is not None:
                generator.set_state(before[1])
        if done and saved is not None:
            now = _rng_state()
            _set_rng_state(saved["rng"])
            if generator is not None and saved.get("generator") is not None:
                generator.set_state(saved["generator"])
        self._epoch_rng = {
            "rng": _rng_state(),
            "generator": generator.get_state() if generator is not None else None,
        }
        it = iter(loader)
        if done:
            for _ in range(done):
                next(it)  # the batches the checkpoint already trained on
            _set_rng_state(now)
        yield from it
        if self.context.step != self._epoch_end:
            raise ValueError(
                f"hook.epoch(loader): the epoch's {n} batches took the step from "
                f"{self._epoch_end - n + done} to {self.context.step}, not {self._epoch_end}: the step "
                "must count the loader's batches (one hook.step_end per batch), or a restored epoch "
                "would skip the wrong number of them"
            )

    def finish(self) -> None:
        self.context.finish()

    def _save(self, step: int) -> bytes:
        import torch

        self._check_schedulers()  # (a scheduler made after ``restore()``)

        rng = self._gathered(_rng_state())
        epoch_rng = self._gathered(self._epoch_rng)
        grads = self._gathered(self._grads())
        extra = self._gathered(self.extra_state)
        sampler = self._gathered(self.sampler.state_dict()) if self.sampler is not None else None
        if self._group is not None and self._group[0] != 0:
            return b""  # rank 0 writes the checkpoint
        state = {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "rng": rng,
            "epoch_rng": epoch_rng,
            "sampler": sampler,
            "stateful": {name: obj.state_dict() for name, obj in self.stateful.items()},
            "extra": extra,
            "grads": grads,
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def _modules(self) -> list[tuple[str, Any]]:
        """The model and the torch modules named in ``stateful`` (a GAN's second net), by name."""
        import torch

        named = [("model", self.model)] + [(k, v) for k, v in self.stateful.items()]
        return [(k, m) for k, m in named if isinstance(m, torch.nn.Module)]

    def _grads(self) -> dict[str, Any] | None:
        """The gradients the parameters hold now, when any is not zero: a loop that accumulates
        them over several mini-batches (a step per mini-batch, the optimiser's every k-th) holds
        the window's sum between its boundaries, and a checkpoint without it resumes that window
        with its first mini-batches' gradients lost. None at an optimiser step's boundary (the
        gradients freed or zeroed), so the checkpoint costs nothing more there."""
        grads: dict[str, Any] = {}
        for prefix, module in self._modules():
            for name, p in module.named_parameters():
                if p.grad is not None and bool(p.grad.any()):
                    grads[f"{prefix}.{name}"] = p.grad.detach().clone()
        return grads or None

    def _set_grads(self, grads: dict[str, Any] | None) -> None:
        if not grads:
            return
        for prefix, module in self._modules():
            for name, p in module.named_parameters():
                saved = grads.get(f"{prefix}.{name}")
                if saved is not None:
                    p.grad = saved.to(device=p.device, dtype=p.dtype)

    def _set_threads(self, devices: list[str]) -> None:
        import torch

        if self.context.on_gpu or not devices:
            return
        torch.set_num_threads(max(1, len(devices) // max(1, self.context.world_size)))

    def _gathered(self, value: Any) -> Any:
        """This process's ``value``; with a process group, every rank's, in rank order (a
        collective: every rank calls ``_save`` at the same boundary, rank 0's result is written)."""
        if self._group is None:
            return value
        import torch.distributed as dist

        values: list[Any] = [None] * self._group[1]
        dist.all_gather_object(values, value)
        return values

    def _load(self, blob: bytes) -> int:
        import torch

        state = torch.load(io.BytesIO(blob), weights_only=False)
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        rng = state["rng"]
        if isinstance(rng, list):  # one per rank (saved by a process group)
            rank = self._group[0] if self._group else 0
            rng = rng[rank] if rank < len(rng) else rng[0]
        _set_rng_state(rng)
        epoch_rng = state.get("epoch_rng")
        if isinstance(epoch_rng, list):
            rank = self._group[0] if self._group else 0
            epoch_rng = epoch_rng[rank] if rank < len(epoch_rng) else epoch_rng[0]
        self._loaded_epoch_rng = epoch_rng
        saved = state.get("stateful") or {}
        missing = [name for name in self.stateful if name not in saved]
        if missing:
            raise ValueError(f"the checkpoint has no state for {missing} (saved: {sorted(saved)})")
        for name, obj in self.stateful.items():
            obj.load_state_dict(saved[name])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(self._sampler_position(state["sampler"]))
        grads = state.get("grads")
        if isinstance(grads, list):  # one per rank (ranks accumulating under no_sync differ)
            rank = self._group[0] if self._group else 0
            grads = grads[rank] if rank < len(grads) else grads[0]
        self._set_grads(grads)
        extra = state["extra"]
        if isinstance(extra, list):  # one per rank: what each rank's loop kept (its own losses, hidden state)
            rank = self._group[0] if self._group else 0
            extra = extra[rank] if rank < len(extra) else extra[0]
        self.extra_state.clear()
        self.extra_state.update(extra)
        return int(state["step"])

    def _sampler_position(self, saved: Any) -> Any:
        """The sampler position this rank loads. A process group saves every rank's (a list, in
        rank order): with the same number of ranks each loads its own; with another number (the
        job grown or shrunk since) the sampler's ``merge_state_dicts`` (Quiver's loader has it:
        ``merge_positions``) makes one job-wide position every rank loads. A sampler without it
        cannot be resumed at another size, and that is said plainly."""
        if not isinstance(saved, list):
            return saved  # one process's (saved without a process group)
        rank, world = self._group if self._group is not None else (0, 1)
        if len(saved) == world:
            return saved[rank]
        merge = getattr(self.sampler, "merge_state_dicts", None)
        if merge is None:
            raise ValueError(
                f"the checkpoint holds the sampler positions of {len(saved)} ranks and this job has "
                f"{world}: {type(self.sampler).__name__} cannot merge them (no merge_state_dicts); "
                "resume with the same number of ranks"
            )
        return merge(saved)

    def _park(self) -> None:
        """Free the accelerator while parked: parameters and optimizer state move to host memory."""
        import torch

        try:
            first = next(self.model.parameters())
        except StopIteration:
            return
        self._device = first.device
        if self._device.type != "cpu":
            self._move(torch.device("cpu"))
            torch.cuda.empty_cache()

    def _unpark(self) -> None:
        if self._device is not None and self._device.type != "cpu":
            self._move(self._device)

    def _move(self, device: Any) -> None:
        self.model.to(device)
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                for k, v in st.items():
                    if hasattr(v, "to"):
                        st[k] = v.to(device)


def _broadcast_from_rank0(values: list[int]) -> list[int]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.int64)
    dist.broadcast(t, src=0)
    return [int(v) for v in t.tolist()]


def init_distributed() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; for a job the scheduler spread over several
    nodes (``MICROCO_WORLD_SIZE`` > 1) also joins the gloo process group first.

    The rendezvous is a ``torch.distributed.FileStore`` in the job's checkpoint directory,
    per attempt: the nodes of a spread job share the checkpoint root already (a moved job
    resumes from it), so no port has to be agreed on in advance. Call before ``TorchHook``.
    """
    from ._job import ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_RANK, ENV_WORLD_SIZE

    world = int(os.environ.get(ENV_WORLD_SIZE, "1") or 1)
    rank = int(os.environ.get(ENV_RANK, "0") or 0)
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    ckpt = os.environ.get(ENV_CHECKPOINT_DIR)
    if not ckpt:
        raise RuntimeError("a spread job needs MICROCO_CHECKPOINT_DIR (shared by its nodes) to meet")
    attempt = os.environ.get(ENV_ATTEMPT, "0")
    os.makedirs(ckpt, exist_ok=True)
    store = dist.FileStore(os.path.join(ckpt, f"rendezvous-{attempt}"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return rank, world


def average_gradients(model: Any) -> None:
    """All-reduce and average every gradient over the ranks (a no-op in a single process):
    with each rank computing the mean loss of an equal share of the global batch, the result
    is the gradient of the global batch's mean loss."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world


def seed_everything(seed: int) -> None:
    """Seed every RNG a PyTorch job draws from; on CUDA also ask for deterministic kernels
    (CPU kernels already are, and asking costs ~2 s of imports)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
