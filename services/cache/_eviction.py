"""Eviction policies: which chunks leave the cache to make room, as pure decisions.

The ledger (what is cached, its size, dataset, and when it was inserted / last read) and the
consumption tracker (which job has consumed which chunk this epoch) are plain state; a
policy looks at both and answers with a closed ``Admission``. The cache server carries the
decision out. Policies register by name so the server, the benchmark and the tests choose
them the same way.

* ``coordinated`` (Quiver): a chunk leaves only once every job sharing its dataset has
  consumed it this epoch, and a dataset stays within the allocation the manager gave it. A
  chunk nobody needs any more makes room first. With ``bind`` (off by default: measured
  not to pay in issue 21's benchmark, docs/codesign.md) the allocation binds both ways: a
  dataset within its allocation may also take the room another dataset holds beyond its own
  (its chunks the fewest jobs still need first), consumed or not, so that room the manager
  moved to it is not kept by the pins of the dataset it moved from. If nothing may leave,
  the insert is refused (the client then reads that data from the backing store: a cost,
  never a loss).
* ``lru``: the generic cache of the same capacity: always admit, evict least-recently-used.
"""

from __future__ import annotations

import abc
import enum
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field


@dataclass
class Entry:
    key: str
    size: int
    dataset: str
    inserted: int
    last_access: int


class Ledger:
    """What a cache holds, with a logical clock for insertion and access order.

    Recency is kept as an ordered map (coldest first) and bytes per dataset as counters, so
    that touching, adding, removing and finding the coldest entries are O(1) each: a policy
    never has to sort or scan the whole ledger to decide an insert.
    """

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.used = 0
        self._tick = 0
        self._recency: OrderedDict[str, None] = OrderedDict()
        self._by_dataset: dict[str, int] = {}

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def add(self, key: str, size: int, dataset: str) -> None:
        if key in self.entries:
            self.touch(key)
            return
        t = self._next()
        self.entries[key] = Entry(key, size, dataset, t, t)
        self._recency[key] = None
        self.used += size
        self._by_dataset[dataset] = self._by_dataset.get(dataset, 0) + size

    def touch(self, key: str) -> None:
        e = self.entries.get(key)
        if e is not None:
            e.last_access = self._next()
            self._recency.move_to_end(key)

    def remove(self, key: str) -> Entry | None:
        e = self.entries.pop(key, None)
        if e is not None:
            self.used -= e.size
            del self._recency[key]
            left = self._by_dataset[e.dataset] - e.size
            if left:
                self._by_dataset[e.dataset] = left
            else:
                del self._by_dataset[e.dataset]
        return e

    def relabel(self, key: str, dataset: str) -> None:
        """Attribute entry ``key`` to ``dataset`` (a recovered chunk a job has named)."""
        e = self.entries.get(key)
        if e is None or e.dataset == dataset:
            return
        self._by_dataset[e.dataset] -= e.size
        if not self._by_dataset[e.dataset]:
            del self._by_dataset[e.dataset]
        e.dataset = dataset
        self._by_dataset[dataset] = self._by_dataset.get(dataset, 0) + e.size

    def coldest(self) -> Iterator[str]:
        """Keys from least to most recently used (lazily: take only what you need)."""
        return iter(self._recency)

    def used_by(self, dataset: str) -> int:
        return self._by_dataset.get(dataset, 0)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)


@dataclass
class _JobProgress:
    dataset: str
    epoch: int
    consumed: set[str] = field(default_factory=set)
    seen_at: float = 0.0


class ConsumptionTracker:
    """Per job: its dataset, current epoch and the chunks it has fully consumed in it.

    A job silent for longer than ``ttl_s`` no longer holds chunks in the cache (a crashed job
    must not pin the cache forever).
    """

    def __init__(self, ttl_s: float = 60.0) -> None:
        self.ttl_s = ttl_s
        self.jobs: dict[str, _JobProgress] = {}
        # Chunk digest -> the dataset names known to contain it (learned from lookups, inserts
        # and consumption reports): a chunk is pinned by every job on any of them, whichever
        # name inserted it (content, not names).
        self.contains: dict[str, set[str]] = {}
        # Jobs that are alive but do not run now (a scheduler-aware cache lends their pins to
        # the running jobs): their progress no longer pins, but what they have still to read
        # this epoch is evicted last (``wanted_later``).
        self.lent: dict[str, _JobProgress] = {}

    def report(self, job: str, dataset: str, epoch: int, consumed: Iterable[str], now: float) -> None:
        p = self.jobs.get(job)
        if p is None or p.dataset != dataset or epoch != p.epoch:
            p = self.jobs[job] = _JobProgress(dataset, epoch)
        if epoch == p.epoch:
            p.consumed.update(consumed)
        p.seen_at = now

    def forget(self, job: str) -> None:
        self.jobs.pop(job, None)

    def expire(self, now: float, keep: Iterable[str] = ()) -> list[str]:
        """Forget jobs silent past the TTL, but those in ``keep`` (jobs the scheduler says are
        alive but not running: suspended, waiting for their slice, moving)."""
        kept = set(keep)
        gone = [j for j, p in self.jobs.items() if now - p.seen_at > self.ttl_s and j not in kept]
        for j in gone:
            del self.jobs[j]
        return gone

    def jobs_on(self, dataset: str) -> list[str]:
        return sorted(j for j, p in self.jobs.items() if p.dataset == dataset)

    def fully_consumed(self, dataset: str, key: str) -> bool:
        """True when every job on ``dataset``, or on any other dataset known to hold the same
        bytes, has consumed ``key`` this epoch (vacuously true when no job uses them)."""
        names = self.contains.get(key)
        return all(
            key in p.consumed
            for p in self.jobs.values()
            if p.dataset == dataset or (names is not None and p.dataset in names)
        )

    def wanting(self, dataset: str, key: str) -> int:
        """How many jobs pinning ``key`` (as ``fully_consumed`` counts them) still need it."""
        names = self.contains.get(key)
        return sum(
            1
            for p in self.jobs.values()
            if (p.dataset == dataset or (names is not None and p.dataset in names)) and key not in p.consumed
        )

    def in_use(self, dataset: str) -> bool:
        """Some job reads ``dataset``: one that runs, or one that does not run now (lent)."""
        return any(p.dataset == dataset for p in self.jobs.values()) or any(
            p.dataset == dataset for p in self.lent.values()
        )

    def wanted_later(self, dataset: str, key: str) -> bool:
        """True when a job that does not run now (lent) has still to read ``key`` this epoch:
        the chunk is evictable, but a hit waits for it when that job resumes."""
        if not self.lent:
            return False
        names = self.contains.get(key)
        return any(
            key not in p.consumed
            for p in self.lent.values()
            if p.dataset == dataset or (names is not None and p.dataset in names)
        )


class Outcome(enum.Enum):
    ADMIT = "admit"
    PRESENT = "present"
    TOO_LARGE = "too_large"
    OVER_ALLOCATION = "over_allocation"
    NO_EVICTABLE = "no_evictable"


@dataclass(frozen=True)
class Admission:
    """A policy's answer to an insert: admit (after evicting ``victims``) or why not."""

    outcome: Outcome
    victims: tuple[str, ...] = ()
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return self.outcome in (Outcome.ADMIT, Outcome.PRESENT)


class EvictionPolicy(abc.ABC):
    """Decides whether a chunk may enter and which chunks make room for it."""

    name: str = ""

    @abc.abstractmethod
    def admit(
        self,
        ledger: Ledger,
        capacity: int,
        key: str,
        size: int,
        dataset: str,
        consumption: ConsumptionTracker,
        quotas: Mapping[str, int] | None = None,
    ) -> Admission: ...

    def room(
        self,
        ledger: Ledger,
        capacity: int,
        dataset: str,
        consumption: ConsumptionTracker,
        quotas: Mapping[str, int] | None = None,
    ) -> int:
        """Bytes of ``dataset`` chunks that could be admitted now (a hint for clients deciding
        whether to fetch whole chunks)."""
        return capacity


def _evictable(ledger: Ledger, consumption: ConsumptionTracker) -> list[Entry]:
    return [e for e in ledger.entries.values() if consumption.fully_consumed(e.dataset, e.key)]


def _group(quotas: Mapping[str, int] | None, dataset: str) -> frozenset[str]:
    """The dataset names sharing ``dataset``'s bytes (and so its quota), when the quota map
    knows them (``group(name)``); else just ``dataset``."""
    group = getattr(quotas, "group", None)
    return group(dataset) if group is not None else frozenset((dataset,))


def _beyond_allocation(
    ledger: Ledger,
    quotas: Mapping[str, int],
    group: frozenset[str],
    consumption: ConsumptionTracker,
    gone: set[str],
) -> list[Entry]:
    """Chunks other datasets hold beyond their allocation (not counting ``gone``, which leave
    anyway), the fewest-wanted first: the room a dataset within its own may take. A dataset
    the manager does not know has no bound (``quotas`` answers a huge quota for it)."""
    by_group: dict[frozenset[str], list[Entry]] = {}
    for e in ledger.entries.values():
        if e.key not in gone and e.dataset not in group:
            by_group.setdefault(_group(quotas, e.dataset), []).append(e)
    out: list[Entry] = []
    for members, entries in by_group.items():
        over = sum(e.size for e in entries) - min(quotas.get(d, 1 << 62) for d in members)
        if over <= 0:
            continue
        entries.sort(
            key=lambda e: (
                consumption.wanting(e.dataset, e.key),
                consumption.wanted_later(e.dataset, e.key),
                e.inserted,
            )
        )
        for e in entries:
            if over <= 0:
                break
            out.append(e)
            over -= e.size
    return out


def _precheck(ledger: Ledger, capacity: int, key: str, size: int) -> Admission | None:
    if key in ledger:
        return Admission(Outcome.PRESENT)
    if size > capacity:
        return Admission(Outcome.TOO_LARGE, reason=f"chunk of {size} B exceeds capacity {capacity} B")
    return None


class LRUPolicy(EvictionPolicy):
    """Least recently used: always admit, evict the coldest chunks until the new one fits."""

    name = "lru"

    def admit(self, ledger, capacity, key, size, dataset, consumption, quotas=None):  # type: ignore[no-untyped-def]
        pre = _precheck(ledger, capacity, key, size)
        if pre:
            return pre
        need = ledger.used + size - capacity
        victims: list[str] = []
        if need > 0:
            for k in ledger.coldest():  # O(victims), not a sort of the ledger
                victims.append(k)
                need -= ledger.entries[k].size
                if need <= 0:
                    break
        return Admission(Outcome.ADMIT, tuple(victims))


class CoordinatedPolicy(EvictionPolicy):
    """Quiver: evict only chunks every sharing job has consumed this epoch; honour quotas.
    ``bind``: a dataset within its allocation may take what others hold beyond theirs."""

    name = "coordinated"

    def __init__(self, bind: bool = False) -> None:
        self.bind = bind

    def admit(self, ledger, capacity, key, size, dataset, consumption, quotas=None):  # type: ignore[no-untyped-def]
        pre = _precheck(ledger, capacity, key, size)
        if pre:
            return pre
        quota = None if quotas is None else quotas.get(dataset, 0)
        group = _group(quotas, dataset)
        own_used = sum(ledger.used_by(d) for d in group)
        # Chunks that may leave: no job needs them again this epoch. Those of datasets nobody
        # uses go first, then the longest-consumed (earliest inserted) ones; of those, the ones
        # a suspended job (lent: not pinning) has still to read this epoch go last.
        evictable = _evictable(ledger, consumption)
        evictable.sort(
            key=lambda e: (
                consumption.in_use(e.dataset),
                consumption.wanted_later(e.dataset, e.key),
                e.inserted,
            )
        )
        victims: list[str] = []
        freed = 0
        own_freed = 0
        if quota is not None and own_used + size > quota:
            # Over its allocation the dataset can only replace its own consumed chunks.
            for e in evictable:
                if own_used - own_freed + size <= quota:
                    break
                if e.dataset in group:
                    victims.append(e.key)
                    own_freed += e.size
                    freed += e.size
            if own_used - own_freed + size > quota:
                return Admission(
                    Outcome.OVER_ALLOCATION,
                    reason=f"dataset {dataset!r} holds {own_used} B of its {quota} B allocation "
                    "and none of it is consumed by every job yet",
                )
        for e in evictable:
            if ledger.used - freed + size <= capacity:
                break
            if e.key not in victims:
                victims.append(e.key)
                freed += e.size
        if ledger.used - freed + size > capacity and quotas is not None and self.bind:
            # Within its allocation (checked above): what others hold beyond theirs is its room.
            for e in _beyond_allocation(ledger, quotas, group, consumption, set(victims)):
                if ledger.used - freed + size <= capacity:
                    break
                victims.append(e.key)
                freed += e.size
        if ledger.used - freed + size > capacity:
            return Admission(
                Outcome.NO_EVICTABLE,
                reason="cache full of chunks some sharing job has not consumed this epoch",
            )
        return Admission(Outcome.ADMIT, tuple(victims))

    def room(self, ledger, capacity, dataset, consumption, quotas=None):  # type: ignore[no-untyped-def]
        evictable = _evictable(ledger, consumption)
        room = capacity - ledger.used + sum(e.size for e in evictable)
        if quotas is not None:
            group = _group(quotas, dataset)
            gone = {e.key for e in evictable}
            room += (
                0
                if not self.bind
                else sum(e.size for e in _beyond_allocation(ledger, quotas, group, consumption, gone))
            )
            own_evictable = sum(e.size for e in evictable if e.dataset in group)
            own_used = sum(ledger.used_by(d) for d in group)
            room = min(room, quotas.get(dataset, 0) - own_used + own_evictable)
        return max(0, room)


POLICIES: dict[str, type[EvictionPolicy]] = {p.name: p for p in (CoordinatedPolicy, LRUPolicy)}


def make_policy(name: str) -> EvictionPolicy:
    """The eviction policy registered as ``name`` (``coordinated`` or ``lru``)."""
    try:
        return POLICIES[name]()
    except KeyError:
        from microco.common.errors import InvalidArgument

        raise InvalidArgument(f"unknown eviction policy {name!r}; known: {sorted(POLICIES)}") from None
