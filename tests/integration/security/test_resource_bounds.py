"""What one authenticated caller can make a service hold in memory (session 42): a cache server
keeps a chunk whole until its last part arrives, and only its capacity bounded one, so streams
that never sent the last part each held up to the capacity. Against a real cache server in this
process, over mutual TLS."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from _support import issued

from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
from microco.clients.cache import digest
from microco.common.channel import dial

pytestmark = pytest.mark.integration

PART = 256 << 10


@pytest.fixture
def cache_server(tmp_path: Any) -> Iterator[tuple[Any, str]]:
    from microco.services.cache._chunkstore import ChunkStore
    from microco.services.cache._core import CacheCore
    from microco.services.cache._servicer import CacheServicer, serve_in_process

    servicer = CacheServicer(CacheCore(ChunkStore(str(tmp_path / "cache")), 16 << 20, "coordinated"))
    servicer.max_receiving = 1 << 20
    server, address = serve_in_process(servicer)
    yield servicer, address
    server.stop(grace=0)


def _parts(data: bytes, dataset: str, last: bool = True) -> Iterator[cache_pb2.ChunkData]:
    d = digest(data)
    for off in range(0, len(data), PART):
        end = off + PART >= len(data)
        yield cache_pb2.ChunkData(
            digest=d, data=data[off : off + PART], offset=off, last=end and last, dataset=dataset
        )


def test_a_cache_server_bounds_the_bytes_of_chunks_arriving_at_once(cache_server):
    servicer, address = cache_server
    stub = cache_pb2_grpc.CacheServiceStub(dial(address, identity=issued("user:mallory")))
    # a chunk that never ends is refused once it passes the bound, not buffered up to the capacity
    with pytest.raises(grpc.RpcError) as info:
        stub.PutChunks(_parts(os.urandom(8 << 20), "m", last=False), timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    assert "arriving chunks" in info.value.details()

    # the bound is over every stream at once: one holding 768 KiB leaves no room for 512 KiB more
    big = os.urandom(1 << 20)
    held, go = threading.Event(), threading.Event()

    def slow() -> Iterator[cache_pb2.ChunkData]:
        parts = list(_parts(big, "a"))
        yield from parts[:3]
        held.set()  # the server asks for the fourth part: it holds three
        go.wait(60)
        yield parts[3]

    alice = cache_pb2_grpc.CacheServiceStub(dial(address, identity=issued("user:alice")))
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(r=alice.PutChunks(slow(), timeout=60)))
    t.start()
    try:
        assert held.wait(60)
        small = os.urandom(512 << 10)
        with pytest.raises(grpc.RpcError) as info:
            stub.PutChunks(_parts(small, "m"), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        go.set()
        t.join(60)
    assert list(result["r"].stored) == [digest(big)]
    # every byte counted is given back, refused or stored: the small chunk goes in now
    assert list(stub.PutChunks(_parts(small, "m"), timeout=60).stored) == [digest(small)]
    assert servicer._receiving == 0
