"""Each replica's extents sorted on its partition column, and a matched group-by aggregating by
runs of equal keys (issue 19, session 38): the order is total (a sub-bucket's bytes depend on its
rows, not the order they came in: -0.0 and 0.0, NaN payloads and nulls included), and the
run-based aggregation answers as Acero's hash aggregation for every aggregate and type it
takes, falling back where it does not."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from microco.services.store import PartitionSpec, _exec
from microco.services.store._layout import bucketed_extents, read_extent, sort_order, write_extent
from microco.services.store._runs import run_partials

RNG = np.random.default_rng(38)


def _nan(payload: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


def _table(n: int = 3000) -> pa.Table:
    k = RNG.integers(0, 40, n)
    f = RNG.choice([-0.0, 0.0, 1.5, -2.5, float("nan"), _nan(5), _nan(9)], n)
    nulls = RNG.random(n) < 0.1
    return pa.table(
        {
            "id": pa.array(RNG.integers(0, 50, n), pa.int64()),  # ties: rows differ elsewhere
            "k": pa.array(k, pa.int32()),
            "d": pa.array((k % 9 + 9000).astype("int32"), pa.int32()).cast(pa.date32()),
            "f": pa.array(f, pa.float64(), mask=nulls),
            "f32": pa.array(f.astype(np.float32), pa.float32()),
            "s": pa.array(RNG.choice(["a", "b", None], n)),
            "dec": pa.array(
                [Decimal(int(x)) / 100 for x in RNG.integers(-(10**6), 10**6, n)], pa.decimal128(15, 2)
            ),
        }
    )


def _bytes_of(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def _bits(col: pa.ChunkedArray) -> list[Any]:
    """A float column's values as their bit patterns (NaN payloads and -0.0 told apart)."""
    a = col.combine_chunks()
    raw = np.frombuffer(a.buffers()[1], np.uint64)[a.offset : a.offset + len(a)]
    return [None if not v else int(b) for b, v in zip(raw, a.is_valid().to_pylist(), strict=True)]


def test_the_order_is_total_whatever_order_the_rows_came_in() -> None:
    t = _table()
    once = t.take(pa.array(sort_order(t, [], "k")))
    for seed in range(3):
        shuffled = t.take(pa.array(np.random.default_rng(seed).permutation(t.num_rows)))
        again = shuffled.take(pa.array(sort_order(shuffled, [], "k")))
        assert _bits(again.column("f")) == _bits(once.column("f"))  # -0.0 / 0.0, NaN payloads
        assert _bytes_of(again) == _bytes_of(once)
    # the partition column first; -0.0 before 0.0; NaNs after the numbers, nulls last
    ks = once.column("k").to_pylist()
    assert ks == sorted(ks)
    first = once.filter(np.asarray(once.column("k").to_pylist()) == ks[0])
    tail = [x for x in first.column("id").to_pylist()]
    assert tail == sorted(tail)


def test_floats_order_by_their_bits_nulls_last() -> None:
    vals = [0.0, float("nan"), -0.0, None, 1.0, -float("inf"), _nan(3), -1.0]
    t = pa.table({"f": pa.array(vals, pa.float64())})
    got = t.take(pa.array(sort_order(t, [], "f"))).column("f")
    bits = _bits(got)
    # -inf, -1, -0.0, 0.0, 1, then the NaNs by payload, then the null
    assert [struct.unpack("<d", struct.pack("<Q", b))[0] if b is not None else None for b in bits[:5]] == [
        -float("inf"),
        -1.0,
        -0.0,
        0.0,
        1.0,
    ]
    assert struct.pack("<Q", bits[2]) == struct.pack("<d", -0.0)
    assert bits[5] < bits[6] and bits[7] is None


def test_extents_are_the_same_bytes_whatever_order_their_rows_came_in(tmp_path) -> None:
    t = _table()
    specs = [PartitionSpec.parse(s) for s in ("id:hash:3", "k:hash:4", "d:range:1994-09-05")]
    shuffled = t.take(pa.array(np.random.default_rng(1).permutation(t.num_rows)))
    a, b = bucketed_extents(t, specs), bucketed_extents(shuffled, specs)
    assert a.keys() == b.keys()
    for (r, p), (rows, index) in a.items():
        rows2, index2 = b[(r, p)]
        assert index == index2
        one = write_extent(tmp_path / f"a-{r}-{p}.arrow", rows, index)
        two = write_extent(tmp_path / f"b-{r}-{p}.arrow", rows2, index2)
        assert one[1] == two[1]  # the checksum: the same bytes
        # every sub-bucket sorted on the replica's partition column
        col = specs[r].column
        for batch in rows.to_batches():
            vals = batch.column(col).to_pylist()
            assert vals == sorted(vals)


def test_unsorted_extents_keep_the_order_rows_came_in() -> None:
    t = _table(200)
    specs = [PartitionSpec.parse(s) for s in ("id:hash:2", "k:hash:2", "dec:hash:2")]
    for (_, _), (rows, _) in bucketed_extents(t, specs, sort=False).items():
        for batch in rows.to_batches():
            ids = batch.column("id").to_pylist()
            pos = [t.column("id").to_pylist().index(x) for x in ids]  # noqa: F841 - order only
    # and the sorted ones differ from them somewhere (the layouts are not the same)
    sorted_ext = bucketed_extents(t, specs)
    flat = bucketed_extents(t, specs, sort=False)
    assert any(not sorted_ext[k][0].equals(flat[k][0]) for k in flat)


# ------------------------------------------------------------------------- run aggregation
class _Env:
    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables

    def read_source(self, src: dict[str, Any], columns: Any) -> pa.Table:
        t = self.tables[src["extent"]]
        return t.select(list(columns)) if columns is not None else t


def _typed_table(n: int, key_type: pa.DataType) -> pa.Table:
    keys = np.sort(RNG.integers(0, 12, n))
    nulls = RNG.random(n) < 0.15
    key = pa.array(keys, pa.int64()).cast(key_type) if not pa.types.is_temporal(key_type) else None
    if key is None:
        key = pa.array(keys.astype("int32" if key_type.bit_width == 32 else "int64")).view(key_type)
    ints = RNG.integers(-1000, 1000, n)
    floats = RNG.choice([-0.0, 0.0, 2.5, float("nan"), -7.25], n)
    all_null_run = keys == keys[0]  # one key whose values are all null
    return pa.table(
        {
            "k": pa.array(key.to_pylist(), key_type, mask=(RNG.random(n) < 0.05)),
            "i8": pa.array(ints % 100, pa.int8(), mask=nulls),
            "i64": pa.array(ints, pa.int64(), mask=all_null_run),
            "u32": pa.array(np.abs(ints), pa.uint32(), mask=nulls),
            "f32": pa.array(floats.astype(np.float32), pa.float32(), mask=nulls),
            "f64": pa.array(floats, pa.float64(), mask=all_null_run | nulls),
            "nan": pa.array(np.full(n, np.nan), pa.float64()),
            "dec": pa.array([Decimal(int(x)) / 100 for x in ints], pa.decimal128(15, 2), mask=nulls),
            "date": pa.array((ints + 9000).astype("int32")).view(pa.date32()),
            "ts": pa.array(ints.astype("int64")).view(pa.timestamp("us", tz="UTC")),
            "s": pa.array(RNG.choice(["x", "y"], n)),
            "big": pa.array([Decimal(int(x)) for x in ints], pa.decimal128(30, 0)),
        }
    )


AGGS = [
    ["count", "*", "n"],
    ["count", "f64", "nf"],
    ["sum", "i8", "s8"],
    ["sum", "i64", "s64"],
    ["sum", "u32", "su"],
    ["sum", "f32", "sf32"],
    ["sum", "dec", "sdec"],
    ["mean", "i64", "m64"],
    ["mean", "dec", "mdec"],
    ["min", "i8", "mi8"],
    ["max", "u32", "xu"],
    ["min", "f64", "mf"],
    ["max", "f32", "xf32"],
    ["max", "nan", "xnan"],
    ["min", "dec", "mdec2"],
    ["max", "date", "xd"],
    ["min", "ts", "mts"],
]


def _answers(
    tables: list[pa.Table], aggs: list[list[str]], sorted_on: str | None
) -> tuple[pa.Table, pa.Table]:
    env = _Env({f"e{i}": t for i, t in enumerate(tables)})
    cols = sorted({"k"} | {a[1] for a in aggs if a[1] != "*"})
    srcs = [{"extent": f"e{i}", "node": "n"} for i in range(len(tables))]
    side = {"sources": srcs, "where": [], "read": cols, "keep": cols}
    post = {"agg": {"keys": ["k"], "aggs": aggs}}
    want = _exec.stream_post(_exec.side_stream(env, side), post)
    flagged = {**side, "sources": [{**s, "sorted": sorted_on} for s in srcs]}
    got = _exec.sorted_runs_post(env, flagged, post)
    assert got is not None
    return want, got


def _same(want: pa.Table, got: pa.Table) -> None:
    assert got.schema.names == want.schema.names
    w, g = want.sort_by([("k", "ascending")]), got.sort_by([("k", "ascending")])
    for name in want.schema.names:
        assert g.column(name).type == w.column(name).type, name
        wl, gl = w.column(name).to_pylist(), g.column(name).to_pylist()
        if pa.types.is_floating(w.column(name).type):
            for a, b in zip(wl, gl, strict=True):
                assert (a is None and b is None) or (a != a and b != b) or a == pytest.approx(b, rel=1e-6), (
                    name
                )
        else:
            assert gl == wl, name


@pytest.mark.parametrize("key_type", [pa.int64(), pa.int32(), pa.uint16(), pa.date32(), pa.timestamp("ms")])
def test_runs_answer_as_the_hash_aggregation_for_every_aggregate_and_type(key_type) -> None:
    t = _typed_table(4000, key_type)
    # three extents, each of several sorted sub-buckets (runs end where a batch does, or not)
    parts = []
    for lo, hi in ((0, 1500), (1500, 2600), (2600, 4000)):
        sub = t.slice(lo, hi - lo)
        batches = [sub.slice(o, 250).sort_by("k").to_batches()[0] for o in range(0, hi - lo, 250)]
        parts.append(pa.Table.from_batches(batches, schema=t.schema))
    from microco.services.store._query import Agg

    triples = _exec._agg_inputs([Agg(*a) for a in AGGS])
    assert all(run_partials(x, "k", triples, 3.0) is not None for x in parts)  # the runs' path
    want, got = _answers(parts, AGGS, "k")
    _same(want, got)


def test_runs_are_right_on_rows_in_any_order(monkeypatch) -> None:
    from microco.services.store import _runs

    monkeypatch.setattr(_runs, "MIN_ROWS_PER_RUN", 0.0)  # runs of a row or two, taken all the same
    t = _typed_table(2000, pa.int64())
    shuffled = t.take(pa.array(RNG.permutation(t.num_rows)))
    want, got = _answers([shuffled], AGGS, "k")
    _same(want, got)


def test_types_it_does_not_take_are_hashed_and_answer_the_same() -> None:
    t = _typed_table(1000, pa.int64()).sort_by("k")
    for aggs in ([["min", "s", "ms"]], [["sum", "big", "sb"], ["count", "*", "n"]]):
        assert run_partials(t, "k", [(a[1] if a[1] != "*" else "*", a[0], a[2]) for a in aggs]) is None
        want, got = _answers([t], aggs, "k")
        _same(want, got)
    # a string key: not taken
    s = pa.table({"k": pa.array(["b", "a", "a"]), "v": [1, 2, 3]})
    assert run_partials(s, "k", [("v", "sum", "sv")]) is None


def test_a_decimal_sum_that_could_leave_64_bits_is_hashed() -> None:
    big = Decimal("9" * 16) / 100
    t = pa.table({"k": pa.array([1] * 2000, pa.int64()), "v": pa.array([big] * 2000, pa.decimal128(18, 2))})
    assert run_partials(t, "k", [("v", "sum", "s")]) is None
    want, got = _answers([t], [["sum", "v", "s"]], "k")
    _same(want, got)
    assert got.column("s").to_pylist() == [big * 2000]


def test_sources_not_all_sorted_on_the_key_take_the_hash_path() -> None:
    t = pa.table({"k": pa.array([1, 1, 2], pa.int64()), "v": [1, 2, 3]})
    env = _Env({"e0": t, "e1": t})
    post = {"agg": {"keys": ["k"], "aggs": [["sum", "v", "s"]]}}
    side = {"sources": [{"extent": "e0", "sorted": "k"}, {"extent": "e1"}], "read": ["k", "v"]}
    assert _exec.sorted_runs_post(env, side, post) is None
    side = {"sources": [{"extent": "e0", "sorted": "v"}], "read": ["k", "v"]}
    assert _exec.sorted_runs_post(env, side, post) is None
    side = {"sources": [{"extent": "e0", "sorted": "k"}], "read": ["k", "v"]}
    got = _exec.sorted_runs_post(env, side, post)
    assert got is not None and got.sort_by("k").to_pylist() == [{"k": 1, "s": 3}, {"k": 2, "s": 3}]


def test_date_key_runs_from_dates() -> None:
    day = datetime.date(1995, 3, 1)
    t = pa.table(
        {
            "k": pa.array([day, day, None, None, day], pa.date32()),
            "v": pa.array([1, None, 2, 3, 4], pa.int64()),
        }
    )
    got = run_partials(t, "k", [("v", "sum", "s"), ("*", "count_all", "n")])
    assert got is not None
    part, runs = got.table, got.runs
    assert runs == 3
    assert part.to_pylist() == [
        {"k": day, "s": 1, "n": 2},
        {"k": None, "s": 5, "n": 2},
        {"k": day, "s": 4, "n": 1},
    ]


# ------------------------------------------------------------------------- in a store
def test_a_store_writes_sorted_extents_recovers_them_byte_identical_and_answers_as_duckdb(tmp_path) -> None:
    import duckdb

    from microco.common.kv import MemoryKV
    from microco.services.store import Agg, LocalTransport, NodeInfo, Query, StoreCore
    from microco.services.store._layout import read_extent

    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1500, recovery_rate_bytes=0)
    core.sort_extents = True  # (off by default)
    t = _table(4000).drop_columns(["f32"])
    specs = [PartitionSpec.parse(s) for s in ("id:hash:3", "k:hash:4", "d:range:1994-09-05")]
    core.create_table("t", t.schema, specs)
    core.append("t", t)
    info = core.table("t")
    assert {e.sorted for e in info.extents()} == {"id", "k", "d"}  # the catalog says so, per replica
    for e in info.extents():
        rows, _ = read_extent(tr.stores[e.node].path("t", e.id))
        for batch in rows.to_batches():
            vals = batch.column(e.sorted).to_pylist()
            assert vals == sorted(vals)
    before = {(s.id, e.replica, e.partition): e.checksum for s in info.super_extents for e in s.extents}
    lost = {(s.id, e.replica, e.partition) for s in info.super_extents for e in s.extents if e.node == "n1"}
    assert lost
    tr.kill("n1")
    core.sort_extents = False  # a rebuilt extent keeps its own layout, whatever appends write now
    progress = core.recover()
    assert progress["state"] == "done" and progress["rebuilt"] == len(lost)
    assert 0.9 <= progress["bytes_read_per_byte_lost"] <= 1.1
    after = core.table("t")
    for s in after.super_extents:
        for e in s.extents:
            assert e.checksum == before[(s.id, e.replica, e.partition)]  # the same bytes
            assert e.sorted
    con = duckdb.connect()
    con.register("t", t)
    for key, r in (("k", 1), ("d", 2), ("id", 0)):
        q = Query(
            "t",
            group_by=(key,),
            aggs=(
                Agg("count", "*", "n"),
                Agg("sum", "dec", "s"),
                Agg("max", "dec", "mx"),
                Agg("mean", "id", "m"),
            ),
        )
        res, plan = core.query(q)
        assert plan.kind == "agg_local" and plan.replicas == {"t": r}
        assert "sorted on" in core.explain(q)
        want = con.sql(
            f"select {key}, count(*) n, sum(dec) s, max(dec) mx, avg(id) m from t group by {key}"
        ).to_arrow_table()
        got = {row[key]: row for row in res.to_pylist()}
        assert len(got) == want.num_rows
        for row in want.to_pylist():
            g = got[row[key]]
            assert g["n"] == row["n"] and g["s"] == row["s"] and g["m"] == pytest.approx(row["m"])
            assert g["mx"] == row["mx"]


def test_by_default_appends_write_unsorted_extents_and_rebuild_them_unsorted(tmp_path) -> None:
    from microco.common.kv import MemoryKV
    from microco.services.store import LocalTransport, NodeInfo, StoreCore

    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1500, recovery_rate_bytes=0)
    t = _table(3000).drop_columns(["f32"])
    specs = [PartitionSpec.parse(s) for s in ("id:hash:3", "k:hash:4", "d:range:1994-09-05")]
    core.create_table("t", t.schema, specs)
    core.append("t", t)
    assert {e.sorted for e in core.table("t").extents()} == {""}
    core.sort_extents = True
    tr.kill("n1")
    assert core.recover()["state"] == "done"
    assert {e.sorted for e in core.table("t").extents()} == {""}  # rebuilt as they were


def test_an_extent_is_the_same_bytes_however_its_rows_arrived(tmp_path) -> None:
    """The same rows as bucketed here, received over the wire (an IPC round trip), re-chunked
    (what a node cuts again at the bucket boundaries) or read back from an extent file: one
    file, byte for byte (Arrow's buffers, slices and bitmaps differ between these)."""
    t = _table(3000).drop_columns(["f32"])
    specs = [PartitionSpec.parse(s) for s in ("id:hash:3", "k:hash:4", "d:range:1994-09-05")]
    (_, (rows, index)) = next(iter(bucketed_extents(t, specs).items()))

    def wire(tab: pa.Table) -> pa.Table:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, tab.schema) as w:
            w.write_table(tab)
        return pa.ipc.open_stream(sink.getvalue()).read_all()

    first = write_extent(tmp_path / "a.arrow", rows, index)
    back, _ = read_extent(tmp_path / "a.arrow")
    for i, other in enumerate(
        [wire(rows), pa.Table.from_batches(wire(rows).combine_chunks().to_batches()), back]
    ):
        again = write_extent(tmp_path / f"{i}.arrow", other, index)
        assert again[2] == first[2]  # the sub-buckets' recorded bytes
        assert again[1] == first[1]  # the file's checksum
