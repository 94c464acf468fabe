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

So a replica runs the model's own code (an exploration of no variables, committed at once).
What would explore there safely: one rank deciding, its configuration broadcast to the others
at step boundaries, and a failed trial's repeat agreed by every rank (docs/compiler.md,
"Data-parallel replicas").
"""

from __future__ import annotations

from typing import Any


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
