"""Orphan extent files are collected: those of a failed append attempt, and those a node still
holds after its extents were rebuilt elsewhere; referenced and young files are kept."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa

from microco.common.kv import MemoryKV
from microco.services.store import Agg, LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
SPECS = [PartitionSpec("a", "hash", 3), PartitionSpec("b", "hash", 2), PartitionSpec("c", "hash", 2)]
ROWS = pa.table({"a": np.arange(600), "b": np.arange(600) % 7, "c": np.arange(600) % 5})


def _files(tr: LocalTransport) -> dict[str, set[str]]:
    out = {}
    for name, s in tr.stores.items():
        d = s.data_dir / "tables" / "t"
        out[name] = {f.name for f in d.iterdir()} if d.exists() else set()
    return out


def _age(tr: LocalTransport, seconds: float) -> None:
    """Make every file look ``seconds`` old (instead of waiting)."""
    then = time.time() - seconds
    for s in tr.stores.values():
        for dirpath, _, files in os.walk(s.data_dir):
            for f in files:
                os.utime(os.path.join(dirpath, f), (then, then))


def test_orphans_of_a_failed_append_and_of_a_returning_node_are_collected(tmp_path):
    tr = LocalTransport(str(tmp_path), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0, gc_min_age_s=60)
    core.create_table("t", ROWS.schema, SPECS)
    core.append("t", ROWS)
    referenced = {(e.node, f"{e.id}.arrow") for e in core.table("t").extents()}

    # a failed append attempt: a file written on n0 that no catalog entry names, plus a crashed
    # write's temporary file
    (tr.stores["n0"].data_dir / "tables" / "t" / "s000009-r0-p0000-deadbeef.arrow").write_bytes(b"x" * 100)
    (tr.stores["n1"].data_dir / "tables" / "t" / "s000009-r1-p0000-feedf00d.tmp-abc123").write_bytes(
        b"y" * 10
    )
    # n2 dies, its extents are rebuilt elsewhere, then it comes back with its old files
    n2_before = _files(tr)["n2"]
    assert n2_before
    tr.kill("n2")
    assert core.recover()["state"] == "done"
    tr.dead.discard("n2")
    assert all(e.node != "n2" for e in core.table("t").extents())

    # young files are kept: an append or rebuild in flight has not committed its extents yet
    assert core.collect_garbage()["deleted"] == []
    _age(tr, 120)
    res = core.collect_garbage()
    assert set(res["deleted"]) == {
        "n0:t/s000009-r0-p0000-deadbeef.arrow",
        "n1:t/s000009-r1-p0000-feedf00d.tmp-abc123",
    } | {f"n2:t/{f}" for f in n2_before}
    assert res["bytes"] > 110 and res["errors"] == []
    # every referenced file is still there, nothing else is
    left = {(n, f) for n, fs in _files(tr).items() for f in fs}
    now_referenced = {(e.node, f"{e.id}.arrow") for e in core.table("t").extents()}
    assert left == now_referenced and referenced - now_referenced <= {
        (n, f) for n, f in referenced if n == "n2"
    }
    # the data is whole: every row answers once
    out, _ = core.query(Query("t", group_by=(), aggs=(Agg("count", "*", "n"),)))
    assert out.column("n").to_pylist() == [600]
    assert core.collect_garbage()["deleted"] == []  # nothing more to do
