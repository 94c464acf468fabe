"""What makes the co-design deliver (issue 21), each a pure decision or an in-process core:
the scheduler names as ``resuming`` the job its policy will run next (not the least-served
one affinity passes over); a suspended job's unread chunks are evicted last (evictable, yet
kept while anything else can go); a migrating job's working set comes from the cache of the
host it leaves, not from the backing store. MemoryKV, no sockets, no processes."""

from __future__ import annotations

import time

from microco.clients.scheduler import PhasePublisher, job_phases
from microco.common import MemoryKV
from microco.services.cache import CacheCore, ChunkStore, LocalStore, build_index
from microco.services.cache._follow import SchedulerFollower
from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    make_policy,
    next_to_run,
)

R, Q, S = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED
OFF = {"enable_packing": False, "enable_migration": False, "enable_grow_shrink": False}


def _view() -> ClusterView:
    """Two devices: a1's quantum ends at 160, b1 keeps its device. Waiting: c (least served,
    its own dataset) and b2 (b1's dataset, within the affinity slack)."""
    return ClusterView(
        now=150.0,
        devices=(DeviceView("g0", "n0"), DeviceView("g1", "n0")),
        jobs=(
            JobView(
                id="a1",
                devices_wanted=1,
                state=R,
                devices=("g0",),
                attained_service_s=100.0,
                last_change_at=100.0,
                dataset="a",
            ),
            JobView(
                id="b1",
                devices_wanted=1,
                state=R,
                devices=("g1",),
                attained_service_s=70.0,
                last_change_at=140.0,
                dataset="b",
            ),
            JobView(id="c", devices_wanted=1, state=Q, submitted_at=100.0, dataset="c"),
            JobView(id="b2", devices_wanted=1, state=S, attained_service_s=30.0, dataset="b"),
        ),
    )


def _records(view: ClusterView) -> list[dict]:
    state = {R: "running", Q: "queued", S: "suspended"}
    return [
        {"id": j.id, "state": state[j.state], "node": "n0", "attained_service_s": j.attained_service_s}
        for j in view.jobs
    ]


def test_the_job_published_as_resuming_is_the_one_the_policy_runs_next():
    view = _view()
    plain = make_policy("gandiva", quantum_s=60.0, **OFF)
    affine = make_policy("gandiva", quantum_s=60.0, dataset_affinity=True, **OFF)
    assert next_to_run(plain, view) == ("c",)  # at 160, least attained service first
    assert next_to_run(affine, view) == ("b2",)  # affinity passes c over: b1 reads b
    # Nothing is decided now (a1's quantum is not over): a forecast, not a decision.
    assert affine.decide(view) == []
    default = job_phases(_records(view), 150.0)
    assert default["c"].phase == "resuming" and default["b2"].phase == "suspended"
    told = job_phases(_records(view), 150.0, next_to_run(affine, view))
    assert told["b2"].phase == "resuming" and told["c"].phase == "waiting"
    kv = MemoryKV()
    PhasePublisher(kv).publish(_records(view), 150.0, ("b2",))
    assert kv.get_json("/microco/scheduler/phases/b2")["phase"] == "resuming"


def test_no_forecast_without_a_decision_point():
    view = ClusterView(now=0.0, devices=(DeviceView("g0", "n0"),), jobs=())
    assert next_to_run(make_policy("fifo"), view) is None  # (the phases' default order then)
    assert next_to_run(make_policy("fifo"), view, horizon_s=1.0) == ()  # it would start none


def _dataset(root, n=16, size=100, chunk_bytes=400):
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"s{i:03d}").write_bytes(bytes([i]) * size)
    store = LocalStore(str(root))
    return build_index(store.list_files(), store.read, chunk_bytes), store


def _bytes(index, store, c) -> bytes:
    return b"".join(store.read(s.path) for s in index.samples_of(c))


def test_a_suspended_jobs_unread_chunks_are_evicted_last(tmp_path):
    index, store = _dataset(tmp_path / "data")
    a, b, c = index.chunks[:3]  # 400 B each
    victims = {}
    for lent in (False, True):
        core = CacheCore(ChunkStore(str(tmp_path / f"cache-{lent}")), 800, "coordinated")
        core.report_progress("run", "ds", 0, [], dataset_bytes=index.total_bytes)
        core.report_progress("sus", "ds", 0, [a.digest], dataset_bytes=index.total_bytes)
        for ch in (b, a):  # b inserted first: first out by insertion order
            assert core.put(ch.digest, _bytes(index, store, ch), "ds").outcome == "stored"
        core.report_progress("run", "ds", 0, [a.digest, b.digest])
        if lent:
            core.lend("sus")  # suspended: it pins nothing, b is evictable...
        else:
            core.forget_job("sus")  # (as a cache not told of it sees it after the TTL)
        assert core.put(c.digest, _bytes(index, store, c), "ds").outcome == "stored"
        victims[lent] = [d for d in (a.digest, b.digest) if d not in core.ledger]
    assert victims[False] == [b.digest]  # the earliest inserted goes
    assert victims[True] == [a.digest]  # ...but b, which sus has still to read, goes last


def test_a_migrating_jobs_working_set_comes_from_the_old_hosts_cache(tmp_path):
    index, store = _dataset(tmp_path / "data")
    reads: list[str] = []

    class Counting:
        url = store.url

        def read(self, path: str) -> bytes:
            reads.append(path)
            return store.read(path)

    old = CacheCore(ChunkStore(str(tmp_path / "cache-h1")), 4000, "coordinated", node="h1")
    held = index.chunks[:3]
    for ch in held:
        assert old.put(ch.digest, _bytes(index, store, ch), "ds").outcome == "stored"
    old.report_progress("j", "ds", 0, [], dataset_bytes=index.total_bytes)
    asked: list[tuple[str, str]] = []

    def peer_chunks(node: str, digests: list[str], job: str) -> dict[str, bytes]:
        asked.append((node, job))
        return {d: data for d, data in old.read_chunks(digests) if data is not None}

    kv = MemoryKV()
    new = CacheCore(ChunkStore(str(tmp_path / "cache-h2")), 4000, "coordinated", node="h2")
    f = SchedulerFollower(
        new, kv, "h2", open_dataset=lambda _n: (index, Counting()), peer_chunks=peer_chunks
    ).start()
    kv.put_json("/microco/cache/jobs/j", {"dataset": "ds", "node": "h1"})
    PhasePublisher(kv).moving("j", "h1", "h2", 1.0)
    deadline = time.monotonic() + 30
    while not f.idle() or f.prefetched_chunks + f.copied_chunks < len(index.chunks):
        assert time.monotonic() < deadline, "the new host was not warmed"
        time.sleep(0.01)
    f.stop()
    assert set(new.lookup([c.digest for c in index.chunks], "ds")) == {c.digest for c in index.chunks}
    assert f.copied_chunks == len(held) and ("h1", "j") in asked
    copied = {s.path for ch in held for s in index.samples_of(ch)}
    assert reads and not copied & set(reads)  # the rest from the backing store, those not
