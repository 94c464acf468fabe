"""What every small query pays besides its work (issue 19, session 32; docs/store.md, "Fixed
costs of a small query"): a node's filter runs no Acero plan, a node's result leaves as few
batches as its rows need, the coordinator's calls to nodes reuse idle threads, and a query's plan
reads the catalog's version and the live nodes in one request. Behaviour, never timings."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore, _exec
from microco.services.store._partition import PartitionSpec, partition_ids, partitions_for_predicate
from microco.services.store._query import Query
from microco.services.store._threads import CallThreads


def _rows(n: int = 4000) -> pa.Table:
    day = datetime.date(1995, 1, 1)
    return pa.table(
        {
            "k": pa.array([i if i % 7 else None for i in range(n)], pa.int64()),
            "s": pa.array([f"s{i % 13}" if i % 5 else None for i in range(n)], pa.string()),
            "d": pa.array([day + datetime.timedelta(days=i % 400) for i in range(n)], pa.date32()),
            "f": pa.array([i / 3 for i in range(n)], pa.float64()),
        }
    )


WHERES: list[list[list[Any]]] = [
    [["k", "=", 12]],
    [["k", "!=", 12]],
    [["k", "<", 100], ["k", ">=", 10]],
    [["k", "<=", 50], ["s", "=", "s3"]],
    [["k", ">", 3900]],
    [["s", "in", ["s1", "s2", "nope"]]],
    [["k", "in", [1, 2, 3, 700, 701]]],
    [["d", ">=", "1995-03-01"], ["d", "<", "1995-04-01"]],
    [["f", "<", 10.5]],
    [["s", "!=", "s4"], ["d", "=", "1995-01-02"]],
]


@pytest.mark.parametrize("where", WHERES, ids=[str(w) for w in WHERES])
def test_a_filter_keeps_the_rows_the_expression_keeps_without_an_acero_plan(
    where: list[list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # an extent's columns come as one batch per sub-bucket: many small batches, nulls among them
    t = pa.Table.from_batches(_rows().to_batches(max_chunksize=61))
    expected = t.filter(_exec.where_expr(t.schema, where))  # the expression, through Acero

    def no_plan(*a: Any, **k: Any) -> Any:
        raise AssertionError("apply_where ran an Acero plan (Table.filter of an expression)")

    # Table.filter of an expression runs pyarrow.acero._filter_table: a plan per call, whose
    # cost per batch was most of a small filtered scan's time on its node
    monkeypatch.setattr("pyarrow.acero._filter_table", no_plan)
    got = _exec.apply_where(t, where)
    assert got.to_pylist() == expected.to_pylist()
    assert got.schema == t.schema


def test_compact_drops_empty_batches_and_joins_small_ones() -> None:
    t = pa.Table.from_batches(_rows(640).to_batches(max_chunksize=10))
    assert len(t.to_batches()) == 64
    # a selective filter leaves a row or none of each batch (an expression's filter, what a node
    # ran before, keeps every batch as a chunk, most of them empty)
    few = t.filter(_exec.where_expr(t.schema, [["s", "=", "s3"]]))
    assert few.column(0).num_chunks == 64 and len(few.to_batches()) > 30
    out = _exec.compact(few)
    assert len(out.to_batches()) == 1 and out.to_pylist() == few.to_pylist()
    none = _exec.compact(t.filter(_exec.where_expr(t.schema, [["k", "<", -1]])))
    assert none.num_rows == 0 and len(none.to_batches()) <= 1 and none.schema == t.schema
    # big batches stay as they are (no copy)
    big = pa.Table.from_batches(
        _rows(4 * _exec.COMPACT_BELOW_ROWS).to_batches(max_chunksize=_exec.COMPACT_BELOW_ROWS)
    )
    assert _exec.compact(big) is big


def _core(tmp_path: Any, **kw: Any) -> tuple[StoreCore, LocalTransport]:
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)])
    core = StoreCore(MemoryKV(), tr, **kw)
    data = _rows()
    core.create_table(
        "t",
        data.schema,
        [PartitionSpec("k", "hash", 2), PartitionSpec("s", "hash", 2), PartitionSpec("f", "hash", 2)],
    )
    core.append("t", data)
    return core, tr


def test_a_selective_scan_leaves_its_node_as_one_batch(tmp_path: Any) -> None:
    # the node's result stream (what its Flight server sends, a message per batch): a point
    # filter on an extent of 64 sub-buckets was 64 batches, all but one empty
    core, tr = _core(tmp_path)
    plan = core.plan(Query.from_json({"table": "t", "where": [["k", "<", 300]], "select": ["k", "s"]}))
    assert plan.kind == "scan"
    sent = []
    for node, task in plan.stages[0]:
        reader = tr.stores[node].run_stream(task)
        sent.append([b.num_rows for b in reader])
    assert sum(sum(n) for n in sent) == 300 - len(range(0, 300, 7))
    assert all(len(batches) <= 1 for batches in sent), sent


def test_call_threads_reuse_an_idle_thread_and_never_queue_behind_a_busy_one() -> None:
    pool = CallThreads("t-call", idle_s=30)
    seen: list[threading.Thread] = []  # (the threads themselves: their ids cannot be reused)
    for _ in range(5):
        done = threading.Event()
        pool.run(lambda done=done: (seen.append(threading.current_thread()), done.set()))
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while pool.idle() < 1 and time.monotonic() < deadline:  # (back to waiting for a call)
            time.sleep(0.001)
    assert len({id(t) for t in seen}) == 1 and pool.started == 1
    # a call that does not end holds its thread; the next one gets a thread of its own at once
    stuck, released = threading.Event(), threading.Event()
    pool.run(lambda: (stuck.set(), released.wait(30)))
    assert stuck.wait(10)
    ran = threading.Event()
    pool.run(ran.set)
    assert ran.wait(10)
    released.set()
    assert pool.started == 2


def test_idle_call_threads_end() -> None:
    pool = CallThreads("t-call-idle", idle_s=0.05)
    done = threading.Event()
    pool.run(done.set)
    assert done.wait(10)
    deadline = time.monotonic() + 10
    while (
        pool.idle() or any(t.name == "t-call-idle" for t in threading.enumerate())
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.idle() == 0 and not any(t.name == "t-call-idle" for t in threading.enumerate())
    again = threading.Event()
    pool.run(again.set)  # (a new thread)
    assert again.wait(10) and pool.started == 2


def test_a_querys_calls_to_nodes_run_on_reused_threads(tmp_path: Any) -> None:
    core, tr = _core(tmp_path)
    threads: list[threading.Thread] = []
    run_task = tr.run_task

    def recording(node: Any, task: dict[str, Any]) -> pa.Table:
        threads.append(threading.current_thread())
        return run_task(node, task)

    tr.run_task = recording  # type: ignore[method-assign]
    q = Query.from_json({"table": "t", "group_by": ["k"], "aggs": [["sum", "f", "sf"]]})
    for _ in range(8):
        core.query(q)
    calls = len(threads)
    assert calls >= 8
    # each call got a thread of its own before: as many threads as calls; now the few a query's
    # stage runs at once, reused query after query
    assert len({id(t) for t in threads}) <= 3, (calls, len({id(t) for t in threads}))


class _CountingKV(MemoryKV):
    """The real in-memory store, counting the requests made of it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.requests.append("get " + key)
        return super().get(key)

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        self.requests.append("get_prefix " + prefix)
        return super().get_prefix(prefix)

    def get_many(self, keys: Any = (), prefixes: Any = ()) -> Any:
        self.requests.append(f"get_many {list(keys)} {list(prefixes)}")
        return super().get_many(keys, prefixes)


def test_get_many_reads_what_get_and_get_prefix_read() -> None:
    kv = MemoryKV()
    kv.put("/a/1", b"x")
    kv.put("/a/2", b"y")
    kv.put("/b", b"z")
    assert kv.get_many(["/b", "/nope"], ["/a/", "/c/"]) == (
        [b"z", None],
        [[("/a/1", b"x"), ("/a/2", b"y")], []],
    )
    assert kv.get_many() == ([], [])


def test_a_cached_plan_reads_version_and_live_nodes_in_one_request(tmp_path: Any) -> None:
    # the registry in the catalog's store, as a coordinator's FlightTransport has it (the nodes'
    # records registered as the nodes register them; the plan calls no node)
    from microco.common.registry import Registration, ServiceRecord
    from microco.services.store._flight import FlightTransport

    kv = _CountingKV()
    regs = [
        Registration(
            kv,
            ServiceRecord(
                "store-node",
                f"n{i}",
                f"127.0.0.1:{4000 + i}",
                labels={"fault_domain": f"rack{i}", "flight": f"grpc://127.0.0.1:{4000 + i}"},
            ),
        ).start()
        for i in range(3)
    ]
    try:
        tr = FlightTransport(kv)
        core = StoreCore(kv, tr)
        core.create_table("t", _rows().schema, [PartitionSpec("k", "hash", 2)] * 3)
        q = Query.from_json({"table": "t", "group_by": ["s"], "aggs": [["count", "*", "n"]]})
        first = core.plan(q)
        kv.requests.clear()
        again = core.plan(q)  # from the plan cache
        assert again.kind == first.kind
        reads = [r for r in kv.requests if r.startswith("get")]
        # before: the catalog's version (get) and the registry (get_prefix), two round trips
        assert len(reads) == 1 and reads[0].startswith("get_many"), kv.requests
        token, live = core.version_and_live_nodes()
        assert token == core.catalog.version() and [n.name for n in live] == ["n0", "n1", "n2"]
        assert [n.name for n in live] == [n.name for n in tr.live_nodes()]
    finally:
        for r in regs:
            r.stop()


def test_a_group_by_whose_rows_are_on_one_node_is_one_fragment_there(tmp_path: Any) -> None:
    # two nodes per fault domain; replica 2 by range of d (one partition per quarter): a filter
    # on d prunes it to one partition, on one node; a group-by on s then needs no exchange
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr)
    data = _rows()
    bounds = ["1995-04-01", "1995-07-01", "1995-10-01", "1996-01-01"]
    core.create_table(
        "t",
        data.schema,
        [
            PartitionSpec("k", "hash", 4),
            PartitionSpec("f", "hash", 4),
            PartitionSpec("d", "range", bounds=bounds),
        ],
    )
    core.append("t", data)
    where = [["d", ">=", "1995-04-01"], ["d", "<", "1995-07-01"]]
    spec = {
        "table": "t",
        "where": where,
        "group_by": ["s"],
        "aggs": [["count", "*", "n"], ["sum", "f", "sf"]],
    }
    got, plan = core.query(Query.from_json(spec))
    assert plan.kind == "agg_one_node" and plan.replicas == {"t": 2}
    assert len(plan.stages) == 1 and len(plan.stages[0]) == 1 and not plan.shuffle
    assert "one-node aggregation" in plan.explain_text()
    # the same answer as the exchange on a replica spread over two nodes, and as pyarrow's
    forced, fplan = core.query(Query.from_json({**spec, "replica": 0}))
    assert fplan.kind == "agg_shuffle" and len(fplan.stages) == 2
    rows = data.filter(_exec.where_mask(data, where))
    want = rows.group_by("s").aggregate([([], "count_all"), ("f", "sum")])

    def key(r: tuple[Any, ...]) -> tuple[bool, str]:
        return r[0] is None, r[0] or ""

    expect = sorted(
        zip(want["s"].to_pylist(), want["count_all"].to_pylist(), want["f_sum"].to_pylist()), key=key
    )

    def norm(t: pa.Table) -> list[tuple[Any, ...]]:
        return sorted(((r["s"], r["n"], r["sf"]) for r in t.to_pylist()), key=key)

    assert [r[:2] for r in norm(got)] == [r[:2] for r in expect] == [r[:2] for r in norm(forced)]
    assert [r[2] for r in norm(got)] == pytest.approx([r[2] for r in expect])
    # without the filter the rows are on both nodes of the group: an exchange, as before
    _, whole = core.query(Query.from_json({k: v for k, v in spec.items() if k != "where"}))
    assert whole.kind == "agg_shuffle"


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "="])
def test_range_pruning_keeps_the_partitions_that_can_hold_matches_and_not_the_next(op: str) -> None:
    # a bound is where a partition starts: ``col < '1996-01-01'`` on partitions by year kept
    # 1996's partition too before (its rows are read, filtered out)
    bounds = ("1994-01-01", "1995-01-01", "1996-01-01")
    spec = PartitionSpec("d", "range", bounds=bounds)
    days = [datetime.date(1993, 6, 1) + datetime.timedelta(days=i) for i in range(1200)]
    parts = partition_ids(spec, pa.array(days, pa.date32())).tolist()
    compare = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b}
    compare.update({">=": lambda a, b: a >= b, "=": lambda a, b: a == b})
    for value in [*bounds, "1994-06-30", "1994-12-31", "1993-01-01", "1997-01-01"]:
        x = datetime.date.fromisoformat(value)
        holding = {p for d, p in zip(days, parts, strict=True) if compare[op](d, x)}
        kept = partitions_for_predicate(spec, pa.date32(), op, value)
        assert kept is not None and holding <= kept, (op, value)  # never a match missed
        if op in ("<", "<=", ">=", "=") and value in bounds:
            assert kept == holding, (op, value, kept)  # and at a bound, not one partition more


@pytest.mark.parametrize(
    "spec",
    [
        {"table": "t", "group_by": ["k"], "aggs": [["sum", "f", "sf"], ["count", "*", "n"]]},
        {
            "table": "t",
            "join": {"table": "u", "left_on": "k", "right_on": "uk"},
            "group_by": ["s"],
            "aggs": [["sum", "w", "sw"]],
        },
    ],
    ids=["agg_local", "join_copart"],
)
def test_a_small_matched_fragment_is_one_pass_over_its_partitions(
    tmp_path: Any, spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a node's partitions each in its own Acero plan bound big hash tables; on small inputs each
    # was only one more plan to start. Under the bytes bound, one pass; at or over it, a pass a
    # partition; the same answer either way
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr)
    data = _rows()
    core.create_table(
        "t",
        data.schema,
        [PartitionSpec("k", "hash", 4), PartitionSpec("s", "hash", 4), PartitionSpec("f", "hash", 4)],
    )
    core.append("t", data)
    other = pa.table({"uk": pa.array(range(0, 4000, 3), pa.int64()), "w": pa.array([2] * 1334, pa.int64())})
    core.create_table("u", other.schema, [PartitionSpec("uk", "hash", 4)] * 3)
    core.append("u", other)
    plans = {"aggregations": 0}
    aggregated = _exec._aggregated

    def counted(*a: Any, **k: Any) -> pa.Table:
        plans["aggregations"] += 1
        return aggregated(*a, **k)

    monkeypatch.setattr(_exec, "_aggregated", counted)
    q = Query.from_json(spec)
    got, plan = core.query(q)
    assert plan.kind in ("agg_local", "join_copart") and len(plan.stages[0]) == 2
    assert not any(t["by_partition"] for _, t in plan.stages[0])
    one_pass = plans["aggregations"]
    core.agg_by_partition_min_bytes = 0  # (every size: a pass a partition, as before)
    plans["aggregations"] = 0
    each, plan_each = core.query(q)
    assert all(t["by_partition"] for _, t in plan_each.stages[0])
    if plan.kind == "agg_local":  # (a join's passes aggregate inside Acero's join plan)
        assert one_pass == 2 and plans["aggregations"] == 4  # two nodes, two partitions each
    keys = [(k, "ascending") for k in spec["group_by"]]
    for g, e in zip(got.sort_by(keys).to_pylist(), each.sort_by(keys).to_pylist(), strict=True):
        assert list(g.values()) == pytest.approx(list(e.values()))  # (floats summed in another order)
