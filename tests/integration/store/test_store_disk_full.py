"""A store node whose disk fills (session 40's held-out round, an operator's fault): the append
that finds no room fails with a clear ``ResourceExhausted`` naming the node and its directory
(it said "need live store nodes in at least 3 fault domains" of nodes that were all up), leaves
no part-written file behind (each held the room the next write needed, under a name nothing
collects), loses no acknowledged row, and appends work again once there is room. The disk is a
small tmpfs (``small_disk``, tests/conftest.py)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import StoreClient
from microco.common.errors import ResourceExhausted
from microco.services.store._procs import StoreCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.binary())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {"k": np.arange(start, start + n, dtype=np.int64), "v": [os.urandom(100) for _ in range(n)]},
        schema=SCHEMA,
    )


def test_a_full_disk_fails_the_append_clearly_and_loses_nothing(etcd_endpoint, tmp_path, small_disk):
    root = tmp_path / "store"
    root.mkdir()
    nodes = [("d1", "a"), ("d2", "b"), ("d3", "c")]
    for name, _ in nodes:  # each node's data on the small disk, its log beside the test's
        (small_disk / name).mkdir()
        (root / name).symlink_to(small_disk / name)
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (3 << 20))  # leaves about 1 MiB for three nodes
    cluster = StoreCluster(etcd_endpoint, root, nodes).start()
    client = StoreClient.from_address(cluster.coordinator_address)
    try:
        client.create_table("full", SCHEMA, ["k:hash:2", "k:hash:2", "k:hash:2"])
        acked, refused = 0, None
        for _ in range(20):
            try:
                client.append("full", rows(acked, 1000))
            except ResourceExhausted as exc:
                refused = str(exc)
                break
            acked += 1000
        assert refused is not None, "the disk never filled"
        assert "no space left" in refused and any(f"store node {n}" in refused for n, _ in nodes), refused
        assert not [p for p in small_disk.rglob("*") if ".tmp-" in p.name]
        assert client.sql("SELECT count(*) AS n FROM full").to_pylist() == [{"n": acked}]
        ballast.unlink()  # the operator makes room: appends work again
        client.append("full", rows(acked, 1000))
        assert client.sql("SELECT count(*) AS n FROM full").to_pylist() == [{"n": acked + 1000}]
    finally:
        client.close()
        cluster.stop()
