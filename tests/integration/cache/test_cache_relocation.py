"""Issue 16: a cache server restarted on a new port is found again by a running loader (through
etcd, after UNAVAILABLE), and a cache server re-publishes its directory after a real Redis
restart."""

from __future__ import annotations

import time

import pytest
from _support import wait_until

from microco.clients.cache import RedisDirectory, open_loader, register_dataset
from microco.common.hotstate import connect_redis
from microco.common.registry import discover
from microco.services.stack import RedisServer, free_port

pytestmark = pytest.mark.integration


def _epoch(loader, files, epoch: int) -> None:  # type: ignore[no-untyped-def]
    seen = []
    for indices, samples in loader.epoch(epoch):
        for i, data in zip(indices, samples, strict=True):
            assert data == files[loader.index.samples[i].path]
        seen.extend(indices)
    assert sorted(seen) == list(range(len(files)))


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    wait_until(predicate, timeout, what)


def test_a_loader_finds_its_server_again_on_a_new_port(make_dataset, tmp_path, etcd_kv, cache_server):
    files = make_dataset(tmp_path / "d", n=60)
    server = cache_server(node="moving-host", name="m")
    register_dataset(etcd_kv, "moving", str(tmp_path / "d"), chunk_bytes=10_000)
    loader = open_loader(
        etcd_kv, "moving", batch_size=10, job_id="j", node="moving-host", fetch_workers=2, retry_server_s=0.2
    )
    assert loader.client is not None and loader.client.address == server.address
    assert loader.warm() > 0
    server.kill()
    moved = cache_server(node="moving-host", name="m")  # same disk, a new port
    assert moved.address != server.address
    # The killed server's registration lingers until its lease expires.
    _wait(
        lambda: server.address not in {r.address for r in discover(etcd_kv, "cache")}, 30, "old record gone"
    )
    # Calls fail with UNAVAILABLE; once its back-off has passed the loader looks the server up
    # again in etcd. Every epoch meanwhile is complete and correct (from the backing store).
    for epoch in range(1, 20):
        _epoch(loader, files, epoch)
        if loader.stats.server_moves:
            break
        time.sleep(0.3)
    assert loader.client.address == moved.address and loader.stats.server_moves == 1
    h0 = loader.stats.hits
    _epoch(loader, files, epoch + 1)
    assert loader.stats.hits > h0
    loader.close()


def test_a_cache_server_republishes_its_directory_after_redis_restarts(
    make_dataset, tmp_path, tmp_path_factory, etcd_kv, cache_server, monkeypatch
):
    port = free_port()
    redis = RedisServer(tmp_path_factory.mktemp("redis-restart"), port=port).start()
    try:
        make_dataset(tmp_path / "d", n=30)
        server = cache_server(name="r", redis=redis.url)
        _, idx = register_dataset(etcd_kv, "republished", str(tmp_path / "d"), chunk_bytes=10_000)
        loader = open_loader(etcd_kv, "republished", server=server.address, batch_size=5, job_id="w")
        assert loader.warm() == len(idx.chunks)
        loader.close()
        digests = [c.digest for c in idx.chunks]
        directory = RedisDirectory(connect_redis(redis.url))
        _wait(lambda: len(directory.holders(digests) or {}) == len(digests), 10, "directory published")
        redis.stop()
        # The new Redis starts empty: the stack's Redis keeps nothing across a restart (checked
        # here on its command line: asking the new server whether it is empty races the cache
        # server's re-publishing, which a CI run at load lost).
        cmd = redis.command()
        assert cmd[cmd.index("--save") + 1] == "" and cmd[cmd.index("--appendonly") + 1] == "no", cmd
        redis = RedisServer(redis.data_dir, port=port).start()
        directory = RedisDirectory(connect_redis(redis.url))
        _wait(lambda: len(directory.holders(digests) or {}) == len(digests), 30, "directory re-published")
    finally:
        redis.stop()
