"""Cluster-scale pieces: the Poisson trace generator, the occupancy's free-device count kept
by take/release, the shared device topology, and the benchmark's scale mode (tiny sizes)."""

from __future__ import annotations

import json

import pytest

from microco.benchmarks import sim as bench
from microco.services.scheduler.policy import ClusterView, JobPhase
from microco.services.scheduler.policy._state import Occupancy
from microco.services.scheduler.sim import ClusterSpec, poisson_trace
from microco.services.scheduler.sim._engine import _job_view


def test_poisson_trace_is_deterministic_and_loads_the_cluster() -> None:
    a = poisson_trace(2000, 64, load=1.0, seed=3)
    assert a == poisson_trace(2000, 64, load=1.0, seed=3) and a != poisson_trace(2000, 64, seed=4)
    assert len({j.job_id for j in a}) == 2000
    assert all(b.submit_time >= x.submit_time for x, b in zip(a, a[1:]))
    span = a[-1].submit_time - a[0].submit_time
    demand = sum(j.devices * j.duration_s * j.gpu_share for j in a)
    assert demand / (64 * span) == pytest.approx(1.0, rel=0.15)  # offered load, within Poisson noise
    half = poisson_trace(2000, 64, load=0.5, seed=3)
    assert half[-1].submit_time == pytest.approx(2 * a[-1].submit_time, rel=1e-3)
    with pytest.raises(ValueError):
        poisson_trace(0, 64)


def _view(devices, held: dict[str, tuple[str, ...]]) -> ClusterView:
    jobs = tuple(
        _job_view(id=jid, devices_wanted=len(d), state=JobPhase.RUNNING, devices=d) for jid, d in held.items()
    )
    return ClusterView(now=0.0, devices=devices, jobs=jobs)


def test_free_count_follows_take_and_release() -> None:
    devs = ClusterSpec(nodes=2, devices_per_node=4).device_views()
    ids = [d.id for d in devs]
    occ = Occupancy(_view(devs, {"a": (ids[0], ids[1]), "b": (ids[4],)}))
    recount = lambda: sum(1 for h in occ.holders.values() if not h)  # noqa: E731
    assert occ.n_free() == recount() == 5
    occ.take("c", (ids[4], ids[5]))  # one shared (packed), one free
    assert occ.n_free() == recount() == 4
    occ.release("b", (ids[4],))
    assert occ.n_free() == recount() == 4  # c still holds it
    occ.release("c", (ids[4], ids[5]))
    occ.release("a", (ids[0], ids[1]))
    occ.release("nobody", (ids[2],))
    assert occ.n_free() == recount() == 8


def test_topology_is_per_devices_tuple() -> None:
    small = ClusterSpec(nodes=1, devices_per_node=2).device_views()
    big = ClusterSpec(nodes=3, devices_per_node=2).device_views()
    a = Occupancy(_view(small, {}))
    b = Occupancy(_view(big, {}))
    c = Occupancy(_view(small, {}))
    assert len(a.node_of) == 2 and len(b.node_of) == 6 and len(c.node_of) == 2
    assert set(b.nodes) == {"node000", "node001", "node002"}


def test_bench_scale_mode(capsys) -> None:
    assert bench.main(["--scale", "8,16", "--scale-jobs", "60"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in out["scale"]] == [8, 16]
    for r in out["scale"]:
        assert r["jobs"] == 60 and r["sim_cpu_s"] >= 0 and r["decide_calls"] > 0


def test_bench_scale_until_stops_each_run_at_that_time(capsys) -> None:
    assert bench.main(["--scale", "8", "--scale-jobs", "60"]) == 0
    whole = json.loads(capsys.readouterr().out)["scale"][0]
    assert bench.main(["--scale", "8", "--scale-jobs", "60", "--scale-until", "300"]) == 0
    part = json.loads(capsys.readouterr().out)["scale"][0]
    assert 0 < part["decide_calls"] < whole["decide_calls"]


def test_cli_simulates_a_generated_poisson_trace_and_reports_its_cpu(tmp_path, capsys) -> None:
    """``microco sim --trace poisson:JOBS:LOAD:SEED``: the scale benchmark's trace through the
    CLI (so anyone can check the scale target), with the simulation's CPU seconds."""
    from microco.cli import sim as cli
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import default_perf_model, simulate

    none = ["--traces-dir", str(tmp_path)]  # no traces there: the uniform performance model
    assert cli.main(["sim", "--trace", "poisson:60:1.5:2", "--gpus", "8", "--json", *none]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = simulate(make_policy("gandiva"), poisson_trace(60, 8, load=1.5, seed=2), ClusterSpec.for_gpus(8),
                   perf=default_perf_model(None))  # fmt: skip
    assert out["trace"] == "poisson:60:1.5:2" and out["jobs"] == 60
    assert (out["decide_calls"], out["preemptions"]) == (ref.decide_calls, ref.preemptions)
    assert out["avg_jct_s"] == round(ref.avg_jct_s, 4)
    assert out["cpu_s"] >= out["sim_cpu_s"] >= 0  # the process's CPU (trace generation too) and the run's
    for bad in ("poisson:", "poisson:0", "poisson:10:x", "poisson:10:1:2:3", "poisson:10:-1"):
        assert cli.main(["sim", "--trace", bad, "--gpus", "8", "--json", *none]) == 2, bad
        err = capsys.readouterr().err
        assert "poisson:JOBS" in err or "positive load" in err or "whole numbers" in err, err
