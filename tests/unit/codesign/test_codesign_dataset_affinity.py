"""Where the scheduler learns the dataset each job reads (issue 21, dataset affinity): the
cache server a job reports to publishes it in etcd, the scheduler's views carry it when its
policy uses it. In-process: MemoryKV, a CacheCore over a temporary chunk store. No sockets."""

from __future__ import annotations

import sys

from microco.clients.cache import job_dataset, job_datasets, publish_job_dataset
from microco.clients.scheduler import PhasePublisher
from microco.common import MemoryKV
from microco.services.cache import CacheCore, ChunkStore
from microco.services.cache._follow import SchedulerFollower


def test_the_cache_publishes_the_dataset_a_job_reads_and_forgets_it_when_the_job_ends(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 4000, "coordinated")
    kv = MemoryKV()
    follower = SchedulerFollower(core, kv, "h1", publish_interval_s=3600.0).start()
    try:
        follower.publish_datasets()
        assert job_datasets(kv) == {}  # no job has reported
        core.report_progress("j/rank0", "imagenet", 0, [])  # a rank of job j names its dataset
        core.report_progress("k", "coco", 0, [])
        follower.publish_datasets()
        assert job_datasets(kv) == {"j": "imagenet", "k": "coco"}
        assert kv.get_json("/microco/cache/jobs/j") == {"dataset": "imagenet", "node": "h1"}
        PhasePublisher(kv).publish([{"id": "j", "state": "finished"}, {"id": "k", "state": "running"}], 1.0)
        assert job_dataset(kv, "j") == "" and job_dataset(kv, "k") == "coco"
    finally:
        follower.stop()


def test_the_scheduler_views_carry_the_registered_dataset_when_its_policy_uses_it():
    from microco.services.scheduler import SchedulerCore
    from microco.services.scheduler import _jobs as J
    from microco.services.scheduler.policy import make_policy

    kv = MemoryKV()
    kv.put_json("/microco/nodes/n1", {"name": "n1", "address": "127.0.0.1:1", "devices": []})
    jobs = []
    for _ in range(2):
        rec = J.new_record(J.validate_spec({"command": [sys.executable, "-c", "pass"], "devices": 1}, 1), 1.0)
        kv.put(J.job_key(rec.id), rec.to_json())
        jobs.append(rec.id)
    publish_job_dataset(kv, jobs[0], "imagenet", "n1")  # the other has not read anything yet
    on = SchedulerCore(kv, make_policy("gandiva", dataset_affinity=True))
    seen = {j.id: j.dataset for j in on.observe(10.0).jobs}
    assert seen == {jobs[0]: "imagenet", jobs[1]: ""}
    off = SchedulerCore(kv, make_policy("gandiva"))  # no affinity: etcd is not asked
    assert {j.dataset for j in off.observe(10.0).jobs} == {""}


def test_a_suspended_job_lends_its_allocation_share_and_gets_it_back(tmp_path):
    """Jobs of one dataset time-sliced together: while they wait, the running jobs' dataset
    may use their share of the cache (lent with their pins), and it comes back on resume."""
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 1000, "coordinated", probe_bytes=100)
    core.report_progress("j", "a", 0, [], timings=[(0.0, 0.5, 100, 1)], dataset_bytes=800)
    core.report_progress("k", "b", 0, [], timings=[(0.0, 0.5, 100, 1)], dataset_bytes=800)
    shares = {a.dataset: a.bytes for a in core.allocations}
    assert shares["b"] < 800  # the two datasets split the cache
    core.lend("j")
    assert {a.dataset: a.bytes for a in core.allocations} == {"b": 800}  # b may use j's share
    assert "j" in core.jobs  # j is still known: its benefit estimate stays
    core.restore("j")
    assert {a.dataset: a.bytes for a in core.allocations} == shares
