"""Substitutable hits exchanged between the data-parallel ranks of one job.

With a static split (``SubstitutableSampler(num_replicas=, rank=)``) a rank substitutes only
within its own share: a rank whose window holds few cached samples reads misses while another
rank leaves hits unused. ``ExchangeSampler`` lets the ranks trade: in every step each rank looks
up its window, the ranks all-gather which of their candidates are cached (one small collective
per step, beside DDP's gradient all-reduce), and every rank then runs the same deterministic
assignment on the same gathered answers: each rank takes its own hits first, hits a rank cannot
use this step go to ranks short of hits, and what is still missing is filled with each rank's
oldest misses (from another rank's unseen samples, from the back, when its own run out). Every
rank keeps every rank's unseen list, and changes them all alike, so a sample taken by one rank
is gone from all: every sample exactly once per epoch, whatever each rank's cache answers, and
no central arbiter (nothing in Redis to lose).

Every rank takes the same number of steps per epoch (what DDP needs): full batches, with the
last step's samples spread so that each rank gets at least one (one sample is moved from a
rank's second-to-last batch when there are fewer left than ranks). Pure (no I/O): the
collective is ``Exchange.all_gather``: ``TorchExchange`` (``torch.distributed``), or
``ThreadExchange`` for ranks that are threads of one process.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._sampler import Batch, BatchMode, IsCached


class Exchange(Protocol):
    """A collective over the ranks of one job."""

    world_size: int
    rank: int

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, by rank; every rank must call it the same number of times."""
        ...


class ThreadExchange:
    """The collective for ranks that are threads of one process: ``ThreadExchange(world)`` is
    shared, ``.member(rank)`` is what rank ``rank`` passes."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[Any] = [None] * world_size
        self._barrier = threading.Barrier(world_size)

    def member(self, rank: int) -> _ThreadMember:
        return _ThreadMember(self, rank)


class _ThreadMember:
    def __init__(self, group: ThreadExchange, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_gather(self, obj: Any) -> list[Any]:
        g = self.group
        g._slots[self.rank] = obj
        g._barrier.wait()
        out = list(g._slots)
        g._barrier.wait()  # nobody overwrites a slot before everyone has read it
        return out


class TorchExchange:
    """The collective over an initialised ``torch.distributed`` process group. By default its
    own gloo group (made here, so every rank must construct it at the same point): the loader's
    reader thread runs the exchange, which must not interleave with the training step's
    collectives on the default group."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if group is None:
            group = dist.new_group(backend="gloo")
        self._dist, self._group = dist, group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out


def step_sizes(num_samples: int, batch_size: int, world: int, drop_last: bool = False) -> list[list[int]]:
    """Samples each rank takes in each step: ``sizes[step][rank]``. Full batches; the last step's
    remainder spread so that every rank has the same number of steps (none empty)."""
    b, w = batch_size, world
    if drop_last:
        return [[b] * w for _ in range(num_samples // (w * b))]
    if num_samples == 0:
        return []
    steps = -(-num_samples // (w * b))
    sizes = [[b] * w for _ in range(steps - 1)]
    last = num_samples - (steps - 1) * w * b
    if last < w:  # fewer than one each: borrow one from some ranks' previous batch
        if steps < 2 or b < 2:
            raise ValueError(f"{num_samples} samples cannot give {w} ranks equal steps of batch {b}")
        for q in range(w - last):
            sizes[-1][q] -= 1
        last = w
    sizes.append([last // w + (1 if q < last % w else 0) for q in range(w)])
    return sizes


def check_resumable(remaining: int, batch_size: int, world: int, drop_last: bool, epoch: int) -> None:
    """Refuses, clearly, to resume ``epoch`` with ``remaining`` samples on ``world`` ranks when
    they cannot each get an equal, non-empty step (an empty batch on one rank would average a
    NaN loss into every rank's gradients)."""
    try:
        step_sizes(remaining, batch_size, world, drop_last)
    except ValueError:
        raise ValueError(
            f"only {remaining} sample(s) of epoch {epoch} left: too few to "
            f"give {world} ranks an equal, non-empty step each (batch {batch_size}): resume this "
            f"epoch with at most {remaining} ranks, or with drop_last"
        ) from None


class ExchangeSampler:
    """Like ``SubstitutableSampler(num_replicas=, rank=)``, with hits exchanged between ranks.

    Every rank builds the same epoch order (same seed) and starts from the same split; each
    call to ``next_batch`` is a step of all ranks together (a collective)."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        exchange: Exchange,
        *,
        seed: int = 0,
        substitution: int = 10,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if num_samples < 0 or batch_size <= 0 or substitution < 1:
            raise ValueError("need num_samples >= 0, batch_size > 0, substitution >= 1")
        self.exchange = exchange
        self.num_replicas, self.rank = exchange.world_size, exchange.rank
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.substitution = substitution
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = -1
        self._pending: list[list[int]] = []
        # (Refuses now a dataset too small to give every rank equal steps.)
        self._sizes: list[list[int]] = step_sizes(num_samples, batch_size, self.num_replicas, drop_last)
        self._step = 0
        #: Every rank's samples in the last step (the whole job's progress, by rank).
        self.last_taken: list[list[int]] = []

    def _begin(self, epoch: int, pending: list[list[int]], remaining: int) -> None:
        self.epoch = epoch
        self._pending = pending
        self._sizes = step_sizes(remaining, self.batch_size, self.num_replicas, self.drop_last)
        self._step = 0
        self.last_taken = []

    def start_epoch(self, epoch: int) -> None:
        order = list(range(self.num_samples))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        w = self.num_replicas
        self._begin(epoch, [order[q::w] for q in range(w)], self.num_samples)

    @property
    def shard_size(self) -> int:
        """Samples this rank sees in the epoch (from its start or its restore)."""
        return sum(s[self.rank] for s in self._sizes)

    @property
    def steps(self) -> int:
        """Steps (batches) every rank takes in the epoch."""
        return len(self._sizes)

    @property
    def remaining(self) -> int:
        return sum(s[self.rank] for s in self._sizes[self._step :])

    def unseen(self) -> list[int]:
        """Every rank's samples not yet taken this epoch (the job's, not this rank's: with
        exchange a sample belongs to no rank until taken)."""
        return [i for p in self._pending for i in p]

    def restore(self, epoch: int, seen: Sequence[int], base: Sequence[int] = ()) -> None:
        """Resume ``epoch`` after a restart: a collective; ``seen`` is what this rank had been
        given, ``base`` what the whole job had been given before (the same on every rank: a
        job-wide position, after which the number of ranks may differ from the checkpoint's).
        The samples no rank has seen are split again and the steps recounted."""
        gathered = self.exchange.all_gather((epoch, sorted(seen), sorted(base)))
        if {e for e, _, _ in gathered} != {epoch}:
            raise ValueError(f"ranks resume different epochs: {sorted({e for e, _, _ in gathered})}")
        if len({tuple(b) for _, _, b in gathered}) != 1:
            raise ValueError("ranks resume from different positions of the job")
        done = set(base)
        for _, s, _ in gathered:
            if done.intersection(s):
                raise ValueError("a sample was given twice in the positions resumed")
            done.update(s)
        if any(not 0 <= i < self.num_samples for i in done):
            raise ValueError("seen samples out of range")
        remaining = self.num_samples - len(done)
        check_resumable(remaining, self.batch_size, self.num_replicas, self.drop_last, epoch)
        self.start_epoch(epoch)
        pending = [[i for i in p if i not in done] for p in self._pending]
        self._begin(epoch, pending, sum(map(len, pending)))

    def next_batch(
        self,
        is_cached: IsCached,
        mode: BatchMode = BatchMode.PREFER_HITS,
        hit_order: Callable[[int], float] | None = None,
        miss_rank: Callable[[int], int] | None = None,
    ) -> Batch | None:
        """This rank's next mini-batch, or None when the epoch is over (for every rank alike).

        ``miss_rank(i)``: the rank that should read sample ``i`` when it is a miss, or -1 for
        any (the same answers on every rank); misses are handed to it first, from any rank's
        window. The loader passes the rank that fetches ``i``'s chunk whole while it is
        untouched, so a chunk's missed samples meet in one rank's batch."""
        if self.epoch < 0:
            raise RuntimeError("call start_epoch() first")
        if self._step >= len(self._sizes):
            self.last_taken = []
            return None
        want = self._sizes[self._step]
        self._step += 1
        w, r = self.num_replicas, self.rank
        windows = [p[: want[q] * self.substitution] for q, p in enumerate(self._pending)]
        mine = windows[r]
        cached = set(is_cached(mine)) & set(mine)
        hits = [i for i in mine if i in cached]
        if hit_order is not None:
            hits.sort(key=hit_order)
        gathered = self.exchange.all_gather(hits)
        # From here on every rank computes the same thing from the same data.
        hits_of = []
        for q in range(w):
            in_window = set(windows[q])
            seen_q: set[int] = set()
            hq = []
            for i in gathered[q]:
                if i in in_window and i not in seen_q:
                    seen_q.add(i)
                    hq.append(i)
            hits_of.append(hq)
        all_hits = {i for hq in hits_of for i in hq}
        taken: set[int] = set()
        takes: list[list[int]] = [[] for _ in range(w)]

        def give(q: int, items: Sequence[int]) -> None:
            for i in items:
                if len(takes[q]) >= want[q]:
                    return
                if i not in taken:
                    taken.add(i)
                    takes[q].append(i)

        misses_of = [[i for i in windows[q] if i not in all_hits] for q in range(w)]

        def give_misses() -> None:
            if miss_rank is not None:
                # A chunk no rank has touched is read whole by one rank only if its missed
                # samples in this step all go to that rank: each rank first takes the misses it
                # fetches, then misses of touched chunks (any rank's), and another rank's only
                # when none of those is left (a chunk split between ranks is read sample by
                # sample: not cached this epoch).
                pool = [i for q in range(w) for i in misses_of[q]]
                rank_of = {i: miss_rank(i) for i in pool}
                for q in range(w):
                    give(q, [i for i in pool if rank_of[i] == q])
                for q in range(w):
                    give(q, [i for i in misses_of[q] if rank_of[i] < 0])
                for q in range(w):
                    give(q, [i for i in pool if rank_of[i] < 0])
            for q in range(w):
                give(q, misses_of[q])

        if mode is BatchMode.MISSES_ONLY:  # probe: misses first, no trading of hits
            give_misses()
            for q in range(w):
                give(q, hits_of[q])
        else:
            for q in range(w):
                give(q, hits_of[q])
            surplus = [i for q in range(w) for i in hits_of[q] if i not in taken]
            for q in range(w):  # hits a rank cannot use go to ranks short of them
                give(q, surplus)
                surplus = [i for i in surplus if i not in taken]
            give_misses()
        left = [want[q] - len(takes[q]) for q in range(w)]
        if any(left):  # a rank's own unseen samples ran out: the oldest misses of others'
            for q in range(w):
                while len(takes[q]) < want[q]:
                    p = max(
                        range(w),
                        key=lambda x: (
                            sum(1 for i in self._pending[x] if i not in taken) - self._left(x),
                            -x,
                        ),
                    )
                    back = [i for i in reversed(self._pending[p]) if i not in taken]
                    if not back:
                        raise RuntimeError("exchange sampler out of samples (ranks out of step?)")
                    give(q, back[: want[q] - len(takes[q])])
        # Every rank's unseen list, alike on every rank: unused hits stay in front, the rest of
        # the epoch follows, unused misses go to the back.
        for q in range(w):
            win = windows[q]
            was_hit = set(hits_of[q])
            self._pending[q] = (
                [i for i in win if i in was_hit and i not in taken]
                + [i for i in self._pending[q][len(win) :] if i not in taken]
                + [i for i in win if i not in was_hit and i not in taken]
            )
        self.last_taken = takes
        return Batch(tuple(takes[r]), frozenset(i for i in takes[r] if i in all_hits), mode)

    def _left(self, q: int) -> int:
        """Samples rank ``q`` still takes after this step."""
        return sum(s[q] for s in self._sizes[self._step :])

    def batches(self, is_cached: IsCached) -> list[Batch]:
        out = []
        while (batch := self.next_batch(is_cached)) is not None:
            out.append(batch)
        return out
