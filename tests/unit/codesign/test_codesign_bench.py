"""The co-design benchmark's JSON (issue 21's contract) on a tiny scenario: every field the
issue names for both sides, and every job's losses equal to a run straight from the files
(the cache may reorder samples, never lose, repeat or corrupt one). No figure is asserted."""

from __future__ import annotations

import json

import pytest

from microco.benchmarks import codesign

# Both scenarios are run for real (stacks of threads, training jobs): ~35 s of the suite's
# time together, so the file is dealt out with the slow ones (tests/conftest.py) rather than
# last, where it would keep one worker busy after the others have finished.
pytestmark = pytest.mark.slow


def test_the_benchmark_reports_both_sides_and_identical_losses(capsys):
    assert codesign.main(["--tiny", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for side in ("independent", "codesign"):
        got = out[side]
        for key in (
            "avg_jct_s",
            "hit_rate",
            "backing_bytes",
            "resume_to_first_batch_s",
            "migrate_to_first_batch_s",
            "losses_identical",
        ):
            assert key in got
        assert got["losses_identical"] is True
        assert got["avg_jct_s"] > 0 and got["backing_bytes"] > 0 and 0 <= got["hit_rate"] <= 1
        assert got["migrate_to_first_batch_s"] is not None  # the migration happened
    ind, co = out["independent"]["runs"][0], out["codesign"]["runs"][0]  # one round: its ratio
    assert out["jct_speedup"] == round(ind["avg_jct_s"] / co["avg_jct_s"], 3)


def test_the_grace_ablation_runs_both_sides_with_the_finish_grace(capsys):
    assert codesign.main(["--tiny", "--grace-ablation", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for side in ("independent", "codesign", "independent_grace", "codesign_grace"):
        assert out[side]["losses_identical"] is True and out[side]["backing_bytes"] > 0
    for prefix, base, new in (
        ("grace_in_independent_", "independent", "independent_grace"),
        ("grace_in_codesign_", "codesign", "codesign_grace"),
        ("with_grace_", "independent_grace", "codesign_grace"),
    ):
        a, b = out[base]["runs"][0], out[new]["runs"][0]
        assert out[prefix + "jct_speedup"] == round(a["avg_jct_s"] / b["avg_jct_s"], 3)


def test_the_sweep_reports_both_sides_at_every_point_of_the_grid(capsys):
    assert codesign.main(["--tiny", "--sweep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    grid = {(p["cache_ratio"], p["shared_jobs"]) for p in out["sweep"]}
    assert grid == {(r, n) for r in codesign.SWEEP_RATIOS for n in codesign.SWEEP_SHARED_JOBS}
    shared_bytes = out["scenario"]["shared_samples"] * out["scenario"]["sample_bytes"]
    for p in out["sweep"]:
        assert p["cache_bytes"] == int(shared_bytes / p["cache_ratio"])
        for side in ("independent", "codesign"):
            assert p[side]["losses_identical"] is True and p[side]["backing_bytes"] > 0
        assert p["backing_bytes_reduction"] == round(
            p["independent"]["backing_bytes"] / p["codesign"]["backing_bytes"], 3
        )
