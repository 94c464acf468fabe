"""Results stream through the coordinator: the fragments' outputs go into DuckDB batch by batch
(within its memory limit, spilling beyond), a stream that breaks half-way is a node failure the
query retries, and the Query RPC serialises its result as it sends it, decoded as it arrives.
(At scale factor 10 a gather plan held every fragment's output whole: ~6 GB in the coordinator.)"""

from __future__ import annotations

import io
import types

import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import StoreClient
from microco.clients.store._client import PiecesReader
from microco.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore, _sql
from microco.services.store._service import StoreServicer


@pytest.fixture
def spill(tmp_path):
    yield tmp_path / "spill"
    _sql.configure()  # DuckDB's defaults again for the other tests


def _batches(n, rows, seed, col):
    """``n`` batches made as they are consumed (the stream is never a table)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield pa.record_batch({"k": np.arange(i * rows, (i + 1) * rows), col: rng.integers(0, 100, rows)})


def test_the_merge_runs_in_a_bounded_duckdb(spill):
    # 1M rows x 16 bytes streamed in: the table spills past the 16 MiB bound; a plain aggregate
    # over it is exact, a list of all its keys (which cannot spill) is a clear error naming the flag
    _sql.configure(16, spill)
    con = _sql.duck()
    assert con.sql("select current_setting('memory_limit')").fetchall() == [("16.0 MiB",)]
    con.close()
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    plan = _sql.SqlPlan("gather", [], "select count(*) n, sum(v) s from a", ["a"])
    v = sum(int(b["v"].to_numpy().sum()) for b in _batches(4, 250_000, 1, "v"))
    assert _sql.finish_sql_streams(plan, [(schema, _batches(4, 250_000, 1, "v"))]).to_pylist() == [
        {"n": 1_000_000, "s": v}
    ]
    plan = _sql.SqlPlan("gather", [], "select len(list(k)) from a", ["a"])
    with pytest.raises(ResourceExhausted, match="--sql-memory-mb"):
        _sql.finish_sql_streams(plan, [(schema, _batches(4, 250_000, 1, "v"))])
    with pytest.raises(InvalidArgument, match="below 16 MiB"):
        _sql.configure(8, spill)


def test_several_streams_per_table_and_empty_ones():
    plan = _sql.SqlPlan(
        "gather", [], "select (select count(*) from e) e, count(*) t, sum(x) x from t", ["e", "t", "t"]
    )
    x = pa.schema([("x", pa.int64())])
    streams = [
        (x, iter([])),  # a fragment with no rows
        (x, iter([pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3]})])),
        (x.with_metadata({"microco.timings": "{}"}), iter([pa.record_batch({"x": [4]})])),
    ]
    assert _sql.finish_sql_streams(plan, streams).to_pylist() == [{"e": 0, "t": 4, "x": 10}]


class _BreakingTransport(LocalTransport):
    """Every node's first result stream breaks after its first batch (a node lost mid-stream)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.broken = []

    def run_task_stream(self, node, task):
        schema, batches = super().run_task_stream(node, task)
        if self.broken:
            return schema, batches

        def breaking():
            yield from [next(batches, pa.record_batch({c: [] for c in schema.names}, schema=schema))]
            self.broken.append(node.name)
            self.kill(node.name)
            raise Unavailable(f"node {node.name}: connection lost")

        return schema, breaking()


def test_a_stream_broken_half_way_retries_the_query_without_the_node(tmp_path, monkeypatch):
    monkeypatch.setattr(_sql, "STREAM_MERGE_BYTES", 0)  # every gather streams (big ones do)
    tr = _BreakingTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr, super_extent_rows=2000, recovery_rate_bytes=0)
    n = np.arange(4000)
    t = pa.table(
        {"k": pa.array(n, pa.int64()), "v": pa.array(n % 97, pa.int64()), "g": pa.array(n % 13, pa.int64())}
    )
    core.create_table(
        "t",
        t.schema,
        [PartitionSpec("k", "hash", 4), PartitionSpec("v", "hash", 4), PartitionSpec("g", "hash", 2)],
    )
    core.append("t", t)
    # a subquery: t's rows are gathered (every fragment's rows stream into the coordinator's
    # merge), the uncorrelated subquery a sub-plan of its own (staged: the rest gathers g, the
    # whole query would gather v and g)
    got, plan = core.sql("select count(*) n from t where g > (select avg(v) / 10 from t)")
    assert plan.kind == "staged" and plan.streams_merge and len(tr.broken) == 1
    assert "streamed into DuckDB" in plan.explain_text()
    assert got.to_pylist() == [{"n": int((t["g"].to_numpy() > t["v"].to_numpy().mean() / 10).sum())}]


def test_small_gathers_are_held_as_arrow_big_ones_streamed(tmp_path, monkeypatch):
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr, super_extent_rows=5000, recovery_rate_bytes=0)
    n = np.arange(5000)
    t = pa.table(
        {"k": pa.array(n, pa.int64()), "v": pa.array(n % 7, pa.int64()), "g": pa.array(n % 3, pa.int64())}
    )
    core.create_table(
        "t",
        t.schema,
        [PartitionSpec("k", "hash", 4), PartitionSpec("v", "hash", 4), PartitionSpec("g", "hash", 2)],
    )
    core.append("t", t)
    sql = "select count(*) n from t where v > (select avg(v) from t)"
    small = core.explain_sql(sql)
    assert small.gathered_bytes > 0 and not small.streams_merge and "held as Arrow" in small.explain_text()
    want, _ = core.sql(sql)
    monkeypatch.setattr(_sql, "STREAM_MERGE_BYTES", small.gathered_bytes - 1)
    assert core.explain_sql("/* anew */ " + sql).streams_merge
    got, plan = core.sql("/* anew */ " + sql)
    assert plan.streams_merge and got.equals(want)
    # the threshold is a quarter of the SQL memory bound
    try:
        _sql.configure(400)
        assert _sql.STREAM_MERGE_BYTES == 100 << 20
    finally:
        _sql.configure()


def test_query_results_are_sent_and_read_in_pieces(monkeypatch):
    monkeypatch.setattr("microco.clients.store._client.CHUNK", 4096)  # pieces of 4 kB
    table = pa.table({"k": pa.array(range(1200), pa.int64())})  # 9.6 kB: three pieces
    plan = types.SimpleNamespace(
        kind="gather", explain_text=lambda: "plan: x", replicas={"t": 0}, moved_bytes=7
    )
    core = types.SimpleNamespace(sql=lambda sql, gone=None: (table, plan), kv=None)
    servicer = StoreServicer(core)
    servicer._check_read = lambda *a: None
    request = types.SimpleNamespace(query_json='{"sql": "select k from t"}')
    msgs = list(servicer.Query(request, None))
    assert len(msgs) == 3 and all(len(m.arrow_ipc) <= 4096 for m in msgs)
    assert msgs[0].plan_kind == "gather" and [m.moved_bytes for m in msgs] == [0, 0, 7]
    back = pa.ipc.open_stream(io.BufferedReader(PiecesReader(m.arrow_ipc for m in msgs))).read_all()
    assert back.equals(table)
    # the client decodes them as they arrive, with the plan of the first and the last's bytes moved
    client = StoreClient.__new__(StoreClient)
    client.default_timeout = 10
    client._stub = types.SimpleNamespace(Query=lambda req, timeout: iter(msgs))
    assert client.sql("select k from t").equals(table)
    assert client.last_plan == {
        "kind": "gather",
        "explain": "plan: x",
        "replicas": {"t": 0},
        "moved_bytes": 7,
    }
