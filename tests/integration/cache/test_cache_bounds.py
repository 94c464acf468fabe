"""Bad input at the cache's RPC edge: every bound refused with INVALID_ARGUMENT, never
INTERNAL, and no error text echoes the unbounded input."""

from __future__ import annotations

import grpc
import pytest

from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
from microco.common.channel import dial
from microco.services.cache import digest


@pytest.fixture
def stub(inproc_cache):
    address, core = inproc_cache(1 << 20)
    data = b"x" * 1000
    assert core.put(digest(data), data, "d").outcome == "stored"
    with dial(address) as ch:
        yield cache_pb2_grpc.CacheServiceStub(ch), digest(data)


def _code(call):
    with pytest.raises(grpc.RpcError) as ei:
        r = call()
        if hasattr(r, "__iter__") and not hasattr(r, "SerializeToString"):
            list(r)
    return ei.value.code(), ei.value.details()


def _chunks(*msgs):
    return iter(msgs)


def test_each_bound_is_invalid_argument_and_not_echoed(stub):
    s, d = stub
    huge = "Z" * 100_000
    cases = {
        "length 2^40": lambda: s.ReadSamples(
            cache_pb2.ReadSamplesRequest(
                samples=[cache_pb2.SampleRead(chunk=d, offset=0, length=2**40, digest=d)]
            )
        ),
        "offset 2^62": lambda: s.ReadSamples(
            cache_pb2.ReadSamplesRequest(
                samples=[cache_pb2.SampleRead(chunk=d, offset=2**62, length=10, digest=d)]
            )
        ),
        "too many reads": lambda: s.ReadSamples(
            cache_pb2.ReadSamplesRequest(
                samples=[cache_pb2.SampleRead(chunk=d, length=1, digest=d)] * 100_001
            )
        ),
        "huge chunk name": lambda: s.ReadSamples(
            cache_pb2.ReadSamplesRequest(samples=[cache_pb2.SampleRead(chunk=huge, length=1, digest=d)])
        ),
        "huge job id": lambda: s.ReadChunks(cache_pb2.ReadChunksRequest(digests=[d], job_id=huge)),
        "huge digest lookup": lambda: s.Lookup(cache_pb2.LookupRequest(dataset="d", digests=[huge])),
        "too many digests": lambda: s.Lookup(cache_pb2.LookupRequest(dataset="d", digests=[d] * 100_001)),
        "huge dataset": lambda: s.Lookup(cache_pb2.LookupRequest(dataset=huge, digests=[d])),
        "open huge": lambda: s.OpenChunks(cache_pb2.OpenChunksRequest(digests=[huge])),
        "report huge job": lambda: s.ReportProgress(
            cache_pb2.ReportProgressRequest(job_id=huge, dataset="d")
        ),
        "report huge consumed": lambda: s.ReportProgress(
            cache_pb2.ReportProgressRequest(job_id="j", dataset="d", consumed=[huge])
        ),
        "report negative size": lambda: s.ReportProgress(
            cache_pb2.ReportProgressRequest(job_id="j", dataset="d", dataset_bytes=-5)
        ),
        "put huge digest": lambda: s.PutChunks(
            _chunks(cache_pb2.ChunkData(digest=huge, data=b"a", last=True))
        ),
        "put over capacity": lambda: s.PutChunks(
            _chunks(*[cache_pb2.ChunkData(digest=d, data=b"a" * (1 << 19), dataset="d") for _ in range(4)])
        ),
        "corrupt huge": lambda: s.ReportCorrupt(cache_pb2.ReportCorruptRequest(digest=huge)),
    }
    for name, call in cases.items():
        code, details = _code(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, code, details)
        assert len(details) < 300 and "ZZZZ" not in details, (name, details)


def test_reads_within_bounds_still_work(stub):
    s, d = stub
    req = cache_pb2.ReadSamplesRequest(
        samples=[cache_pb2.SampleRead(chunk=d, offset=0, length=1000, digest=d)]
    )
    (batch,) = list(s.ReadSamples(req))
    assert batch.samples[0].data == b"x" * 1000
    # A range past the end of the chunk is a miss, not an error and not a huge allocation.
    req = cache_pb2.ReadSamplesRequest(
        samples=[cache_pb2.SampleRead(chunk=d, offset=900, length=1000, digest=d)]
    )
    (batch,) = list(s.ReadSamples(req))
    assert batch.samples[0].missing
