"""Mechanism costs from the live scheduler's benchmark (``--costs-from``) and the two cost
profiles reported side by side by the sim benchmark."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from microco.benchmarks import sim as bench
from microco.cli import sim as cli
from microco.services.scheduler.sim import COST_PROFILES, CostModel, TraceJob, write_trace_csv

# The fields `microco bench scheduler --json` prints (values from a quick run, trimmed).
SCHED_BENCH = {
    "benchmark": "scheduler",
    "quick": True,
    "suspend_ms": 13.3,
    "resume_ms": 7.9,
    "migrate_ms": 140.0,
    "suspend_resume": {"suspend_ms": 13.3, "resume_ms": 7.9, "checkpoint_bytes": 250096},
    "migration": {"migrate_ms": 140.0, "migrate_checkpoint_exit_ms": 34.6, "migrate_restart_ms": 105.4},
}


def bench_file(tmp_path: Path, data: dict = SCHED_BENCH) -> Path:
    p = tmp_path / "sched.json"
    p.write_text(json.dumps(data))
    return p


def test_mapping_from_the_scheduler_benchmark(tmp_path: Path) -> None:
    c = CostModel.from_scheduler_bench(bench_file(tmp_path))
    want = {"start_s": 0.1054, "suspend_s": 0.0133, "resume_s": 0.0079, "migrate_s": 0.14, "resize_s": 0.0079}
    assert dataclasses.asdict(c) == pytest.approx(want)
    assert CostModel.from_scheduler_bench(SCHED_BENCH) == c  # parsed JSON works too
    assert COST_PROFILES["session1"] == CostModel(5.0, 1.0, 5.0, 10.0, 5.0)  # the old defaults, named


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({k: v for k, v in SCHED_BENCH.items() if k != "resume_ms"}, "resume_ms"),
        ({**SCHED_BENCH, "migration": {}}, "migration.migrate_restart_ms"),
        ({**SCHED_BENCH, "suspend_ms": -1}, "suspend_ms"),
        ({**SCHED_BENCH, "suspend_ms": "13"}, "suspend_ms"),
        ([1, 2], "resume_ms"),
    ],
)
def test_bad_benchmark_json_names_the_field(tmp_path: Path, data, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        CostModel.from_scheduler_bench(bench_file(tmp_path, data))


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON"):
        CostModel.from_scheduler_bench(bad)
    with pytest.raises(SystemExit, match="--costs-from"):
        cli.main(["sim", "--hp-search", "--policy", "fifo", "--costs-from", str(bad)])


def test_cli_costs_from_reaches_the_simulator(tmp_path: Path, capsys) -> None:
    jobs = [TraceJob(f"j{i}", float(i), 1, 300.0) for i in range(6)]
    trace = tmp_path / "t.csv"
    write_trace_csv(jobs, trace)
    base = [
        "sim",
        "--trace",
        str(trace),
        "--policy",
        "gandiva",
        "--gpus",
        "2",
        "--gpus-per-node",
        "2",
        "--json",
    ]
    assert cli.main(base) == 0
    guessed = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--costs-from", str(bench_file(tmp_path))]) == 0
    measured = json.loads(capsys.readouterr().out)
    # switches cost 0.1 s instead of 5-6 s: the same jobs finish sooner
    assert measured["avg_jct_s"] < guessed["avg_jct_s"] and measured["preemptions"] > 0
    # --costs applies over the measured profile
    assert cli.main(base + ["--costs-from", str(bench_file(tmp_path)), "--costs", "resume=200"]) == 0
    assert json.loads(capsys.readouterr().out)["avg_jct_s"] > measured["avg_jct_s"]


def test_bench_reports_both_profiles_in_one_run(tmp_path: Path, capsys) -> None:
    jobs = [TraceJob(f"j{i}", float(10 * i), 1 + (i % 4 == 0), 200.0 + 40 * i) for i in range(10)]
    trace = tmp_path / "t.csv"
    write_trace_csv(jobs, trace)
    args = [
        "--trace",
        str(trace),
        "--gpus",
        "2",
        "--gpus-per-node",
        "2",
        "--hp-configs",
        "9",
        "--hp-gpus",
        "2",
    ]
    assert bench.main(args + ["--quick", "--costs-from", str(bench_file(tmp_path))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["cost_profiles"]) == {"session1", "measured"} and out["cost_profile"] == "measured"
    assert out["cost_profiles"]["session1"]["costs_s"]["resume_s"] == 5.0
    assert out["costs_s"]["resume_s"] == pytest.approx(0.0079)
    side = out["by_cost_profile"]["hp_search identify speed-up gandiva/fifo"]
    assert set(side) == {"session1", "measured"} and all(v > 0 for v in side.values())
    assert out["ratios"] == out["cost_profiles"]["measured"]["ratios"]
    # without --costs-from: one profile, the old defaults
    assert bench.main(args + ["--quick", "--no-hp-search"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["cost_profiles"]) == ["session1"] and "by_cost_profile" not in out


def test_search_accounting_adds_up() -> None:
    """The device-seconds up to identification split into idle, held without progress and
    work, and the work into ASHA's synchronous minimum, extra promotions and training past
    the last rung."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import run_hp_search

    for policy in ("fifo", "gandiva"):
        r = run_hp_search(
            make_policy(policy), gpus=4, n_configs=27, eta=3, min_fraction=1 / 27, duration_s=900
        )
        a = r.accounting
        assert a["time_to_identify_s"] == pytest.approx(r.time_to_identify_s, abs=0.1)
        assert a["device_s"] == pytest.approx(
            a["idle_device_s"] + a["held_without_progress_device_s"] + a["work_s"], abs=1.0
        )
        assert a["work_s"] == pytest.approx(
            a["work_sync_minimum_s"] + a["work_extra_promotions_s"] + a["work_past_last_rung_s"], abs=1.0
        )
        assert a["configs_reached_rung_sync"] == [27, 9, 3] and a["configs_reached_rung"][0] == 27
        # 27 x R/27 + 9 x (R/9 - R/27) + 3 x (R/3 - R/9) with R = 900 s
        assert a["work_sync_minimum_s"] == pytest.approx(900 + 600 + 600)
        assert a["idle_device_s"] >= -1e-6 and a["held_without_progress_device_s"] >= -1e-6
        # no search can identify sooner than its work allows
        assert r.time_to_identify_s >= a["bound_work_s"] - 1e-6
