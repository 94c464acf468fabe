"""Column-major extents (layout 2): a read of some columns uses only those columns' bytes of the
file and asks the kernel to read ahead only those; extents of the batch-major layout (1, every
extent written before) still read, and both layouts give the same rows, batches and checksums."""

from __future__ import annotations

import json
import mmap
import os

import blake3
import numpy as np
import pyarrow as pa
import pytest

from microco.services.store._layout import (
    BUCKETS_META,
    COMPRESSION_META,
    extent_layout,
    open_extent,
    write_options,
)
from microco.services.store._nodestore import NodeStore

N = 12_000
BUCKETS = [[0, 0, 3000], [0, 1, 2000], [1, 0, 4000], [1, 1, 3000]]
SUBSET = ["price", "flag"]


def _rows() -> pa.Table:
    k = np.arange(N, dtype=np.int64)
    return pa.table(
        {
            "k": k,
            "flag": pa.array(np.where(k % 3 == 0, "RETURNED", "NONE")),
            "price": pa.array((k % 1000) * 1.25).cast(pa.decimal128(15, 2)),
            "day": pa.array(k % 2000, pa.int32()).cast(pa.date32()),
            "note": pa.array([f"note {i % 97}" if i % 11 else None for i in range(N)]),
        }
    )


def _old_extent(path, rows: pa.Table, codec: str) -> None:
    """An extent file as nodes wrote them before layout 2 (one Arrow IPC file of the sub-bucket
    batches, the bucket index and codec in the schema's metadata), written here with pyarrow
    alone, not with the store's writer."""
    sized, off, batches = [], 0, []
    for i, j, n in BUCKETS:
        b = rows.slice(off, n).combine_chunks().to_batches()[0]
        batches.append(b)
        sized.append([i, j, n, int(b.nbytes)])
        off += n
    meta = {BUCKETS_META: json.dumps(sized).encode()}
    if codec != "none":
        meta[COMPRESSION_META] = codec.encode()
    schema = rows.schema.with_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.ipc.new_file(str(path), schema, options=write_options(codec)) as w:
        for b in batches:
            w.write_batch(b)


def _ranges(path) -> dict[str, tuple[int, int]]:
    ext = open_extent(path)
    return {f.name: r for f, r in zip(ext.schema, ext._cols.ranges, strict=True)}


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_a_column_subset_is_read_from_those_columns_bytes_alone(tmp_path, codec):
    s = NodeStore("n0", tmp_path, compression=codec)  # the node's default layout
    data = _rows()
    res = s.put_extent("t", "e", data, BUCKETS)
    p = s.path("t", "e")
    assert extent_layout(p) == 2
    ranges = _ranges(p)
    size = p.stat().st_size
    # every column a contiguous range, none overlapping, all of them most of the file
    spans = sorted(ranges.values())
    assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert sum(n for _, n in spans) > 0.9 * size
    # every byte outside the header and the subset's ranges overwritten: the subset still reads
    # the same, whole and by bucket (so the read used no other column's bytes)
    want = data.select(SUBSET)
    raw = bytearray(p.read_bytes())
    keep = bytearray(size)
    header_end = min(o for o, _ in spans)
    keep[:header_end] = raw[:header_end]
    for c in SUBSET:
        o, n = ranges[c]
        keep[o : o + n] = raw[o : o + n]
    for i in range(header_end, size):
        if not any(ranges[c][0] <= i < ranges[c][0] + ranges[c][1] for c in SUBSET):
            keep[i] = 0xA5
    q = tmp_path / "garbled.arrow"
    q.write_bytes(bytes(keep))
    got, _ = open_extent(q).select(None, SUBSET)
    assert got.equals(want)
    assert [b.num_rows for b in got.to_batches()] == [b[2] for b in BUCKETS]  # the same batches
    bucket, _ = open_extent(q).select((1, 1), list(reversed(SUBSET)))
    assert (
        bucket.to_pydict()
        == pa.concat_tables([want.slice(3000, 2000), want.slice(9000, 3000)])
        .select(list(reversed(SUBSET)))
        .to_pydict()
    )
    # while the whole file, read from the intact extent, is the rows appended
    assert s.read("t", "e", checksum=res["checksum"]).equals(data)


def test_only_the_selected_columns_are_read_ahead(tmp_path, monkeypatch):
    """The kernel is asked to read the selected columns' ranges (all of them at once, before
    they are decoded) and nothing else: the map has no read-around of its own."""
    advised: list[tuple[int, int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, o, n, a: (advised.append((o, n, a)), real(fd, o, n, a))
    )
    madvised: list[int] = []
    real_madvise = mmap.mmap.madvise

    class Map(mmap.mmap):
        def madvise(self, option, *a):  # type: ignore[override]
            madvised.append(option)
            return real_madvise(self, option, *a)

    monkeypatch.setattr(mmap, "mmap", Map)
    s = NodeStore("n0", tmp_path)
    res = s.put_extent("t", "e", _rows(), BUCKETS)
    ranges = _ranges(s.path("t", "e"))
    advised.clear()
    s.read("t", "e", columns=["k", "day"], checksum=res["checksum"])
    assert advised == [(*ranges["k"], os.POSIX_FADV_WILLNEED), (*ranges["day"], os.POSIX_FADV_WILLNEED)]
    assert madvised and set(madvised) == {mmap.MADV_RANDOM}


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_extents_of_the_old_layout_read_as_before_and_as_the_new_one(tmp_path, codec):
    data = _rows()
    s = NodeStore("n0", tmp_path, compression=codec)
    old = s.path("t", "old")
    _old_extent(old, data, codec)
    assert extent_layout(old) == 1
    old_sum = blake3.blake3(old.read_bytes()).hexdigest()
    new = s.put_extent("t", "new", data, BUCKETS)
    assert extent_layout(s.path("t", "new")) == 2
    assert open_extent(old).codec == open_extent(s.path("t", "new")).codec == codec
    for cols in (None, SUBSET, ["note"], []):
        for bucket in (None, [0, 1], [1, 0]):
            a = s.read("t", "old", bucket, cols, checksum=old_sum)
            b = s.read("t", "new", bucket, cols, checksum=new["checksum"])
            assert a.num_rows == b.num_rows and a.equals(b)
            assert [x.num_rows for x in a.to_batches()] == [x.num_rows for x in b.to_batches()]
    assert s.read("t", "new", checksum=new["checksum"]).equals(data)
    # the scrub re-hashes either layout's file (the checksum is of the file's bytes)
    s.verify("t", "old", old_sum, force=True)
    s.verify("t", "new", new["checksum"], force=True)
    # a node told to write layout 1 (older nodes reading the same data directory) still can
    one = NodeStore("n1", tmp_path / "one", compression=codec, layout=1).put_extent("t", "e", data, BUCKETS)
    assert extent_layout(tmp_path / "one" / "tables" / "t" / "e.arrow") == 1
    assert one["buckets"] == new["buckets"]
    with pytest.raises(ValueError, match="unknown extent layout"):
        NodeStore("n2", tmp_path / "x", layout=3)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_rows_by_position_decode_only_their_batches(tmp_path, codec):
    """``take``: rows at positions of a selection, their other columns decoded from the batches
    holding them alone (what a late-materialized top-k fetches), equal to taking them from the
    whole read; a position outside it is a clear error, through the node's read too."""
    from microco.common.errors import InvalidArgument

    s = NodeStore("n0", tmp_path, compression=codec)
    data = _rows()
    s.put_extent("t", "e", data, BUCKETS)
    ext = open_extent(s.path("t", "e"))
    positions = [2, 2999, 9001]  # batches 0 and 3 of four
    got, nbytes = ext.take(None, ["note", "k", "price"], positions)
    assert got.equals(data.select(["note", "k", "price"]).take(positions))
    assert nbytes == sum(ext.sizes[k] for k in (0, 3)) < sum(ext.sizes)
    if codec != "none":  # only those batches' columns were decoded
        assert {k for k, have in enumerate(ext._columns) if have} == {0, 3}
    # positions into one bucket's selection (batches 1 and 3: rows 3000-4999 and 9000-11999)
    got, _ = ext.take((1, 1), ["k"], [0, 1999, 2000, 4999])
    assert got.column("k").to_pylist() == [3000, 4999, 9000, 11999]
    with pytest.raises(IndexError):
        ext.take(None, ["k"], [N])
    assert s.read("t", "e", columns=["k"], rows=[5, 7]).column("k").to_pylist() == [5, 7]
    with pytest.raises(InvalidArgument):
        s.read("t", "e", columns=["k"], rows=[N + 1])
    with pytest.raises(InvalidArgument):
        s.read("t", "e", columns=["k"], rows="0")
