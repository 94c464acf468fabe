"""The scheduler-aware cache over real etcd: phases the scheduler's publisher writes reach a
cache core through an etcd watch (the policy itself is unit-tested on MemoryKV, in
tests/unit/codesign). In-process core, the session's etcd; no server process."""

from __future__ import annotations

import pytest
from _support import wait_until

from microco.clients.scheduler import PhasePublisher
from microco.services.cache import CacheCore, ChunkStore, SchedulerFollower

pytestmark = pytest.mark.integration


def _wait(pred, timeout=30.0):
    wait_until(pred, timeout, interval=0.02)


def test_phases_reach_the_cache_through_an_etcd_watch(tmp_path, etcd_kv):
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 1 << 20, "coordinated")
    core.report_progress("j", "ds", 0, [], dataset_bytes=1000)
    pub = PhasePublisher(etcd_kv)
    pub.publish([{"id": "j", "state": "running", "node": "h1"}], 1.0)  # (seen at start)
    follower = SchedulerFollower(core, etcd_kv, "h1").start()
    try:
        pub.publish(
            [{"id": "j", "state": "suspended", "node": "h1"}, {"id": "m", "state": "queued", "node": "h1"}],
            2.0,
        )
        _wait(lambda: "j" in core.held)  # the suspended job is kept past the TTL
        pub.publish([{"id": "j", "state": "finished", "node": "h1"}], 3.0)
        _wait(lambda: "j" not in core.jobs and "j" not in core.held)  # and dropped at once when done
    finally:
        follower.stop()
