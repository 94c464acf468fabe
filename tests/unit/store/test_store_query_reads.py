"""What a SQL query reads from etcd before it runs (the coordinator's per-query fixed cost, found
by profiling: each read is a round trip). A query over k tables reads the table records once and
each table's super-extents once; the nodes seen are read again only when a node changes; a query
whose plan is cached reads the catalog's version token only."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._partition import PartitionSpec

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)]


class CountingKV(MemoryKV):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return super().get(key)

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        self.reads.append(prefix + "*")
        return super().get_prefix(prefix)


def test_a_sql_query_reads_each_table_once_and_the_nodes_seen_only_when_they_change(tmp_path: Any) -> None:
    kv = CountingKV()
    tr = LocalTransport(str(tmp_path), NODES)
    core = StoreCore(kv, tr, sql_plan_cache=0)  # every query planned anew
    a = pa.table({"k": pa.array(range(100), pa.int64()), "v": pa.array(range(100), pa.int64())})
    b = pa.table({"bk": pa.array(range(50), pa.int64()), "w": pa.array(["x"] * 50)})
    core.create_table("a", a.schema, [PartitionSpec(c, "hash", 2) for c in ("k", "v", "k")])
    core.create_table("b", b.schema, [PartitionSpec(c, "hash", 2) for c in ("bk", "w", "bk")])
    core.append("a", a)
    core.append("b", b)
    sql = "select w, sum(v) s from a join b on k = bk group by w"
    want = core.sql(sql)[0]
    kv.reads.clear()
    got, _ = core.sql(sql)
    assert got.equals(want) and got.column("s").to_pylist() == [sum(range(50))]
    assert sorted(kv.reads) == sorted(
        [
            "/microco/store/catalog-version",
            "/microco/store/tables/*",
            "/microco/store/superextents/a/*",
            "/microco/store/superextents/b/*",
        ]
    )
    # with the plan cache, a repeated query reads the catalog's version token only
    cached = StoreCore(kv, tr)
    cached.sql(sql)
    kv.reads.clear()
    got, plan = cached.sql(sql)
    assert plan.cached and got.equals(want) and kv.reads == ["/microco/store/catalog-version"]
    # a node that moved (a new address) is recorded again
    tr.infos["n1"] = NodeInfo("n1", "rack1", address="elsewhere")
    kv.reads.clear()
    core.live_nodes()
    assert kv.reads == ["/microco/store/nodes/*"]
    assert kv.get_json("/microco/store/nodes/n1") == {"domain": "rack1", "address": "elsewhere"}


def test_a_json_model_query_reads_its_table_once_and_a_cached_plan_the_version_only(tmp_path: Any) -> None:
    from microco.services.store._query import Agg, Query

    kv = CountingKV()
    tr = LocalTransport(str(tmp_path), NODES)
    a = pa.table({"k": pa.array(range(100), pa.int64()), "v": pa.array(range(100), pa.int64())})
    core = StoreCore(kv, tr, model_plan_cache=0)  # every query planned anew
    core.create_table("a", a.schema, [PartitionSpec(c, "hash", 2) for c in ("k", "v", "k")])
    core.append("a", a)
    q = Query("a", group_by=("k",), aggs=(Agg("sum", "v", "s"),))
    want = core.query(q)[0]
    kv.reads.clear()
    core.query(q)
    assert sorted(kv.reads) == ["/microco/store/superextents/a/*", "/microco/store/tables/a"]
    cached = StoreCore(kv, tr)
    cached.query(q)
    kv.reads.clear()
    got, plan = cached.query(q)
    assert plan.cached and got.sort_by("k").equals(want.sort_by("k"))
    assert kv.reads == ["/microco/store/catalog-version"]
