"""A drop racing a query whose plan is cached (SQL and the JSON model's plan caches): the query
answers NotFound, never an answer from the dropped table's extents nor a "no extent" error. In
process: three nodes over a local transport; the race is made deterministic by running the query
at the exact point of the drop under test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from microco.common.errors import NotFound
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._partition import PartitionSpec
from microco.services.store._query import Query


def _core(tmp_path: Any) -> tuple[StoreCore, LocalTransport]:
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)])
    core = StoreCore(MemoryKV(), tr)
    data = pa.table({"k": pa.array(range(30), pa.int64()), "v": pa.array(range(30), pa.int64())})
    core.create_table("t", data.schema, [PartitionSpec("k", "hash", 2)] * 3)
    core.append("t", data)
    return core, tr


def _runner(core: StoreCore, how: str) -> Callable[[], Any]:
    if how == "sql":
        return lambda: core.sql("select sum(v) s from t")
    q = Query.from_json({"table": "t", "aggs": [["sum", "v", "s"]]})
    return lambda: core.query(q)


@pytest.mark.parametrize("how", ["sql", "json"])
def test_a_query_during_a_drop_is_not_found(tmp_path: Any, how: str) -> None:
    # the drop deleted the table's records, then wrote the new catalog version: a query between the
    # two found the old version and reused its cached plan, reading the dropped table's extents
    # (and, once the nodes had deleted them, failing with "no extent"). Now the records and the
    # version change in one transaction: a query sees the table and its old version, or neither.
    core, _ = _core(tmp_path)
    run = _runner(core, how)
    run()
    run()  # cached
    kv = core.catalog.kv
    seen: list[Any] = []
    orig_commit, orig_put, orig_delete = kv.commit, kv.put, kv.delete

    def query_first(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            out = fn(*a, **k)
            if not seen:  # the first catalog write of the drop is done: query now
                try:
                    seen.append(run())
                except Exception as exc:  # noqa: BLE001 - what the query answered is the finding
                    seen.append(exc)
            return out

        return wrapped

    kv.commit, kv.put, kv.delete = query_first(orig_commit), query_first(orig_put), query_first(orig_delete)
    kv.delete_prefix = query_first(kv.delete_prefix)  # type: ignore[method-assign]
    core.drop_table("t")
    assert seen and isinstance(seen[0], NotFound), seen
    with pytest.raises(NotFound):
        run()


@pytest.mark.parametrize("how", ["sql", "json"])
def test_a_query_whose_tasks_meet_a_finished_drop_is_not_found(tmp_path: Any, how: str) -> None:
    # planned (from the cache) before the drop, its tasks reach the nodes after the drop deleted
    # the extents: NotFound, not "node n1 has no extent t/..."
    core, tr = _core(tmp_path)
    run = _runner(core, how)
    run()
    run()
    dropped: list[bool] = []
    run_task = tr.run_task

    def racing(node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        if not dropped:
            dropped.append(True)
            core.drop_table("t")
        return run_task(node, task)

    tr.run_task = racing  # type: ignore[method-assign]
    with pytest.raises(NotFound, match="no table"):
        run()


def test_a_table_of_more_super_extents_than_one_transaction_takes_is_dropped_whole(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from microco.services.store import _catalog

    monkeypatch.setattr(_catalog, "TXN_DELETES", 2)
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(3)])
    core = StoreCore(MemoryKV(), tr, super_extent_rows=5)
    data = pa.table({"k": pa.array(range(30), pa.int64())})
    core.create_table("t", data.schema, [PartitionSpec("k", "hash", 2)] * 3)
    core.append("t", data)
    assert len(core.catalog.super_records("t")) == 6
    core.drop_table("t")
    assert core.catalog.super_records("t") == [] and core.catalog.table_names() == []
    core.create_table("t", data.schema, [PartitionSpec("k", "hash", 2)] * 3)
    core.append("t", data.slice(0, 7))
    assert core.sql("select count(*) n from t")[0].to_pylist() == [{"n": 7}]
