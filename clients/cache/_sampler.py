"""Substitutable hits: the pure core of Quiver's sampler.

Within an epoch every unseen sample is as good as any other. For each mini-batch the sampler
offers ``substitution * batch_size`` candidates from the front of the epoch's random order,
takes the ones the cache holds, and moves the misses to the back of the epoch (by then they
may have been prefetched). Only when fewer than a batch of candidates are cached is the batch
filled with misses, oldest first. Every sample appears exactly once per epoch whatever the
cache answers; this module has no I/O and is tested under arbitrary cache states.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

IsCached = Callable[[Sequence[int]], "set[int] | frozenset[int]"]


class BatchMode(enum.Enum):
    """How a batch is chosen: prefer hits (normal), or a probe batch of only misses / hits."""

    PREFER_HITS = "prefer_hits"
    MISSES_ONLY = "misses_only"
    HITS_ONLY = "hits_only"


@dataclass(frozen=True)
class Batch:
    """One mini-batch: sample indices, and which of them the cache said it holds."""

    indices: tuple[int, ...]
    hits: frozenset[int]
    mode: BatchMode = BatchMode.PREFER_HITS

    @property
    def hit_fraction(self) -> float:
        return len(self.hits) / len(self.indices) if self.indices else 0.0


class SubstitutableSampler:
    """Epoch-by-epoch choice of mini-batches with substitutable cache hits.

    ``is_cached(candidates)`` returns the subset the cache can serve now; it may answer
    anything, and differently every call. ``drop_last`` drops a final short batch (its samples
    are then *not* seen, as with PyTorch's ``drop_last``).

    Data-parallel training: ``num_replicas`` ranks each build the same epoch order (same seed)
    and rank ``rank`` takes every ``num_replicas``-th sample of it, so across ranks every sample
    is seen exactly once per epoch; substitution then happens within a rank's share. Shares
    differ by at most one sample (no padding: padding would repeat samples), so one rank may
    have one batch more; use ``drop_last`` or ``torch.distributed.algorithms.Join`` for that.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        seed: int = 0,
        substitution: int = 10,
        shuffle: bool = True,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if num_samples < 0 or batch_size <= 0 or substitution < 1:
            raise ValueError("need num_samples >= 0, batch_size > 0, substitution >= 1")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"need num_replicas >= 1 and 0 <= rank < num_replicas (got {rank}/{num_replicas})"
            )
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.substitution = substitution
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = -1
        self._pending: list[int] = []
        self._shard = len(range(rank, num_samples, num_replicas))

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.num_samples))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: every sample is unseen again, in a fresh order from (seed, epoch)."""
        self.epoch = epoch
        self._pending = self._order(epoch)[self.rank :: self.num_replicas]
        self._shard = len(self._pending)

    def resplit(self, epoch: int, seen_by_job: Sequence[int] | set[int]) -> None:
        """Resume ``epoch`` with this sampler's number of ranks after the job had been given
        ``seen_by_job`` (by any number of ranks): the samples nobody has seen, in the epoch's
        order, are split again, every ``num_replicas``-th to each rank. Every rank must pass the
        same set; this rank's share is then what it sees of the epoch (``shard_size``)."""
        done = set(seen_by_job)
        if any(not 0 <= i < self.num_samples for i in done):
            raise ValueError("seen samples out of range")
        self.epoch = epoch
        self._pending = [i for i in self._order(epoch) if i not in done][self.rank :: self.num_replicas]
        self._shard = len(self._pending)

    @property
    def shard_size(self) -> int:
        """Samples this rank sees in the epoch (from its start, or from a ``resplit``)."""
        return self._shard

    @property
    def remaining(self) -> int:
        """Samples not yet handed out this epoch."""
        return len(self._pending)

    def unseen(self) -> list[int]:
        """The epoch's unseen samples, in the order they would be offered."""
        return list(self._pending)

    def restore(self, epoch: int, unseen: Sequence[int]) -> None:
        """Resume an epoch from a saved unseen list (a suspended job continues exactly)."""
        if len(set(unseen)) != len(unseen) or any(not 0 <= i < self.num_samples for i in unseen):
            raise ValueError("unseen list is not a set of sample indices")
        self.epoch = epoch
        self._pending = list(unseen)

    def next_batch(
        self,
        is_cached: IsCached,
        mode: BatchMode = BatchMode.PREFER_HITS,
        hit_order: Callable[[int], float] | None = None,
        miss_order: Callable[[int], float] | None = None,
    ) -> Batch | None:
        """The next mini-batch, or None when the epoch is over.

        ``hit_order(i)`` ranks the window's hits (lowest first); the loader passes how many
        samples of ``i``'s chunk are still unread, so chunks finish early and free room.
        ``miss_order(i)`` ranks its misses likewise (ties oldest first); the loader ranks
        those another job is reading into the cache now last."""
        if self.epoch < 0:
            raise RuntimeError("call start_epoch() first")
        b = self.batch_size
        if not self._pending or (self.drop_last and len(self._pending) < b):
            return None
        window = self._pending[: b * self.substitution]
        cached = set(is_cached(window)) & set(window)
        hits = [i for i in window if i in cached]
        misses = [i for i in window if i not in cached]
        if hit_order is not None:
            hits.sort(key=hit_order)  # stable: ties keep the epoch's random order
        if miss_order is not None:
            misses.sort(key=miss_order)
        if mode is BatchMode.MISSES_ONLY:
            chosen = misses[:b] + hits[: max(0, b - len(misses))]
        elif mode is BatchMode.HITS_ONLY:
            chosen = hits[:b] + misses[: max(0, b - len(hits))]
        else:
            # Hits first; the oldest deferred misses fill what the cache cannot.
            chosen = hits[:b] + misses[: max(0, b - len(hits))]
        taken = set(chosen)
        # Unused hits stay in front for the next batch; unused misses go to the back of the
        # epoch, by when they may have been prefetched (or are the final misses).
        self._pending = (
            [i for i in hits if i not in taken]
            + self._pending[len(window) :]
            + [i for i in misses if i not in taken]
        )
        return Batch(tuple(chosen), frozenset(cached & taken), mode)

    def batches(self, is_cached: IsCached) -> list[Batch]:
        """All the remaining batches of the epoch (for tests and simulations)."""
        out = []
        while (batch := self.next_batch(is_cached)) is not None:
            out.append(batch)
        return out
