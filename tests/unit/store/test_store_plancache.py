"""The SQL plan cache (``_plancache``): a repeated query reuses its plan, and never a stale one.
A change of a table's schema or partitioning (drop and re-create under the same name), an append,
or a node lost invalidates the plan; a plan whose pruning read ``current_date`` is not kept; and a
cached plan never lets a caller read a table their permissions do not allow. In process: three
nodes over a local transport, tables of a few rows."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from microco.api.store.v1 import store_pb2 as pb
from microco.common.errors import NotFound, PermissionDenied
from microco.common.kv import MemoryKV
from microco.services.runtime.auth import Caller
from microco.services.store import LocalTransport, NodeInfo, StoreCore, _service
from microco.services.store._partition import PartitionSpec
from microco.services.store._plancache import normalise

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)]


def _core(tmp_path: Any) -> tuple[StoreCore, LocalTransport]:
    tr = LocalTransport(str(tmp_path), NODES)
    return StoreCore(MemoryKV(), tr), tr


def _create(core: StoreCore, name: str, data: pa.Table, cols: tuple[str, str, str], parts: int = 2) -> None:
    core.create_table(name, data.schema, [PartitionSpec(c, "hash", parts) for c in cols])
    core.append(name, data)


def _t(**cols: list[Any]) -> pa.Table:
    return pa.table({k: pa.array(v, pa.int64()) for k, v in cols.items()})


def test_normal_form_keeps_quotes_and_comments() -> None:
    assert normalise("  select  a,\n\tb  from t ;") == "select a, b from t ;"
    assert normalise("select 'a  b',  \"X  y\" from t") == "select 'a  b', \"X  y\" from t"
    assert normalise("select 'it''s  x'  from t") == "select 'it''s  x' from t"
    # a line comment stays whole, with the newline that ends it
    assert normalise("select a -- c  d\n  from   t") == "select a -- c  d\n from t"
    # what this cannot follow exactly is kept as written
    for text in ("select /* a  b */  1", "select $$a  b$$", "select E'a\\'  b'"):
        assert normalise(text) == text


def test_a_repeated_query_reuses_its_plan_and_its_answer(tmp_path: Any) -> None:
    core, _ = _core(tmp_path)
    _create(core, "t", _t(k=list(range(40)), v=list(range(40))), ("k", "v", "k"))
    sql = "select k % 4 g, sum(v) s from t group by g order by g"
    first, plan = core.sql(sql)
    assert not plan.cached
    again, plan2 = core.sql("select k % 4 g,\n   sum(v) s   from t group by g order by g")
    assert plan2.cached and again.equals(first)
    assert "plan cache: reused" in plan2.explain_text() and "plan cache" not in plan.explain_text()
    assert not core.sql(sql.replace("% 4", "% 5"))[1].cached  # other text, other plan


def test_a_changed_schema_partitioning_or_placement_is_never_served_a_stale_plan(tmp_path: Any) -> None:
    core, tr = _core(tmp_path)
    _create(core, "t", _t(k=list(range(30)), v=list(range(30))), ("k", "v", "k"))
    sql = "select * from t where k = 3"
    assert core.sql(sql)[0].to_pylist() == [{"k": 3, "v": 3}]
    assert core.sql(sql)[1].cached
    # the same name, another schema: the new column is read
    core.drop_table("t")
    _create(core, "t", _t(k=list(range(30)), v=list(range(30)), w=[7] * 30), ("k", "v", "w"))
    got, plan = core.sql(sql)
    assert not plan.cached and got.to_pylist() == [{"k": 3, "v": 3, "w": 7}]
    assert core.sql(sql)[1].cached
    # the same schema, another partitioning: pruning and replicas follow the new one
    core.drop_table("t")
    _create(core, "t", _t(k=list(range(30)), v=list(range(30)), w=[7] * 30), ("v", "w", "k"), parts=3)
    got, plan = core.sql(sql)
    assert not plan.cached and got.to_pylist() == [{"k": 3, "v": 3, "w": 7}]
    assert plan.replicas == {"t": 2}  # the replica partitioned on k, by the new specs
    # an append: its rows are read (a stale plan would list the old extents only)
    core.append("t", _t(k=[3], v=[100], w=[8]))
    got, plan = core.sql(sql)
    assert not plan.cached and sorted(r["v"] for r in got.to_pylist()) == [3, 100]
    # an extent marked corrupt (the table's record unchanged): the plan reads around it
    assert core.sql(sql)[1].cached
    sx = core.table("t").super_extents[0]
    bad = next(e for e in sx.extents if e.id in json.dumps(plan.tasks))
    core.catalog.mark_extent("t", sx.id, bad.id, "corrupt")
    got, plan = core.sql(sql)
    assert not plan.cached and bad.id not in json.dumps(plan.tasks)
    assert sorted(r["v"] for r in got.to_pylist()) == [3, 100]
    # a node lost: the plan reads around it
    assert core.sql(sql)[1].cached
    tr.kill("n1")
    got, plan = core.sql(sql)
    assert not plan.cached and "n1" not in plan.nodes and sorted(r["v"] for r in got.to_pylist()) == [3, 100]
    # a dropped table is an error, not an old plan's answer
    core.drop_table("t")
    with pytest.raises(NotFound, match="no table .t."):
        core.sql(sql)


def test_a_plan_pruned_by_a_value_that_changes_by_itself_is_not_kept(tmp_path: Any) -> None:
    core, _ = _core(tmp_path)
    d = pa.table({"d": pa.array([0, 1], pa.int32()).cast(pa.date32()), "v": pa.array([1, 2], pa.int64())})
    core.create_table("e", d.schema, [PartitionSpec("d", "range", bounds=("2000-01-01",))] * 3)
    core.append("e", d)
    sql = "select count(*) n from e where d < current_date"
    assert core.sql(sql)[0].to_pylist() == [{"n": 2}]
    assert not core.sql(sql)[1].cached
    assert core.sql("select count(*) n from e where d < date '2001-01-01'")[0].to_pylist() == [{"n": 2}]
    assert core.sql("select count(*) n from e where d < date '2001-01-01'")[1].cached


class _Context:
    def invocation_metadata(self) -> tuple:
        return ()


def _query(servicer: Any, sql: str) -> list[Any]:
    return list(servicer.Query(pb.QueryRequest(query_json=json.dumps({"sql": sql})), _Context()))


def test_a_cached_plan_does_not_let_another_user_read_a_table(tmp_path: Any, monkeypatch: Any) -> None:
    core, _ = _core(tmp_path)
    servicer = _service.StoreServicer(core)
    for owner, name in (("alice", "a"), ("bob", "b")):
        _create(core, name, _t(k=[1, 2], v=[3, 4]), ("k", "v", "k"))
        servicer.owners.created(Caller(f"user:{owner}"), name)
    as_user = {u: Caller(f"user:{u}") for u in ("alice", "bob")}
    sql = "select sum(v) s from a"
    monkeypatch.setattr(_service, "caller", lambda ctx: as_user["alice"])
    assert _query(servicer, sql) and _query(servicer, sql)  # planned, then from the cache
    assert core.sql(sql)[1].cached
    monkeypatch.setattr(_service, "caller", lambda ctx: as_user["bob"])
    for text in (sql, "select  sum(v)  s  from  a", "select * from b where k in (select k from a)"):
        with pytest.raises(PermissionDenied, match="may not read table 'a'"):
            _query(servicer, text)
        with pytest.raises(PermissionDenied, match="may not read table 'a'"):
            servicer.Explain(pb.QueryRequest(query_json=json.dumps({"sql": text})), _Context())
    assert _query(servicer, "select sum(v) s from b")


def test_the_permission_check_reads_the_table_the_planner_reads(tmp_path: Any, monkeypatch: Any) -> None:
    """Two tables whose names differ only in case: SQL resolves ``sales`` to the first in catalog
    order (``SALES``), and the check must be of that one (it took the last, ``sales``: bob, the
    owner of ``sales``, read alice's ``SALES``)."""
    core, _ = _core(tmp_path)
    servicer = _service.StoreServicer(core)
    _create(core, "SALES", _t(k=[1], v=[1000]), ("k", "v", "k"))
    servicer.owners.created(Caller("user:alice"), "SALES")
    # A catalog written before session 42 may hold both (a new name differing only in case is
    # refused since: tests/integration/security); the check must still read the planner's table
    with monkeypatch.context() as m:
        m.setattr(type(core.catalog), "table_names", lambda self: [])
        _create(core, "sales", _t(k=[1], v=[1]), ("k", "v", "k"))
    servicer.owners.created(Caller("user:bob"), "sales")
    assert core.sql("select v from sales")[0].to_pylist() == [{"v": 1000}]  # what the planner reads
    monkeypatch.setattr(_service, "caller", lambda ctx: Caller("user:bob"))
    with pytest.raises(PermissionDenied, match="may not read table 'SALES'"):
        _query(servicer, "select v from sales")


def test_a_catalog_without_a_version_token_is_versioned_by_its_records(tmp_path: Any) -> None:
    """A catalog written before the version token existed (or by a writer that does not bump it):
    the plan is checked against the raw records themselves."""
    from microco.services.store._catalog import SUPER, VERSION

    core, _ = _core(tmp_path)
    _create(core, "t", _t(k=list(range(10)), v=list(range(10))), ("k", "v", "k"))
    core.kv.delete(VERSION)
    sql = "select sum(v) s from t"
    assert core.sql(sql)[0].to_pylist() == [{"s": 45}]
    plan = core.sql(sql)[1]
    assert plan.cached
    # a super-extent's record changed under it, without a token: an extent it reads marked corrupt
    (key, raw), *_ = core.kv.get_prefix(SUPER + "t/")
    rec = json.loads(raw)
    first = next(e for e in rec["extents"] if e["id"] in json.dumps(plan.tasks))
    first["state"] = "corrupt"
    core.kv.put(key, json.dumps(rec).encode())
    got, plan = core.sql(sql)
    assert not plan.cached and got.to_pylist() == [{"s": 45}] and first["id"] not in json.dumps(plan.tasks)


def test_a_kept_parse_is_handed_out_as_a_copy() -> None:
    from microco.services.store._sql import parse, parsed

    sql = "select a, sum(b) s from t where c = 1 group by a"
    first = parsed(sql)
    first.set("where", None)  # what a caller does to its tree is not seen by the next
    assert parsed("select a,  sum(b) s from t where c = 1 group by a") == parse(sql)
