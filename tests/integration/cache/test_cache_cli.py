"""``microco cache ...`` against real etcd and a real cache server."""

from __future__ import annotations

import json

import pytest

from microco.cli import main
from microco.clients.cache import CacheClient

pytestmark = pytest.mark.integration


def test_cli_register_list_stats_allocations(
    make_dataset, tmp_path, etcd_endpoint, etcd_kv, cache_server, capsys
):
    make_dataset(tmp_path / "d", n=12, size=1000)
    server = cache_server(capacity="1M")
    e = ["cache", "--etcd", etcd_endpoint]
    assert (
        main([*e, "register", "mnist", str(tmp_path / "d"), "--chunk-size", "4K", "--owner", "ann", "--json"])
        == 0
    )
    rec = json.loads(capsys.readouterr().out)
    assert rec["num_samples"] == 12 and rec["num_chunks"] == 3 and rec["owner"] == "ann"
    assert main([*e, "datasets"]) == 0
    assert "mnist" not in capsys.readouterr().out  # ann's, not the caller's own
    assert main([*e, "datasets", "--all"]) == 0  # (the tester is an administrator)
    assert "mnist" in capsys.readouterr().out
    with CacheClient(server.address) as c:
        c.report_progress(
            "job-1", "mnist", 0, timings=[(0.0, 0.5, 4000, 4), (1.0, 0.1, 4000, 4)], dataset_bytes=12000
        )
    assert main([*e, "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats[0]["stats"]["policy"] == "coordinated" and stats[0]["stats"]["jobs"] == ["job-1"]
    assert stats[0]["stats"]["hits"] == 4 and stats[0]["stats"]["hit_rate"] == 0.5
    assert main([*e, "stats"]) == 0
    assert "coordinated" in capsys.readouterr().out
    assert main([*e, "allocations"]) == 0
    out = capsys.readouterr().out
    assert "mnist" in out and "rank 1 by benefit per byte" in out
    assert main([*e, "register", "bad/name/x", str(tmp_path / "d")]) == 1
    assert "bad dataset name" in capsys.readouterr().err
    assert main([*e, "register", "x", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
