"""A node's Acero plans are fed a read extent as one batch (issue 19, session 37; docs/store.md,
"A node's aggregation fed whole extents"): an extent is one record batch per sub-bucket, and
Acero's aggregation and hash join pay per batch they are given. Behaviour, never timings."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from microco.services.store import _exec


def _extent(n: int, start: int = 0, buckets: int = 64) -> pa.Table:
    """Rows cut into ``buckets`` batches, as an extent's sub-buckets are (some empty)."""
    t = pa.table(
        {
            "k": pa.array([(start + i) % 97 if i % 11 else None for i in range(n)], pa.int64()),
            "v": pa.array([float(i % 13) for i in range(n)], pa.float64()),
            "s": pa.array([f"s{(start + i) % 5}" for i in range(n)], pa.string()),
        }
    )
    size = max(1, n // buckets)
    batches = [b for off in range(0, n, size) for b in t.slice(off, size).to_batches()]
    empty = t.schema.empty_table().to_batches() or [pa.RecordBatch.from_pylist([], schema=t.schema)]
    return pa.Table.from_batches(batches[:3] + empty + batches[3:], schema=t.schema)


def test_each_source_table_is_one_batch() -> None:
    tables = [_extent(3000), _extent(2000, 7), _extent(0)]
    assert all(t.to_batches() and len(t.to_batches()) > 1 for t in tables[:2])
    got = list(_exec._source_batches(_exec.peeked(iter(tables))))
    # one batch per non-empty table, in order, nothing lost, the stream's schema
    assert [b.num_rows for b in got] == [3000, 2000]
    assert pa.Table.from_batches(got).equals(pa.concat_tables(tables).combine_chunks())


def test_a_large_table_keeps_its_batches(monkeypatch) -> None:
    # above the bound a table is not copied whole: its batches stay as ``compact`` leaves them
    monkeypatch.setattr(_exec, "COMPACT_MAX_BYTES", 1000)
    t = _extent(3000)
    got = list(_exec._source_batches(_exec.peeked(iter([t]))))
    assert len(got) == len([b for b in t.to_batches() if b.num_rows]) > 1
    assert pa.Table.from_batches(got).equals(t.combine_chunks())


def test_aggregation_and_join_answer_as_before() -> None:
    tables = [_extent(3000), _extent(2000, 7)]
    whole = pa.concat_tables(tables)
    post = {"agg": {"keys": ["k"], "aggs": [["sum", "v", "sv"], ["count", "*", "n"], ["max", "s", "ms"]]}}
    got = _exec.stream_post(_exec.peeked(iter(tables)), post).sort_by("k")
    want = whole.group_by("k").aggregate([("v", "sum"), ([], "count_all"), ("s", "max")]).sort_by("k")
    assert got.column("k").equals(want.column("k"))
    assert got.column("sv").equals(want.column("v_sum"))
    assert got.column("n").equals(want.column("count_all"))
    assert got.column("ms").equals(want.column("s_max"))
    right = pa.table({"k": pa.array(range(0, 97, 2), pa.int64()), "w": pa.array(range(49), pa.int64())})
    j = {"left_on": "k", "right_on": "k"}
    joined = _exec.join_post(_exec.peeked(iter(tables)), _exec.peeked(iter([right])), j, None, "R")
    expect = whole.join(right, "k", join_type="inner")
    assert joined.num_rows == expect.num_rows
    assert pc.sum(joined.column("w")).as_py() == pc.sum(expect.column("w")).as_py()
