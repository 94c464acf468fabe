"""Extents are compressed (zstd by default), extents written before compression stay readable, and
the node's cache of open extents is bounded in bytes of decompressed batches, not only in count."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore
from microco.services.store._layout import COMPRESSION_META, open_extent
from microco.services.store._nodestore import NodeStore

N = 20_000


def _rows(start: int = 0, n: int = N) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "k": k,
            "flag": pa.array(np.where(k % 3 == 0, "RETURNED", "NONE")),
            "price": (k % 1000).astype(np.float64) * 1.25,
        }
    )


def _buckets(n: int, pieces: int) -> list[list[int]]:
    size = n // pieces
    return [[p, 0, size if p < pieces - 1 else n - size * (pieces - 1)] for p in range(pieces)]


def test_extents_are_compressed_by_default_and_old_uncompressed_ones_stay_readable(tmp_path):
    data = _rows()
    old = NodeStore("n0", tmp_path, compression="none")  # a node as it wrote before compression
    plain = old.put_extent("t", "old", data, _buckets(N, 4))
    new = NodeStore("n0", tmp_path)  # the same data directory after the upgrade
    packed = new.put_extent("t", "new", data, _buckets(N, 4))
    assert packed["bytes"] < plain["bytes"] / 2
    assert (open_extent(new.path("t", "new")).schema.metadata or {}).get(COMPRESSION_META) is None
    assert open_extent(new.path("t", "new")).codec == "zstd"
    # bucket sizes (recovery's accounting) are the uncompressed bytes either way
    assert [b[3] for b in packed["buckets"]] == [b[3] for b in plain["buckets"]]
    for eid, res in (("old", plain), ("new", packed)):
        assert new.read("t", eid, checksum=res["checksum"]).equals(data)
        assert new.read("t", eid, bucket=[0, 2], columns=["k"], checksum=res["checksum"]).column(
            "k"
        ).to_pylist() == list(range(2 * (N // 4), 3 * (N // 4)))
    assert (
        NodeStore("n1", tmp_path / "lz4", compression="lz4").put_extent("t", "e", data, _buckets(N, 2))[
            "bytes"
        ]
        < plain["bytes"]
    )
    with pytest.raises(ValueError, match="unknown extent compression"):
        NodeStore("n2", tmp_path / "x", compression="gzip9")


def test_open_extents_are_bounded_in_decompressed_bytes(tmp_path):
    data = _rows()
    whole = data.nbytes
    s = NodeStore("n0", tmp_path, cache_bytes=int(whole * 2.5))
    sums = {f"e{i}": s.put_extent("t", f"e{i}", data, _buckets(N, 4))["checksum"] for i in range(5)}
    # one bucket of a compressed extent decompresses only that bucket's batches
    s.read("t", "e0", bucket=[0, 1], checksum=sums["e0"])
    assert 0 < s.resident_bytes <= whole / 2
    for eid, c in sums.items():
        assert s.read("t", eid, checksum=c).equals(data)
        assert s.resident_bytes <= s.cache_bytes
    assert len(s._open) == 2  # the least recently used were evicted: two whole extents fit
    assert set(s._open) == {str(s.path("t", "e3")), str(s.path("t", "e4"))}
    # an extent bigger than the whole cache is served, and not kept
    tiny = NodeStore("n1", tmp_path / "tiny", cache_bytes=1000)
    c = tiny.put_extent("t", "big", data, _buckets(N, 4))["checksum"]
    assert tiny.read("t", "big", checksum=c).equals(data)
    assert tiny.resident_bytes == 0 and not tiny._open
    # deleting or dropping releases what the cache counted
    s.delete("t", "e4")
    s.drop_table("t")
    assert s.resident_bytes == 0 and not s._open
    # the count bound still applies to extents that hold no decompressed memory (old, mapped)
    plain = NodeStore("n2", tmp_path / "plain", compression="none", open_extents=2)
    for i in range(3):
        c = plain.put_extent("t", f"e{i}", data, _buckets(N, 2))["checksum"]
        plain.read("t", f"e{i}", checksum=c)
    assert len(plain._open) == 2 and plain.resident_bytes == 0


def test_a_store_stores_compressed_extents_and_recovers_them(tmp_path):
    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    specs = [
        PartitionSpec("k", "hash", 4),
        PartitionSpec("flag", "hash", 2),
        PartitionSpec("price", "hash", 2),
    ]
    data = _rows()
    core.create_table("t", data.schema, specs)
    core.append("t", data)
    info = core.table("t")
    assert info.stored_bytes < 3 * data.nbytes / 2  # three copies, compressed, on the nodes' disks
    assert info.stored_bytes == sum(s.stats()["bytes"] for s in tr.stores.values())
    # the catalog's `bytes` (the planner's estimates) stay the Arrow data's size
    assert info.bytes == sum(e.bytes for e in info.extents()) == pytest.approx(3 * data.nbytes, rel=0.05)
    tr.kill("n0")
    rep = core.recover()
    assert rep["rebuilt"] > 0 and core.lost_count() == 0
    # bytes read per byte lost counts uncompressed bytes at both ends
    assert rep["bytes_read_per_byte_lost"] == pytest.approx(1.0, abs=0.05)


def test_storage_report_compares_the_catalog_bytes_with_three_parquet_copies(tmp_path):
    import pyarrow.parquet as pq

    from microco.clients.store import storage_report

    pq.write_table(_rows(), tmp_path / "t.parquet")
    size = (tmp_path / "t.parquet").stat().st_size
    rep = storage_report(
        [{"name": "t", "bytes": 3 * size}, {"name": "u", "bytes": 7}], {"t": tmp_path / "t.parquet"}
    )
    assert rep == {"bytes": 3 * size, "parquet3_bytes": 3 * size, "ratio": 1.0}
    with pytest.raises(ValueError, match="no such tables"):
        storage_report([], {"t": tmp_path / "t.parquet"})


def test_a_compressed_extent_decompresses_only_the_columns_read(tmp_path):
    data = _rows()
    s = NodeStore("n0", tmp_path)
    c = s.put_extent("t", "e", data, _buckets(N, 4))["checksum"]
    assert s.read("t", "e", columns=["price", "k"], checksum=c).equals(data.select(["price", "k"]))
    assert s.resident_bytes == data.column("k").nbytes + data.column("price").nbytes
    s.read("t", "e", columns=["k"], checksum=c)  # already decompressed: nothing more held
    assert s.resident_bytes == data.column("k").nbytes + data.column("price").nbytes
    assert s.read("t", "e", checksum=c).equals(data)  # the rest on demand, the same rows
    assert s.resident_bytes == data.nbytes
    with pytest.raises(KeyError):
        s.read("t", "e", columns=["nope"], checksum=c)
    # no column (count(*)) still has every row, of the whole extent and of a bucket
    fresh = NodeStore("n1", tmp_path)
    assert fresh.read("t", "e", columns=[], checksum=c).num_rows == N
    assert fresh.read("t", "e", bucket=[0, 1], columns=[], checksum=c).num_rows == N // 4
    assert fresh.resident_bytes == 0
