"""A node keeps extents open between reads, and never serves a stale one: a rewritten, deleted or
corrupted file is re-opened or refused. The SQL planner's small pieces found by profiling: the
star of EXISTS reads no column, constants are folded once (but not time-dependent ones), and a
co-partitioned plan runs one fragment per node."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot

from microco.common.errors import InvalidArgument, NotFound
from microco.services.store import _sql
from microco.services.store._layout import read_extent
from microco.services.store._nodestore import CorruptExtent, NodeStore


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(start, start + n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


def test_an_open_extent_is_reused_until_its_file_changes(tmp_path):
    s = NodeStore("n0", tmp_path)
    res = s.put_extent("t", "e1", _rows(0, 10), [[0, 0, 4], [1, 0, 6]])
    assert s.read("t", "e1", checksum=res["checksum"])["k"].to_pylist() == list(range(10))
    assert s.read("t", "e1", bucket=[0, 1], columns=["k"], checksum=res["checksum"]).to_pydict() == {
        "k": list(range(4, 10))
    }
    assert len(s._open) == 1
    first = s._open[str(s.path("t", "e1"))][2]
    s.read("t", "e1", checksum=res["checksum"])
    assert s._open[str(s.path("t", "e1"))][2] is first  # not re-opened
    # the same extent id rewritten (a new file version): the new rows, never the cached ones
    res2 = s.put_extent("t", "e1", _rows(100, 3), [[0, 0, 3]])
    assert s.read("t", "e1", checksum=res2["checksum"])["k"].to_pylist() == [100, 101, 102]
    # bytes read count the selected batches, as a fresh read of the file does
    before = s.bytes_read
    s.read("t", "e1", checksum=res2["checksum"])
    assert s.bytes_read - before == read_extent(s.path("t", "e1"))[1]
    # deleted: gone from the cache too
    s.delete("t", "e1")
    assert not s._open
    with pytest.raises(NotFound):
        s.read("t", "e1", checksum=res2["checksum"])


def test_a_corrupt_extent_is_refused_and_forgotten(tmp_path):
    s = NodeStore("n0", tmp_path)
    res = s.put_extent("t", "e1", _rows(0, 50), [[0, 0, 50]])
    s.read("t", "e1", checksum=res["checksum"])
    p = s.path("t", "e1")
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))  # a new mtime: the cached verification no longer applies
    with pytest.raises(CorruptExtent):
        s.read("t", "e1", checksum=res["checksum"])
    assert str(p) not in s._open and str(p) not in s._verified


def test_the_star_of_exists_and_count_reads_no_column():
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.string())])
    tree = sqlglot.parse_one(
        "select a, count(*) from t where exists (select * from u where u.b = t.a) group by a", read="duckdb"
    )
    assert _sql._needed_columns(tree, schema) == ["a", "b"]
    star = sqlglot.parse_one("select * from t", read="duckdb")
    assert _sql._needed_columns(star, schema) == ["a", "b", "c"]


def test_constants_are_folded_once_but_not_time_dependent_ones():
    date = sqlglot.parse_one("date '1994-01-01' + interval '3' month", read="duckdb")
    _sql._folded.cache_clear()
    assert _sql._constant(date) == "1994-04-01"
    assert _sql._constant(date) == "1994-04-01"
    assert _sql._folded.cache_info().hits == 1
    today = sqlglot.parse_one("current_date", read="duckdb")
    _sql._constant(today)
    _sql._constant(today)
    assert _sql._folded.cache_info().currsize == 1  # current_date was not memoised


def test_a_file_is_streamed_in_ipc_pieces_that_read_back_whole(tmp_path, monkeypatch):
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from microco.clients.store import _client

    table = pa.table({"k": pa.array(range(5000), pa.int64()), "s": [f"row {i}" for i in range(5000)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1000)
    pcsv.write_csv(table, tmp_path / "t.csv")
    monkeypatch.setattr(_client, "CHUNK", 4096)  # many pieces
    for name in ("t.parquet", "t.csv"):
        schema, batches = _client.iter_file(tmp_path / name, batch_rows=700, csv_block_bytes=8192)
        batches = list(batches)
        assert len(batches) > 1 and schema.names == ["k", "s"]
        pieces = list(_client.ipc_chunks(schema, iter(batches)))
        assert len(pieces) > 2 and all(len(p) <= 4096 for p in pieces)
        back = pa.ipc.open_stream(pa.py_buffer(b"".join(pieces))).read_all()
        assert back.column("k").to_pylist() == list(range(5000))
    empty = list(_client.ipc_chunks(table.schema, iter([])))
    assert len(empty) == 1 and pa.ipc.open_stream(pa.py_buffer(empty[0])).read_all().num_rows == 0
    (tmp_path / "t.xlsx").write_text("{}")
    with pytest.raises(InvalidArgument, match="only Parquet"):
        _client.iter_file(tmp_path / "t.xlsx")


def test_a_whole_extents_columns_are_assembled_once(tmp_path):
    """A query's read of a whole extent built a record batch per sub-bucket every time (~64 an
    extent; a fifth of a small matched fragment's time on its node). The table of a column set is
    now kept with the open extent: read again, it is the same table, built from no batch; a
    bucket read and another column set are their own; a rewritten file is read anew."""
    s = NodeStore("n0", tmp_path)
    res = s.put_extent("t", "e1", _rows(0, 10), [[0, 0, 4], [1, 0, 6]])
    first = s.read("t", "e1", columns=["v", "k"], checksum=res["checksum"])
    ext = s._open[str(s.path("t", "e1"))][2]
    built = []
    real = ext._batch
    ext._batch = lambda k, fields: built.append(k) or real(k, fields)
    again = s.read("t", "e1", columns=["v", "k"], checksum=res["checksum"])
    assert again is first and built == []
    assert again.column_names == ["v", "k"] and again["k"].to_pylist() == list(range(10))
    assert s.read("t", "e1", columns=["k"], checksum=res["checksum"])["k"].to_pylist() == list(range(10))
    assert s.read("t", "e1", bucket=[0, 1], columns=["k"], checksum=res["checksum"])["k"].to_pylist() == list(
        range(4, 10)
    )
    assert built == [0, 1, 1]  # the new column set's two batches, the bucket's one
    res2 = s.put_extent("t", "e1", _rows(100, 3), [[0, 0, 3]])
    assert s.read("t", "e1", columns=["v", "k"], checksum=res2["checksum"])["k"].to_pylist() == [
        100,
        101,
        102,
    ]
