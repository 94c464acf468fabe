"""Session 40: a grow judged from mini-batch times that vary widely. A loop whose every 16th
batch waits 250 ms for data (a ``DataLoader`` restarting its workers at each epoch's start)
and whose others take 10 ms is a real job's shape; the scheduler judged a grow from one
20-batch mean before it and one after, each of which held one or two of those waits (24 or
37 ms around a true 25), so the verdict was the phase of the ticks, not the job: a grow that
did not pay was kept, one that paid was undone and the job capped for good.

The job's side is the real hook (``JobContext``) on a fake clock; the agent's relay of its
report (``hook_report``, ``status_to_proto``) and the scheduler's reconciler and gandiva's
verdict are the real ones."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from _support import put_node

from microco.clients.agent import AgentDirectory
from microco.clients.scheduler import JobContext
from microco.clients.telemetry import StepTelemetry
from microco.common.kv import MemoryKV
from microco.services.agent._procs import hook_report
from microco.services.agent._service import status_to_proto
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler.policy import Resize, make_policy


class FakeAgents:
    def __init__(self, real):
        self.nodes = real.nodes
        self.seq = 0

    def control(self, address, job_id, action, devices=None):
        self.seq += 1
        return SimpleNamespace(control_seq=self.seq)


def _core():
    kv = MemoryKV()
    put_node(kv, "n1", devices=2)
    core = SchedulerCore(kv, make_policy("gandiva", quantum_s=0.001))
    core.io.agents = FakeAgents(AgentDirectory(kv))
    core.io.nodes = core.agents.nodes()
    core.io.address = lambda node: "127.0.0.1:1"  # type: ignore[method-assign]
    rec = core.submit({"command": [sys.executable, "-c", "pass"], "devices": 1, "name": "e", "elastic": True})
    rec = replace(rec, state=J.RUNNING, node="n1", devices=("n1/0",), attempt=1)
    core.store.jobs = {rec.id: rec}
    core.store.save = core.store.keep  # type: ignore[method-assign]
    return core, rec.id


def _verdict(phase: int, fast_ms_after: float, period: int = 16, drift_per_1000: float = 0.0) -> str:
    """Run the job on one device, grow it when the policy says so, run on two, and return
    what gandiva made of the grow: "kept" or "undone". Readings every 7 mini-batches,
    starting at ``phase``."""
    core, jid = _core()
    clock = [core.store.jobs[jid].last_change_at]
    ctx = JobContext(
        telemetry=StepTelemetry(clock=lambda: clock[0], cpu_clock=lambda: clock[0]), devices=["n1/0"]
    )
    fast = 10.0
    for step in range(1, 4000):
        grown = 1.0 + drift_per_1000 * step / 1000.0  # a step time that grows over the run
        clock[0] += (250.0 if step % period == 0 else fast * grown) / 1000.0
        ctx.step_end(step)
        if step % 7 != phase:
            continue
        rec = core.store.jobs[jid]
        p = status_to_proto(
            {
                "job_id": jid,
                "pid": 1,
                "attempt": 1,
                "exited": False,
                "exit_code": 0,
                "device_ids": list(rec.devices),
                "control_seq": 0,
                "started_at": 0.0,
                "message": "",
                **hook_report(ctx.status()),
            }
        )
        rec = core.reconciler._progress(rec, p, 0.1)
        core.store.keep(replace(rec, pending=None))
        decisions = [d for d in core.policy.decide(core._view(clock[0])) if isinstance(d, Resize)]
        for d in decisions:
            assert core.actions.apply(d, clock[0])
            core.store.keep(replace(core.store.jobs[jid], pending=None))
            if "undo grow" in d.reason:
                return "undone"
            fast = fast_ms_after  # grown: the job's compute now takes this long
        rec = core.store.jobs[jid]
        if rec.grow_trial is None and len(rec.devices) == 2:
            return "kept"
        if len(rec.devices) == 2 and step > 3000:
            return "kept"
    return "never grown"


@pytest.mark.parametrize("phase", range(7))
def test_a_grow_that_does_not_pay_is_undone_whatever_the_phase_of_the_readings(phase):
    """Ten ms a batch on one device and on two (the 250 ms waits unchanged): no gain."""
    assert _verdict(phase, fast_ms_after=10.0) == "undone"


@pytest.mark.parametrize("phase", range(7))
@pytest.mark.parametrize("period", [16, 32])
def test_a_grow_that_pays_is_kept_whatever_the_phase_of_the_readings(phase, period):
    """Five ms a batch on two devices: (15 x 10 + 250) / (15 x 5 + 250) = 1.23x the throughput
    with a wait every 16 batches, 1.38x every 32, above gandiva's 1.1. (Every 32: the first 20
    batches after the start held no wait at all, so the mean since the change looked known at
    10 ms, and the grow was undone; it is now measured over 3 s at least.)"""
    assert _verdict(phase, fast_ms_after=5.0, period=period) == "kept"


@pytest.mark.xfail(
    strict=True, reason="session 42: a grow is judged against the time before it; drift is charged to it"
)
@pytest.mark.parametrize("drift_per_1000", [2.0])
def test_a_grow_that_pays_is_kept_while_the_step_time_drifts(drift_per_1000):
    """Session 42, found and not fixed (docs/scheduler.md, "Session 42 held-out round"): a job
    whose step time grows over its run (a sequence-length warm-up: here 200% per 1,000
    mini-batches, a 250 ms wait every 64) whose compute runs 1.5x as fast on two devices: the
    same grow without drift is kept. The time before the grow is measured before it, the time
    after it later: the drift between the two readings is charged to the grow, which is undone
    (the job capped below two devices for good). Strict: this fails once a fix makes the grow
    kept, so that the mark is removed."""
    assert _verdict(0, fast_ms_after=10.0 / 1.5, period=64, drift_per_1000=drift_per_1000) == "kept"
