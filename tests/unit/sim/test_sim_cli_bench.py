"""``microco sim`` and ``microco bench sim`` end to end on small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microco.benchmarks import sim as bench
from microco.cli import sim as cli
from microco.services.scheduler.sim import TraceJob, default_traces_dir, write_trace_csv

TRACES = default_traces_dir()
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"public traces not at {TRACES}")
KEYS = {
    "policy",
    "jobs",
    "gpu_utilization",
    "avg_jct_s",
    "p95_jct_s",
    "avg_time_to_first_feedback_s",
    "makespan_s",
}


def small_trace(tmp_path: Path) -> Path:
    jobs = [TraceJob(f"j{i}", float(i * 10), 1 + (i % 3 == 0), 200.0 + 50 * i) for i in range(12)]
    p = tmp_path / "trace.csv"
    write_trace_csv(jobs, p)
    return p


@pytest.mark.parametrize("policy", ["fifo", "las", "gandiva"])
def test_cli_prints_required_json(tmp_path: Path, capsys, policy: str) -> None:
    p = small_trace(tmp_path)
    rc = cli.main(
        ["sim", "--trace", str(p), "--policy", policy, "--gpus", "4", "--gpus-per-node", "2", "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert KEYS <= set(out) and out["policy"] == policy and out["jobs"] == 12


def test_cli_hp_search_settings(capsys) -> None:
    args = ["sim", "--hp-search", "--policy", "gandiva", "--gpus", "2", "--hp-configs", "9", "--json"]
    assert cli.main(args + ["--hp-eta", "3", "--hp-min-fraction", "1/27"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["configs"] == 9 and out["eta"] == 3 and len(out["rungs"]) == 3
    assert out["time_to_identify_s"] > 0 and out["time_to_best_trained_s"] > 0
    with pytest.raises(SystemExit):
        cli.main(args + ["--hp-min-fraction", "2"])
    with pytest.raises(SystemExit, match="--hp-model must be one of"):
        cli.main(args + ["--hp-model", "nope"])


@needs_traces
def test_cli_hp_search_model(capsys) -> None:
    # Gavel's measurements: ResNet-50 keeps a V100 busy alone, ResNet-18 half of it, so only
    # ResNet-18's configurations are packed two to a device
    args = ["sim", "--hp-search", "--policy", "gandiva", "--gpus", "2", "--hp-configs", "9", "--json"]
    found = {}
    for model in ("ResNet-50 (batch size 64)", "ResNet-18 (batch size 64)"):
        assert cli.main(args + ["--hp-model", model]) == 0
        found[model] = json.loads(capsys.readouterr().out)
        assert found[model]["model"] == model
    r50, r18 = found["ResNet-50 (batch size 64)"], found["ResNet-18 (batch size 64)"]
    assert r50["packs"] == 0 < r18["packs"]
    assert r18["time_to_identify_s"] < r50["time_to_identify_s"]


def test_cli_errors(tmp_path: Path, capsys) -> None:
    p = small_trace(tmp_path)
    assert cli.main(["sim", "--trace", str(p), "--policy", "fifo", "--opt", "nope=1"]) == 2
    assert "no option" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,devices,duration_s\nx,0,-1,5\n")
    assert cli.main(["sim", "--trace", str(bad), "--policy", "fifo"]) == 2
    assert "bad.csv:2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["sim", "--trace", str(tmp_path / "missing.csv")])
    with pytest.raises(SystemExit):
        cli.main(["sim", "--policy", "nonesuch"])
    assert cli.main(["sim", "--trace", str(p), "--policy", "gandiva", "--opt", "quantum_s=abc"]) == 2
    assert "quantum_s of policy 'gandiva' must be a number, got 'abc'" in capsys.readouterr().err
    capsys.readouterr()
    for flag, value, why in (
        ("--gpus", "0", "must be at least 1"),
        ("--gpus-per-node", "0", "must be at least 1"),
        ("--gpus", "two", "want a whole number"),
        ("--time-scale", "0", "must be a positive number"),
        ("--tick", "-5", "must be a positive number"),
        ("--elastic-fraction", "1.5", "between 0 and 1"),
    ):
        with pytest.raises(SystemExit):
            cli.main(["sim", "--trace", str(p), flag, value])
        err = capsys.readouterr().err
        assert flag in err and why in err, err


def test_cli_policy_options_reach_the_policy(tmp_path: Path, capsys) -> None:
    p = small_trace(tmp_path)
    args = ["sim", "--trace", str(p), "--policy", "gandiva", "--gpus", "2", "--gpus-per-node", "2", "--json"]
    cli.main(args + ["--opt", "enable_time_slicing=false", "--opt", "enable_migration=false"])
    off = json.loads(capsys.readouterr().out)
    cli.main(args)
    on = json.loads(capsys.readouterr().out)
    assert off["preemptions"] == 0 < on["preemptions"]


@needs_traces
def test_bench_quick_runs_every_policy_and_plots(tmp_path: Path, capsys) -> None:
    png = tmp_path / "sim.png"
    rc = bench.main(
        [
            "--quick",
            "--json",
            "--plot",
            str(png),
            "--hp-configs",
            "9",
            "--hp-gpus",
            "2",
            "--sweep-gpus",
            "4,64",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {
        "fifo",
        "fifo[strict]",
        "las",
        "gandiva",
        "gandiva[no trial packs]",
        "gandiva[pairs, spread]",
    }
    assert out["jobs"] == 60
    assert "gandiva_vs_fifo" in out["ratios"] and "hp_search_speedup_gandiva_vs_fifo" in out["ratios"]
    assert "gpu_utilization_window" in out["ratios"]["gandiva_vs_fifo_strict"]
    assert set(out["targets_met"]) >= {"gandiva_ttff_minus_77pct_vs_fifo", "hp_search_5x_faster_than_fifo"}
    # one window for every policy: first to last arrival
    windows = {tuple(r["util_window_s"]) for r in out["results"].values()}
    assert len(windows) == 1 and out["util_window_s"][1] > out["util_window_s"][0]
    # and one load window (99% of the arrivals, ending at the last), inside it
    loads = {tuple(r["load_window_s"]) for r in out["results"].values()}
    assert loads == {tuple(out["load_window_s"])}
    assert (
        out["util_window_s"][0]
        <= out["load_window_s"][0]
        < out["load_window_s"][1]
        == out["util_window_s"][1]
    )
    assert "gpu_utilization_load" in out["ratios"]["gandiva_vs_fifo"]
    assert out["hp_search"]["settings"]["n_configs"] == 9 and out["hp_search"]["fifo"]["eta"] == 3
    small, big = out["gpu_sweep"]
    assert small["gpus"] == 4 and big["gpus"] == 64  # exactly the sizes asked for
    # 4 GPUs: the 60 jobs queue, so the trace has a contended window; 64 GPUs: none
    assert small["contended_window_s"] is not None and big["contended_window_s"] is None
    for row in out["gpu_sweep"]:
        for label in ("fifo", "fifo[strict]", "gandiva", "gandiva[no trial packs]", "gandiva[pairs, spread]"):
            assert 0 < row[label]["gpu_utilization_window"] <= 1
            assert 0 < row[label]["gpu_utilization_load"] <= 1
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@needs_traces
def test_bench_ablations_run_each_variant_with_its_ratios(capsys) -> None:
    rc = bench.main(["--quick", "--json", "--ablations", "--no-hp-search", "--sweep-gpus", "4"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(bench.ABLATIONS) <= set(out["results"])
    grace, plain = out["results"][bench.GRACE], out["results"]["gandiva"]
    # on the Tiresias trace at 16 GPUs some job is near its end when a newcomer's turn comes
    assert grace["preemptions"] < plain["preemptions"]
    vs_las = out["ratios"]["gandiva_finish_grace_vs_las"]
    assert vs_las["avg_jct_s"] == pytest.approx(
        grace["avg_jct_s"] / out["results"]["las"]["avg_jct_s"], rel=1e-3
    )
    assert set(out["ratios"]["gandiva_finish_grace_vs_fifo"]) >= {"avg_time_to_first_feedback_s", "avg_jct_s"}


@needs_traces
def test_cli_philly_durations(capsys) -> None:
    base = ["sim", "--trace", "tiresias", "--policy", "fifo", "--json"]
    assert cli.main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--philly-durations"]) == 0
    philly = json.loads(capsys.readouterr().out)
    assert philly["jobs"] == plain["jobs"] == 60
    assert philly["avg_jct_s"] != plain["avg_jct_s"]


def test_cli_costs_reach_the_simulator(tmp_path: Path, capsys) -> None:
    p = small_trace(tmp_path)
    args = ["sim", "--trace", str(p), "--policy", "gandiva", "--gpus", "2", "--gpus-per-node", "2", "--json"]
    assert cli.main(args + ["--costs", "start=0,suspend=0,resume=0,migrate=0"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert cli.main(args + ["--costs", "resume=120"]) == 0
    dear = json.loads(capsys.readouterr().out)
    assert dear["avg_jct_s"] > free["avg_jct_s"] and dear["preemptions"] > 0
    with pytest.raises(SystemExit):
        cli.main(args + ["--costs", "resume=-1"])


def test_bench_cost_profiles_subset(tmp_path: Path, capsys) -> None:
    sched = tmp_path / "sched.json"
    sched.write_text(
        json.dumps(
            {
                "suspend_ms": 10.0,
                "resume_ms": 5.0,
                "migrate_ms": 100.0,
                "migration": {"migrate_restart_ms": 80.0},
            }
        )
    )
    p = small_trace(tmp_path)
    base = ["--trace", str(p), "--sweep-only", "--sweep-gpus", "2", "--costs-from", str(sched)]
    assert bench.main(base + ["--cost-profiles", "measured"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["cost_profiles"]) == ["measured"] and out["cost_profile"] == "measured"
    assert out["cost_profiles"]["measured"]["costs_s"]["suspend_s"] == pytest.approx(0.01)
    with pytest.raises(SystemExit):
        bench.main(["--trace", str(p), "--sweep-only", "--sweep-gpus", "2", "--cost-profiles", "measured"])


@needs_traces
def test_bench_full_run_searches_every_model_family(capsys) -> None:
    # the full (not --quick) run adds the search per model family, the ASHA sweep and the
    # seed sweep; small settings keep it to seconds
    rc = bench.main(
        [
            "--json",
            "--trace",
            "tiresias",
            "--hp-configs",
            "9",
            "--hp-gpus",
            "2",
            "--cost-profiles",
            "session1",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["model"]: r for r in out["hp_search_by_model"]}
    assert len(rows) == 7 and "hp_search_sweep" in out and "hp_search_seeds" in out
    # only a model that leaves its device partly idle is packed
    assert rows["ResNet-50 (batch size 64)"]["gandiva_packs"] == 0
    assert rows["ResNet-18 (batch size 64)"]["gandiva_packs"] > 0
    assert all(r["identify_speedup_gandiva_vs_fifo"] > 0 for r in rows.values())
