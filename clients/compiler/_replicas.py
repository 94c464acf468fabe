"""Is this process one replica of a data-parallel training? Then Astra does not explore.

Data parallelism (``DistributedDataParallel``, FSDP, or a loop that all-reduces its own
gradients) keeps one copy of the model per process and needs every copy to take the same update
at every step. Astra's exploration is per process: each rank would time its own trials and
commit its own configuration, and configurations differ in floating-point order (a fused
optimiser, channels-last kernels, a compiled step), so the replicas would drift apart, silently.
Worse, ``DistributedDataParallel`` does not follow a parameter's change of layout made after it
was built: measured (issue 18, session 38) with two gloo ranks on the CPU and no Astra at all,
``model.to(memory_format=torch.channels_last)`` three steps in gave losses 1e-3 to 5e-3 apart
from the same run left contiguous (the same change without DDP: 1e-7); through Astra, which
committed channels-last, 2% apart after 40 steps.

So a replica ran the model's own code (an exploration of no variables, committed at once).
Since session 40 the ranks of a process group explore together instead (:class:`ReplicaGroup`,
docs/compiler.md, "Data-parallel replicas, coordinated"): every rank runs the same
configuration at every step, rank 0's explorer decides from step times agreed across the ranks
(the slowest rank's), its answer broadcast to the others; only choices that leave the
parameters where they are (the thread count, the optimiser's implementation) are offered; and a
step that fails on any rank is rolled back and repeated by every rank together. An FSDP model,
a DDP module whose gradients cannot be averaged by hand as DDP averages them
(:func:`ddp_unfit`), or ranks whose models differ keep the model's own code.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def replica_of(model: Any) -> str:
    """Why ``model`` (a ``torch.nn.Module``) trains as one replica of several ("" if it does not):
    it is, or holds, a ``DistributedDataParallel`` or FSDP module, or this process is one rank of
    a ``torch.distributed`` group of more than one (its gradients may be all-reduced by the
    user's own loop, or by a DDP module built around this one)."""
    import torch
    from torch import nn

    wrappers = (nn.parallel.DistributedDataParallel, *_fsdp_classes())
    for module in model.modules():
        if isinstance(module, wrappers):
            return f"the model holds {type(module).__name__}"
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        if world > 1:
            return f"rank {dist.get_rank()} of a process group of {world}"
    return ""


def coordinable(model: Any) -> str:
    """Why the ranks of this process group cannot explore ``model`` together ("" where they can):
    FSDP (its parameters are shards, gathered and freed around each use), or no
    ``torch.distributed`` group of more than one to agree in."""
    import torch

    for module in model.modules():
        if isinstance(module, _fsdp_classes()):
            return f"the model holds {type(module).__name__}"
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return "no process group of more than one rank"
    if not dist.is_gloo_available():
        return "no gloo backend to agree in"
    return ""


def ddp_unfit(ddp: Any) -> str:
    """Why a ``DistributedDataParallel`` module's gradients cannot be averaged by hand in a
    guarded step as DDP itself averages them ("" where they can): DDP's default reduction is
    each gradient divided by the group's size, then summed (``average_gradients``); a comm
    hook, mixed precision, a static graph, DDP's Python reducer or its ``Join`` do otherwise, and
    a group of other ranks than the whole world would not pair with this one's agreement."""
    import torch

    dist = torch.distributed
    if getattr(ddp, "_comm_hooks", None):
        return "a comm hook"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "mixed precision"
    if getattr(ddp, "static_graph", False):
        return "static_graph"
    if getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False):
        return "the Python reducer"
    join = getattr(ddp, "_join_config", None)
    if join is not None and getattr(join, "enable", False):
        return "Join"
    group = getattr(ddp, "process_group", None)
    if group is not None and dist.get_world_size(group) != dist.get_world_size():
        return f"a process group of {dist.get_world_size(group)} of {dist.get_world_size()} ranks"
    return ""


class PeerStepFailed(RuntimeError):
    """Another rank's step failed under the configuration every rank ran: this rank's step is
    rolled back and repeated with it."""


class ReplicaGroup:
    """The ranks of the default process group exploring one model together, over a gloo group
    of their own: the agreements (a few floats, all-reduced with MAX) and rank 0's decisions
    (broadcast) never pair with a collective of the user's or of DDP's on another group, so a
    rank that failed in its backward while another waits in DDP's all-reduce does not pair one
    with the other (PyTorch's collectives pair by order, per group)."""

    def __init__(self, group: Any, rank: int, world: int) -> None:
        self.group = group
        self.rank = rank
        self.world = world
        self.agreements = 0  # collectives this process ran in the group (a test's count)

    @classmethod
    def join(cls) -> ReplicaGroup:
        """Every rank, at the same step (a collective: ``new_group``)."""
        import torch

        dist = torch.distributed
        group = dist.new_group(backend="gloo")
        return cls(group, dist.get_rank(), dist.get_world_size())

    def agree(self, failed: bool, *values: float) -> tuple[bool, list[float]]:
        """Did any rank fail, and each value's largest over the ranks (NaN where any rank's is
        not a finite number: a step time not measured)."""
        import torch

        dist = torch.distributed
        row = [1.0 if failed else 0.0]
        for v in values:
            known = math.isfinite(v)
            row += [v if known else -math.inf, 0.0 if known else 1.0]
        t = torch.tensor(row, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.agreements += 1
        out = t.tolist()
        return out[0] > 0, [out[1 + 2 * i] if out[2 + 2 * i] == 0 else math.nan for i in range(len(values))]

    def from_rank0(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` as rank 0 ran it, on every rank (its answer broadcast); where it raised on
        rank 0, every rank raises (a ``RuntimeError`` with its message elsewhere)."""
        import torch

        dist = torch.distributed
        box: list[Any] = [None]
        error: Exception | None = None
        if self.rank == 0:
            try:
                box[0] = ("ok", fn())
            except Exception as exc:  # noqa: BLE001 - raised on every rank, below
                error = exc
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=0, group=self.group)
        self.agreements += 1
        if error is not None:
            raise error
        status, value = box[0]
        if status != "ok":
            raise RuntimeError(f"rank 0's explorer: {value}")
        return value


class ReplicatedExplorer:
    """An explorer every rank calls at the same steps (their sessions see the same agreed step
    times, so they reach their reports together): rank 0's own explorer answers, the others
    take its answer. Only rank 0's explorer is ever called (a shared on-disk state is written
    by one process)."""

    def __init__(self, inner: Any, group: ReplicaGroup) -> None:
        self.inner = inner
        self.group = group
        self.core = getattr(inner, "core", None) if group.rank == 0 else None

    def register(self, spec: Any) -> Any:
        return self.group.from_rank0(lambda: self.inner.register(spec))

    def report(self, key: str, report: Any) -> Any:
        return self.group.from_rank0(lambda: self.inner.report(key, report))


class GradSync:
    """The ``DistributedDataParallel`` modules whose own gradient averaging is paused in a
    guarded step (a trial that may fail: its backward must not leave another rank waiting in a
    bucket's all-reduce that this rank never starts), and their gradients averaged by hand at
    the end of each backward instead, once every rank said its backward finished."""

    def __init__(self) -> None:
        self._paused: list[tuple[Any, bool]] = []  # (module, its require_backward_grad_sync)

    def pause(self, ddp: Any) -> None:
        """At the module's call (a forward pre-hook: before its ``_pre_forward`` reads it)."""
        if any(d is ddp for d, _ in self._paused) or ddp_unfit(ddp):
            return
        self._paused.append((ddp, bool(ddp.require_backward_grad_sync)))
        ddp.require_backward_grad_sync = False

    def average(self) -> None:
        for ddp, wanted in self._paused:
            if wanted:
                average_gradients(ddp)

    def resume(self) -> None:
        """The modules' flags as DDP's synced forward would have left them."""
        for ddp, wanted in self._paused:
            ddp.require_backward_grad_sync = wanted
            ddp.require_forward_param_sync = wanted
        self._paused = []


def average_gradients(ddp: Any) -> None:
    """What DDP's reducer does at the end of a backward (no comm hook): every parameter's
    gradient divided by the group's size and summed over the ranks, a rank with no gradient
    for it counting zeros; one that no rank has stays ``None``. One flat all-reduce per dtype
    and device, in the module's parameter order."""
    import torch
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    dist = torch.distributed
    group = ddp.process_group
    world = dist.get_world_size(group)
    params = [p for p in getattr(ddp, "_module_parameters", ddp.parameters()) if p.requires_grad]
    if not params:
        return
    have = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=torch.float64)
    dist.all_reduce(have, group=group)
    by_kind: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for p, n in zip(params, have.tolist(), strict=True):
        if n > 0:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_kind.setdefault((p.dtype, p.device), []).append(p)
    for members in by_kind.values():
        grads = [p.grad for p in members]
        flat = _flatten_dense_tensors(grads).mul_(1.0 / world)  # type: ignore[no-untyped-call]
        dist.all_reduce(flat, group=group)
        for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):  # type: ignore[no-untyped-call]
            assert g is not None
            g.copy_(avg)


def _fsdp_classes() -> tuple[type, ...]:
    """FSDP's module classes where this build has them: the wrapper and ``fully_shard``'s."""
    try:
        from torch.distributed import fsdp
    except Exception:  # noqa: BLE001 - a build without distributed support
        return ()
    return tuple(
        c for c in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None)) if c
    )


def tf_replicas_of(model: Any) -> str:
    """Why a Keras model's variables belong to a ``tf.distribute`` strategy of more than one
    replica ("" where they do not): its ``distribute_strategy`` (the scope it was built under).
    ``AstraTF``'s step is one replica's (its gradients are not all-reduced across the
    strategy's replicas): measured (issue 18, session 38) under ``MultiWorkerMirroredStrategy``
    with two workers, the workers' weights were 0.5 apart after ten steps."""
    strategy = getattr(model, "distribute_strategy", None) or getattr(model, "_distribute_strategy", None)
    replicas = getattr(strategy, "num_replicas_in_sync", 1) if strategy is not None else 1
    if replicas > 1:
        return f"its variables belong to a {type(strategy).__name__} of {replicas} replicas"
    return ""
