"""The JSON planner's stages (bind -> choose by estimated cost -> fragments) and co-located
placement: partition p of every table partitioned by one function sits on one node, so a
co-partitioned join moves no bytes even across several super-extents."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore, place_super_extent
from microco.services.store._core import colocated_homes
from microco.services.store._partition import PartitionSpec
from microco.services.store._placement import domain_groups
from microco.services.store._planner import (
    COST_TIE,
    MOVE_WEIGHT,
    bind,
    choose,
    column_share,
    fragments,
    plan_query,
)
from microco.services.store._query import Agg, Join, Query

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
RNG = np.random.default_rng(3)
ORDERS = pa.table(
    {
        "o_id": np.arange(2000, dtype=np.int64),
        "o_cust": RNG.integers(0, 50, 2000),
        "o_price": RNG.random(2000),
        "o_note": pa.array([f"note {i % 97}" for i in range(2000)]),
    }
)
ITEMS = pa.table(
    {
        "l_id": np.arange(6000, dtype=np.int64),
        "l_oid": RNG.integers(0, 2000, 6000),
        "l_qty": RNG.integers(1, 50, 6000),
    }
)
ORDER_SPECS = [
    PartitionSpec("o_id", "hash", 4),
    PartitionSpec("o_cust", "hash", 4),
    PartitionSpec("o_price", "hash", 2),
]
ITEM_SPECS = [
    PartitionSpec("l_oid", "hash", 4),
    PartitionSpec("l_id", "hash", 3),
    PartitionSpec("l_qty", "hash", 2),
]


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    tr = LocalTransport(str(tmp_path_factory.mktemp("plan")), NODES)
    # several super-extents per table, of different counts: only co-located placement keeps
    # partition p of orders and items on one node
    c = StoreCore(MemoryKV(), tr, super_extent_rows=1500, recovery_rate_bytes=0)
    c.create_table("orders", ORDERS.schema, ORDER_SPECS)
    c.create_table("items", ITEMS.schema, ITEM_SPECS)
    c.append("orders", ORDERS)
    c.append("items", ITEMS)
    return c


def _live(core):
    nodes = core.live_nodes()
    return {n.name for n in nodes}, {n.name: n.address for n in nodes}


def test_bind_reads_filter_columns_and_keeps_only_what_flows_on():
    from microco.services.store._catalog import TableInfo

    t = TableInfo("orders", ORDERS.schema, ORDER_SPECS, [], 0, 0)
    b = bind(Query("orders", where=(("o_price", ">", 0.5),), select=("o_id",)), {"orders": t})
    assert b.keep_a == ["o_id"] and b.read_a == ["o_id", "o_price"] and b.out_cols == ["o_id"]
    g = bind(Query("orders", group_by=("o_cust",), aggs=(Agg("sum", "o_price", "s"),)), {"orders": t})
    assert g.keep_a == ["o_cust", "o_price"] and g.out_cols == ["o_cust", "s"] and g.is_agg


def test_column_share_weighs_columns_by_type():
    from microco.services.store._catalog import TableInfo

    t = TableInfo("orders", ORDERS.schema, ORDER_SPECS, [], 0, 0)
    # three 8-byte columns and one string (16): 40 bytes a row
    assert column_share(t, ["o_id"]) == pytest.approx(8 / 40)
    assert column_share(t, ["o_note"]) == pytest.approx(16 / 40)
    assert column_share(t, list(ORDERS.schema.names)) == 1.0


def test_colocated_placement_pins_partitions_of_one_function_to_one_node():
    homes = colocated_homes(ORDER_SPECS)
    assert homes == ["hash:4:", None, "hash:2:"]  # the first replica of each function
    items = colocated_homes(ITEM_SPECS)
    for sid in range(6):
        a = place_super_extent(NODES, sid, [4, 4, 2], homes)
        b = place_super_extent(NODES, sid + 3, [4, 3, 2], items)  # another table, other ids
        for p in range(4):
            assert a[(0, p)] == b[(0, p)]
        # the invariant: the three replicas of a super-extent on three disjoint groups
        groups = domain_groups(NODES)
        where = [{i for i, g in enumerate(groups) if any(n.name == a[(r, 0)] for n in g)} for r in range(3)]
        assert set().union(*where) == {0, 1, 2}
    # without homes: the rotation of before
    assert place_super_extent(NODES, 1, [4, 4, 2]) == place_super_extent(NODES, 1, [4, 4, 2], [None] * 3)


def test_copartitioned_join_moves_no_bytes_across_super_extents(core):
    q = Query(
        "orders", join=Join("items", "o_id", "l_oid"), group_by=("o_cust",), aggs=(Agg("sum", "l_qty", "q"),)
    )
    assert len(core.table("items").super_extents) > len(core.table("orders").super_extents) > 1
    res, plan = core.query(q)
    assert plan.kind == "join_copart" and plan.moved_bytes == 0, plan.explain_text()
    assert "0 read 0.00 MB" in plan.explain_text() or "read 0.00 MB" in plan.explain_text()
    want = {}
    oc = dict(zip(ORDERS["o_id"].to_pylist(), ORDERS["o_cust"].to_pylist(), strict=True))
    for oid, qty in zip(ITEMS["l_oid"].to_pylist(), ITEMS["l_qty"].to_pylist(), strict=True):
        want[oc[oid]] = want.get(oc[oid], 0) + qty
    assert dict(zip(res["o_cust"].to_pylist(), res["q"].to_pylist(), strict=True)) == want


def test_choose_takes_the_cheapest_candidate_and_explains_the_others(core):
    live, addresses = _live(core)
    tables = {"orders": core.table("orders"), "items": core.table("items")}
    cases = [
        Query("orders", where=(("o_cust", "=", 7),)),  # pruning: replica 1 reads a quarter
        Query("orders", group_by=("o_cust",), aggs=(Agg("sum", "o_price", "s"),)),  # no shuffle on 1
        Query("orders", join=Join("items", "o_id", "l_oid")),
    ]
    expect = [("scan", 1), ("agg_local", 1), ("join_copart", 0)]
    for q, (kind, r) in zip(cases, expect, strict=True):
        c = choose(bind(q, tables), live, addresses)
        assert (c.kind, c.replicas["orders"]) == (kind, r)
        assert c.alternatives and all(
            c.cost.total <= alt.total * (1 + COST_TIE) for _, _, alt in c.alternatives
        )
        plan = fragments(bind(q, tables), c, live, addresses)
        assert plan.kind == kind and "cost: " in plan.explain_text() and "rather than" in plan.explain_text()
        assert plan_query(q, tables, live, addresses).explain == plan.explain
    shuffle = choose(bind(cases[1], tables), live, addresses).alternatives
    assert any(k == "agg_shuffle" and cost.bytes_moved > 0 for k, _, cost in shuffle)
    assert MOVE_WEIGHT > 1


def test_estimates_within_the_tie_margin_prefer_no_shuffle():
    # Seen in the demo: every replica of a table on one node, so a shuffle moved "0 bytes" and
    # won by 85 rows of extent-split noise over the replica partitioned on the group-by column.
    from microco.services.store._planner import Choice, Cost, _cheapest

    local = Choice("agg_local", {"t": 1}, Cost(200_000, 2_620_000, 0), [])
    shuffle = Choice("agg_shuffle", {"t": 2}, Cost(199_915, 2_618_900, 0), [])
    assert _cheapest([shuffle, local], lambda c: c.replicas["t"]) is local
    cheaper = Choice("agg_shuffle", {"t": 2}, Cost(100_000, 1_300_000, 0), [])  # really less work
    assert _cheapest([cheaper, local], lambda c: c.replicas["t"]) is cheaper


def test_a_copartitioned_pair_that_moves_more_than_a_shuffle_loses(core, monkeypatch):
    from microco.services.store import _planner

    live, addresses = _live(core)
    tables = {"orders": core.table("orders"), "items": core.table("items")}
    q = Query("orders", join=Join("items", "o_id", "l_oid"))
    # the same layout seen with every partition join reading its extents from a peer
    real = _planner._copart_tasks
    monkeypatch.setattr(
        _planner, "_copart_tasks", lambda ua, ub: [(p, s, "elsewhere") for p, s, _ in real(ua, ub)]
    )
    c = choose(bind(q, tables), live, addresses)
    copart = [cost for k, _, cost in c.alternatives + [(c.kind, c.replicas, c.cost)] if k == "join_copart"]
    shuffle = [cost for k, _, cost in c.alternatives + [(c.kind, c.replicas, c.cost)] if k == "join_shuffle"]
    assert copart and shuffle
    assert c.kind == ("join_shuffle" if shuffle[0].total < copart[0].total else "join_copart")
    assert copart[0].bytes_moved > shuffle[0].bytes_moved and c.kind == "join_shuffle"


def test_the_cheapest_replica_is_the_one_that_reads_fewest_bytes(core):
    from microco.services.store._planner import cheapest_replica

    live, addresses = _live(core)
    t = core.table("orders")
    r, cost, units, allowed = cheapest_replica(t, [("o_cust", "=", 7)], ["o_id", "o_cust"], live, addresses)
    assert r == 1 and allowed is not None and len(allowed) == 1
    _, whole, _, _ = cheapest_replica(t, [], ["o_id", "o_cust"], live, addresses)
    assert 0 < cost.bytes_read < whole.bytes_read
    assert whole.rows == pytest.approx(t.rows, rel=0.05) and sum(u.bytes for u in units) * column_share(
        t, ["o_id", "o_cust"]
    ) == (pytest.approx(cost.bytes_read, abs=1))
    # a replica that cannot be read at all is passed over, not fatal
    down = {n for n in live if n not in {s["node"] for u in units for s in u.sources}}
    r2, *_ = cheapest_replica(t, [("o_cust", "=", 7)], ["o_id"], down, addresses)
    assert r2 in (0, 1, 2)


@pytest.mark.parametrize(
    "q, kind",
    [
        # a group-by on the partition column: every group lies in one partition
        (
            Query("items", group_by=("l_oid",), aggs=(Agg("sum", "l_qty", "q"), Agg("count", "*", "n"))),
            "agg_local",
        ),
        # a co-partitioned join grouped off its key (partials merged) and by it
        (
            Query(
                "orders",
                join=Join("items", "o_id", "l_oid"),
                group_by=("o_cust",),
                aggs=(Agg("sum", "l_qty", "q"), Agg("mean", "o_price", "p")),
            ),
            "join_copart",
        ),
        (
            Query(
                "orders",
                join=Join("items", "o_id", "l_oid"),
                group_by=("o_id",),
                aggs=(Agg("max", "l_qty", "m"),),
            ),
            "join_copart",
        ),
    ],
)
def test_matched_plans_run_a_partition_at_a_time(core, q, kind, monkeypatch):
    # each node holds several partitions (4 partitions, 2 nodes a replica); the matched plan's
    # fragments read, join and aggregate one partition at a time, and answer as the node-wide
    # pass does (the answers must not depend on it)
    import duckdb

    # (these tables are small: a node's partitions a pass each only when it is asked for any size)
    monkeypatch.setattr(core, "agg_by_partition_min_bytes", 0)
    got, plan = core.query(q)
    assert plan.kind == kind and all(t["by_partition"] for _, t in plan.stages[0]), plan.explain_text()
    core.agg_by_partition = False
    try:
        whole, plan_off = core.query(q)
    finally:
        core.agg_by_partition = True
    assert not any(t.get("by_partition") for _, t in plan_off.stages[0])
    keys = list(q.group_by)
    order = [(k, "ascending") for k in keys]
    for g, w in zip(got.sort_by(order).to_pylist(), whole.sort_by(order).to_pylist(), strict=True):
        assert list(g.values()) == pytest.approx(list(w.values()))  # floats summed in another order
    con = duckdb.connect()
    con.register("orders", ORDERS)
    con.register("items", ITEMS)
    aggs = {"sum": "sum", "count": "count", "mean": "avg", "max": "max"}
    cols = ", ".join(f"{aggs[a.fn]}({a.column}) as {a.name}" for a in q.aggs)
    src = "orders join items on o_id = l_oid" if q.join else q.table
    want = con.sql(
        f"select {', '.join(keys)}, {cols} from {src} group by {', '.join(keys)} order by {', '.join(keys)}"
    )
    got_rows = got.sort_by(order).to_pylist()
    for g, w in zip(got_rows, want.fetchall(), strict=True):
        assert list(g.values()) == pytest.approx(list(w))


def test_a_partition_read_on_one_side_only_joins_nothing():
    from microco.services.store import _exec

    # partition 0 has rows on both sides, partition 1 only on the left: an inner join of it is empty
    tables = {
        "l0": pa.table({"k": [1, 2], "v": [10, 20]}),
        "l1": pa.table({"k": [3], "v": [30]}),
        "r0": pa.table({"k": [1, 1, 2], "w": [1, 2, 3]}),
    }

    class Env:
        def read_source(self, source, columns):
            return tables[source["id"]]

    def side(*ids):
        return {
            "sources": [{"id": i, "node": "n", "unit": [0, int(i[1])]} for i in ids],
            "read": None,
            "keep": None,
        }

    task = {
        "op": "fragment",
        "left": side("l0", "l1"),
        "right": side("r0"),
        "join": {"left_on": "k", "right_on": "k"},
        "post": {"agg": {"keys": ["k"], "aggs": [["sum", "w", "s"]]}},
        "by_partition": True,
    }
    out = _exec.run_task(Env(), task).sort_by("k")
    assert out.to_pylist() == [{"k": 1, "s": 3}, {"k": 2, "s": 3}]
    task["by_partition"] = False
    assert _exec.run_task(Env(), task).sort_by("k").equals(out)
