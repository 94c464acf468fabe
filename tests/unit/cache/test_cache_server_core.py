"""Chunk store on disk and the server core (temporary directories, no sockets)."""

from __future__ import annotations

import os
import stat

from microco.services.cache import CacheCore, ChunkStore, digest, file_locator


def _chunk(i: int, size: int = 100) -> tuple[str, bytes]:
    data = bytes([i]) * size
    return digest(data), data


def _flip(path: str, at: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_store_verifies_on_insert_and_on_restart(tmp_path):
    store = ChunkStore(str(tmp_path))
    d, data = _chunk(1)
    store.put(d, data)
    assert store.read(d) == data and os.path.basename(store.path(d)) == file_locator(d)
    assert stat.S_IMODE(os.stat(store.dir).st_mode) == 0o711  # not listable by others
    d2, data2 = _chunk(2)
    store.put(d2, data2)
    _flip(store.path(d2))
    again = ChunkStore(str(tmp_path))
    assert again.digests() == {d: 100} and again.dropped_on_start == 1


def test_core_rejects_bad_digest_and_catches_flipped_byte(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path)), 1000, "coordinated")
    d, data = _chunk(5)
    assert core.put(d, data[:-1] + b"x", "ds").outcome == "digest_mismatch"
    assert core.put("zz", data, "ds").outcome == "malformed_digest"
    assert core.put(d, data, "ds").outcome == "stored"
    assert core.put(d, data, "ds").outcome == "present"
    sample = data[10:20]
    reads = [(d, 10, 10, digest(sample)), (d, 0, 5, digest(b"wrong"))]
    out = list(core.read_samples(reads))
    assert out[0] == (0, sample)
    assert out[1] == (1, None)  # claims a digest the bytes don't have: not served, chunk re-checked
    # ...but the chunk itself verifies, so a client's wrong claim cannot evict others' data.
    assert core.lookup([d]) == [d] and core.counters.corrupt_dropped == 0
    _flip(core.store.path(d), at=12)
    assert list(core.read_samples([reads[0]])) == [(0, None)]
    assert core.lookup([d]) == [] and core.counters.corrupt_dropped == 1
    assert core.stats()["used_bytes"] == 0


def test_core_coordinated_eviction_and_allocation(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path)), 300, "coordinated", probe_bytes=100)
    chunks = [_chunk(i) for i in range(5)]
    core.report_progress("j1", "ds", 0, [], timings=[], dataset_bytes=500)
    core.report_progress("j2", "ds", 0, [], timings=[], dataset_bytes=500)
    for d, data in chunks[:3]:
        assert core.put(d, data, "ds").outcome == "stored"
    assert core.put(*chunks[3], "ds").outcome == "over_allocation"  # full share, nothing consumed
    core.report_progress("j1", "ds", 0, [chunks[0][0]])
    assert core.put(*chunks[3], "ds").outcome != "stored"  # j2 still needs it
    core.report_progress("j2", "ds", 0, [chunks[0][0]])
    assert core.put(*chunks[3], "ds").outcome == "stored"
    assert core.lookup([c[0] for c in chunks]) == [c[0] for c in chunks[1:4]]
    # Timings with a probe spread give an estimate; the allocation says why.
    alloc = core.report_progress("j1", "ds", 0, [], timings=[(0.0, 1.0, 50, 5), (1.0, 0.1, 50, 5)])
    assert alloc is not None and alloc.bytes == 300 and "rank 1" in alloc.reason
    assert (core.stats()["hits"], core.stats()["misses"]) == (5, 5)  # as the job saw them
    table = core.allocation_table()
    assert table[0][0].dataset == "ds" and table[0][1] == 300
    grants = core.open_chunks([chunks[1][0], chunks[4][0]])
    assert [g[0] for g in grants] == [chunks[1][0]]
    with open(grants[0][1], "rb") as f:
        assert f.read() == chunks[1][1]
    core.report_progress("j1", "ds", 0, [], finished=True)
    assert core.stats()["jobs"] == ["j2"]


def test_core_lru_always_admits(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path)), 200, "lru")
    chunks = [_chunk(i) for i in range(3)]
    for d, data in chunks:
        assert core.put(d, data, "ds").outcome == "stored"
    assert core.lookup([c[0] for c in chunks]) == [chunks[1][0], chunks[2][0]]
    assert core.stats()["evictions"] == 1
    # Bytes that are not what they claim evict nothing, even under LRU.
    liar, _ = _chunk(9)
    assert core.put(liar, b"\x00" * 100, "ds").outcome == "digest_mismatch"
    assert core.stats()["evictions"] == 1 and len(core.lookup([c[0] for c in chunks])) == 2


def test_metrics_collector_reads_the_core(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from microco.services.cache._metrics import CacheCollector

    core = CacheCore(ChunkStore(str(tmp_path)), 1000, "coordinated")
    d, data = _chunk(3)
    core.put(d, data, "imgs")
    core.report_progress("j", "imgs", 0, [], timings=[(1.0, 0.1, 100, 4)], dataset_bytes=500)
    reg = CollectorRegistry()
    reg.register(CacheCollector(core))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert "microco_cache_used_bytes 100.0" in text and "microco_cache_hits_total 4.0" in text
    assert 'microco_cache_dataset_bytes{dataset="imgs"} 100.0' in text
    assert 'microco_cache_allocation_bytes{dataset="imgs"}' in text
