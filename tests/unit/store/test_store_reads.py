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
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(InvalidArgument, match="only Parquet"):
        _client.iter_file(tmp_path / "t.json")


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


def _disk_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_cold_read_of_a_compressed_extents_columns_reads_only_them_from_disk(tmp_path, codec):
    """A compressed extent was memory-mapped: reading a few of its columns faulted in their
    buffers' pages, which lie between every other column's in each sub-bucket's batch, and the
    kernel's read-ahead around them, so a cold query read the whole file from disk (and so did
    positioned reads with the kernel's read-ahead on: 97% of this file)."""
    import os

    import pyarrow.parquet as pq

    from microco.benchmarks.store_tpch import generate
    from microco.services.store import to_plain_strings
    from microco.services.store._layout import open_extent, write_extent

    data = generate(0.01, tmp_path / "tpch", tables=("lineitem",))
    t = to_plain_strings(pq.read_table(data / "lineitem.parquet"))
    per = t.num_rows // 16  # 16 sub-buckets of ~3,760 rows: buffers of a few kB, as at scale
    t = t.slice(0, per * 16)
    path = tmp_path / "e.arrow"
    write_extent(path, t, [[0, k, per] for k in range(16)], codec)
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache: cold
    finally:
        os.close(fd)
    q6 = ["l_shipdate", "l_discount", "l_quantity", "l_extendedprice"]  # TPC-H Q6's columns
    before = _disk_read_bytes()
    got, _ = open_extent(path).select(None, q6)
    read = _disk_read_bytes() - before
    assert got.equals(t.select(q6))
    if read == 0:
        pytest.skip("the file system reports no disk reads here (page cache not evicted)")
    # four of sixteen columns: 25% of the file measured; mapped, or read with the kernel's
    # read-ahead, 97-100%
    assert read < size / 2, (read, size)
