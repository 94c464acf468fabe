"""The JSON-model plan cache (``StoreCore.plan``): a repeated query reuses its plan (the fixed cost
a matched plan pays on every query: the table's record and super-extents read from etcd, the
planner), and never a stale one: an append, a drop and re-create with another partitioning, an
extent marked corrupt, or a node lost plans anew, and answers equal a cache-less core's. A
reused shuffle plan runs under its own query id. In process: three nodes over a local
transport, tables of a few rows."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from microco.common.errors import NotFound
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._partition import PartitionSpec
from microco.services.store._query import Agg, Join, Query

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)]


def _t(**cols: list[Any]) -> pa.Table:
    return pa.table({k: pa.array(v, pa.int64()) for k, v in cols.items()})


def _create(core: StoreCore, name: str, data: pa.Table, cols: tuple[str, str, str], parts: int = 2) -> None:
    core.create_table(name, data.schema, [PartitionSpec(c, "hash", parts) for c in cols])
    core.append(name, data)


def _rows(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


BY_K = Query("t", group_by=("k",), aggs=(Agg("sum", "v", "s"), Agg("count", "*", "n")))


def test_a_repeated_query_reuses_its_plan_and_its_answer(tmp_path: Any) -> None:
    tr = LocalTransport(str(tmp_path), NODES)
    kv = MemoryKV()
    core, fresh = StoreCore(kv, tr), StoreCore(kv, tr, model_plan_cache=0)
    _create(core, "t", _t(k=[i % 7 for i in range(60)], v=list(range(60))), ("k", "v", "k"))
    first, plan = core.query(BY_K)
    assert not plan.cached and plan.kind == "agg_local"
    again, plan2 = core.query(BY_K)
    assert plan2.cached and _rows(again) == _rows(first) == _rows(fresh.query(BY_K)[0])
    assert "plan cache: reused" in plan2.explain_text() and "plan cache" not in plan.explain_text()
    assert plan2.qid != plan.qid  # each run its own id
    # another query (a forced replica) is another plan
    other = Query("t", group_by=("k",), aggs=BY_K.aggs, replica=1)
    assert not core.query(other)[1].cached
    assert not fresh.query(BY_K)[1].cached  # a core without a cache plans every query


def test_a_reused_shuffle_plan_runs_under_its_own_query_id(tmp_path: Any) -> None:
    # two nodes per fault domain: a replica's partitions on two nodes, which exchange partials
    # (on one node the group-by is one fragment there, ``agg_one_node``)
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr)
    _create(core, "t", _t(k=[i % 5 for i in range(50)], v=list(range(50))), ("v", "v", "v"), parts=3)
    q = Query("t", group_by=("k",), aggs=(Agg("sum", "v", "s"),))
    first, plan = core.query(q)
    again, plan2 = core.query(q)
    assert plan.kind == plan2.kind == "agg_shuffle" and plan2.cached
    ids = {t["qid"] for stage in plan2.stages for _, t in stage}
    assert ids == {plan2.qid} and plan2.qid != plan.qid
    # the cached copy itself is not handed out: its tasks keep their own id
    assert all(
        t["qid"] != plan2.qid for _, (_, p) in core.model_plans._d.items() for s in p.stages for _, t in s
    )
    assert _rows(again) == _rows(first) == sorted((k, sum(range(k, 50, 5))) for k in range(5))
    assert plan2.moved_bytes == plan.moved_bytes  # counted per run, from the planned bytes


def test_a_changed_catalog_or_node_set_is_never_served_a_stale_plan(tmp_path: Any) -> None:
    tr = LocalTransport(str(tmp_path), NODES)
    kv = MemoryKV()
    core, fresh = StoreCore(kv, tr), StoreCore(kv, tr, model_plan_cache=0)
    _create(core, "t", _t(k=list(range(30)), v=list(range(30))), ("k", "v", "k"))
    _create(core, "u", _t(uk=list(range(30)), w=[2] * 30), ("uk", "w", "uk"))
    join = Query("t", join=Join("u", "k", "uk"), group_by=("k",), aggs=(Agg("sum", "w", "s"),))

    def check(q: Query, cached: bool) -> Any:
        got, plan = core.query(q)
        assert plan.cached is cached
        assert _rows(got) == _rows(fresh.query(q)[0])
        return got, plan

    for q in (BY_K, join):
        check(q, False)
        check(q, True)
    # an append to either table: its rows are read (a stale plan lists the old extents only)
    core.append("t", _t(k=[3], v=[100]))
    got, _ = check(BY_K, False)
    assert (3, 103, 2) in _rows(got)
    check(BY_K, True)
    core.append("u", _t(uk=[3], w=[5]))
    got, _ = check(join, False)
    assert (3, 14) in _rows(got)  # t has k=3 twice, u has uk=3 twice: 2 * (2 + 5)
    check(join, True)
    # dropped and re-created with another schema and partitioning: the new one is planned
    core.drop_table("t")
    _create(core, "t", _t(k=list(range(10)), v=[1] * 10, x=[0] * 10), ("v", "x", "k"), parts=3)
    got, plan = check(BY_K, False)
    assert plan.replicas == {"t": 2} and len(got) == 10
    # an extent marked corrupt: the plan reads around it
    check(BY_K, True)
    sx = core.table("t").super_extents[0]
    bad = next(e for e in sx.extents if e.id in json.dumps(plan.stages))
    core.catalog.mark_extent("t", sx.id, bad.id, "corrupt")
    _, plan = check(BY_K, False)
    assert bad.id not in json.dumps(plan.stages)
    # a node lost: the plan reads around it
    check(BY_K, True)
    tr.kill("n1")
    _, plan = check(BY_K, False)
    assert "n1" not in plan.nodes and all(n != "n1" for stage in plan.stages for n, _ in stage)
    check(BY_K, True)
    # a dropped table is an error, not an old plan's answer
    core.drop_table("t")
    with pytest.raises(NotFound):
        core.query(BY_K)
