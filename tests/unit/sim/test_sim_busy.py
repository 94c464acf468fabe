"""The solo busy fraction derived from Gavel's self pairs, the utilisation model built on it,
and gandiva packing full-device jobs in the simulator (kept when they beat time-slicing,
undone when they do not)."""

from __future__ import annotations

import pytest

from microco.services.scheduler.policy import make_policy
from microco.services.scheduler.sim import ClusterSpec, PerfModel, TraceJob, default_traces_dir, simulate

# X and Y each run at full speed next to a copy of themselves (they use half a device
# alone); X and Y together slow each other badly; Z saturates its device; W could not be
# co-located with itself (0: out of memory); V has no self pair at all.
PERF = PerfModel(
    alone={"v100": {"X": 10.0, "Y": 10.0, "Z": 10.0, "W": 10.0, "V": 10.0, "T": 10.0}},
    pairs={
        "v100": {
            ("X", "X"): 1.0,
            ("Y", "Y"): 1.0,
            ("X", "Y"): 0.3,
            ("Y", "X"): 0.3,
            ("Z", "Z"): 0.45,
            ("W", "W"): 0.0,
            ("T", "T"): 0.8,
        }
    },
)


def test_solo_busy_fraction_from_self_pair() -> None:
    assert PERF.solo_busy("X", "v100") == pytest.approx(0.5)  # s = 2.0
    assert PERF.solo_busy("T", "v100") == pytest.approx(1 / 1.6)  # s = 1.6
    assert PERF.solo_busy("Z", "v100") == 1.0  # s = 0.9 < 1: saturates alone
    assert PERF.solo_busy("W", "v100") == 1.0  # self pair 0: unknown, assume full
    assert PERF.solo_busy("V", "v100") == 1.0  # no self pair
    assert PERF.solo_busy("nope", "k80") == 1.0
    assert PerfModel.uniform().solo_busy("X", "v100") == 1.0


def test_busy_fraction_does_not_weaken_measured_interference() -> None:
    # full-share jobs keep Gavel's packed speeds, whatever their busy fractions
    assert PERF.packed_speed("X", 1.0, [("Y", 1.0)], "v100") == pytest.approx(0.3)
    assert PERF.packed_speed("X", 1.0, [("X", 1.0)], "v100") == pytest.approx(1.0)


def test_contention_counts_every_request_on_the_device() -> None:
    # X next to Y alone: 0.4 + 0.4 requested, under the device: minimum contention 0.1
    assert PERF.packed_speed("X", 0.4, [("Y", 0.4)], "v100") == pytest.approx(1 - 0.7 * 0.1)
    # a third job (0.4 more) oversubscribes the device by 0.2: each other job slows X by
    # its measured pair slowdown scaled by 0.2, not by the pair's own minimum
    assert PERF.packed_speed("X", 0.4, [("Y", 0.4), ("X", 0.4)], "v100") == pytest.approx(
        (1 - 0.7 * 0.2) * (1 - 0.0 * 0.2)
    )
    assert PERF.packed_speed("X", 0.4, [("Y", 0.4), ("Y", 0.4)], "v100") == pytest.approx(
        (1 - 0.7 * 0.2) ** 2
    )


def test_gavel_self_pairs_give_expected_busy_fractions() -> None:
    p = default_traces_dir() / "gavel_throughputs.json"
    if not p.exists():
        pytest.skip("public traces not present")
    pm = PerfModel.from_gavel(p)
    assert pm.solo_busy("ResNet-18 (batch size 64)", "v100") == pytest.approx(0.5)  # 1.0 + 1.0
    assert pm.solo_busy("ResNet-50 (batch size 64)", "v100") == pytest.approx(1.0, abs=0.01)
    assert 0.6 < pm.solo_busy("Transformer (batch size 64)", "v100") < 0.7  # s = 1.49
    assert pm.solo_busy("ResNet-50 (batch size 128)", "v100") == 1.0  # could not co-locate


def test_utilization_counts_solo_busy_fraction_for_every_policy() -> None:
    trace = [TraceJob("a", 0.0, 1, 1000.0, model="X"), TraceJob("b", 0.0, 1, 1000.0, model="Z")]
    for name in ("fifo", "las", "gandiva"):
        r = simulate(make_policy(name), trace, ClusterSpec.for_gpus(2, 2), perf=PERF)
        # both start at once: X keeps its device half busy, Z all of it
        assert r.gpu_utilization == pytest.approx((0.5 + 1.0) / 2, rel=0.02), name
        r2 = simulate(make_policy(name), trace[:1], ClusterSpec.for_gpus(1, 1), perf=PERF)
        assert r2.gpu_utilization == pytest.approx(0.5, rel=0.02), name


def test_gandiva_packs_full_jobs_that_fit_and_keeps_the_pack() -> None:
    # four full-device X jobs on two devices: once profiled, two fit on each device
    trace = [TraceJob(f"j{i}", float(i), 1, 20_000.0, model="X") for i in range(4)]
    cl = ClusterSpec.for_gpus(2, 2)
    g = simulate(make_policy("gandiva", pack_cooldown_s=120.0), trace, cl, perf=PERF, check_invariants=True)
    f = simulate(make_policy("fifo"), trace, cl, perf=PERF)
    assert g.packs >= 2
    assert g.gpu_utilization > f.gpu_utilization * 1.3
    assert g.makespan_s < f.makespan_s * 0.8
    assert all(v["finished"] is not None for v in g.per_job.values())
    # without the observed busy fraction gandiva cannot tell the jobs leave room: no pack
    blind = simulate(
        make_policy("gandiva", pack_cooldown_s=120.0), trace, cl, perf=PERF, observe_utilization=False
    )
    assert blind.packs == 0


def test_gandiva_undoes_a_pack_of_full_jobs_that_loses_to_time_slicing() -> None:
    # X and Y each use half a device alone, but together run at 0.3 + 0.3 < 1
    trace = [
        TraceJob("x1", 0.0, 1, 20_000.0, model="X"),
        TraceJob("y1", 1.0, 1, 20_000.0, model="Y"),
    ]
    res = simulate(
        make_policy("gandiva", pack_cooldown_s=120.0, enable_migration=False),
        trace,
        ClusterSpec.for_gpus(1, 1),
        perf=PERF,
        check_invariants=True,
    )
    assert res.packs >= 1
    assert res.preemptions > res.packs  # every pack was undone (plus the time-slices)
    assert all(v["finished"] is not None for v in res.per_job.values())
    # each bad pack lasts only until it is judged, so utilisation stays near time-slicing's
    ts = simulate(make_policy("gandiva", enable_packing=False), trace, ClusterSpec.for_gpus(1, 1), perf=PERF)
    assert res.makespan_s < ts.makespan_s * 1.1
