"""The compiler benchmark's JSON (issue 7's contract), on a tiny TensorFlow model: every field the
issue names, the next run starting at the commit, and ratios that follow from the figures."""

from __future__ import annotations

import pytest

# TensorFlow is imported by the test, not at collection: every xdist worker collects every file,
# and an import of TensorFlow (~8 CPU-s) in each was the slowest part of collecting the suite.
pytestmark = pytest.mark.tensorflow


def test_tf_benchmark_reports_every_field_and_a_next_run_at_the_commit():
    pytest.importorskip("tensorflow")
    from microco.benchmarks.compiler import bench_tf

    sizes = {"T": 2, "B": 2, "I": 4, "H": 4, "layers": 1}
    m = bench_tf("gru", sizes, run_steps=300, rounds=1, next_run=True)
    for key in ("name", "framework", "eager_ms", "static_ms", "microco_ms", "explore_steps", "explore_s"):
        assert key in m
    assert m["name"] == "gru" and m["framework"] == "tensorflow"
    assert set(m["total_run_s"]) == {"eager", "static", "microco", "microco_rerun"}
    assert all(v > 0 for v in m["total_run_s"].values())
    assert 0 < m["explore_steps"] <= 300 and m["explore_s"] > 0
    assert m["speedup_vs_static"] == pytest.approx(m["static_ms"] / m["microco_ms"], rel=0.01)
    # The next run found the commit: no exploration, the same configuration (unless the XLA rate
    # learned meanwhile repriced a pruned compile into one trial: a reopen, reported as such).
    r = m["rerun"]
    assert r["reopened"] or (
        r["committed_at_start"] and r["explore_steps"] == 0 and r["config"] == m["config"]
    )
    assert m["trials"] == len(m["trial_log"]) and isinstance(m["retimes"], list)
