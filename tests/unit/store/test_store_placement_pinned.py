"""Placement pins every replica's partition ``p`` to one node across super-extents (not only the
co-located first replica of each partition function): pure checks of ``place_super_extent``, the
planner's shuffle-free group-by on such a replica with no merge of partials at the coordinator,
and recovery reading from both other replicas' node groups (in-process store, no sockets)."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import product

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import (
    Agg,
    LocalTransport,
    NodeInfo,
    PartitionSpec,
    Query,
    StoreCore,
    check_row_copies,
    place_super_extent,
)
from microco.services.store._core import colocated_homes
from microco.services.store._placement import Copy
from microco.services.store._recovery import plan_recovery

CLUSTERS = {
    "6 nodes, 3 racks": [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)],
    "9 nodes, 3 racks": [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(9)],
    "7 nodes, 4 racks": [NodeInfo(f"n{i}", f"rack{i % 4}") for i in range(7)],
    "5 unlabelled": [NodeInfo(f"n{i}") for i in range(5)],
}
TABLES = {
    # lineitem's: three replicas by one function (hash mod 8): only the first is co-located
    "same function": [
        PartitionSpec("a", "hash", 8),
        PartitionSpec("b", "hash", 8),
        PartitionSpec("c", "hash", 8),
    ],
    "three functions": [
        PartitionSpec("a", "hash", 4),
        PartitionSpec("b", "hash", 3),
        PartitionSpec("c", "range", bounds=("1992-01-01", "1995-01-01")),
    ],
    "none co-located": [PartitionSpec("a", "hash", 5)] * 3,
}


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("colocated", [True, False])
def test_every_replica_keeps_each_partition_on_one_node(cluster, table, colocated):
    nodes, specs = CLUSTERS[cluster], TABLES[table]
    counts = [s.count for s in specs]
    homes = colocated_homes(specs) if colocated else None
    domain = {n.name: n.domain for n in nodes}
    where: dict[tuple[int, int], set[str]] = defaultdict(set)
    held = Counter()
    for sid in range(12):
        pl = place_super_extent(nodes, sid, counts, homes)
        assert set(pl) == {(r, p) for r, c in enumerate(counts) for p in range(c)}
        for key, node in pl.items():
            where[key].add(node)
            held[node] += 1
        # any row's three copies (one partition in each replica) on three nodes in three domains:
        # the replicas' domains are disjoint (checked on every combination for the first ones)
        doms = [{domain[pl[(r, p)]] for p in range(c)} for r, c in enumerate(counts)]
        assert not (doms[0] & doms[1] or doms[0] & doms[2] or doms[1] & doms[2]), (sid, doms)
        for parts in product(*(range(min(c, 3)) for c in counts)):
            copies = [Copy(r, pl[(r, p)], domain[pl[(r, p)]]) for r, p in enumerate(parts)]
            assert check_row_copies(copies) is None, (sid, parts, copies)
    assert all(len(ns) == 1 for ns in where.values()), {k: v for k, v in where.items() if len(v) > 1}
    # each replica on one group; together they use the cluster (no node left without data when
    # the partitions outnumber a group's nodes)
    if min(counts) >= len(nodes):
        assert set(held) == {n.name for n in nodes}


def test_colocated_replicas_of_two_tables_share_nodes():
    nodes = CLUSTERS["6 nodes, 3 racks"]
    a = [
        PartitionSpec("o_orderkey", "hash", 8),
        PartitionSpec("o_custkey", "hash", 8),
        PartitionSpec("o_orderdate", "hash", 4),
    ]
    b = TABLES["same function"]
    for s1, s2 in [(0, 0), (3, 11), (7, 2)]:
        pa_, pb = (
            place_super_extent(nodes, s1, [s.count for s in a], colocated_homes(a)),
            place_super_extent(nodes, s2, [s.count for s in b], colocated_homes(b)),
        )
        assert all(pa_[(0, p)] == pb[(0, p)] for p in range(8))


N = 6000
DATA = pa.table(
    {
        "k": np.arange(N, dtype=np.int64),
        "g": (np.arange(N) * 7919) % 1001,
        "h": (np.arange(N) * 104729) % 577,
        "v": np.arange(N) % 97,
    }
)
SPECS = [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 4), PartitionSpec("h", "hash", 4)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    nodes = CLUSTERS["6 nodes, 3 racks"]
    tr = LocalTransport(str(tmp_path_factory.mktemp("pinned")), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    core.create_table("t", DATA.schema, SPECS)
    core.append("t", DATA)
    assert len(core.table("t").super_extents) == 6
    return core, tr


@pytest.mark.parametrize("col", ["g", "h"])
def test_group_by_a_non_colocated_replica_is_local_with_no_merge(store, col):
    """Six super-extents: each partition of replica 1 and 2 is on one node, so ``agg_local``
    aggregates whole partitions on their nodes and the coordinator only concatenates (before, the
    partitions rotated over the nodes and every group's partials were merged at the coordinator)."""
    core, _ = store
    q = Query("t", group_by=(col,), aggs=(Agg("sum", "v", "s"), Agg("count", "*", "n")))
    got, plan = core.query(q)
    assert plan.kind == "agg_local" and plan.replicas == {
        "t": SPECS.index(next(s for s in SPECS if s.column == col))
    }
    assert "the coordinator only concatenates" in plan.explain_text(), plan.explain_text()
    assert plan.final["combine"] is False  # no merge of partials at the coordinator
    want = duckdb.sql(f"select {col}, sum(v) s, count(*) n from DATA group by {col}").to_arrow_table()
    key = lambda r: r[col]  # noqa: E731
    assert sorted(got.to_pylist(), key=key) == sorted(
        [{col: r[col], "s": r["s"], "n": r["n"]} for r in want.to_pylist()], key=key
    )


def test_recovery_reads_from_both_other_groups_and_keeps_the_invariant(tmp_path):
    nodes = CLUSTERS["9 nodes, 3 racks"]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    specs = [PartitionSpec(c, "hash", 6) for c in "abc"]  # one function: only "a" is co-located
    n = 3000
    data = pa.table({"a": np.arange(n, dtype=np.int64), "b": np.arange(n) % 101, "c": np.arange(n) % 89})
    core.create_table("t", data.schema, specs)
    core.append("t", data)
    victim = "n0"
    lost = [e for e in core.table("t").extents() if e.node == victim]
    assert len(lost) >= 6
    tr.kill(victim)
    plan = plan_recovery(core.tables(), tr.live_nodes(), core.domains())
    assert len(plan.tasks) == len(lost) and not plan.stuck
    read_by = Counter()
    for task in plan.tasks:
        for s in task.sources:
            read_by[s["node"]] += s["bytes"]
    lost_groups = {e.replica for e in lost}
    assert len(lost_groups) == 1  # the victim holds one replica (its group's)
    other_nodes = {e.node for e in core.table("t").extents() if e.replica not in lost_groups}
    assert set(read_by) == other_nodes  # every node of both other groups serves reads
    assert len(other_nodes) == 6
    assert max(read_by.values()) <= 3 * min(read_by.values())
    eligible = {n.name for n in nodes if n.domain == "rack0" and n.name != victim}
    assert {t.target for t in plan.tasks} == eligible  # rebuilt extents spread over the domain's nodes
    rep = core.recover()
    assert rep["rebuilt"] == len(lost) and core.lost_count() == 0
    assert rep["bytes_read_per_byte_lost"] <= 1.05
    domain = {n.name: n.domain for n in nodes}
    copies: dict[int, list[Copy]] = defaultdict(list)
    for e in core.table("t").extents():
        for k in tr.stores[e.node].read("t", e.id, columns=["a"]).column("a").to_pylist():
            copies[k].append(Copy(e.replica, e.node, domain[e.node]))
    assert len(copies) == n and all(check_row_copies(c) is None for c in copies.values())


def test_extent_record_json_is_every_field(store):
    from dataclasses import asdict

    core, _ = store
    for e in core.table("t").extents()[:5]:
        assert e.to_json() == asdict(e) and type(e).from_json(e.to_json()) == e


@pytest.mark.parametrize("col", ["g", "h"])
def test_sql_group_by_a_non_colocated_replica_reads_only_local_extents(store, col):
    """The SQL path's partition-local plan runs one fragment per partition: with every partition
    on one node it reads no extent from a peer (before: ~128 kB of this table moved for ``h``)."""
    core, _ = store
    sql = f"select {col}, sum(v) as s from t group by {col}"
    got, plan = core.sql(sql)
    assert plan.kind == "partition_local" and plan.moved_bytes == 0, plan.explain
    want = duckdb.sql(sql.replace(" t ", " DATA ")).fetchall()
    assert sorted(tuple(r.values()) for r in got.to_pylist()) == sorted(want)
