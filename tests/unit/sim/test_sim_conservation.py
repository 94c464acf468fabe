"""Bookkeeping that can fail: device-seconds and progress checked from independent counters
(each device's timeline of holders against each job's attained service and progress), on a
slice of a real trace, and shown to catch a corrupted counter."""

from __future__ import annotations

import functools

import pytest

from microco.services.scheduler.policy import make_policy
from microco.services.scheduler.sim import (
    ClusterSpec,
    Simulator,
    default_perf_model,
    default_traces_dir,
    load_trace,
)

TRACES = default_traces_dir()
ALIBABA = TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
needs_traces = pytest.mark.skipif(not ALIBABA.is_file(), reason=f"public traces not at {TRACES}")


@functools.cache
def _slice(n: int = 200):
    # the trace's busiest part: its last n GPU pods (the first ones trickle in over months)
    return tuple(load_trace(ALIBABA)[-n:])


@needs_traces
@pytest.mark.parametrize("name", ["gandiva", "fifo", "las"])
def test_conservation_on_real_trace_slice(name: str) -> None:
    jobs = _slice()
    sim = Simulator(
        make_policy(name),
        jobs,
        ClusterSpec.for_gpus(16),
        perf=default_perf_model(TRACES),
        check_invariants=True,
    )
    res = sim.run()  # checks after every decision and at the end
    assert res.jobs == len(jobs)
    assert all(pj["finished"] is not None for pj in res.per_job.values())
    # the two sides are different counters: the device timelines hold every job's time
    assert sum(sim.device_busy_s.values()) == pytest.approx(
        sum(pj["device_s"] for pj in res.per_job.values())
    )
    assert sum(sim.device_busy_s.values()) > 0


class _LeakyAttained(Simulator):
    """A bookkeeping bug: one sync of one job adds a second to its attained service."""

    bumped = False

    def _sync(self, j):
        super()._sync(j)
        if j.devices and not self.bumped and self.now > 0:
            j.attained += 1.0
            type(self).bumped = True


class _LostInterval(Simulator):
    """A bookkeeping bug: the first release of a device forgets to record its interval."""

    lost = False

    def _release(self, j):
        if j.devices and not self.lost:
            type(self).lost = True
            d = j.devices[0]
            self._open[d][j.id] = self.now  # the interval so far is never counted
        return super()._release(j)


class _FreeProgress(Simulator):
    """A bookkeeping bug: a waiting job's progress advances without any device."""

    def _sync(self, j):
        super()._sync(j)
        if not j.devices and j.finished is None and j.phase.name == "SUSPENDED":
            j.done = min(j.work, j.done + 50.0)


def _small_trace():
    from microco.services.scheduler.sim import TraceJob

    # more one-device jobs than devices: time-slicing suspends and resumes them
    return [
        TraceJob(f"j{i}", float(i * 5), 1, 600.0 + 37 * i, model="ResNet-18 (batch size 64)")
        for i in range(6)
    ]


@pytest.mark.parametrize("bug", [_LeakyAttained, _LostInterval, _FreeProgress])
def test_check_catches_injected_bookkeeping_bug(bug) -> None:
    for attr in ("bumped", "lost"):
        if hasattr(bug, attr):
            setattr(bug, attr, False)
    trace = _small_trace()
    cl = ClusterSpec.for_gpus(2, 2)
    # the same run without the bug passes the check
    Simulator(make_policy("gandiva", quantum_s=30.0), trace, cl, check_invariants=True).run()
    with pytest.raises(AssertionError, match="conservation"):
        bug(make_policy("gandiva", quantum_s=30.0), trace, cl, check_invariants=True).run()


def test_check_runs_without_decisions_too() -> None:
    """The check is a method the runner calls at the end as well: a corrupted counter after
    the last decision is caught."""
    sim = Simulator(make_policy("fifo"), _small_trace(), ClusterSpec.for_gpus(2, 2), check_invariants=True)
    sim.run()
    sim.check_conservation()
    d = next(iter(sim.device_busy_s))
    sim.device_busy_s[d] += 0.5
    with pytest.raises(AssertionError, match="conservation"):
        sim.check_conservation()
