"""A scheduler-aware cache: the cache server follows the scheduler's job phases in etcd.

The scheduler publishes one small key per job (``microco.clients.scheduler`` ``PHASES_PREFIX``:
running, waiting, suspended, resuming, migrating, finished). This server acts on them:

* **resuming** (the job that gets the next time slice) on this host: its pins and allocation
  are kept, and the chunks of its dataset it has not consumed this epoch are read from the
  backing store into the cache, as far as its allocation allows, while the others' slice ends;
* **suspended** / **waiting**: the job is silent, but alive: its share of the allocation (and
  its benefit estimate) stays past the job TTL (which only protects against crashed jobs); the
  chunks only it still needs are lent to the running jobs (no longer pinned for it) and
  restored when it is about to resume (``lend=False``: kept pinned for it instead);
* **migrating** to this host: the job's dataset is warmed here before it restarts (its dataset
  is found under ``/microco/cache/jobs/<job>``, written by the host it ran on), and the warm's
  end is reported under ``/microco/cache/warm/<job>`` (the scheduler holds the job's restart
  here until then, or a deadline); migrating away from this host, or **finished** (or its key
  deleted): its pins and allocation go at once.

It also tells the others which dataset each job it serves reads (``/microco/cache/jobs/<job>``,
``clients/cache/_jobs.py``), every ``publish_interval_s`` and at each phase change, and
deletes that when the job is gone: a host a job migrates to warms that dataset, and the
scheduler's ``dataset_affinity`` runs jobs of one dataset in the same time slices.

Without a scheduler (or with ``--no-follow-scheduler``) nothing here runs and the cache behaves
as before: the TTL alone decides when a silent job stops pinning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from microco.clients.cache import (
    JOB_DATASETS_PREFIX,
    DatasetIndex,
    forget_job_dataset,
    forget_warm,
    get_dataset,
    job_dataset,
    load_index,
    open_store,
    publish_job_dataset,
    report_warm,
)
from microco.clients.scheduler import JobPhase, read_phases, watch_phases
from microco.common.errors import MicrocoError
from microco.common.kv import KV

from ._core import CacheCore

log = logging.getLogger(__name__)

JOBS_PREFIX = JOB_DATASETS_PREFIX  # job id -> {"dataset", "node"} (clients/cache/_jobs.py)

OpenDataset = Callable[[str], tuple[DatasetIndex, Any]]
PeerChunks = Callable[[str, list[str], str], dict[str, bytes]]
_RUNNING = JobPhase("", "running")


class SchedulerFollower:
    """Applies the scheduler's job phases to one cache server's core.

    ``open_dataset(name)`` gives a dataset's verified index and its backing store (default:
    the dataset's record in etcd, its index on this host, ``open_store`` of its URL).
    """

    def __init__(
        self,
        core: CacheCore,
        kv: KV,
        node: str,
        *,
        open_dataset: OpenDataset | None = None,
        dataset_wait_s: float = 30.0,
        lend: bool = True,
        publish_interval_s: float = 2.0,
        peer_chunks: PeerChunks | None = None,
    ) -> None:
        self.core, self.kv, self.node = core, kv, node
        # A suspended job's pins are lent to the running jobs and restored (prefetched) when it
        # is about to resume; ``lend=False`` keeps them for it instead.
        self.lend = lend
        self.open_dataset = open_dataset or self._open_from_etcd
        # (node, digests, job) -> the chunks that node's cache server holds: a job moving here
        # brings its working set from the cache of the host it leaves, not from the backing
        # store (default: that node's server found in the registry, over gRPC).
        self.peer_chunks = peer_chunks or self._peer_chunks
        self.dataset_wait_s = dataset_wait_s
        self._cancel: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._prefetching: dict[str, threading.Event] = {}  # job -> stop
        self._to_report: set[str] = set()  # jobs moving here: report the warm's end (scheduler)
        self._threads: list[threading.Thread] = []
        self._datasets: dict[str, tuple[DatasetIndex, Any]] = {}
        self._published: set[str] = set()
        self.publish_interval_s = publish_interval_s
        self._stop = threading.Event()
        self.prefetched_chunks = 0
        self.prefetched_bytes = 0
        self._peers: dict[str, Any] = {}  # node -> its cache server's CacheClient
        self.copied_chunks = 0  # brought from the cache of the host a job moved from
        self.copied_bytes = 0
        self.phases: dict[str, JobPhase] = {}

    # -- lifecycle
    def start(self) -> SchedulerFollower:
        self._cancel = watch_phases(self.kv, self.on_phase)
        for job_id, phase in read_phases(self.kv).items():
            self.on_phase(job_id, phase)
        self._stop.clear()
        t = threading.Thread(target=self._publish_loop, name="follow-publish", daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()
        return self

    def stop(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None
        self._stop.set()
        with self._lock:
            for ev in self._prefetching.values():
                ev.set()
            threads, self._threads = self._threads, []
        for t in threads:
            t.join(timeout=30)
        for client in self._peers.values():
            client.close()
        self._peers.clear()

    def idle(self) -> bool:
        """No prefetch under way (for tests and the benchmark)."""
        with self._lock:
            return not any(t.is_alive() for t in self._threads if t.name != "follow-publish")

    # -- the policy
    def on_phase(self, job_id: str, phase: JobPhase | None) -> None:
        try:
            self._on_phase(job_id, phase)
        except MicrocoError as exc:  # advice only: never take the server down
            log.warning("cannot follow job %s: %s", job_id, exc)

    def _on_phase(self, job_id: str, phase: JobPhase | None) -> None:
        if phase is None or phase.phase == "finished":
            self.phases.pop(job_id, None)
            self._stop_prefetch(job_id)
            self.core.forget_job(job_id)
            self._published.discard(job_id)
            forget_job_dataset(self.kv, job_id)  # (idempotent: every host may say so)
            forget_warm(self.kv, job_id)
            return
        self._publish_dataset(job_id)
        self.phases[job_id] = phase
        here = phase.node in ("", self.node)
        if phase.phase == "running":
            if here:
                self.core.arrive(job_id)
            self.core.restore(job_id)
            self.core.hold(job_id, False)  # it reports again: the TTL applies
            if not here:
                self._stop_prefetch(job_id)
                self.core.forget_job(job_id, moved=True)
        elif phase.phase in ("suspended", "waiting"):
            self._stop_prefetch(job_id)
            if self.lend:
                self.core.lend(job_id)
            self.core.hold(job_id)
        elif phase.phase == "resuming":
            self.core.restore(job_id)
            self.core.hold(job_id)
            if here:
                self.core.arrive(job_id)
                self._prefetch(job_id)
        elif phase.phase == "migrating":
            if phase.target == self.node:
                self.core.arrive(job_id)
                self._prefetch(job_id, source=phase.node, report=True)
            elif phase.node == self.node:
                self._stop_prefetch(job_id)
                self.core.forget_job(job_id, moved=True)

    def _publish_dataset(self, job_id: str) -> None:
        """Tell the other hosts which dataset a job reads (a host it moves to warms it) and
        the scheduler (dataset affinity)."""
        if job_id in self._published:
            return
        ds = self.core.dataset_of(job_id)
        if ds:
            publish_job_dataset(self.kv, job_id, ds, self.node)
            self._published.add(job_id)

    def publish_datasets(self) -> None:
        """Publish the dataset of every job reporting here not published yet (a job that
        reported since its last phase change). Its ranks (``job/rank<n>``) are one job."""
        for name in list(self.core.jobs):
            job_id = name.split("/rank", 1)[0]
            if job_id not in self._published and self.phases.get(job_id, _RUNNING).phase != "finished":
                self._publish_dataset(job_id)

    def _publish_loop(self) -> None:
        while not self._stop.wait(self.publish_interval_s):
            try:
                self.publish_datasets()
            except MicrocoError as exc:  # advice only: try again next time
                log.warning("cannot publish the jobs' datasets: %s", exc)

    def _dataset_for(self, job_id: str, stop: threading.Event) -> str:
        deadline = time.monotonic() + self.dataset_wait_s
        while not stop.is_set():
            ds = self.core.dataset_of(job_id)
            if ds:
                return ds
            ds = job_dataset(self.kv, job_id)
            if ds:
                return ds
            if time.monotonic() >= deadline:
                return ""
            stop.wait(0.05)
        return ""

    # -- prefetch
    def _prefetch(self, job_id: str, source: str = "", report: bool = False) -> None:
        """Start bringing in ``job_id``'s chunks (from ``source``'s cache first); ``report``:
        tell the scheduler when that is over (a prefetch already under way for it reports)."""
        with self._lock:
            if report:
                self._to_report.add(job_id)
            if job_id in self._prefetching and not self._prefetching[job_id].is_set():
                return
            stop = self._prefetching[job_id] = threading.Event()
            t = threading.Thread(
                target=self._prefetch_run,
                args=(job_id, stop, source),
                name=f"follow-{job_id}",
                daemon=True,
            )
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _stop_prefetch(self, job_id: str) -> None:
        with self._lock:
            self._to_report.discard(job_id)
            ev = self._prefetching.pop(job_id, None)
        if ev is not None:
            ev.set()

    def _prefetch_run(self, job_id: str, stop: threading.Event, source: str = "") -> None:
        """Bring in the job's unconsumed chunks; for a job moving here, tell the scheduler
        when that is over (``report_warm``), unless it was called off."""
        error, held, report = "", 0, False
        try:
            error, held = self._fill(job_id, stop, source)
        except (MicrocoError, OSError) as exc:
            log.warning("prefetch for job %s stopped: %s", job_id, exc)
            error = str(exc) or type(exc).__name__
        finally:
            with self._lock:
                if self._prefetching.get(job_id) is stop:
                    del self._prefetching[job_id]
                    report = job_id in self._to_report and not stop.is_set()
                    self._to_report.discard(job_id)
        if report:
            try:
                report_warm(self.kv, job_id, self.node, held, error)
            except MicrocoError as exc:  # advice only: the scheduler's deadline then passes
                log.warning("cannot report the warm for job %s: %s", job_id, exc)

    def _fill(self, job_id: str, stop: threading.Event, source: str) -> tuple[str, int]:
        """The prefetch itself: "" (or why nothing could be done) and the chunks of the job's
        dataset held here when it ends (its allocation full, or every chunk it needs in)."""
        ds = self._dataset_for(job_id, stop)
        if not ds:
            log.info("job %s: its dataset is not known here yet; nothing to prefetch", job_id)
            return "its dataset is not known to the cache servers", 0
        index, store = self._dataset(ds)
        digests = [c.digest for c in index.chunks]
        if not self.core.job_names(job_id):
            # New here (moving in): the job pins what comes, and has its allocation share.
            self.core.report_progress(job_id, ds, 0, [], dataset_bytes=index.total_bytes)
        self.core.hold(job_id)
        consumed = self.core.consumed_by(job_id)
        present = set(self.core.lookup(digests, ds))
        if source and source != self.node:
            wanted = [c for c in index.chunks if c.digest not in consumed and c.digest not in present]
            present |= self._copy_from(source, job_id, ds, wanted, stop)
        for chunk in index.chunks:
            if stop.is_set():
                break
            if chunk.digest in consumed or chunk.digest in present:
                continue
            if self.core.room(ds) < chunk.size:
                break  # its allocation is full (or nothing is evictable): done
            # Claimed like a job's whole-chunk read: a job missing it now waits for this
            # read instead of making a second one (and one it has in flight is skipped).
            claim = self.core.lookup_claim([chunk.digest], ds, job=f"prefetch:{job_id}", claim=[chunk.digest])
            if not claim.claimed:
                continue
            data = b"".join(store.read(s.path) for s in index.samples_of(chunk))
            r = self.core.put(chunk.digest, data, ds)
            if r.outcome == "stored":
                self.prefetched_chunks += 1
                self.prefetched_bytes += len(data)
            elif r.outcome != "present":
                break
        return "", len(self.core.lookup(digests, ds))

    def _copy_from(
        self, source: str, job_id: str, ds: str, wanted: list[Any], stop: threading.Event
    ) -> set[str]:
        """Bring ``wanted`` chunks the cache on ``source`` (the host ``job_id`` leaves) holds
        into this one, as far as there is room: host to host, not over the backing store's
        link. The digests stored (each verified by ``put``); nothing when that host's server
        is unknown or does not answer (the backing store then serves, as before)."""
        got: set[str] = set()
        try:
            for i in range(0, len(wanted), 16):
                if stop.is_set():
                    break
                part = wanted[i : i + 16]
                held = self.peer_chunks(source, [c.digest for c in part], job_id)
                for c in part:
                    data = held.get(c.digest)
                    if data is None:
                        continue
                    if self.core.room(ds) < len(data):
                        return got
                    r = self.core.put(c.digest, data, ds)
                    if r.outcome == "stored":
                        got.add(c.digest)
                        self.copied_chunks += 1
                        self.copied_bytes += len(data)
                    elif r.outcome != "present":
                        return got
        except MicrocoError as exc:
            log.info("job %s: cannot copy its working set from %s: %s", job_id, source, exc)
        return got

    def _peer_chunks(self, node: str, digests: list[str], job_id: str) -> dict[str, bytes]:
        """The chunks of ``digests`` held by ``node``'s cache server (from the registry)."""
        from microco.clients.cache import CacheClient
        from microco.common.registry import discover

        client = self._peers.get(node)
        if client is None:
            address = next(
                (r.address for r in discover(self.kv, "cache") if r.labels.get("node") == node), None
            )
            if address is None:
                return {}
            client = self._peers[node] = CacheClient(address, timeout=10)
        try:
            return client.read_chunks(digests, job_id=job_id)
        except MicrocoError:
            self._peers.pop(node, None)  # (found again in the registry next time)
            client.close()
            raise

    def _dataset(self, name: str) -> tuple[DatasetIndex, Any]:
        if name not in self._datasets:
            self._datasets[name] = self.open_dataset(name)
        return self._datasets[name]

    def _open_from_etcd(self, name: str) -> tuple[DatasetIndex, Any]:
        record = get_dataset(self.kv, name)
        store = open_store(record.url)
        return load_index(record, store), store
