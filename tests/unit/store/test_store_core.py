"""The store's pure core, no sockets: partitioning, placement (invariant row by row), bucketing and
recovery, planner and query results against DuckDB on the raw data, whichever replica answers."""

from __future__ import annotations

import math
from collections import defaultdict

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.common.errors import AlreadyExists, InvalidArgument, NotFound
from microco.common.kv import MemoryKV
from microco.services.store import (
    Agg,
    Join,
    LocalTransport,
    NodeInfo,
    PartitionSpec,
    Query,
    StoreCore,
    check_row_copies,
    partition_ids,
    place_super_extent,
)
from microco.services.store._layout import others, read_extent
from microco.services.store._partition import partitions_for_predicate
from microco.services.store._placement import Copy

RNG = np.random.default_rng(7)
N_ORD, N_ITEM = 3000, 9000


def _orders() -> pa.Table:
    return pa.table(
        {
            "o_id": np.arange(N_ORD, dtype=np.int64),
            "o_cust": RNG.integers(0, 40, N_ORD),
            "o_date": pa.array(RNG.integers(8000, 9000, N_ORD).astype("int32")).cast(pa.date32()),
            "o_price": np.round(RNG.random(N_ORD) * 100, 2),
            "o_flag": pa.array(RNG.choice(["A", "B", "C", "D"], N_ORD)).cast(pa.string_view()),
        }
    )


def _items() -> pa.Table:
    return pa.table(
        {
            "l_id": np.arange(N_ITEM, dtype=np.int64),
            "l_oid": RNG.integers(0, N_ORD, N_ITEM),
            "l_qty": RNG.integers(1, 50, N_ITEM),
        }
    )


ORDERS = _orders()
ITEMS = _items()
NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
ORDER_SPECS = [
    PartitionSpec("o_id", "hash", 4),
    PartitionSpec("o_cust", "hash", 4),
    PartitionSpec("o_date", "range", bounds=("1992-01-01", "1993-06-01")),
]
ITEM_SPECS = [
    PartitionSpec("l_oid", "hash", 4),
    PartitionSpec("l_id", "hash", 3),
    PartitionSpec("l_qty", "hash", 2),
]


def _loaded(root) -> tuple[StoreCore, LocalTransport]:
    tr = LocalTransport(str(root), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    core.create_table("orders", ORDERS.schema, ORDER_SPECS)
    core.create_table("items", ITEMS.schema, ITEM_SPECS)
    core.append("orders", ORDERS)
    core.append("items", ITEMS.slice(0, 5000))
    core.append("items", ITEMS.slice(5000))
    return core, tr


@pytest.fixture()
def store(tmp_path):
    """A store of its own, for the tests that kill a node or damage an extent."""
    return _loaded(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store for the tests that only read (and check afterwards that it is unchanged)."""
    return _loaded(tmp_path_factory.mktemp("shared"))


# --------------------------------------------------------------------------- partitioning
def test_hash_partition_is_deterministic_and_spread():
    ids = partition_ids(PartitionSpec("x", "hash", 8), pa.array(np.arange(10_000)))
    assert ids.min() == 0 and ids.max() == 7
    counts = np.bincount(ids)
    assert counts.min() > 1000  # consecutive keys spread evenly
    again = partition_ids(
        PartitionSpec("x", "hash", 8), pa.chunked_array([np.arange(5000), np.arange(5000, 10_000)])
    )
    assert (ids == again).all()
    s = partition_ids(PartitionSpec("x", "hash", 4), pa.array(["a", "b", "a", None]))
    assert s[0] == s[2] and s[3] == 0
    sv = partition_ids(PartitionSpec("x", "hash", 4), pa.array(["a", "b", "a", None]).cast(pa.string_view()))
    assert (s == sv).all()


def test_range_partition_and_pruning():
    spec = PartitionSpec("d", "range", bounds=("1992-01-01", "1993-06-01"))
    vals = pa.array(["1991-05-05", "1992-01-01", "1993-01-01", "1999-01-01"]).cast(pa.date32())
    assert partition_ids(spec, vals).tolist() == [0, 1, 1, 2]
    assert partitions_for_predicate(spec, pa.date32(), "<", "1991-12-01") == {0}
    assert partitions_for_predicate(spec, pa.date32(), ">=", "1993-07-01") == {2}
    h = PartitionSpec("k", "hash", 8)
    assert partitions_for_predicate(h, pa.int64(), "=", 5) == set(partition_ids(h, pa.array([5])).tolist())
    assert partitions_for_predicate(h, pa.int64(), "<", 5) is None
    with pytest.raises(InvalidArgument):
        PartitionSpec("d", "range", bounds=())
    with pytest.raises(InvalidArgument):
        PartitionSpec.parse("x:zigzag")
    assert PartitionSpec.parse("x:hash:16").partitions == 16


# --------------------------------------------------------------------------- placement
def test_placement_groups_are_disjoint_and_pinned():
    seen = defaultdict(set)
    for sid in range(6):
        pl = place_super_extent(NODES, sid, [4, 4, 3])
        dom = {n.name: n.domain for n in NODES}
        per_rep = [{dom[pl[(r, p)]] for p in range(c)} for r, c in enumerate([4, 4, 3])]
        assert (
            not (per_rep[0] & per_rep[1]) and not (per_rep[0] & per_rep[2]) and not (per_rep[1] & per_rep[2])
        )
        for (r, _), node in pl.items():
            seen[node].add(r)
    # each replica stays on one group (its partitions on one node each: test_store_placement_pinned),
    # and the three replicas use every node
    assert all(len(v) == 1 for v in seen.values()) and len(seen) == len(NODES)
    with pytest.raises(Exception, match="fault domains"):
        place_super_extent([NodeInfo("a", "x"), NodeInfo("b", "y")], 0, [2, 2, 2])


def _row_copies(core: StoreCore, tr: LocalTransport, table: str, key: str):
    copies = defaultdict(list)
    dom = {n.name: n.domain for n in NODES}
    for e in core.table(table).extents():
        rows, _ = read_extent(tr.stores[e.node].path(table, e.id))
        for k in rows.column(key).to_pylist():
            copies[k].append(Copy(e.replica, e.node, dom[e.node]))
    return copies


def assert_invariant(core, tr, table, key, expected_rows):
    copies = _row_copies(core, tr, table, key)
    assert len(copies) == expected_rows
    for k, cs in copies.items():
        problem = check_row_copies(cs)
        assert problem is None, f"row {k}: {problem}"


def test_invariant_row_by_row(shared):
    core, tr = shared
    assert_invariant(core, tr, "orders", "o_id", N_ORD)
    assert_invariant(core, tr, "items", "l_id", N_ITEM)
    assert core.table("orders").rows == N_ORD and len(core.table("orders").super_extents) == 3


def test_buckets_rebuild_an_extent_exactly(shared):
    core, tr = shared
    t = core.table("orders")
    s = t.super_extents[0]
    lost = s.replica(1)[0]
    original, _ = read_extent(tr.stores[lost.node].path("orders", lost.id))
    for r2 in others(1):
        pos = others(r2).index(1)
        parts = [
            read_extent(tr.stores[x.node].path("orders", x.id), (pos, lost.partition))[0]
            for x in s.replica(r2)
        ]
        rebuilt = pa.concat_tables(parts)
        assert sorted(rebuilt.column("o_id").to_pylist()) == sorted(original.column("o_id").to_pylist())


# --------------------------------------------------------------------------- queries
def _duck(sql: str) -> pa.Table:
    con = duckdb.connect()
    con.register(
        "orders",
        ORDERS.cast(
            pa.schema([f if f.name != "o_flag" else pa.field("o_flag", pa.string()) for f in ORDERS.schema])
        ),
    )
    con.register("items", ITEMS)
    return con.sql(sql).to_arrow_table()


def assert_same(got: pa.Table, want: pa.Table, ordered: bool = False):
    assert got.num_rows == want.num_rows, (got.num_rows, want.num_rows)
    g, w = got.to_pylist(), want.to_pylist()
    names = got.column_names

    def norm(row):
        return tuple(round(v, 6) if isinstance(v, float) else v for v in (row[n] for n in names))

    if not ordered:
        g, w = sorted(g, key=lambda r: repr(norm(r))), sorted(w, key=lambda r: repr(norm(r)))
    for a, b in zip(g, w, strict=True):
        for n in names:
            x, y = a[n], b[n] if n in b else list(b.values())[names.index(n)]
            if isinstance(x, float) or isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9), (n, x, y)
            else:
                assert x == y, (n, x, y)


CASES = [
    (Query("orders", where=(("o_cust", "=", 7),)), "select * from orders where o_cust = 7", "o_cust"),
    (
        Query(
            "orders", where=(("o_date", "<", "1992-03-01"), ("o_price", ">", 50.0)), select=("o_id", "o_date")
        ),
        "select o_id, o_date from orders where o_date < date '1992-03-01' and o_price > 50",
        "o_date",
    ),
    (
        Query(
            "orders",
            group_by=("o_cust",),
            aggs=(
                Agg("sum", "o_price", "s"),
                Agg("count", "*", "n"),
                Agg("mean", "o_price", "m"),
                Agg("max", "o_date", "mx"),
            ),
        ),
        "select o_cust, sum(o_price) s, count(*) n, avg(o_price) m, max(o_date) mx from orders group by o_cust",
        "o_cust",
    ),
    (
        Query("orders", group_by=("o_flag",), aggs=(Agg("min", "o_price", "lo"), Agg("count", "o_id", "n"))),
        "select o_flag, min(o_price) lo, count(o_id) n from orders group by o_flag",
        None,
    ),
    (
        Query("orders", aggs=(Agg("sum", "o_price", "s"), Agg("count", "*", "n"))),
        "select sum(o_price) s, count(*) n from orders",
        None,
    ),
    (
        Query(
            "orders",
            join=Join("items", "o_id", "l_oid"),
            group_by=("o_cust",),
            aggs=(Agg("sum", "l_qty", "q"),),
        ),
        "select o_cust, sum(l_qty) q from orders join items on o_id = l_oid group by o_cust",
        "o_id",
    ),
    (
        Query(
            "orders",
            select=("o_id", "o_cust"),
            join=Join("items", "o_id", "l_oid", where=(("l_qty", ">", 45),), select=("l_id", "l_qty")),
        ),
        "select o_id, o_cust, l_id, l_qty from orders join items on o_id = l_oid where l_qty > 45",
        "o_id",
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_query_matches_duckdb_on_every_replica(shared, case):
    core, _ = shared
    q, sql, matching_col = CASES[case]
    want = _duck(sql)
    kinds = set()
    for r in (None, 0, 1, 2):
        res, plan = core.query(Query(**{**q.__dict__, "replica": r}))
        assert_same(res, want)
        kinds.add(plan.kind)
        if plan.kind.endswith("shuffle"):
            assert plan.moved_bytes > 0  # the exchange is real: buckets cross nodes
        else:
            assert plan.moved_bytes == 0 or plan.kind == "join_copart"
        if r is None and matching_col is not None:
            assert ORDER_SPECS[plan.replicas["orders"]].column == matching_col, plan.explain_text()
    if q.group_by and not q.join:
        assert kinds == {"agg_local", "agg_shuffle"} or q.group_by == ("o_flag",)
    if q.join:
        assert kinds == {"join_copart", "join_shuffle"}


def test_order_limit_and_explain(shared):
    core, _ = shared
    q = Query("orders", select=("o_id", "o_price"), order_by=(("o_price", True), ("o_id", False)), limit=7)
    res, _ = core.query(q)
    assert_same(
        res, _duck("select o_id, o_price from orders order by o_price desc, o_id limit 7"), ordered=True
    )
    text = core.explain(Query("orders", group_by=("o_cust",), aggs=(Agg("count", "*", "n"),)))
    assert "replica 1" in text and "shuffle-free" in text
    text = core.explain(Query("orders", group_by=("o_cust",), aggs=(Agg("count", "*", "n"),), replica=0))
    assert "shuffle aggregation" in text and "replica 1 would avoid the shuffle" in text
    text = core.explain(Query("orders", where=(("o_cust", "=", 3),)))
    assert "prunes to 1 of 4 partitions" in text


# --------------------------------------------------------------------------- failures and recovery
def test_dead_node_degraded_reads_then_recovery(store):
    core, tr = store
    tr.kill("n1")
    for q, sql, _ in CASES:
        want = _duck(sql)
        for r in (None, 2):  # the matching replica and a shuffled one
            res, plan = core.query(Query(**{**q.__dict__, "replica": r}))
            assert_same(res, want)
    assert "degraded" in core.explain(Query("orders", group_by=("o_cust",), aggs=(Agg("count", "*", "n"),)))
    lost = core.lost_count()
    assert lost > 0
    progress = core.recover()
    assert progress["state"] == "done" and progress["rebuilt"] == lost
    assert 0.9 <= progress["bytes_read_per_byte_lost"] <= 1.1
    assert progress["full_scan_bytes"] > 2 * progress["bytes_read"]
    assert core.lost_count() == 0
    assert all(e.node != "n1" for t in core.tables() for e in t.extents())
    for table, key, n in (("orders", "o_id", N_ORD), ("items", "l_id", N_ITEM)):
        copies = _row_copies(core, tr, table, key)
        assert len(copies) == n
        assert all(check_row_copies(cs) is None for cs in copies.values())
    res, _ = core.query(CASES[2][0])
    assert_same(res, _duck(CASES[2][1]))


def test_corrupt_extent_detected_and_rebuilt(store):
    core, tr = store
    e = core.table("orders").super_extents[1].replica(1)[0]
    path = tr.stores[e.node].path("orders", e.id)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    q, sql, _ = CASES[2]
    res, plan = core.query(q)  # replica 1 matches; the corrupt extent is detected and read degraded
    assert_same(res, _duck(sql))
    assert core.lost_count() == 1
    progress = core.recover()
    assert progress["rebuilt"] == 1 and core.lost_count() == 0
    assert core.scrub() == []
    assert_invariant(core, tr, "orders", "o_id", N_ORD)


def test_scrub_finds_corruption(store):
    core, tr = store
    e = core.table("items").extents()[0]
    path = tr.stores[e.node].path("items", e.id)
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    assert core.scrub() == [f"items/{e.id}"]


def test_bad_input_changes_nothing(shared):
    core, _ = shared
    before = (core.table("orders").rows, len(core.table("orders").super_extents), core.catalog.table_names())
    with pytest.raises(InvalidArgument, match="partitioning column 'o_cust'"):
        core.append("orders", ORDERS.drop_columns(["o_cust"]))
    with pytest.raises(InvalidArgument, match="schema mismatch"):
        core.append("orders", ORDERS.append_column("extra", pa.array(np.zeros(N_ORD))))
    with pytest.raises(InvalidArgument, match="schema mismatch"):
        core.append("orders", ORDERS.set_column(3, "o_price", pa.array(["x"] * N_ORD)))
    with pytest.raises(NotFound):
        core.append("nope", ORDERS)
    with pytest.raises(NotFound):
        core.query(Query("nope"))
    with pytest.raises(InvalidArgument, match="no column 'zz'"):
        core.query(Query("orders", where=(("zz", "=", 1),)))
    with pytest.raises(InvalidArgument):
        core.query(Query.from_json('{"table": "orders", "group_by": ["o_cust"]}'))
    with pytest.raises(AlreadyExists):
        core.create_table("orders", ORDERS.schema, ORDER_SPECS)
    with pytest.raises(InvalidArgument, match="not in the schema"):
        core.create_table("t2", ORDERS.schema, [PartitionSpec("zz")] * 3)
    with pytest.raises(InvalidArgument, match="do not parse"):
        core.create_table("t3", ORDERS.schema, [PartitionSpec("o_date", "range", bounds=("notadate",))] * 3)
    after = (core.table("orders").rows, len(core.table("orders").super_extents), core.catalog.table_names())
    assert before == after


def test_query_json_roundtrip():
    q = CASES[6][0]
    assert Query.from_json(q.to_json()) == q
    with pytest.raises(InvalidArgument):
        Query.from_json("{not json")


def test_missing_extent_file_is_read_degraded_and_rebuilt(store):
    core, tr = store
    e = core.table("orders").super_extents[2].replica(1)[0]
    tr.stores[e.node].path("orders", e.id).unlink()  # e.g. a node restarted on an empty disk
    q, sql, _ = CASES[2]
    res, _ = core.query(q)
    assert_same(res, _duck(sql))
    assert core.lost_count() == 1
    assert core.recover()["rebuilt"] == 1 and core.lost_count() == 0
    assert_invariant(core, tr, "orders", "o_id", N_ORD)
