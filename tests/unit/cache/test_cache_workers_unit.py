"""A worker's reads of a planned batch (``_workers.py``), no torch and no cache server: a
server that cannot be reached turns its hits into backing-store reads, never a lost sample."""

from __future__ import annotations

import pickle
import random

from microco.clients.cache import LocalStore, build_index
from microco.clients.cache._workers import ReadPlan, WorkerReader


def test_a_plan_whose_server_is_gone_is_read_from_the_backing_store(tmp_path):
    rng = random.Random(1)
    files = {f"s{i:02d}.bin": rng.randbytes(300) for i in range(12)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    store = LocalStore(str(tmp_path))
    idx = build_index(store.list_files(), store.read, 1200)
    reader = pickle.loads(pickle.dumps(WorkerReader(idx, store, threads=2)))  # as spawn sends it
    plan = ReadPlan([0, 5, 7, 11], seq=3)
    plan.sources = {"127.0.0.1:1": [0, 5]}  # nothing listens there
    plan.inline = {7: files[idx.samples[7].path]}  # held by the main process
    plan.dataset, plan.job_id = "d", "j"
    data, report = reader.read(plan)
    assert data == [files[idx.samples[i].path] for i in plan]
    assert report.seq == 3 and report.failed_servers == ["127.0.0.1:1"]
    assert report.from_cache == [7]  # only the inline one came from a cache
    assert report.backing_bytes == 3 * 300 and report.miss_bytes == 3 * 300 and report.batch_bytes == 4 * 300


def test_a_throttled_store_pickles_to_a_worker_with_a_bucket_of_its_own(tmp_path):
    from microco.clients.cache import ThrottledStore

    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    store = ThrottledStore(LocalStore(str(tmp_path)), 1e6, latency_s=0.001)
    copy = pickle.loads(pickle.dumps(store))
    assert (copy.bytes_per_s, copy.latency_s, copy.url) == (1e6, 0.001, store.url)
    assert copy.read("a.bin") == b"x" * 10 and copy.bytes_read == 10 and store.bytes_read == 0
