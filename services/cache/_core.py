"""The cache server's core: chunk store + eviction policy + allocation + directory.

No gRPC here: the servicer is a thin adapter over ``CacheCore``, and tests drive the core
directly. Everything the core decides comes from the pure policies in ``_eviction`` and
``_allocation``; the core owns the clock, the disk and the locks.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from microco.clients.cache import RedisDirectory, digest, directory_locator, is_digest
from microco.common.errors import InvalidArgument, NotFound

from ._allocation import Allocation, JobDemand, allocate, estimate_benefit
from ._chunkstore import ChunkStore, DigestMismatch
from ._claims import MAX_WAIT_S, Claims
from ._eviction import ConsumptionTracker, EvictionPolicy, Ledger, Outcome, _JobProgress, make_policy
from ._transient import Transient

log = logging.getLogger(__name__)


@dataclass
class _JobInfo:
    dataset: str
    user: str = ""
    batch_bytes: int = 0
    timings: deque = field(default_factory=lambda: deque(maxlen=256))
    miss_read_s: float = 0.0  # the loader's latest read of one all-miss batch


@dataclass
class Counters:
    """Hits and misses are samples as reported by jobs; bytes_served is what this server sent."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    corrupt_dropped: int = 0
    rejected: int = 0
    bytes_served: int = 0


@dataclass
class JobCounters:
    """One job's cumulative counters on this server (hits and misses as the job reported them)."""

    dataset: str = ""
    hits: int = 0
    misses: int = 0
    bytes_served: int = 0


# Chunk digests whose dataset membership is remembered; past this, those not held are forgotten.
MAX_MEMBERSHIP = 1 << 20

# Per-job counters kept, most recently active first out: finished jobs keep theirs (a plot of a
# job that just ended must not lose its last points) but the map stays bounded.
MAX_JOB_COUNTERS = 1024


@dataclass(frozen=True)
class LookupResult:
    """A lookup's answer: chunks held, chunks another job is reading whole from the backing
    store now (claimed, not yet inserted), and the claims this call was granted."""

    present: list[str]
    in_flight: list[str]
    claimed: list[str]


# Lookups waiting for chunks in flight at once, at most (each holds a server thread); past
# this a lookup answers at once and its job reads the chunk itself.
MAX_WAITERS = 4


@dataclass(frozen=True)
class PutResult:
    digest: str
    outcome: str  # "stored", "present", or a rejection reason
    detail: str = ""


class CacheCore:
    """One cache server's state and decisions."""

    def __init__(
        self,
        store: ChunkStore,
        capacity_bytes: int,
        policy: EvictionPolicy | str = "coordinated",
        directory: RedisDirectory | None = None,
        node: str = "",
        clock: Callable[[], float] = time.monotonic,
        job_ttl_s: float = 60.0,
        probe_bytes: int = 64 << 20,
        shared_link: bool = False,
        bind_allocation: bool = False,
    ) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgument("cache capacity must be positive")
        self.store = store
        self.capacity = capacity_bytes
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        if bind_allocation:  # (coordinated: a dataset within its allocation takes others' excess)
            self.policy.bind = True  # type: ignore[attr-defined]
        self.directory = directory
        self.node = node
        self.clock = clock
        self.probe_bytes = probe_bytes
        self.shared_link = shared_link  # a job's misses priced by what they cost the others too
        self.counters = Counters(corrupt_dropped=store.dropped_on_start)
        self.job_counters: OrderedDict[str, JobCounters] = OrderedDict()
        self._lock = threading.RLock()
        # In-flight claims (``_claims``): a put, a release or a forgotten holder wakes waiters.
        self.claims = Claims()
        self._claims_changed = threading.Condition(self._lock)
        self._waiters = 0
        self.max_wait_s = MAX_WAIT_S  # longest a lookup waits for chunks in flight
        # Claimed chunks the cache refused, kept briefly (bounded) for the jobs waiting on them.
        self.transient = Transient()
        self.ledger = Ledger()
        self.consumption = ConsumptionTracker(ttl_s=job_ttl_s)
        self.jobs: dict[str, _JobInfo] = {}
        self.dataset_bytes: dict[str, int] = {}
        self.allocations: list[Allocation] = []
        # Jobs the scheduler says are alive but not running (suspended, waiting for their time
        # slice, moving): silent, yet their pins and allocation stay (see _follow).
        self.held: set[str] = set()
        # Suspended jobs' progress, set aside: while a job does not run, the chunks only it still
        # needs are lent to the jobs that run (evictable); its progress comes back on resume.
        self._lent: dict[str, _JobProgress] = self.consumption.lent  # (evicted last: _eviction)
        # Jobs the scheduler moved to another host (``forget_job(moved=True)``), until they
        # arrive here again: what they still report here (late) is ignored.
        self._away: OrderedDict[str, None] = OrderedDict()
        # Union-find over dataset names that share bytes: one content group, one allocation.
        self._parent: dict[str, str] = {}
        self._members_of: dict[str, frozenset[str]] = {}  # allocation label -> dataset names
        for d, size in sorted(store.digests().items()):
            # Recovered chunks belong to no known dataset until a job names it: they go first.
            self.ledger.add(d, size, "")
        self._shrink_to_capacity()
        if directory is not None:
            directory.withdraw()
            directory.add(self.ledger.entries)

    # -- reads
    def lookup(self, digests: Sequence[str], dataset: str = "") -> list[str]:
        with self._lock:
            self._learn(digests, dataset)
            self.transient.expire(self.clock())
            return [d for d in digests if d in self.ledger or d in self.transient]

    def lookup_claim(
        self,
        digests: Sequence[str],
        dataset: str = "",
        job: str = "",
        claim: Sequence[str] = (),
        lease_s: float = 0.0,
        wait_s: float = 0.0,
    ) -> LookupResult:
        """``lookup`` that also claims ``claim`` for ``job`` (the chunks it is about to read
        whole from the backing store; held ones are not claimed) and, with ``wait_s``, waits
        up to that long (at most ``max_wait_s``) for those of ``digests`` another job has in
        flight to be put (or their claims to end)."""
        deadline = time.monotonic() + min(max(0.0, wait_s), self.max_wait_s)
        with self._lock:
            self._learn(digests, dataset)
            self._learn(claim, dataset)
            now = self.clock()
            self.claims.expire(now)
            self.transient.expire(now)
            wanted = [d for d in claim if is_digest(d) and d not in self.ledger and d not in self.transient]
            claimed = self.claims.claim(wanted, job, now, lease_s)
            if wait_s > 0 and self._waiters < MAX_WAITERS:
                self._waiters += 1
                try:
                    while True:
                        now = self.clock()
                        # (A chunk in the ledger may still be being written: wait for its put.)
                        pending = self.claims.in_flight(digests, job, now)
                        left = deadline - time.monotonic()
                        if not pending or left <= 0:
                            break
                        lease_end = min(self.claims.until(d) or now for d in pending) - now
                        self._claims_changed.wait(max(0.001, min(left, lease_end)))
                finally:
                    self._waiters -= 1
            now = self.clock()
            self.transient.expire(now)
            present = [d for d in digests if d in self.ledger or d in self.transient]
            in_flight = [
                d
                for d in self.claims.in_flight(digests, job, now)
                if d not in self.ledger and d not in self.transient
            ]
            return LookupResult(present, in_flight, claimed)

    def _release(self, digests: Iterable[str]) -> None:
        """End the claims on ``digests`` and wake the lookups waiting for them."""
        with self._lock:
            if self.claims.release(digests):
                self._claims_changed.notify_all()

    def _forget_claims(self, jobs: Iterable[str]) -> None:
        """Call with the lock held."""
        if self.claims.forget(jobs):
            self._claims_changed.notify_all()

    # -- content: which dataset names hold which bytes
    def _find(self, ds: str) -> str:
        root = ds
        while self._parent.get(root, root) != root:
            root = self._parent[root]
        while ds != root:  # path compression
            self._parent[ds], ds = root, self._parent.get(ds, ds)
        return root

    def _learn(self, digests: Iterable[str], dataset: str) -> None:
        """Record that ``dataset`` contains ``digests``; names sharing a digest join one
        content group. Call with the lock held."""
        if not dataset:
            return
        contains = self.consumption.contains
        for d in digests:
            names = contains.get(d)
            if names is None:
                if len(contains) >= MAX_MEMBERSHIP:
                    for k in [k for k in contains if k not in self.ledger]:
                        del contains[k]
                contains[d] = {dataset}
            elif dataset not in names:
                a, b = self._find(next(iter(names))), self._find(dataset)
                if a != b:
                    self._parent[max(a, b)] = min(a, b)
                names.add(dataset)

    def known_in(self, digests: Iterable[str], dataset: str) -> list[bool]:
        """Whether each digest is known to belong to ``dataset`` (named with it by a call)."""
        with self._lock:
            contains = self.consumption.contains
            return [dataset in contains.get(d, ()) for d in digests]

    def room(self, dataset: str) -> int:
        """Bytes of ``dataset`` the cache could admit now (free, evictable, within quota)."""
        with self._lock:
            return self.policy.room(self.ledger, self.capacity, dataset, self.consumption, self._quotas())

    def _job(self, job: str, dataset: str = "") -> JobCounters:
        """``job``'s counters (created on first use); call with the lock held."""
        c = self.job_counters.get(job)
        if c is None:
            c = self.job_counters[job] = JobCounters()
            while len(self.job_counters) > MAX_JOB_COUNTERS:
                self.job_counters.popitem(last=False)
        else:
            self.job_counters.move_to_end(job)
        if dataset:
            c.dataset = dataset
        return c

    def read_samples(
        self, reads: Sequence[tuple[str, int, int, str]], job: str = ""
    ) -> Iterator[tuple[int, bytes | None]]:
        """(chunk, offset, length, sample digest) -> (position, bytes or None when missing).
        Bytes served are counted for the server and, when named, for ``job``.

        Each sample is hashed before it leaves: a flipped byte is caught here, the chunk
        dropped (so that it will be fetched again) and the sample reported missing."""
        for pos, (chunk, offset, length, sample_digest) in enumerate(reads):
            with self._lock:
                e = self.ledger.entries.get(chunk)
                # A range outside the chunk cannot be a sample of it: a miss, and no read
                # (nor allocation) of the length asked for.
                held = e is not None and offset >= 0 and 0 <= length and offset + length <= e.size
                if held:
                    self.ledger.touch(chunk)
                    kept = None
                else:
                    kept = self.transient.get(chunk, self.clock())
            data = None
            if kept is not None:
                part = kept[offset : offset + length] if 0 <= offset and 0 <= length else b""
                if len(part) == length and digest(part) == sample_digest:
                    data = part
            elif held:
                try:
                    data = self.store.read(chunk, offset, length)
                except (NotFound, OSError):  # vanished underneath us: a miss
                    data = None
                if data is not None and (len(data) != length or digest(data) != sample_digest):
                    self.drop_corrupt(chunk)
                    data = None
            if data is not None:
                with self._lock:
                    self.counters.bytes_served += len(data)
                    if job:
                        self._job(job).bytes_served += len(data)
            yield pos, data

    def read_chunks(self, digests: Sequence[str], job: str = "") -> Iterator[tuple[str, bytes | None]]:
        for d in digests:
            with self._lock:
                held = d in self.ledger
                kept = None if held else self.transient.get(d, self.clock())
            data = kept
            if kept is None and held:
                if self.store.verify(d):
                    data = self.store.read(d)
                else:
                    self._forget(d, corrupt=True)
            if data is not None:
                with self._lock:
                    self.counters.bytes_served += len(data)
                    if job:
                        self._job(job).bytes_served += len(data)
            yield d, data

    def open_chunks(self, digests: Sequence[str]) -> list[tuple[str, str, int]]:
        """Grants for same-host direct reads: (digest, path, size) of those held."""
        with self._lock:
            out = []
            for d in digests:
                if d in self.ledger:
                    self.ledger.touch(d)
                    out.append((d, self.store.path(d), self.ledger.entries[d].size))
            return out

    def drop_corrupt(self, d: str) -> bool:
        """Re-verify chunk ``d``; drop it if it does not match. True when dropped."""
        if not is_digest(d):
            raise InvalidArgument("malformed digest")
        if d not in self.store:
            return False
        if self.store.verify(d):
            return False
        self._forget(d, corrupt=True)
        return True

    def _forget(self, d: str, corrupt: bool = False) -> None:
        with self._lock:
            self.ledger.remove(d)
            self.store.drop(d)
            if corrupt:
                self.counters.corrupt_dropped += 1
                log.warning("dropped corrupt chunk", extra={"locator": self.store.path(d)[-12:]})
        if self.directory is not None:
            self.directory.remove([d])

    # -- writes
    def put(self, d: str, data: bytes, dataset: str) -> PutResult:
        if not is_digest(d):
            return PutResult(d, "malformed_digest", "digest must be 64 lower-case hex digits")
        # Verify before anything is evicted for it: bytes that are not what they claim must
        # not push anyone's data out.
        if digest(data) != d:
            with self._lock:
                self.counters.rejected += 1
            return PutResult(d, "digest_mismatch", f"bytes do not match digest {d[:12]}...")
        with self._lock:
            self._learn((d,), dataset)
            quotas = self._quotas()
            adm = self.policy.admit(
                self.ledger, self.capacity, d, len(data), dataset, self.consumption, quotas
            )
            if adm.outcome is Outcome.PRESENT:
                self.ledger.touch(d)
                self.transient.drop(d)
                self._release((d,))
                return PutResult(d, "present")
            if not adm.admitted:
                self.counters.rejected += 1
                now = self.clock()
                if self.claims.holder(d, now) is not None:
                    # Jobs may be waiting on its claim: keep it for them briefly, outside the
                    # allocation (``_transient``), so that none reads it from the backing store.
                    self.transient.keep(d, data, now)
                self._release((d,))
                return PutResult(d, adm.outcome.value, adm.reason)
            # Reserve the room now so that concurrent puts see it taken.
            for v in adm.victims:
                log.debug("evict %s", directory_locator(v)[:12])
                self.ledger.remove(v)
                self.store.drop(v)
                self.counters.evictions += 1
            self.ledger.add(d, len(data), dataset)
            self.transient.drop(d)
        if self.directory is not None and adm.victims:
            self.directory.remove(adm.victims)
        try:
            self.store.put(d, data, verified=True)
        except DigestMismatch as exc:
            with self._lock:
                self.ledger.remove(d)
                self.counters.rejected += 1
            self._release((d,))
            return PutResult(d, "digest_mismatch", str(exc))
        except OSError as exc:
            with self._lock:
                self.ledger.remove(d)
            self._release((d,))
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return self._disk_full(d, exc)
        except BaseException:
            with self._lock:
                self.ledger.remove(d)
            self._release((d,))
            raise
        # Released once the bytes are on disk: a waiter woken now reads them.
        self._release((d,))
        if self.directory is not None:
            self.directory.add([d])
        return PutResult(d, "stored")

    def _disk_full(self, d: str, exc: OSError) -> PutResult:
        """The disk under the chunk directory is full before the cache is (its capacity was set
        larger than the room there, or others fill that disk): the chunk is refused, saying so,
        and the capacity comes down to what the disk holds now, so that later inserts evict
        cold chunks to make room as at a full cache, instead of each failing with the
        operating system's error (session 40: every insert was then an INTERNAL error, for as
        long as the server ran). It is not raised again by itself: restart the server, with a
        ``--capacity`` that fits, once there is room."""
        with self._lock:
            old = self.capacity
            self.capacity = max(1, min(self.capacity, self.ledger.used))
            self.counters.rejected += 1
        log.warning(
            "no space left under %s (%s): capacity lowered from %d to %d bytes",
            self.store.root,
            exc.strerror,
            old,
            self.capacity,
        )
        return PutResult(
            d,
            "disk_full",
            f"no space left under {self.store.root} ({exc.strerror}); this server's capacity is now "
            f"{self.capacity} bytes (was {old})",
        )

    def _shrink_to_capacity(self) -> None:
        while self.ledger.used > self.capacity and self.ledger.entries:
            victim = next(self.ledger.coldest())
            self.ledger.remove(victim)
            self.store.drop(victim)

    # -- jobs, allocation
    def report_progress(
        self,
        job: str,
        dataset: str,
        epoch: int,
        consumed: Iterable[str],
        timings: Iterable[tuple[float, float, int, int]] = (),
        user: str = "",
        dataset_bytes: int = 0,
        finished: bool = False,
        miss_read_s: float = 0.0,
    ) -> Allocation | None:
        if not job or not dataset:
            raise InvalidArgument("job_id and dataset are required")
        now = self.clock()
        with self._lock:
            if finished:
                self.consumption.forget(job)
                self.jobs.pop(job, None)
                self._forget_claims((job,))
                self._reallocate()
                return None
            consumed = list(consumed)
            self._learn(consumed, dataset)
            if job in self._away:
                # Moved to another host (the scheduler said so): a late report (its parked
                # loader's read-ahead, say) must not make it pin this host's cache again.
                return None
            lent = self._lent.get(job)
            if lent is not None:
                # Suspended: its progress stays lent (it pins nothing while it does not run;
                # its loader may still report the batches it had read ahead).
                if lent.dataset != dataset or lent.epoch != epoch:
                    lent = self._lent[job] = _JobProgress(dataset, epoch)
                lent.consumed.update(consumed)
                lent.seen_at = now
            else:
                self.consumption.report(job, dataset, epoch, consumed, now)
            for d in consumed:
                e = self.ledger.entries.get(d)
                if e is not None and not e.dataset:
                    self.ledger.relabel(d, dataset)
            info = self.jobs.get(job)
            if info is None or info.dataset != dataset:
                info = self.jobs[job] = _JobInfo(dataset, user)
            per_job = self._job(job, dataset)
            for h, secs, nbytes, n in timings:
                info.timings.append((h, secs))
                # Hits and misses as the jobs saw them (direct reads never pass through here).
                hit = round(h * n)
                self.counters.hits += hit
                self.counters.misses += max(0, n - hit)
                per_job.hits += hit
                per_job.misses += max(0, n - hit)
                if nbytes > 0:
                    info.batch_bytes = nbytes
            if dataset_bytes > 0:
                self.dataset_bytes[dataset] = dataset_bytes
            if miss_read_s > 0:
                info.miss_read_s = miss_read_s
            gone_jobs = self.consumption.expire(now, keep=self.held)
            for gone in gone_jobs:
                self.jobs.pop(gone, None)
            self._forget_claims(gone_jobs)
            self._reallocate()
            return next((a for a in self.allocations if dataset in self._members_of.get(a.dataset, ())), None)

    def job_names(self, job: str) -> list[str]:
        """The names ``job`` reports under here: itself, and its ranks (``job/rank<n>``)."""
        with self._lock:
            known = set(self.jobs) | set(self.consumption.jobs) | set(self.held) | set(self._lent)
            return sorted(j for j in known if j == job or j.startswith(job + "/"))

    def dataset_of(self, job: str) -> str:
        with self._lock:
            for name in self.job_names(job):
                info = self.jobs.get(name)
                if info is not None:
                    return info.dataset
            return ""

    def hold(self, job: str, held: bool = True) -> None:
        """Keep (or stop keeping) a silent job's pins and allocation past the TTL."""
        with self._lock:
            names = self.job_names(job) or [job]
            if held:
                self.held.update(names)
            else:
                self.held.difference_update(names)

    def lend(self, job: str) -> None:
        """The job is suspended: it stays known (its benefit estimate too), but the chunks
        only it still needs this epoch stop being pinned and its share of the allocation goes
        to the running jobs' datasets until it resumes (``restore``)."""
        with self._lock:
            for name in self.job_names(job):
                p = self.consumption.jobs.pop(name, None)
                if p is not None:
                    self._lent[name] = p
                self.held.add(name)
            self._reallocate()

    def restore(self, job: str) -> None:
        """The job runs again (or is about to): its progress pins what is still cached."""
        with self._lock:
            now = self.clock()
            for name in self.job_names(job):
                p = self._lent.pop(name, None)
                if p is not None and name not in self.consumption.jobs:
                    p.seen_at = now
                    self.consumption.jobs[name] = p
            self._reallocate()

    def forget_job(self, job: str, moved: bool = False) -> None:
        """The job is gone (finished, failed, cancelled, moved away): its pins and its share
        of the allocation go at once, not after the TTL. ``moved``: it runs on another host now;
        its reports here are ignored until it arrives again (``arrive``)."""
        with self._lock:
            names = self.job_names(job)
            for name in names:
                self.consumption.forget(name)
                self.jobs.pop(name, None)
                self.held.discard(name)
                self._lent.pop(name, None)
            self._forget_claims([*names, job])
            for name in {*names, job}:
                self._away.pop(name, None)
                if moved:
                    self._away[name] = None
            while len(self._away) > MAX_JOB_COUNTERS:
                self._away.popitem(last=False)
            self._reallocate()

    def arrive(self, job: str) -> None:
        """The job runs (or is about to run) on this host: its reports count again."""
        with self._lock:
            for name in [n for n in self._away if n == job or n.startswith(job + "/")]:
                del self._away[name]

    def consumed_by(self, job: str) -> set[str]:
        """Chunks every rank of ``job`` has consumed in its current epoch."""
        with self._lock:
            progress = {**self._lent, **self.consumption.jobs}
            sets = [progress[n].consumed for n in self.job_names(job) if n in progress]
            return set.intersection(*sets) if sets else set()

    def _reallocate(self) -> None:
        """Allocate per content group (dataset names sharing bytes), labelled ``a+b``: the
        same bytes are counted once, and every job reading them adds to their benefit."""
        names = set(self.dataset_bytes) | {info.dataset for info in self.jobs.values()}
        groups: dict[str, set[str]] = {}
        for ds in names:
            groups.setdefault(self._find(ds), set()).add(ds)
        label_of: dict[str, str] = {}
        members: dict[str, frozenset[str]] = {}
        sizes: dict[str, int] = {}
        for group in groups.values():
            label = "+".join(sorted(group))
            members[label] = frozenset(group)
            # Names of one content may differ in a few files: the largest bounds the group.
            sizes[label] = max(self.dataset_bytes.get(ds, 0) for ds in group)
            for ds in group:
                label_of[ds] = label
        demands = [
            JobDemand(
                job,
                label_of[info.dataset],
                info.batch_bytes,
                estimate_benefit(info.timings),
                info.miss_read_s,
            )
            for job, info in sorted(self.jobs.items())
            if job not in self._lent  # a suspended job's share is lent too (restored on resume)
        ]
        self._members_of = members
        self.allocations = allocate(
            self.capacity, sizes, demands, probe_bytes=self.probe_bytes, shared_link=self.shared_link
        )

    def _quotas(self) -> dict[str, int] | None:
        # Quotas apply only to datasets the manager knows; chunks of others are not limited
        # beyond capacity (they are evicted first anyway).
        if not self.allocations:
            return None
        q = _QuotaMap()
        for a in self.allocations:
            group = self._members_of.get(a.dataset, frozenset((a.dataset,)))
            for ds in group:
                q[ds] = a.bytes
                q.groups[ds] = group
        return q

    def stats(self) -> dict:
        with self._lock:
            per: dict[str, list[int]] = {}
            for e in self.ledger.entries.values():
                s = per.setdefault(e.dataset, [0, 0])
                s[0] += e.size
                s[1] += 1
            return {
                "capacity_bytes": self.capacity,
                "used_bytes": self.ledger.used,
                "chunks": len(self.ledger),
                "policy": self.policy.name,
                "node": self.node,
                "datasets": {k: {"bytes": v[0], "chunks": v[1]} for k, v in sorted(per.items())},
                "jobs": sorted(self.jobs),
                # the console's per-job hit-rate plot reads entries with job_id, hits and misses
                "job_stats": [{"job_id": job, **c.__dict__} for job, c in sorted(self.job_counters.items())],
                **self.counters.__dict__,
            }

    def allocation_table(self) -> list[tuple[Allocation, int]]:
        with self._lock:
            return [
                (a, sum(self.ledger.used_by(ds) for ds in self._members_of.get(a.dataset, (a.dataset,))))
                for a in self.allocations
            ]

    def group_members(self, label: str) -> frozenset[str]:
        """The dataset names an allocation's label stands for (a content group's, ``a+b``)."""
        with self._lock:
            return self._members_of.get(label, frozenset((label,)))


class _QuotaMap(dict):
    """Quota per dataset; a dataset the manager has not seen is bounded by capacity only.
    ``group(name)``: the dataset names sharing ``name``'s bytes, whose use counts against one
    quota."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, frozenset[str]] = {}

    def group(self, dataset: str) -> frozenset[str]:
        return self.groups.get(dataset, frozenset((dataset,)))

    def get(self, key, default=None):  # type: ignore[no-untyped-def, override]
        return super().get(key, 1 << 62)
