"""``microco bench cache`` runs end to end on a tiny dataset and prints the issue's keys."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_bench_cache_smoke(capsys):
    from microco.benchmarks.cache import main

    args = [
        "--quick",
        "--json",
        "--samples",
        "48",
        "--sample-kb",
        "4",
        "--bandwidth-mb-s",
        "2",
        "--compute-ms",
        "0",
        # Servers in this process: no etcd, Redis or nine server processes to start (they took
        # 47 of this test's 57 s on a loaded machine); the servers' processes have tests of
        # their own (test_cache_server.py).
        "--in-process",
        # Every section but ddp (its 8 servers would double this test's time; the spread cache
        # and exchanging ranks have tests of their own in test_cache_spread.py).
        *("--only", "one_job", "--only", "two_jobs", "--only", "prefetch"),
        *("--only", "allocation", "--only", "serving"),
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["cache_to_dataset_ratio"] - 0.5) < 0.01
    for policy in ("none", "lru", "quiver"):
        assert out[policy]["epoch_s"] > 0 and 0 <= out[policy]["hit_rate"] <= 1
    assert out["none"]["hit_rate"] == 0
    for key in ("shared_bytes_cached", "per_job_bytes_cached", "serve_mb_s", "local_read_mb_s"):
        assert out[key] > 0
    assert out["shared_bytes_cached"] < out["per_job_bytes_cached"]  # one copy, not two
    saving = out["allocation"]["measured_saving"]
    assert set(saving) == {"io", "cpu"} and all(0 <= v <= 1 for v in saving.values())
