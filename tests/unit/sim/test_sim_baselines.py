"""Baselines with fractional-GPU sharing (issue 23): fifo and las as the Alibaba cluster ran
them, and Tiresias' two-queue las, on small traces."""

from __future__ import annotations

import random

from microco.services.scheduler.policy import check_decisions, make_policy
from microco.services.scheduler.sim import (
    TIRESIAS_TWO_QUEUES,
    ClusterSpec,
    FractionalSharing,
    PerfModel,
    Simulator,
    TraceJob,
    baseline_policies,
    sharing_policy,
    simulate,
)


def _jobs(shares: list[float], duration: float = 100.0) -> list[TraceJob]:
    return [
        TraceJob(job_id=f"j{i}", submit_time=0.0, devices=1, duration_s=duration, model="m", gpu_share=s)
        for i, s in enumerate(shares)
    ]


def test_fractional_requests_share_one_device() -> None:
    trace = _jobs([0.25, 0.25, 0.5, 0.25])
    shared = simulate(sharing_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), check_invariants=True)
    plain = simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), check_invariants=True)
    # 0.25 + 0.25 + 0.5 fill the device at once; the fourth waits for room
    assert shared.packs == 2 and shared.decisions_refused == 0
    assert plain.packs == 0
    starts = sorted(v["first_feedback"] for v in shared.per_job.values())
    assert starts[2] < 10.0 < starts[3]
    assert shared.makespan_s < plain.makespan_s


def test_whole_device_requests_are_never_shared() -> None:
    trace = _jobs([1.0, 0.5, 1.0])
    r = simulate(sharing_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), check_invariants=True)
    assert r.packs == 0 and r.decisions_refused == 0


def test_a_fractional_arrival_joins_the_fullest_device_with_room() -> None:
    trace = _jobs([0.5, 0.25])
    trace.append(
        TraceJob(job_id="late", submit_time=50.0, devices=1, duration_s=100.0, model="m", gpu_share=0.25)
    )
    seen: list = []

    class Log(FractionalSharing):
        def decide(self, view):
            out = super().decide(view)
            seen.extend(out)
            return out

    r = simulate(Log(make_policy("fifo")), trace, ClusterSpec.for_gpus(2, 2), check_invariants=True)
    # j0 and j1 arrive together and the wrapped fifo gives each a free device; the late
    # arrival joins j0's (0.5 used: the fullest with room), although the other has room too
    assert r.packs == 1 and r.decisions_refused == 0
    pack = [d for d in seen if d.job_id == "late"][0]
    start0 = [d for d in seen if d.job_id == "j0"][0]
    assert pack.with_jobs == ("j0",) and pack.devices == start0.devices


def _random_trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 20.0)
        k = rng.choice((1, 1, 1, 2, 4))
        out.append(
            TraceJob(
                job_id=f"r{i:03d}",
                submit_time=round(t, 3),
                devices=k,
                duration_s=rng.lognormvariate(5.0, 1.0),
                model=rng.choice("AB"),
                gpu_share=rng.choice((0.25, 0.5, 1.0)) if k == 1 else 1.0,
            )
        )
    return out


class _Checked:
    """Every decision list must pass the contract's check on the view it was made on."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.time_driven = inner, inner.name, inner.time_driven
        if hasattr(inner, "wakeup_at"):
            self.wakeup_at = inner.wakeup_at
        self.problems: list = []

    def decide(self, view):
        out = self.inner.decide(view)
        self.problems.extend(check_decisions(view, out))
        return out


def test_sharing_baselines_decide_validly_on_a_random_trace() -> None:
    perf = PerfModel(
        alone={"v100": {"A": 10.0, "B": 6.0}},
        pairs={"v100": {("A", "B"): 0.8, ("B", "A"): 0.7, ("A", "A"): 0.5, ("B", "B"): 0.6}},
    )
    trace = _random_trace(60, 3)
    for label, pol in baseline_policies().items():
        checked = _Checked(pol)
        r = Simulator(checked, trace, ClusterSpec.for_gpus(8, 4), perf=perf, check_invariants=True).run()
        assert checked.problems == [], label
        assert r.decisions_refused == 0, label
        assert all(v["finished"] is not None for v in r.per_job.values()), label
        if label.endswith("+share"):
            assert r.packs > 0, label
        else:
            assert r.packs == 0, label


def test_tiresias_two_queues_is_las_with_one_threshold() -> None:
    pol = make_policy("las", **TIRESIAS_TWO_QUEUES)
    assert pol.config.thresholds_s == (3600.0,)
    assert set(baseline_policies()) == {
        "fifo",
        "fifo+share",
        "las",
        "las+share",
        "las[2 queues]",
        "las[2 queues]+share",
    }
