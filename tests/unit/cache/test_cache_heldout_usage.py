"""Usage over time that the cache's authors had not tried (session 40's held-out round): a
dataset whose files are rewritten between epochs, or between registration and a job. Every
sample delivered is compared with its file's bytes read directly at that moment."""

from __future__ import annotations

import os
import random

import pytest

from microco.clients.cache import (
    CacheClient,
    LocalStore,
    QuiverLoader,
    build_index,
    digest,
    index_store,
    open_loader,
    register_dataset,
)
from microco.common.errors import FailedPrecondition
from microco.common.kv import MemoryKV
from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process


@pytest.fixture
def server(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 1 << 20, "coordinated")
    srv, address = serve_in_process(CacheServicer(core))
    yield address
    srv.stop(0)


def _dataset(root, n: int = 24, size: int = 300) -> None:
    rng = random.Random(7)
    root.mkdir()
    for i in range(n):
        (root / f"f{i:03d}").write_bytes(rng.randbytes(size))


def _epoch(loader: QuiverLoader, root, epoch: int) -> list[int]:
    """Every sample of the epoch, each checked against its file as it is now."""
    seen = []
    for indices, data in loader.epoch(epoch):
        for i, got in zip(indices, data, strict=True):
            assert got == (root / loader.index.samples[i].path).read_bytes()
            seen.append(i)
    return seen


def test_a_file_rewritten_between_epochs_is_refused_never_served_stale(tmp_path, server) -> None:
    # A hit is the registered bytes (checked by digest) while the file now holds others: the
    # rewritten file was served stale from the cache once cached, and refused only on a miss.
    root = tmp_path / "d"
    _dataset(root)
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 1 << 12)  # (no registration stamps)
    loader = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=server, prefetch=False)
    try:
        assert sorted(_epoch(loader, root, 0)) == list(range(24))
        assert sorted(_epoch(loader, root, 1)) == list(range(24))
        assert loader.stats.hits > 0
        (root / "f007").write_bytes(b"N" * 300)  # same size, other bytes
        with pytest.raises(FailedPrecondition, match="'f007' changed since the dataset was registered"):
            _epoch(loader, root, 2)
    finally:
        loader.close()


def test_a_file_touched_or_copied_over_with_the_same_bytes_is_read_on(tmp_path, server) -> None:
    root = tmp_path / "d"
    _dataset(root)
    store = LocalStore(str(root))
    idx = index_store(store, 1 << 12)
    loader = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=server, prefetch=False)
    try:
        _epoch(loader, root, 0)
        same = (root / "f003").read_bytes()
        os.remove(root / "f003")
        (root / "f003").write_bytes(same)  # a new inode, new times, the registered bytes
        os.utime(root / "f011", ns=(1, 1))
        for epoch in (1, 2):
            assert sorted(_epoch(loader, root, epoch)) == list(range(24))
    finally:
        loader.close()


def test_a_file_rewritten_after_registration_is_refused_to_a_job_started_later(tmp_path, server) -> None:
    # The registration keeps each file's stamp beside the index; a job started after the file
    # changed (its chunk cached by an earlier job) was served the registered bytes as hits.
    root = tmp_path / "d"
    _dataset(root)
    kv = MemoryKV()
    register_dataset(kv, "d", str(root), owner="u", chunk_bytes=1 << 12)
    first = open_loader(kv, "u/d", server=server, batch_size=4, job_id="j1", prefetch=False)
    try:
        assert first.warm() == len(first.index.chunks)  # every chunk cached
    finally:
        first.close()
    (root / "f020").write_bytes(b"M" * 300)
    loader = open_loader(kv, "u/d", server=server, batch_size=4, job_id="j2", prefetch=False)
    try:
        with pytest.raises(FailedPrecondition, match="'f020' changed since the dataset was registered"):
            _epoch(loader, root, 0)
    finally:
        loader.close()


def test_a_sample_too_large_for_one_message_is_streamed_and_does_not_fail_the_batch(tmp_path) -> None:
    # One file larger than a gRPC message (a whole-file sample over 64 MiB: a video, an HDF5
    # file, a big shard registered whole) streamed from a server on another host: ReadSamples
    # was refused whole (a sample is at most 64 MiB), and the loader took the server for down,
    # losing the batch's other hits too.
    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 80 << 20, "coordinated")
    srv, address = serve_in_process(CacheServicer(core))
    client = CacheClient(address)
    try:
        small = b"s" * 1000
        big = random.Random(1).randbytes(1 << 16) * 1025  # 64 MiB + 64 KiB
        chunk = small + big
        assert client.put_chunks([(digest(chunk), chunk)], "d", timeout=60).stored
        reads = [
            (digest(chunk), 0, len(small), digest(small)),
            (digest(chunk), len(small), len(big), digest(big)),
        ]
        got = client.read_samples(reads, "j", timeout=60)
        assert got[0] == small
        assert got[1] is not None and len(got[1]) == len(big) and digest(got[1]) == digest(big)
    finally:
        client.close()
        srv.stop(0)


def _idx_file(path, code: int, shape: tuple[int, ...], body: bytes) -> None:
    import struct

    path.write_bytes(b"\0\0" + bytes([code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + body)


def test_mnist_idx_files_are_read_item_by_item_as_torchvision_reads_them(tmp_path, server) -> None:
    # MNIST's IDX files (what torchvision's MNIST reads, written here): their 16-byte header broke
    # fixed:784, so an images file could only be one sample of 47 MB.
    import numpy as np

    root = tmp_path / "mnist"
    root.mkdir()
    rng = random.Random(2)
    images = rng.randbytes(30 * 28 * 28)
    _idx_file(root / "train-images-idx3-ubyte", 0x08, (30, 28, 28), images)
    _idx_file(root / "train-labels-idx1-ubyte", 0x08, (30,), bytes(rng.randrange(10) for _ in range(30)))
    _idx_file(root / "t10k-floats-idx2", 0x0D, (4, 3), np.arange(12, dtype=">f4").tobytes())
    store = LocalStore(str(root))
    idx = index_store(store, 4 << 10, records="idx")
    assert len(idx) == 30 + 30 + 4

    def direct(path: str, i: int) -> bytes:  # torchvision's read_sn3_pascalvincent_tensor, in numpy
        raw = (root / path).read_bytes()
        dims = raw[3]
        shape = np.frombuffer(raw, ">u4", dims, 4)
        dtype = {0x08: ">u1", 0x0D: ">f4"}[raw[2]]
        return np.frombuffer(raw, dtype, offset=4 + 4 * dims).reshape(*shape)[i].tobytes()

    loader = QuiverLoader(idx, store, batch_size=8, dataset="mnist", job_id="j", server=server)
    try:
        for epoch in range(2):
            seen = []
            for indices, data in loader.epoch(epoch):
                for i, got in zip(indices, data, strict=True):
                    ref = idx.samples[i]
                    item = [s.index for s in idx.samples if s.path == ref.path].index(i)
                    assert got == direct(ref.path, item)
                    seen.append(i)
            assert sorted(seen) == list(range(len(idx)))
    finally:
        loader.close()
    from microco.common.errors import InvalidArgument

    (root / "cut-idx1").write_bytes((root / "train-labels-idx1-ubyte").read_bytes()[:-1])
    with pytest.raises(InvalidArgument, match="cut-idx1: IDX data of 29 bytes is not its 30 items"):
        index_store(store, 4 << 10, records="idx")
    (root / "cut-idx1").write_bytes(b"\x1f\x8b\x08\x00")
    with pytest.raises(InvalidArgument, match="gzip-compressed IDX"):
        index_store(store, 4 << 10, records="idx")


def test_one_user_does_not_learn_of_another_users_datasets_or_jobs_from_the_cache(tmp_path) -> None:
    # Two users with the same bytes under different paths and names share one cached copy, but
    # GetStats and GetAllocations listed every dataset (names, sizes), job id and allocation
    # reason to any user who asked, though etcd and the scheduler keep those to their owner.
    from _support import issued

    from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
    from microco.common.channel import dial

    core = CacheCore(ChunkStore(str(tmp_path / "cache")), 1 << 20, "coordinated")
    srv, address = serve_in_process(CacheServicer(core))
    stubs = {
        who: cache_pb2_grpc.CacheServiceStub(dial(address, identity=issued(who)))
        for who in ("user:alice", "user:bob", "user:carol")
    }
    try:
        data = b"the same bytes " * 200
        for who, name in (("user:alice", "alice/scans"), ("user:bob", "bob/copy")):
            stub = stubs[who]
            stub.Lookup(
                cache_pb2.LookupRequest(digests=[digest(data)], dataset=name, job_id=f"{name}-job"),
                timeout=10,
            )
            msg = cache_pb2.ChunkData(digest=digest(data), data=data, dataset=name, last=True)
            stub.PutChunks(iter([msg]), timeout=10)
            stub.ReportProgress(
                cache_pb2.ReportProgressRequest(
                    job_id=f"{name}-job", dataset=name, dataset_bytes=len(data), epoch=0
                ),
                timeout=10,
            )
        assert core.stats()["used_bytes"] == len(data)  # one copy for both
        for who, mine, other in (
            ("user:alice", "alice/scans", "bob/copy"),
            ("user:bob", "bob/copy", "alice/scans"),
        ):
            stats = stubs[who].GetStats(cache_pb2.GetStatsRequest(), timeout=10)
            allocs = stubs[who].GetAllocations(cache_pb2.GetAllocationsRequest(), timeout=10)
            shown = str(stats) + str(allocs)
            assert mine in shown and f"{mine}-job" in shown
            assert other not in shown, shown
            assert stats.used_bytes == len(data)  # the server's totals stay everyone's
        carol = str(stubs["user:carol"].GetStats(cache_pb2.GetStatsRequest(), timeout=10))
        carol += str(stubs["user:carol"].GetAllocations(cache_pb2.GetAllocationsRequest(), timeout=10))
        assert "alice" not in carol and "bob" not in carol
        admin = str(CacheClient(address).stats())  # the tests' administrator: everything
        assert "alice/scans" in admin and "bob/copy" in admin
        # A dataset a platform service put in before any user named it here (the scheduler's
        # follower warming a job's next node): its owner, by its qualified name, sees it; no
        # one else does (a migrated job read its own dataset's warm state so, CI of session 40).
        warmed = b"warmed by the platform " * 100
        msg = cache_pb2.ChunkData(digest=digest(warmed), data=warmed, dataset="alice/warmed", last=True)
        admin_stub = cache_pb2_grpc.CacheServiceStub(dial(address, identity=issued("service:scheduler")))
        admin_stub.PutChunks(iter([msg]), timeout=10)
        assert "alice/warmed" in str(stubs["user:alice"].GetStats(cache_pb2.GetStatsRequest(), timeout=10))
        assert "alice/warmed" not in str(stubs["user:bob"].GetStats(cache_pb2.GetStatsRequest(), timeout=10))
    finally:
        srv.stop(0)


def test_a_file_rewritten_on_an_fsspec_store_is_refused_too(tmp_path, server) -> None:
    import fsspec

    from microco.clients.cache import open_store

    fs = fsspec.filesystem("memory")
    base = f"/heldout-{os.getpid()}-{tmp_path.name}"
    rng = random.Random(4)
    for i in range(12):
        fs.pipe(f"{base}/f{i:02d}", rng.randbytes(200))
    store = open_store(f"memory://{base}")
    idx = index_store(store, 1 << 10)
    loader = QuiverLoader(idx, store, batch_size=4, dataset="m", job_id="j", server=server, prefetch=False)
    try:
        for epoch in (0, 1):
            for indices, data in loader.epoch(epoch):
                for i, got in zip(indices, data, strict=True):
                    assert got == fs.cat(f"{base}/{idx.samples[i].path}")
        fs.pipe(f"{base}/f05", b"Z" * 200)
        with pytest.raises(FailedPrecondition, match="'f05' changed since the dataset was registered"):
            for _ in loader.epoch(2):
                pass
    finally:
        loader.close()
        fs.rm(base, recursive=True)
