"""Co-design benchmark: ``microco bench codesign [--quick] [--json]``.

The mixed scenario of issue 21 on one machine with virtual devices, run twice side by side,
the two runs interleaved (independent, co-designed, independent, ...) so that load on the
machine falls on both alike:

* more training jobs than devices, so the scheduler's own ``gandiva`` policy (time-slicing:
  least attained service first, a quantum per slice; suspend = park in place at a mini-batch
  boundary; packing, migration and grow-shrink off) decides, from views a driver builds
  every 20 ms, which jobs run; several jobs share a dataset larger than a host's cache, one
  reads its own (``--scenario two-datasets``: two datasets of two jobs each, see below);
* two hosts, each with a real Quiver cache server (``CacheCore`` behind the real gRPC servicer,
  co-ordinated eviction, the job TTL equal to the quantum, as the defaults are: 60 s and 60 s);
  every job reads through the real ``QuiverLoader`` (substitutable hits, its own prefetch);
* one backing store behind one throttled link (``ThrottledStore``) shared by every reader;
* one job migrated to the second host mid-run: it checkpoints, restarts there (``--restart-s``,
  the modelled cost of a process restart) and continues: independently, from its epoch's start
  (a restarted loader begins its epoch again); co-designed, where its loader left the epoch
  (the loader's position is in the checkpoint: ``QuiverLoader.state_dict``).

``independent``: the systems as today (the cache knows nothing of the scheduler).
``codesign``: the driver publishes job phases with the scheduler's ``PhasePublisher`` and each
cache server follows them (``services/cache/_follow.py``): prefetch for the job about to get
its slice, a suspended job's pins kept past the TTL, a migrating job's dataset warmed on the
new host while it restarts, a finished job's pins dropped at once; and the policy runs with
``dataset_affinity`` (jobs of one dataset in the same time slices). ``--ablation`` adds the two
runs that separate the policy from the cache: independent with affinity, co-designed without.

``--scenario two-datasets``: not the issue's scenario, but the case affinity is for: two
datasets, each a little smaller than a host's cache, read by two jobs each, submitted
alternately (a, b, a, b), so that Gandiva's order puts one job of each dataset in a slice.

Every job trains a small least-squares model on its samples' bytes with one exact update per
epoch (per-sample gradients summed in sample order), so its losses are identical to an
uninterrupted run's whatever the order the cache delivered samples in, and any lost, repeated
or corrupted sample shows: ``losses_identical`` compares them with a run straight from the
files. The phases travel through an in-process KV here (the same interface as etcd), and the
driver stands in for the scheduler service (no node agents, jobs are threads): what is
measured is the cache's side of the co-design.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DIM = 16


@dataclass
class Scenario:
    shared_samples: int = 480
    own_samples: int = 240
    sample_bytes: int = 16_000
    cache_bytes: int = 4_000_000  # per host; the shared dataset is ~1.9x this
    chunk_bytes: int = 128_000
    link_bytes_per_s: float = 16e6
    batch_size: int = 16
    compute_s: float = 0.02  # the virtual device's busy time per mini-batch
    epochs: int = 3
    devices: int = 2
    shared_jobs: int = 3
    quantum_s: float = 1.5
    restart_s: float = 1.0
    migrate_after_slices: int = 1  # the job migrates when it is next suspended after this many
    lend: bool = True  # co-designed: a suspended job's pins lent to the running jobs (else kept)
    # "mixed" (issue 21's): shared_jobs on one dataset, one job on its own; "two-datasets":
    # two datasets of own_samples each, two jobs each, submitted alternately.
    kind: str = "mixed"

    def datasets(self) -> dict[str, int]:
        if self.kind == "two-datasets":
            return {"a": self.own_samples, "b": self.own_samples}
        return {"shared": self.shared_samples, "own": self.own_samples}

    def jobs(self) -> list[tuple[str, str]]:
        """(job name, dataset) in submission order."""
        if self.kind == "two-datasets":
            return [("a0", "a"), ("b0", "b"), ("a1", "a"), ("b1", "b")]
        return [(f"shared{i}", "shared") for i in range(self.shared_jobs)] + [("own", "own")]


# name -> (cache servers follow the scheduler, the policy's dataset affinity, the loaders claim
# chunks they read whole (in-flight claims, a cache feature: on both sides), how the loaders
# price a miss for the allocation: "stall" or "link", ``clients/cache/_stall.py``, the
# allocation adds what a job's misses cost the others on the shared link (a cache feature:
# on both sides; ``services/cache/_allocation.py``), a dataset within its allocation may
# take the room others hold beyond theirs (``bind``, off by default: ``CacheCore(bind_allocation)``,
# ``services/cache/_eviction.py``), the policy's finish grace fed by each job's step telemetry
# (``grace``: a running job that will finish within ``GRACE_QUANTA`` quanta at its observed
# pace is not time-sliced out; ``GandivaConfig.finish_grace_s``))
MODES = {
    "independent": (False, False, True, "stall", False, False, False),
    "codesign": (True, True, True, "stall", False, False, False),
    "independent_affinity": (False, True, True, "stall", False, False, False),
    "codesign_no_affinity": (True, False, True, "stall", False, False, False),
    "independent_no_claims": (False, False, False, "stall", False, False, False),
    "codesign_no_claims": (True, True, False, "stall", False, False, False),
    "independent_link": (False, False, True, "link", False, False, False),
    "codesign_link": (True, True, True, "link", False, False, False),
    "independent_shared_link": (False, False, True, "stall", True, False, False),  # the link's price on
    "codesign_shared_link": (True, True, True, "stall", True, False, False),
    "independent_bind": (False, False, True, "stall", False, True, False),  # the allocation bound
    "codesign_bind": (True, True, True, "stall", False, True, False),
    # the policy's finish grace (a scheduler option, off by default: on neither side's default)
    "independent_grace": (False, False, True, "stall", False, False, True),
    "codesign_grace": (True, True, True, "stall", False, False, True),
}
#: The finish grace in quanta: at most this much longer a waiting job waits for its slice
#: (per running job that keeps its device), for a job that would otherwise be suspended with
#: less than this left and wait a whole slice to finish (its working set gone by then).
GRACE_QUANTA = 0.5
ABLATIONS = {
    "ablation": ("independent_affinity", "codesign_no_affinity"),
    "claims_ablation": ("independent_no_claims", "codesign_no_claims"),
    "price_ablation": ("independent_link", "codesign_link"),
    "allocation_ablation": (
        "independent_shared_link",
        "codesign_shared_link",
        "independent_bind",
        "codesign_bind",
    ),
    "grace_ablation": ("independent_grace", "codesign_grace"),
}
# (prefix of the ratios, base mode, mode compared with it), when both ran
COMPARISONS = (
    ("", "independent", "codesign"),
    ("affinity_alone_", "independent", "independent_affinity"),  # the policy alone
    ("affinity_in_codesign_", "codesign_no_affinity", "codesign"),  # the policy in the platform
    ("claims_in_independent_", "independent_no_claims", "independent"),
    ("claims_in_codesign_", "codesign_no_claims", "codesign"),
    ("without_claims_", "independent_no_claims", "codesign_no_claims"),  # as before claims
    ("link_price_in_independent_", "independent", "independent_link"),
    ("link_price_in_codesign_", "codesign", "codesign_link"),
    # the shared link's price in the allocation (off by default): without vs with it
    ("shared_link_in_independent_", "independent", "independent_shared_link"),
    ("shared_link_in_codesign_", "codesign", "codesign_shared_link"),
    ("with_shared_link_", "independent_shared_link", "codesign_shared_link"),
    ("bind_in_independent_", "independent", "independent_bind"),
    ("bind_in_codesign_", "codesign", "codesign_bind"),
    ("grace_in_independent_", "independent", "independent_grace"),  # the policy's grace alone
    ("grace_in_codesign_", "codesign", "codesign_grace"),
    ("with_grace_", "independent_grace", "codesign_grace"),  # the co-design's part, both graced
)


def _features(data: bytes) -> tuple[np.ndarray, float]:
    raw = np.frombuffer(data[: DIM * 2], dtype=np.uint8).astype(np.float64)
    x = raw[:DIM] / 255.0
    y = float(raw[DIM:].mean() / 255.0)
    return x, y


class Model:
    """Least squares, one exact full-batch step per epoch: order-independent, exact."""

    def __init__(self, n: int) -> None:
        self.w = np.zeros(DIM)
        self.n = n
        self.losses: list[float] = []
        self._reset()

    def _reset(self) -> None:
        self.grads = np.zeros((self.n, DIM))
        self.errs = np.zeros(self.n)

    def add(self, i: int, data: bytes) -> None:
        x, y = _features(data)
        err = float(x @ self.w - y)
        self.grads[i] = err * x
        self.errs[i] = err * err

    def end_epoch(self) -> None:
        self.losses.append(float(np.sum(self.errs) / self.n))
        self.w = self.w - 0.5 * np.sum(self.grads, axis=0) / self.n
        self._reset()

    def restart_epoch(self) -> None:  # back to the epoch's checkpoint
        self._reset()


def reference_losses(files: list[bytes], epochs: int) -> list[float]:
    m = Model(len(files))
    for _ in range(epochs):
        for i, d in enumerate(files):
            m.add(i, d)
        m.end_epoch()
    return m.losses


@dataclass
class Job:
    name: str
    dataset: str
    index: Any
    model: Model
    node: str = "h1"
    order: int = 0
    device: str = ""
    state: str = "queued"  # queued, running, suspended, migrating, finished
    attained_s: float = 0.0
    last_change: float = 0.0
    slices: int = 0
    finished_at: float = 0.0
    allowed: threading.Event = field(default_factory=threading.Event)
    parked: threading.Event = field(default_factory=threading.Event)
    resumed_at: float | None = None
    resume_waits: list[float] = field(default_factory=list)
    migrate_to: str = ""
    migrate_decided: float = 0.0
    migrate_waits: list[float] = field(default_factory=list)
    hits: int = 0
    misses: int = 0
    stall_s: float = 0.0  # waiting for data in its steps
    # What its step telemetry tells the scheduler (as the hook's reports do): the steps it has
    # trained of ``total_steps``, and its recent mini-batch time (boundary to boundary, so the
    # waits for data are in it: the pace it will finish at).
    steps_done: int = 0
    total_steps: int = 0
    step_times: list[float] = field(default_factory=list)

    @property
    def minibatch_ms(self) -> float | None:
        recent = self.step_times[-8:]
        return 1000.0 * statistics.median(recent) if recent else None


def _open(datasets: dict[str, Any], store: Any, name: str) -> tuple[Any, Any]:
    return datasets[name], store


class Platform:
    """Two hosts' cache servers (in-process gRPC), the link, and optionally the followers."""

    def __init__(
        self,
        tmp: Path,
        sc: Scenario,
        codesign: bool,
        datasets: dict[str, Any],
        link: Any,
        account: Any = None,
        shared_link: bool = False,
        bind: bool = False,
    ) -> None:
        from microco.common import MemoryKV
        from microco.services.cache import (
            CacheCore,
            CacheServicer,
            ChunkStore,
            SchedulerFollower,
            serve_in_process,
        )

        self.kv = MemoryKV()
        self.cores: dict[str, Any] = {}
        self.address: dict[str, str] = {}
        self._servers = []
        self.followers = []
        for node in ("h1", "h2"):
            core_args = (ChunkStore(str(tmp / f"cache-{node}")), sc.cache_bytes, "coordinated")
            core_kw: dict[str, Any] = {
                "node": node,
                "job_ttl_s": sc.quantum_s,
                "probe_bytes": sc.cache_bytes // 8,
                "shared_link": shared_link,
            }
            store: Any = link
            if account is not None:
                from .codesign_account import AccountedStore, accounted_core

                core = accounted_core(account, *core_args, **core_kw)
                store = AccountedStore(link, account, f"follower-{node}", node)
            else:
                core = CacheCore(*core_args, **core_kw)
            core.policy.bind = bind  # (as ``CacheCore(bind_allocation=...)`` sets it)
            server, address = serve_in_process(CacheServicer(core))
            self._servers.append(server)
            self.cores[node], self.address[node] = core, address
            if codesign:
                f = SchedulerFollower(
                    core,
                    self.kv,
                    node,
                    open_dataset=functools.partial(_open, datasets, store),
                    lend=sc.lend,
                    peer_chunks=self._peer_chunks,  # (the other host's server, over gRPC)
                )
                self.followers.append(f.start())

    def _peer_chunks(self, node: str, digests: list[str], job_id: str) -> dict[str, bytes]:
        from microco.clients.cache import CacheClient

        with CacheClient(self.address[node]) as client:
            return client.read_chunks(digests, job_id=job_id)

    def close(self) -> None:
        for f in self.followers:
            f.stop()
        for s in self._servers:
            s.stop(0)


def _run_mode(
    mode: str,
    sc: Scenario,
    root: Path,
    datasets: dict[str, Any],
    files: dict[str, list[bytes]],
    account: Any = None,
) -> dict:
    from microco.clients.cache import LocalStore, QuiverLoader, ThrottledStore
    from microco.clients.scheduler import PhasePublisher
    from microco.services.scheduler.policy import (
        ClusterView,
        DeviceView,
        JobPhase,
        JobView,
        Resume,
        Start,
        Suspend,
        make_policy,
        next_to_run,
    )

    codesign, affinity, claims, price, shared_link, bind, grace = MODES[mode]
    loader_class = type("Loader", (QuiverLoader,), {"CLAIMS": claims, "MISS_PRICE": price})
    policy = make_policy(
        "gandiva",
        quantum_s=sc.quantum_s,
        enable_packing=False,
        enable_migration=False,  # (the benchmark moves one job itself, at a set point)
        enable_grow_shrink=False,
        dataset_affinity=affinity,
        finish_grace_s=GRACE_QUANTA * sc.quantum_s if grace else 0.0,
    )
    devices = tuple(DeviceView(f"d{i}", "local", kind="virtual") for i in range(sc.devices))

    tmp = Path(tempfile.mkdtemp(prefix="codesign-", dir=root))
    link = ThrottledStore(LocalStore(str(root / "data")), sc.link_bytes_per_s)
    plat = Platform(tmp, sc, codesign, datasets, link, account, shared_link, bind)
    publisher = PhasePublisher(plat.kv) if codesign else None
    jobs = [
        Job(name, ds, datasets[ds], Model(len(datasets[ds].samples)), order=i)
        for i, (name, ds) in enumerate(sc.jobs())
    ]
    for j in jobs:
        j.total_steps = sc.epochs * -(-len(j.index.samples) // sc.batch_size)
    migrating = jobs[1]  # (mixed: a job of the shared dataset) moves to the second host
    t_start = time.monotonic()
    lock = threading.Lock()

    def publish() -> None:
        if publisher is None:
            return
        now = time.monotonic()
        with lock:
            recs = [
                {
                    "id": j.name,
                    "state": j.state,
                    "node": j.node,
                    "attained_service_s": j.attained_s,
                    "last_change_at": j.last_change,
                }
                for j in jobs
            ]
        # The jobs the policy itself will run next (what the cache prefetches for): a forecast
        # from the policy, not the least-served waiting job it may pass over.
        publisher.publish(recs, now, next_to_run(policy, view(now)))

    def train(job: Job) -> None:
        from microco.clients.telemetry import StepTelemetry

        # The job's step telemetry (the hook's stream; not installed: jobs here are threads of
        # one process): one record per mini-batch, its pace read by the scheduler's views.
        tel = StepTelemetry()
        per_epoch = -(-len(job.index.samples) // sc.batch_size)
        epoch = 0
        position: dict | None = None
        while epoch < sc.epochs:
            store: Any = link
            if account is not None:
                from .codesign_account import AccountedStore

                store = AccountedStore(link, account, job.name, job.node)
            loader = loader_class(
                job.index,
                store,
                batch_size=sc.batch_size,
                dataset=job.dataset,
                job_id=job.name,
                server=plat.address[job.node],
                node=job.node,
                seed=zlib.crc32(job.name.encode()),
            )
            if position is not None:
                loader.load_state_dict(position)  # its checkpoint's place in the epoch
                if (loader.resume_epoch or 0) > epoch:
                    job.model.end_epoch()  # it was stopped after the epoch's last batch
                epoch, position = loader.resume_epoch or 0, None
            moved = False
            try:
                while epoch < sc.epochs and not moved:
                    for indices, data in loader.epoch(epoch):
                        now = time.monotonic()
                        if job.resumed_at is not None:
                            job.resume_waits.append(now - job.resumed_at)
                            job.resumed_at = None
                        if job.migrate_decided:
                            job.migrate_waits.append(now - job.migrate_decided)
                            job.migrate_decided = 0.0
                        for i, d in zip(indices, data, strict=True):
                            job.model.add(i, d)
                        time.sleep(sc.compute_s)  # the device computes
                        rec = tel.end_step(job.steps_done)
                        with lock:
                            job.steps_done += 1
                            job.step_times.append(rec.step_s)
                        # The mini-batch boundary: obey the scheduler.
                        if not job.allowed.is_set():
                            job.parked.set()
                            job.allowed.wait()
                            job.parked.clear()
                            tel.mark()  # (the park belongs to no mini-batch)
                            if job.migrate_to:
                                moved = True
                                break
                    if moved:
                        if codesign:  # the checkpoint holds the loader's place in the epoch
                            position = loader.state_dict()
                        else:  # as today: the epoch starts again from its boundary's state
                            job.model.restart_epoch()
                            with lock:
                                job.steps_done = epoch * per_epoch
                        break
                    job.model.end_epoch()
                    epoch += 1
            finally:
                job.hits += loader.stats.hits
                job.misses += loader.stats.misses
                job.stall_s += loader.stats.stall_s
                loader.close()
            if moved:
                time.sleep(sc.restart_s)  # checkpoint, exit, start again on the new host
                job.node, job.migrate_to = job.migrate_to, ""
                tel.mark()
        job.finished_at = time.monotonic() - t_start
        job.parked.set()

    threads = {j.name: threading.Thread(target=train, args=(j,), daemon=True) for j in jobs}
    by_name = {j.name: j for j in jobs}
    migrated = False
    phase_of = {
        "queued": JobPhase.QUEUED,
        "running": JobPhase.RUNNING,
        "suspended": JobPhase.SUSPENDED,
        "migrating": JobPhase.SUSPENDED,  # waiting for devices on its new host
    }

    def start(j: Job, device: str) -> None:
        how = "start" if not threads[j.name].is_alive() else "resume"
        with lock:
            j.state, j.last_change, j.device = "running", time.monotonic(), device
            j.slices += 1
        if j.migrate_to:
            j.migrate_decided = time.monotonic()  # on its new host's devices from now
            with lock:
                j.node = j.migrate_to  # (where the scheduler publishes it running from now)
        elif how == "resume":
            j.resumed_at = time.monotonic()
        if account is not None:
            account.event(j.node, "state", j.name, "running")
        publish()
        j.allowed.set()
        if how == "start":
            threads[j.name].start()

    def suspend(out: Job) -> None:
        nonlocal migrated
        out.allowed.clear()
        out.parked.wait()
        if out.finished_at:
            return  # it ended at that boundary: the next pass sees it finished
        with lock:
            out.attained_s += time.monotonic() - out.last_change
            out.state, out.last_change, out.device = "suspended", time.monotonic(), ""
        if account is not None:
            account.event(out.node, "state", out.name, "suspended")
        if out is migrating and not migrated and out.slices >= sc.migrate_after_slices:
            migrated = True
            out.migrate_to = "h2"
            with lock:
                out.state = "migrating"
            if publisher is not None:
                publisher.moving(out.name, out.node, "h2", time.monotonic())
        publish()

    def view(now: float) -> ClusterView:
        with lock:
            return ClusterView(
                now=now,
                devices=devices,
                jobs=tuple(
                    JobView(
                        id=j.name,
                        devices_wanted=1,
                        submitted_at=float(j.order),
                        state=phase_of[j.state],
                        devices=(j.device,) if j.state == "running" else (),
                        attained_service_s=j.attained_s
                        + (now - j.last_change if j.state == "running" else 0.0),
                        last_change_at=j.last_change,
                        dataset=j.dataset,  # the name its loader registers with the cache
                        # its telemetry, as the hook reports it (both sides; only a policy
                        # with a finish grace acts on it)
                        steps_done=j.steps_done,
                        total_steps=j.total_steps,
                        minibatch_ms=j.minibatch_ms,
                    )
                    for j in jobs
                    if j.state != "finished"
                ),
            )

    slices: list[list[str]] = []  # who ran together: each time the running set changed
    most_allocated: dict[str, int] = {}  # the most a dataset was allocated on a host
    while any(j.finished_at == 0.0 for j in jobs):
        for core in plat.cores.values():
            for a in core.allocations:
                most_allocated[a.dataset] = max(most_allocated.get(a.dataset, 0), a.bytes)
        now = time.monotonic()
        for j in jobs:
            if j.finished_at and j.state != "finished":
                with lock:
                    if j.state == "running":
                        j.attained_s += now - j.last_change
                    j.state, j.device = "finished", ""
                publish()
        decisions = policy.decide(view(time.monotonic()))
        for d in decisions:
            j = by_name[d.job_id]
            if isinstance(d, Suspend):
                suspend(j)
            elif isinstance(d, Start | Resume) and j.state != "finished":
                start(j, d.devices[0])
        if decisions:
            slices.append(sorted(j.name for j in jobs if j.state == "running"))
        time.sleep(0.02)
    for t in threads.values():
        t.join()
    plat.close()
    hits = sum(j.hits for j in jobs)
    misses = sum(j.misses for j in jobs)
    resumes = [w for j in jobs for w in j.resume_waits]
    migrates = [w for j in jobs for w in j.migrate_waits]
    ok = all(j.model.losses == reference_losses(files[j.dataset], sc.epochs) for j in jobs)
    result: dict[str, Any] = {
        "avg_jct_s": statistics.mean(j.finished_at for j in jobs),
        "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "backing_bytes": link.bytes_read,
        "resume_to_first_batch_s": statistics.mean(resumes) if resumes else None,
        "migrate_to_first_batch_s": statistics.mean(migrates) if migrates else None,
        "losses_identical": ok,
        "jct_s": {j.name: round(j.finished_at, 3) for j in jobs},
        "losses_identical_by_job": {
            j.name: j.model.losses == reference_losses(files[j.dataset], sc.epochs) for j in jobs
        },
        "resumes": len(resumes),
        "prefetched_bytes": sum(f.prefetched_bytes for f in plat.followers),
        # a migrating job's working set brought from its old host's cache (not the link)
        "copied_bytes": sum(f.copied_bytes for f in plat.followers),
        # slices in which two or more running jobs read one dataset, of all slices
        "shared_slices": sum(1 for sl in slices if len({by_name[n].dataset for n in sl}) < len(sl)),
        "slices": len(slices),
        "most_allocated_bytes": most_allocated,
    }
    if account is not None:
        from .codesign_account import summarise

        chunk_of = {
            s.path: c.digest for idx in datasets.values() for c in idx.chunks for s in idx.samples_of(c)
        }
        ds_of = {c.digest: name for name, idx in datasets.items() for c in idx.chunks}
        result["account"] = summarise(account, chunk_of, ds_of)
        result["account"]["jobs"] = {
            j.name: {
                "jct_s": round(j.finished_at, 3),
                "running_s": round(j.attained_s, 3),
                "waiting_s": round(j.finished_at - j.attained_s, 3),
                "stall_s": round(j.stall_s, 3),
                "slices": j.slices,
            }
            for j in jobs
        }
        result["account"]["link_busy_s"] = round(link.bytes_read / sc.link_bytes_per_s, 3)
        result["account"]["makespan_s"] = round(max(j.finished_at for j in jobs), 3)
    shutil.rmtree(tmp, ignore_errors=True)
    return result


def _make_data(root: Path, sc: Scenario) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    from microco.clients.cache import LocalStore, build_index

    rng = random.Random(21)
    (root / "data").mkdir(parents=True)
    link = LocalStore(str(root / "data"))  # one backing store holds both datasets
    datasets, files = {}, {}
    for name, n in sc.datasets().items():
        d = root / "data" / name
        d.mkdir(parents=True)
        for i in range(n):
            (d / f"s{i:05d}").write_bytes(rng.randbytes(sc.sample_bytes))
        listing = [(f"{name}/{p}", size) for p, size in LocalStore(str(d)).list_files()]
        idx = build_index(listing, link.read, sc.chunk_bytes)
        datasets[name] = idx
        files[name] = [link.read(s.path) for s in idx.samples]
    return datasets, files


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run(
    sc: Scenario, rounds: int, modes: tuple[str, ...] = ("independent", "codesign"), account: bool = False
) -> dict:
    root = Path(tempfile.mkdtemp(prefix="microco-bench-codesign-"))
    from microco.common.identity import private_ca

    private_ca(root / "pki")  # the servers it starts are its own: so are their identities
    try:
        datasets, files = _make_data(root, sc)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(rounds):
            order = modes if r % 2 == 0 else tuple(reversed(modes))  # ABBA...
            for mode in order:
                acc = None
                if account:
                    from .codesign_account import Account

                    acc = Account()
                runs[mode].append(_run_mode(mode, sc, root, datasets, files, acc))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {"scenario": sc.__dict__, "rounds": rounds}
    for mode, rs in runs.items():
        agg: dict[str, Any] = {}
        for k in (
            "avg_jct_s",
            "hit_rate",
            "backing_bytes",
            "resume_to_first_batch_s",
            "migrate_to_first_batch_s",
        ):
            vals = [x[k] for x in rs if x[k] is not None]
            agg[k] = statistics.median(vals) if vals else None
        agg["losses_identical"] = all(x["losses_identical"] for x in rs)
        agg["shared_slices"] = f"{sum(x['shared_slices'] for x in rs)}/{sum(x['slices'] for x in rs)}"
        agg["runs"] = rs
        out[mode] = agg
    # Ratios per round (its two runs side by side, in alternating order), then their median:
    # load on the machine that drifts between rounds falls on both sides of each ratio.
    comparisons = [(p, a, b) for p, a, b in COMPARISONS if a in runs and b in runs]
    for prefix, base, new in comparisons:
        pairs = list(zip(runs[base], runs[new], strict=True))
        for name, key in (("jct_speedup", "avg_jct_s"), ("backing_bytes_reduction", "backing_bytes")):
            ratios = [_ratio(a[key], b[key]) for a, b in pairs]
            got = [r for r in ratios if r is not None]
            out[prefix + name] = statistics.median(got) if got else None
            out[prefix + name + "_per_round"] = ratios
    out["targets"] = {"jct_speedup": 1.3, "backing_bytes_reduction": 1.5}
    return out


#: ``--sweep``: the shared dataset's size over a host's cache, and the jobs reading it (with
#: the one job on its own dataset, on the same two devices). 1.9x and 3 jobs is the default.
SWEEP_RATIOS = (1.2, 1.9, 3.0)
SWEEP_SHARED_JOBS = (3, 6)


def sweep(sc: Scenario, rounds: int, modes: tuple[str, ...] = ("independent", "codesign")) -> dict:
    """Both sides at each point of a small grid, each point its own interleaved rounds: where
    the co-design saves bytes and time and where it does not (docs/codesign.md). ``modes``
    beyond the two sides (an ablation's) are reported per point too, with their ratios."""
    shared_bytes = sc.shared_samples * sc.sample_bytes
    points = []
    ratio_keys = ("jct_speedup", "backing_bytes_reduction")
    for ratio in SWEEP_RATIOS:
        for n in SWEEP_SHARED_JOBS:
            cache = int(shared_bytes / ratio)
            point = Scenario(**{**sc.__dict__, "cache_bytes": cache, "shared_jobs": n})
            got = run(point, rounds, modes)
            points.append(
                {
                    "cache_ratio": ratio,
                    "shared_jobs": n,
                    "cache_bytes": cache,
                    **{
                        side: {
                            k: got[side][k]
                            for k in ("avg_jct_s", "backing_bytes", "hit_rate", "losses_identical")
                        }
                        for side in modes
                    },
                    **{
                        k: v
                        for k, v in got.items()
                        if any(k.endswith(r) or k.endswith(r + "_per_round") for r in ratio_keys)
                    },
                }
            )
    return {"scenario": sc.__dict__, "rounds": rounds, "sweep": points}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="microco bench codesign", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="four rounds of two epochs per job (about a minute here)"
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of each (default 6, quick 4)")
    p.add_argument("--restart-s", type=float, default=Scenario.restart_s, help="modelled process restart")
    p.add_argument(
        "--quantum-s", type=float, default=Scenario.quantum_s, help="the policy's time slice (both sides)"
    )
    p.add_argument(
        "--keep-pins",
        action="store_true",
        help="co-designed: keep a suspended job's pins (default: lend them)",
    )
    p.add_argument(
        "--scenario",
        choices=("mixed", "two-datasets"),
        default="mixed",
        help="mixed: issue 21's (default); two-datasets: two datasets of two jobs each, alternating",
    )
    p.add_argument(
        "--epochs", type=int, default=None, help="epochs per job (default: 3, quick 2; x3 two-datasets)"
    )
    p.add_argument(
        "--ablation",
        action="store_true",
        help="also run independent with dataset affinity and co-designed without it",
    )
    p.add_argument(
        "--claims-ablation",
        action="store_true",
        help="also run both sides with the loaders' in-flight claims off (as before them)",
    )
    p.add_argument(
        "--price-ablation",
        action="store_true",
        help="also run both sides with a miss priced by the link's time (MISS_PRICE='link')",
    )
    p.add_argument(
        "--allocation-ablation",
        action="store_true",
        help="also run both sides with the shared link's price in the allocation (``*_shared_link``: "
        "CacheCore(shared_link=True)) and with the allocation bound both ways (``*_bind``: "
        "CacheCore(bind_allocation=True)); both are off by default",
    )
    p.add_argument(
        "--grace-ablation",
        action="store_true",
        help="also run both sides with the policy's finish grace (``*_grace``: a running job that "
        "will finish within half a quantum at its telemetry's pace is not time-sliced out)",
    )
    p.add_argument(
        "--account",
        action="store_true",
        help="record every backing-store read and cache insert/eviction; classify why each read missed",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="both sides over a grid instead: the shared dataset 1.2x, 1.9x, 3x a host's cache, "
        "read by 3 and 6 jobs (rounds per point: 3, quick 2)",
    )
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the smoke test's size
    p.add_argument("--json", action="store_true", help="JSON on stdout (always JSON; kept for symmetry)")
    args = p.parse_args(argv)
    epochs = 2 if args.quick else Scenario.epochs
    if args.scenario == "two-datasets":
        # its datasets are half the shared one: three times the epochs, so that every job
        # still needs several time slices (as the mixed scenario's shared jobs do)
        epochs *= 3
    if args.epochs is not None:
        if args.epochs < 1:
            p.error("--epochs must be at least 1")
        epochs = args.epochs
    if args.quantum_s <= 0:
        p.error("--quantum-s must be positive")
    sc = Scenario(restart_s=args.restart_s, epochs=epochs, kind=args.scenario, quantum_s=args.quantum_s)
    if args.tiny:
        sc = Scenario(
            shared_samples=64,
            own_samples=32,
            sample_bytes=2000,
            cache_bytes=80_000,
            chunk_bytes=16_000,
            link_bytes_per_s=20e6,
            batch_size=8,
            compute_s=0.002,
            epochs=2,
            # Slices short beside a job's ~0.4 s: every job is suspended several times, so the
            # migrating one is too, whatever the machine's speed (the smoke test needs the move).
            quantum_s=0.05,
            restart_s=0.05,
            kind=args.scenario,
        )
    sc.lend = not args.keep_pins
    modes = ("independent", "codesign") + tuple(
        m for flag, ms in ABLATIONS.items() if getattr(args, flag) for m in ms
    )
    if args.sweep:
        rounds = args.rounds if args.rounds is not None else (1 if args.tiny else 2 if args.quick else 3)
        json.dump(sweep(sc, rounds, modes), sys.stdout, indent=2, default=float)
        print()
        return 0
    rounds = args.rounds if args.rounds is not None else (1 if args.tiny else 4 if args.quick else 6)
    out = run(sc, rounds, modes, account=args.account)
    json.dump(out, sys.stdout, indent=2, default=float)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
