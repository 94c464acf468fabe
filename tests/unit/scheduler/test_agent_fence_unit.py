"""Fencing: an agent that cannot confirm its lease stops its jobs before the lease can expire,
refuses new ones, and comes back under a new epoch (services/agent/_fence.py)."""

from __future__ import annotations

import sys

import pytest

from microco.common.errors import Unavailable
from microco.common.kv import MemoryKV
from microco.services.agent._fence import FENCE_AT, KILL_MARGIN, FencedLease
from microco.services.agent._service import NodeAgent


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_fences_before_the_lease_can_expire_and_once() -> None:
    kv, clock, fenced = MemoryKV(), _Clock(), []
    fl = FencedLease(kv, "/n/a", lambda: b"rec", 4, lambda: fenced.append(clock.t), clock=clock)
    fl._put_new()  # sent at 100: the lease lives at least until 104
    epoch = fl.epoch
    assert epoch and kv.get("/n/a") == b"rec" and not fl.fenced
    clock.t = 100.0 + FENCE_AT * 4 - 0.01
    fl.check()
    assert not fenced
    clock.t = 100.0 + FENCE_AT * 4
    fl.check()
    fl.check()
    assert fenced == [clock.t] and fl.fenced and fl.fences == 1 and fl.epoch == 0
    assert fenced[0] < 104.0  # before the earliest moment etcd could expire the lease
    with pytest.raises(Unavailable):
        NodeAgent._check_not_fenced(type("A", (), {"_leased": fl, "node": "a"})())  # type: ignore[arg-type]
    fl._put_new()  # etcd answers again: a new lease, a new epoch, the fence lifted
    assert not fl.fenced and fl.epoch not in (0, epoch) and kv.get("/n/a") == b"rec"
    fl.stop()


def test_a_fenced_jobs_grace_ends_before_the_lease_can_expire() -> None:
    """A fence reached on time leaves the grace asked for where the lease allows it; one reached
    late (the watchdog starved) kills at once (CI, 2026-12-02: a 0.6 s grace after a fence due
    0.75 s before expiry left the job alive after its lease had gone)."""
    kv, clock = MemoryKV(), _Clock()
    fl = FencedLease(kv, "/n/g", lambda: b"x", 10, lambda: None, clock=clock)
    fl._put_new()  # the lease lives at least until 110
    assert fl.kill_grace(1.0) == 1.0  # not fenced: nothing known to bound it but what is asked
    clock.t = 100.0 + FENCE_AT * 10  # fenced on time: 2.5 s left, 1.25 s of it for the kill
    fl.check()
    assert (
        fl.fenced
        and fl.kill_grace(1.0) == 1.0
        and fl.kill_grace(2.0) == pytest.approx(2.5 - KILL_MARGIN * 10)
    )
    clock.t = 109.0  # the same fence, its jobs stopped late: killed at once
    assert fl.kill_grace(1.0) == 0.0
    fl3 = FencedLease(kv, "/n/h", lambda: b"x", 3, lambda: None, clock=clock)
    fl3._put_new()  # 3 s lease sent at 109: lives until 112; fenced at 111.25
    clock.t = 109.0 + FENCE_AT * 3
    fl3.check()
    assert fl3.kill_grace(0.6) == pytest.approx(0.75 - KILL_MARGIN * 3)  # under the 0.6 s asked
    fl.stop()
    fl3.stop()


def test_a_confirmed_keepalive_moves_the_deadline_from_its_send_time() -> None:
    kv, clock = MemoryKV(), _Clock()
    fl = FencedLease(kv, "/n/b", lambda: b"x", 6, lambda: None, clock=clock)
    fl._put_new()
    clock.t = 103.0
    with fl._lock:
        fl._deadline = max(fl._deadline, clock.t + fl.ttl)  # what _keepalive does on an answer
    clock.t = 103.0 + FENCE_AT * 6 - 0.01
    fl.check()
    assert not fl.fenced
    with pytest.raises(ValueError):
        FencedLease(kv, "/n/c", lambda: b"", 0, lambda: None)
    with pytest.raises(ValueError):
        FencedLease(kv, "/n/c", lambda: b"", 5, lambda: None, fence_at=1.0)


def test_a_fenced_agent_stops_its_jobs_and_refuses_new_ones(tmp_path) -> None:
    agent = NodeAgent(MemoryKV(), "fx", str(tmp_path), virtual_devices=1, lease_ttl_s=5, preload=[])
    try:
        agent.register("127.0.0.1:1")
        dev = agent.devices[0].id
        cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
        proc = agent.procs.start("j1", cmd, {}, [dev])
        assert proc.poll() is None
        assert agent.record()["epoch"] == agent._leased.epoch != 0
        agent._leased._fence("test")
        assert proc.poll() is not None  # stopped before the fence returned
        with pytest.raises(Unavailable, match="fenced"):
            agent.procs.start("j2", cmd, {}, [dev])
    finally:
        agent.close()


def test_a_put_failing_after_its_lease_was_granted_keeps_the_fence() -> None:
    # Seen in the fault matrix: as a paused etcd came back, the new lease was granted but the
    # put timed out; the fence lifted anyway with no record in etcd, and the node never
    # re-registered (its job, fenced, was never restarted).
    class FlakyPut(MemoryKV):
        fail = 0

        def put(self, key, value, lease=None):  # type: ignore[no-untyped-def]
            if self.fail:
                self.fail -= 1
                raise TimeoutError("etcd connection timeout")
            super().put(key, value, lease=lease)

    kv, clock = FlakyPut(), _Clock()
    fl = FencedLease(kv, "/n/d", lambda: b"rec", 4, lambda: None, clock=clock)
    fl._put_new()
    clock.t += 4
    fl.check()
    assert fl.fenced and kv.get("/n/d") is None
    kv.fail = 1
    with pytest.raises(TimeoutError):
        fl._put_new()
    assert fl.fenced and fl.epoch == 0 and kv.get("/n/d") is None  # still fenced: try again
    fl._put_new()
    assert not fl.fenced and fl.epoch and kv.get("/n/d") == b"rec"
    fl.stop()
