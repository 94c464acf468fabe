"""Client-side pieces with no server (no sockets): the loader over a backing store only,
size parsing, stats conversion, dataset records in an in-memory KV."""

from __future__ import annotations

import pytest

from microco.clients.cache import QuiverLoader, get_dataset, list_datasets, load_index, register_dataset
from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound
from microco.common.kv import MemoryKV
from microco.services.cache import LocalStore, ThrottledStore, build_index, parse_size
from microco.services.cache._servicer import stats_to_proto


def _write(root, n=30, size=300):
    files = {}
    for i in range(n):
        data = bytes([(i * 7 + j) % 256 for j in range(size)])
        (root / f"f{i:03d}").write_bytes(data)
        files[f"f{i:03d}"] = data
    return files


def test_loader_without_a_cache_reads_everything_once(tmp_path):
    files = _write(tmp_path)
    store = LocalStore(str(tmp_path))
    idx = build_index(store.list_files(), store.read, 1000)
    loader = QuiverLoader(
        idx, ThrottledStore(store, 50e6), batch_size=7, dataset="d", job_id="j", server=None
    )
    for epoch in range(2):
        seen = []
        for indices, samples in loader.epoch(epoch):
            assert samples == [files[idx.samples[i].path] for i in indices]
            seen += indices
        assert sorted(seen) == list(range(30))
    assert loader.stats.hits == 0 and loader.stats.misses == 60 and len(loader) == 5
    (tmp_path / "f003").write_bytes(b"changed")
    with pytest.raises(FailedPrecondition, match="changed since"):
        loader.read([3])
    loader.close()


def test_register_in_memory_kv(tmp_path):
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d", n=5)
    kv = MemoryKV()
    rec, idx = register_dataset(kv, "five", str(tmp_path / "d"), chunk_bytes=600)
    assert (rec.num_samples, rec.num_chunks) == (5, 3)
    assert get_dataset(kv, "five") == rec and list_datasets(kv) == [rec]
    assert load_index(rec) == idx
    with pytest.raises(NotFound):
        get_dataset(kv, "six")
    with pytest.raises(InvalidArgument):
        register_dataset(kv, "a/b/c", str(tmp_path / "d"))
    with pytest.raises(InvalidArgument):
        register_dataset(kv, "/b", str(tmp_path / "d"))
    with pytest.raises(NotFound):
        register_dataset(kv, "x", str(tmp_path / "nope"))


def test_parse_size_and_stats_proto():
    assert (
        parse_size("4M") == 4 << 20
        and parse_size("1.5GiB") == int(1.5 * (1 << 30))
        and parse_size("100") == 100
    )
    for bad in ("x", "-1", "0"):
        with pytest.raises(InvalidArgument):
            parse_size(bad)
    s = {
        "capacity_bytes": 10,
        "used_bytes": 5,
        "chunks": 1,
        "hits": 2,
        "misses": 3,
        "policy": "lru",
        "node": "n",
        "evictions": 0,
        "corrupt_dropped": 0,
        "rejected": 0,
        "bytes_served": 7,
        "datasets": {"d": {"bytes": 5, "chunks": 1}},
        "jobs": ["j"],
    }
    p = stats_to_proto(s)
    assert p.datasets[0].dataset == "d" and list(p.jobs) == ["j"] and p.policy == "lru"
