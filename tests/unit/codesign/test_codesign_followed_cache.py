"""A scheduler-aware cache: the scheduler's job phases (published in etcd) drive the cache
server's core. In-process: MemoryKV, a CacheCore over a temporary chunk store, a dataset in a
temporary folder. No sockets."""

from __future__ import annotations

import pytest
from _support import wait_until

from microco.clients.cache import warm_report
from microco.clients.scheduler import PhasePublisher, job_phases, phase_key, read_phases
from microco.common import MemoryKV
from microco.services.cache import CacheCore, ChunkStore, LocalStore, build_index
from microco.services.cache._follow import JOBS_PREFIX, SchedulerFollower


def _dataset(root, n=16, size=100, chunk_bytes=400):
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"s{i:03d}").write_bytes(bytes([i]) * size)
    store = LocalStore(str(root))
    return build_index(store.list_files(), store.read, chunk_bytes), store


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _wait(pred, timeout=30.0):
    wait_until(pred, timeout, interval=0.01)


def _setup(tmp_path, node="h1", capacity=4000, ttl=60.0):
    index, store = _dataset(tmp_path / "data")
    clock = Clock()
    core = CacheCore(
        ChunkStore(str(tmp_path / f"cache-{node}")), capacity, "coordinated", clock=clock, job_ttl_s=ttl
    )
    kv = MemoryKV()
    follower = SchedulerFollower(core, kv, node, open_dataset=lambda _name: (index, store)).start()
    return index, store, core, kv, follower, clock


def _fill(core, index, store, ds="ds", chunks=None):
    for c in index.chunks if chunks is None else chunks:
        data = b"".join(store.read(s.path) for s in index.samples_of(c))
        assert core.put(c.digest, data, ds).outcome == "stored"


def _record(job_id, state, node="h1", attained=0.0, changed=0.0, pending=None):
    return {
        "id": job_id,
        "state": state,
        "node": node,
        "attained_service_s": attained,
        "last_change_at": changed,
        "pending": pending,
    }


def test_phases_from_records_next_slice_first_and_only_changes_written():
    recs = [
        _record("a", "running"),
        _record("b", "suspended", attained=50.0),
        _record("c", "queued", attained=10.0),
        _record("d", "finished"),
    ]
    got = job_phases(recs, 1.0)
    assert {j: p.phase for j, p in got.items()} == {
        "a": "running",
        "b": "suspended",
        "c": "resuming",  # least attained service: the next time slice is its
        "d": "finished",
    }
    # Nobody runs: no slice to take over, so nobody is "about to resume".
    assert job_phases([_record("b", "suspended")], 1.0)["b"].phase == "suspended"
    kv = MemoryKV()
    pub = PhasePublisher(kv)
    pub.publish(recs, 1.0)
    assert pub.writes == 4 and read_phases(kv)["c"].phase == "resuming"
    pub.publish(recs, 2.0)  # nothing changed but the time: nothing written
    assert pub.writes == 4
    pub.moving("a", "h1", "h2", 3.0)
    pub.publish([_record("a", "migrating"), *recs[1:]], 3.0)
    assert read_phases(kv)["a"].target == "h2"  # the target published at the move is kept
    pub.publish(recs[1:2], 4.0)  # a, c, d's records are gone: their keys too
    assert sorted(read_phases(kv)) == ["b"] and kv.get(phase_key("a")) is None


def test_a_finished_job_drops_its_pins_at_once(tmp_path):
    index, store, core, kv, follower, _clock = _setup(tmp_path, capacity=1000)
    core.report_progress("j", "ds", 0, [], dataset_bytes=index.total_bytes)
    _fill(core, index, store, chunks=index.chunks[:2])
    assert core.room("other") == 1000 - 800  # pinned: j has consumed none of them
    PhasePublisher(kv).publish([_record("j", "finished")], 1.0)
    assert "j" not in core.jobs and core.room("other") == 1000  # not after the TTL: now
    follower.stop()


@pytest.mark.parametrize("lend", [True, False])
def test_a_suspended_job_keeps_its_allocation_past_the_ttl_and_lends_its_pins(tmp_path, lend):
    index, store, core, kv, follower, clock = _setup(tmp_path, capacity=1000, ttl=60.0)
    follower.lend = lend
    core.report_progress("j", "ds", 0, [], dataset_bytes=index.total_bytes)
    _fill(core, index, store, chunks=index.chunks[:2])
    first = index.chunks[0].digest
    assert not core.consumption.fully_consumed("ds", first)  # pinned for j
    pub = PhasePublisher(kv)
    # j waits, m is next (less attained service), k runs.
    pub.publish(
        [_record("j", "suspended", attained=9.0), _record("m", "queued"), _record("k", "running")], 1.0
    )
    clock.t += 600  # ten minutes suspended; another job reports meanwhile
    core.report_progress("k", "other", 0, [], dataset_bytes=10_000)
    assert "j" in core.jobs and "j" in core.job_names("j")  # its allocation share stays
    # Lent: the running jobs may evict what only j needs; kept: still pinned for it.
    assert core.consumption.fully_consumed("ds", first) is lend
    pub.publish([_record("j", "running"), _record("k", "suspended"), _record("m", "running")], 2.0)
    assert not core.consumption.fully_consumed("ds", first)  # restored with its progress
    follower.stop()


def test_without_the_scheduler_the_ttl_drops_a_silent_job(tmp_path):
    index, store, core, _kv, follower, clock = _setup(tmp_path, capacity=1000)
    follower.stop()
    core.report_progress("j", "ds", 0, [], dataset_bytes=index.total_bytes)
    _fill(core, index, store, chunks=index.chunks[:2])
    clock.t += 600
    core.report_progress("k", "other", 0, [], dataset_bytes=10_000)
    assert "j" not in core.jobs


def test_the_job_about_to_resume_gets_its_unconsumed_chunks_prefetched(tmp_path):
    index, store, core, kv, follower, _clock = _setup(tmp_path, capacity=4000)
    consumed = [index.chunks[0].digest]
    core.report_progress("j", "ds", 0, consumed, dataset_bytes=index.total_bytes)
    # Another job reads another dataset; j waits for its slice: it is next.
    PhasePublisher(kv).publish([_record("k", "running"), _record("j", "suspended")], 1.0)
    _wait(follower.idle)
    want = {c.digest for c in index.chunks[1:]}  # not the chunk it has already consumed
    assert set(core.lookup(list(want), "ds")) == want
    assert index.chunks[0].digest not in core.ledger
    assert follower.prefetched_chunks == len(want)
    follower.stop()


def test_a_migrating_job_warms_the_new_host_and_leaves_the_old_one(tmp_path):
    index, store, old, kv, f_old, _ = _setup(tmp_path / "a", node="h1")
    new = CacheCore(ChunkStore(str(tmp_path / "cache-h2")), 4000, "coordinated")
    f_new = SchedulerFollower(new, kv, "h2", open_dataset=lambda _name: (index, store)).start()
    old.report_progress("j", "ds", 0, [], dataset_bytes=index.total_bytes)
    pub = PhasePublisher(kv)
    pub.publish([_record("j", "running")], 1.0)
    assert kv.get_json(JOBS_PREFIX + "j") == {"dataset": "ds", "node": "h1"}
    assert warm_report(kv, "j") is None
    pub.moving("j", "h1", "h2", 2.0)
    _wait(f_new.idle)
    assert len(new.lookup([c.digest for c in index.chunks], "ds")) == len(index.chunks)
    assert "j" in new.jobs and "j" not in old.jobs  # pinned for it there, dropped here
    # the new host reports the warm over (the scheduler holds the restart until then)
    _wait(lambda: warm_report(kv, "j") is not None)
    assert warm_report(kv, "j") == {"node": "h2", "ok": True, "chunks": len(index.chunks), "error": ""}
    pub.publish([_record("j", "finished", node="h2")], 3.0)
    _wait(lambda: warm_report(kv, "j") is None)  # gone with the job
    f_old.stop()
    f_new.stop()


def test_a_job_moving_in_whose_dataset_is_unknown_is_reported_not_warm(tmp_path):
    _index, _store, _core, kv, follower, _ = _setup(tmp_path, node="h2")
    follower.dataset_wait_s = 0.0
    PhasePublisher(kv).moving("ghost", "h1", "h2", 1.0)
    _wait(lambda: warm_report(kv, "ghost") is not None)
    report = warm_report(kv, "ghost")
    assert report is not None and report["node"] == "h2" and not report["ok"] and report["error"]
    follower.stop()


@pytest.mark.parametrize("phase", ["waiting", "resuming"])
def test_an_unknown_job_is_no_error(tmp_path, phase):
    _index, _store, core, kv, follower, _ = _setup(tmp_path)
    follower.dataset_wait_s = 0.0
    kv.put_json(
        phase_key("ghost"), {"job_id": "ghost", "phase": phase, "node": "h1", "target": "", "at": 0.0}
    )
    _wait(follower.idle)
    assert core.jobs == {}
    follower.stop()


def test_the_scheduler_publishes_its_jobs_phases_once_per_change():
    import sys

    from microco.services.scheduler import SchedulerCore
    from microco.services.scheduler.policy import make_policy

    kv = MemoryKV()
    kv.put_json("/microco/nodes/n1", {"name": "n1", "address": "127.0.0.1:1", "devices": []})
    core = SchedulerCore(kv, make_policy("fifo"))  # no device anywhere: the job waits
    from microco.services.scheduler import _jobs as J

    job = J.new_record(J.validate_spec({"command": [sys.executable, "-c", "pass"], "devices": 1}, 1), 1.0)
    kv.put(J.job_key(job.id), job.to_json())  # as the API writes it
    core.tick()
    assert read_phases(kv)[job.id].phase == "waiting"
    writes = core.phases.writes
    core.tick()
    assert core.phases.writes == writes  # nothing changed: nothing written
