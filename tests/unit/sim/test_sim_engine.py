"""The simulator's bookkeeping: it drives the real policy objects, conserves work and
device-seconds, never puts a job in two places, finishes every job, and is deterministic."""

from __future__ import annotations

import random

import pytest

from microco.services.scheduler.policy import (
    JobView,
    check_decisions,
    cluster_view_from_dicts,
    cluster_view_to_dict,
    make_policy,
)
from microco.services.scheduler.sim import (
    AshaSearcher,
    ClusterSpec,
    CostModel,
    PerfModel,
    Simulator,
    TraceJob,
    UnknownModelError,
    asha_rungs,
    contended_window,
    default_traces_dir,
    load_window,
    run_hp_search,
    simulate,
)
from microco.services.scheduler.sim._engine import _job_view

FAMILIES = ["ResNet-18 (batch size 64)", "ResNet-50 (batch size 64)", "LM (batch size 20)", "A3C"]
POLICIES = ["fifo", "las", "gandiva"]


def perf() -> PerfModel:
    p = default_traces_dir() / "gavel_throughputs.json"
    return PerfModel.from_gavel(p) if p.exists() else PerfModel.uniform()


def random_trace(n: int = 80, seed: int = 1) -> list[TraceJob]:
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.expovariate(1 / 40.0)
        jobs.append(
            TraceJob(
                job_id=f"j{i:03d}",
                submit_time=round(t, 1),
                devices=rng.choice([1, 1, 1, 1, 2, 4, 8]),
                duration_s=rng.choice([30.0, 120.0, 600.0, 3000.0]),
                model=rng.choice(FAMILIES),
                elastic=rng.random() < 0.15,
                gpu_share=rng.choice([0.3, 0.5, 1.0, 1.0]),
            )
        )
    return jobs


class Recording:
    """Wraps a registered policy; checks every decision list the sim used against the view it
    was decided on, records the problems found, and keeps a copy of every ``keep_every``-th
    view with its decisions (0: none)."""

    def __init__(self, inner, keep_every: int = 0) -> None:
        self.inner = inner
        self.name = inner.name
        self.time_driven = getattr(inner, "time_driven", True)
        self.calls = 0
        self.problems: list[str] = []
        self.keep_every = keep_every
        self.kept: list = []
        if hasattr(inner, "wakeup_at"):
            self.wakeup_at = inner.wakeup_at

    def decide(self, view):
        out = self.inner.decide(view)
        # checked now: the simulator's views are exact only while the policy is called (a
        # holding job's attained service moves with the clock, docs/scheduler-sim.md,
        # "Performance"). Checking here, rather than a copy of every view afterwards, spares
        # the copies (four fifths of the test's time).
        if self.keep_every and self.calls % self.keep_every == 0:
            d = cluster_view_to_dict(view)  # a copy (the view goes on changing)
            self.kept.append((cluster_view_from_dicts(d["now"], d["devices"], d["jobs"]), out))
        self.calls += 1
        self.problems += [f"t={view.now}: {p}" for p in check_decisions(view, out)]
        return out


@pytest.mark.parametrize("name", POLICIES)
def test_bookkeeping_on_random_trace(name: str) -> None:
    trace = random_trace()
    pol = Recording(make_policy(name, **({"quantum_s": 30.0} if name == "gandiva" else {})))
    sim = Simulator(pol, trace, ClusterSpec.for_gpus(8, 4), perf=perf(), check_invariants=True, tick_s=30)
    res = sim.run()
    # every job finishes, having done exactly its work
    assert res.jobs == len(trace)
    for jid, pj in res.per_job.items():
        assert pj["finished"] is not None, jid
        assert pj["done_s"] == pytest.approx(pj["work_s"], rel=1e-6, abs=1e-6)
        assert pj["first_feedback"] >= pj["submit"]
    # device-seconds conserved: what jobs held is what devices were held for
    assert sum(pj["device_s"] for pj in res.per_job.values()) == pytest.approx(
        sum(sim.device_busy_s.values())
    )
    # a device cannot be held longer than the run (packing counts once per job, so allow 2x)
    assert max(sim.device_busy_s.values()) <= 2 * res.makespan_s + 1e-6
    # the simulator drove the real policy and every decision list it applied was valid
    assert pol.calls and pol.problems == []
    assert res.decisions_refused == 0
    assert 0 < res.gpu_utilization <= res.gpu_allocation <= 1.0 + 1e-9


@pytest.mark.parametrize("name", POLICIES)
def test_deterministic(name: str) -> None:
    trace = random_trace(60, seed=3)
    a = simulate(make_policy(name), trace, ClusterSpec.for_gpus(8, 4), perf=perf())
    b = simulate(make_policy(name), list(reversed(trace)), ClusterSpec.for_gpus(8, 4), perf=perf())
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("sim_wall_s")
        d.pop("sim_cpu_s")
    assert da == db
    assert a.per_job == b.per_job


def test_fifo_exclusive_device_seconds_match_work_plus_start_cost() -> None:
    trace = [TraceJob(f"j{i}", float(i), 1, 100.0) for i in range(6)]
    res = simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(2, 2), costs=CostModel(start_s=5.0))
    for pj in res.per_job.values():
        assert pj["device_s"] == pytest.approx(105.0)
    assert res.preemptions == 0 and res.packs == 0
    # 6 jobs of 105 s on 2 devices, arrivals 0..5: three waves, the last job starts at 211
    assert res.makespan_s == pytest.approx(316.0)


def test_time_slicing_gives_everyone_progress_and_first_feedback() -> None:
    trace = [TraceJob(f"j{i}", 0.0, 1, 1000.0) for i in range(4)]
    f = simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(2, 2))
    g = simulate(
        make_policy("gandiva", quantum_s=60, enable_packing=False), trace, ClusterSpec.for_gpus(2, 2)
    )
    assert g.avg_time_to_first_feedback_s < f.avg_time_to_first_feedback_s / 5
    assert g.preemptions > 0
    assert all(pj["finished"] for pj in g.per_job.values())


def test_packing_helps_complementary_jobs() -> None:
    trace = [TraceJob(f"j{i}", 0.0, 1, 1000.0, model=FAMILIES[1], gpu_share=0.4) for i in range(4)]
    cl = ClusterSpec.for_gpus(2, 2)
    on = simulate(make_policy("gandiva", enable_time_slicing=False), trace, cl, perf=perf())
    off = simulate(
        make_policy("gandiva", enable_time_slicing=False, enable_packing=False), trace, cl, perf=perf()
    )
    assert on.packs >= 2
    assert on.makespan_s < off.makespan_s
    assert on.gpu_utilization > off.gpu_utilization


def test_bad_pack_is_undone_by_introspection() -> None:
    # the trace claims small shares, but Gavel measured these two slow each other down a lot
    m = "ResNet-50 (batch size 64)"
    trace = [
        TraceJob("a", 0.0, 1, 2000.0, model=m, gpu_share=0.5),
        TraceJob("b", 1.0, 1, 2000.0, model=m, gpu_share=0.5),
    ]
    pm = perf()
    pm.contention_min = 1.0  # make interference full whatever the shares: packing loses
    res = simulate(
        make_policy("gandiva", enable_time_slicing=False, pack_keep_ratio=1.0),
        trace,
        ClusterSpec.for_gpus(1, 1),
        perf=pm,
    )
    if pm.pair_ratio(m, m, "v100") < 0.5:
        assert res.packs >= 1 and res.preemptions >= 1  # packed, judged, unpacked
    assert all(pj["finished"] for pj in res.per_job.values())


def test_jobs_too_big_are_rejected_not_hung() -> None:
    trace = [TraceJob("big", 0.0, 16, 10.0), TraceJob("ok", 0.0, 1, 10.0)]
    res = simulate(make_policy("gandiva"), trace, ClusterSpec.for_gpus(4, 4))
    assert res.jobs_rejected == 1 and res.jobs == 1


def test_models_the_measurements_lack_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    measured = PerfModel({"v100": {"A3C": 10.0}}, {"v100": {}})
    trace = [
        TraceJob("a", 0.0, 1, 10.0, model="A3C"),
        TraceJob("b", 1.0, 1, 10.0, model="resnet50"),
        TraceJob("c", 2.0, 1, 10.0, model=""),
    ]
    # refused by default, naming the model (issue 23: unknown names refused unless mapped)
    with pytest.raises(UnknownModelError, match="'resnet50'"):
        simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), perf=measured)
    with caplog.at_level("WARNING"):
        res = simulate(
            make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), perf=measured, on_unknown_model="default"
        )
    assert res.unknown_models == ["resnet50"] and res.to_dict()["unknown_models"] == ["resnet50"]
    assert "resnet50" in caplog.text and "default speeds" in caplog.text
    # the uniform model measures nothing on purpose: nothing to report
    assert simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1)).unknown_models == []


def test_view_round_trips_through_dicts_with_same_decisions() -> None:
    """The simulator half of 'same decisions in simulator and live scheduler': a view
    exported as plain dicts and rebuilt with cluster_view_from_dicts (what the live
    scheduler uses) gives every policy the same decisions."""
    trace = random_trace(40, seed=5)
    for name in POLICIES:
        pol = Recording(make_policy(name), keep_every=5)
        Simulator(pol, trace, ClusterSpec.for_gpus(8, 4), perf=perf()).run()
        assert pol.kept
        for view, ds in pol.kept:
            d = cluster_view_to_dict(view)
            rebuilt = cluster_view_from_dicts(d["now"], d["devices"], d["jobs"])
            assert make_policy(name).decide(rebuilt) == ds


def test_fast_job_view_is_a_real_job_view() -> None:
    import dataclasses

    fields = {
        f.name: f.default for f in dataclasses.fields(JobView) if f.name not in ("id", "devices_wanted")
    }
    v = _job_view(id="a", devices_wanted=2, **fields)
    assert v == JobView(id="a", devices_wanted=2) and hash(v) == hash(JobView(id="a", devices_wanted=2))


def test_hp_search_gandiva_identifies_best_sooner() -> None:
    kw = {"gpus": 2, "per_node": 2, "n_configs": 27, "duration_s": 1200.0}
    f = run_hp_search(make_policy("fifo"), **kw)
    g = run_hp_search(make_policy("gandiva"), **kw)
    assert f.rungs == g.rungs == asha_rungs(3, 1 / 81) and len(f.rungs) == 4
    assert f.found_best and g.found_best and f.identified_best == g.identified_best
    assert g.time_to_identify_s < 0.75 * f.time_to_identify_s
    assert g.time_to_best_trained_s < f.time_to_best_trained_s  # finalists get priority
    assert 0 < g.stopped_early < 27 and 0 < f.stopped_early < 27


def test_asha_rungs_and_cutoff() -> None:
    assert asha_rungs(3, 1 / 27) == pytest.approx((1 / 27, 1 / 9, 1 / 3))
    assert asha_rungs(4, 1 / 64) == pytest.approx((1 / 64, 1 / 16, 1 / 4))
    with pytest.raises(ValueError):
        asha_rungs(1, 0.1)
    final = {"a": 0.5, "b": 0.9, "c": 0.3, "d": 0.4}
    s = AshaSearcher(final, (0.5,), 2, noise=0.0, gap=0.0)
    prios = {}
    s.set_priority = prios.__setitem__
    assert s.on_rung("a", 1.0) is False  # the first at a rung always continues
    assert s.on_rung("b", 2.0) is True  # worse than the 1/2 quantile of {0.5}
    assert s.on_rung("c", 3.0) is False
    assert s.on_rung("d", 4.0) is False  # 0.4 <= median of {0.5, 0.9, 0.3} = 0.5
    assert prios == {"a": 1, "c": 1, "d": 1} and s.stopped == {"b"}


def test_several_probe_points_and_priority_changes() -> None:
    seen = []
    trace = [TraceJob("a", 0.0, 1, 1000.0), TraceJob("b", 0.0, 1, 1000.0)]
    sim = Simulator(
        make_policy("fifo"),
        trace,
        ClusterSpec.for_gpus(1, 1),
        probe_fraction=(0.1, 0.5),
        on_probe=lambda j, now: seen.append((j, round(now))) or (j == "a" and now > 200),
        check_invariants=True,
    )
    res = sim.run()
    # a: probes at 10% and 50% of its work (after a 5 s start), stopped at the second;
    # then b runs to the end through both probes
    assert [j for j, _ in seen] == ["a", "a", "b", "b"]
    assert seen[0][1] == 105 and seen[1][1] == 505
    assert res.per_job["a"]["stopped_early"] and not res.per_job["b"]["stopped_early"]
    sim2 = Simulator(make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1))
    sim2.set_priority("b", 5)
    pj = sim2.run().per_job
    assert pj["b"]["finished"] < pj["a"]["finished"]  # fifo serves higher priority first


def test_elastic_jobs_grow_on_idle_devices_and_shrink_for_newcomers() -> None:
    trace = [
        TraceJob("e", 0.0, 1, 2000.0, elastic=True),
        TraceJob("late", 500.0, 1, 100.0),
        TraceJob("late2", 520.0, 1, 100.0),
    ]
    cl = ClusterSpec.for_gpus(2, 2)
    on = simulate(make_policy("gandiva"), trace, cl, check_invariants=True)
    off = simulate(make_policy("gandiva", enable_grow_shrink=False), trace, cl, check_invariants=True)
    assert on.resizes >= 2  # grew, then shrank when 'late' arrived
    assert on.per_job["e"]["finished"] < off.per_job["e"]["finished"]
    assert all(pj["finished"] for pj in on.per_job.values())


def test_utilisation_over_a_common_window() -> None:
    # one device; a runs 5..105 (5 s start cost), b arrives at 200: the default window is
    # first to last arrival, [0, 200], in which the device did 100 s of useful work
    trace = [TraceJob("a", 0.0, 1, 100.0), TraceJob("b", 200.0, 1, 10.0)]
    res = simulate(
        make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), extra_windows={"early": (0.0, 50.0)}
    )
    assert res.util_window_s == (0.0, 200.0)
    assert res.gpu_utilization_window == pytest.approx(0.5)
    assert res.gpu_utilization_extra["early"] == pytest.approx(45.0 / 50.0)
    # over its own makespan (0..215) the same run is 110/215: not a common yardstick
    assert res.gpu_utilization == pytest.approx(110.0 / 215.0)
    # a fractional request keeps only its share of the device busy
    half = [TraceJob("a", 0.0, 1, 100.0, gpu_share=0.5), TraceJob("b", 200.0, 1, 10.0)]
    r2 = simulate(make_policy("fifo"), half, ClusterSpec.for_gpus(1, 1))
    assert r2.gpu_utilization_window == pytest.approx(0.25)


def test_load_window_holds_the_bulk_of_the_arrivals() -> None:
    # 1 early job, then 99 arriving over [1000, 1098]: 99% of the arrivals start at 1000
    times = [0.0] + [1000.0 + i for i in range(99)]
    assert load_window(times) == (1000.0, 1098.0)
    assert load_window(times, 1.0) == (0.0, 1098.0)
    assert load_window([5.0]) is None and load_window([]) is None
    with pytest.raises(ValueError):
        load_window(times, 0.0)
    # the simulator reports utilisation over it: one device, a job of 10 s at 0 and one
    # per 1 s from 1000 for 99 s (1 s each): the device is busy over the whole window
    trace = [TraceJob("early", 0.0, 1, 10.0)] + [TraceJob(f"j{i:02d}", 1000.0 + i, 1, 1.0) for i in range(99)]
    res = simulate(make_policy("fifo"), trace, ClusterSpec.for_gpus(1, 1), costs=CostModel(start_s=0.0))
    assert res.load_window_s == (1000.0, 1098.0)
    assert res.gpu_utilization_load == pytest.approx(1.0)
    assert res.gpu_utilization_window == pytest.approx((10.0 + 98.0) / 1098.0)


def test_contended_window_is_a_property_of_the_trace() -> None:
    trace = [TraceJob("a", 0.0, 1, 100.0), TraceJob("b", 10.0, 1, 100.0)]
    assert contended_window(trace, 1) == (0.0, 10.0)  # 200 device-s submitted in 10 s
    assert contended_window(trace, 100) is None
    assert contended_window([], 4) is None


def test_cluster_of_exactly_the_size_asked() -> None:
    assert ClusterSpec.for_gpus(12, 8).size == 12 and ClusterSpec.for_gpus(12, 8).devices_per_node == 6
    assert ClusterSpec.for_gpus(32, 8).nodes == 4 and ClusterSpec.for_gpus(4, 8).size == 4
    with pytest.raises(ValueError):
        ClusterSpec.for_gpus(0)
