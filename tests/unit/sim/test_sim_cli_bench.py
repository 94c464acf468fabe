"""``microco sim`` and ``microco bench sim`` end to end on small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microco.benchmarks import sim as bench
from microco.clients.cli import sim as cli
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
    rc = bench.main(["--quick", "--json", "--plot", str(png), "--hp-configs", "8", "--hp-gpus", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"fifo", "las", "gandiva"}
    assert out["jobs"] == 60
    assert "gandiva_vs_fifo" in out["ratios"] and "hp_search_speedup_gandiva_vs_fifo" in out["ratios"]
    assert set(out["targets_met"]) >= {"gandiva_ttff_minus_77pct_vs_fifo", "hp_search_5x_faster_than_fifo"}
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


@needs_traces
def test_cli_philly_durations(capsys) -> None:
    base = ["sim", "--trace", "tiresias", "--policy", "fifo", "--json"]
    assert cli.main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--philly-durations"]) == 0
    philly = json.loads(capsys.readouterr().out)
    assert philly["jobs"] == plain["jobs"] == 60
    assert philly["avg_jct_s"] != plain["avg_jct_s"]
