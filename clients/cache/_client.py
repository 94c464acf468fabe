"""Typed gRPC client of one cache server: one method per RPC, the stub kept private.

Unary calls go through the common ``ServiceClient`` (deadline budget, retry of UNAVAILABLE
only for idempotent calls). The data loader passes ``retry=False``: when its cache server is
gone it reads from the backing store at once rather than waiting out retries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
from microco.common import ServiceClient, dial
from microco.common.errors import from_rpc_error
from microco.common.forkgate import GATE

_PART = 4 << 20
#: The largest sample ``read_samples`` streams: one sample travels in one message, and a
#: server refuses a read over 64 MiB (its ``_limits``) as the channels refuse such a message.
#: A larger one is answered missing here (its caller reads it elsewhere) and never asked for:
#: asked for, the whole call was refused, and a loader took the server for down.
MAX_STREAMED_SAMPLE = (64 << 20) - (64 << 10)


@dataclass(frozen=True)
class Grant:
    """A chunk file the server lets this (same-host) client read directly."""

    digest: str
    path: str
    size: int


@dataclass(frozen=True)
class LookupAnswer:
    """Chunks held, room for the dataset, chunks another job has in flight, claims granted."""

    present: set[str]
    room: int
    in_flight: set[str]
    claimed: set[str]


class CacheClient(ServiceClient):
    """Client of the cache server at ``address`` (``host:port``); errors are ``MicrocoError``s."""

    service_name = "cache"

    def __init__(self, address: str | grpc.Channel, timeout: float = 10.0) -> None:
        channel = dial(address) if isinstance(address, str) else address
        super().__init__(channel, timeout)
        self.address = address if isinstance(address, str) else ""
        self._stub = cache_pb2_grpc.CacheServiceStub(channel)  # type: ignore[no-untyped-call]

    def _t(self, timeout: float | None) -> float:
        return self.default_timeout if timeout is None else timeout

    def lookup(
        self,
        digests: Sequence[str],
        dataset: str = "",
        job_id: str = "",
        *,
        timeout: float | None = None,
        retry: bool = True,
    ) -> set[str]:
        """The subset of ``digests`` (chunks) this server holds."""
        req = cache_pb2.LookupRequest(dataset=dataset, digests=list(digests), job_id=job_id)
        return set(self._call(self._stub.Lookup, req, timeout=timeout, idempotent=True, retry=retry).present)

    def lookup_room(
        self,
        digests: Sequence[str],
        dataset: str = "",
        job_id: str = "",
        *,
        timeout: float | None = None,
        retry: bool = True,
        in_flight: set[str] | None = None,
    ) -> tuple[set[str], int]:
        """Like ``lookup``, plus the bytes of ``dataset`` the server could admit now; the
        chunks another job has in flight (``lookup_claim``) are added to ``in_flight`` if given."""
        req = cache_pb2.LookupRequest(dataset=dataset, digests=list(digests), job_id=job_id)
        r = self._call(self._stub.Lookup, req, timeout=timeout, idempotent=True, retry=retry)
        if in_flight is not None:
            in_flight.update(r.in_flight)
        return set(r.present), r.room_bytes

    def lookup_claim(
        self,
        digests: Sequence[str],
        dataset: str = "",
        job_id: str = "",
        *,
        claim: Sequence[str] = (),
        lease_s: float = 0.0,
        wait_s: float = 0.0,
        timeout: float | None = None,
        retry: bool = True,
    ) -> LookupAnswer:
        """``lookup_room`` that also claims ``claim`` for ``job_id`` (chunks it is about to read
        whole from the backing store: other jobs see them in flight until put or until the
        lease ends) and, with ``wait_s``, waits that long at most for those of ``digests``
        another job has in flight."""
        req = cache_pb2.LookupRequest(
            dataset=dataset,
            digests=list(digests),
            job_id=job_id,
            claim=list(claim),
            claim_lease_s=lease_s,
            wait_s=wait_s,
        )
        t = self._t(timeout) + wait_s
        r = self._call(self._stub.Lookup, req, timeout=t, idempotent=True, retry=retry)
        return LookupAnswer(set(r.present), r.room_bytes, set(r.in_flight), set(r.claimed))

    def read_samples(
        self, reads: Sequence[tuple[str, int, int, str]], job_id: str = "", *, timeout: float | None = None
    ) -> list[bytes | None]:
        """Bytes per (chunk, offset, length, sample digest); None where the server had none.
        A sample too large for one message (``MAX_STREAMED_SAMPLE``) is cut from its chunk,
        read in parts (``read_chunks``); the caller hashes every sample, as for any read."""
        asked = [k for k, (_c, _o, n, _d) in enumerate(reads) if n <= MAX_STREAMED_SAMPLE]
        out: list[bytes | None] = [None] * len(reads)
        large = [k for k, (_c, _o, n, _d) in enumerate(reads) if n > MAX_STREAMED_SAMPLE]
        if large:
            chunks = self.read_chunks(sorted({reads[k][0] for k in large}), job_id=job_id, timeout=timeout)
            for k in large:
                c, o, n, _d = reads[k]
                if c in chunks and o + n <= len(chunks[c]):
                    out[k] = chunks[c][o : o + n]
        if not asked:
            return out
        req = cache_pb2.ReadSamplesRequest(
            samples=[
                cache_pb2.SampleRead(chunk=c, offset=o, length=n, digest=d)
                for c, o, n, d in (reads[k] for k in asked)
            ],
            job_id=job_id,
        )
        try:
            with GATE.held():  # a fork waits for the stream (common/forkgate.py)
                for batch in self._stub.ReadSamples(req, timeout=self._t(timeout)):
                    for s in batch.samples:
                        if not s.missing:
                            out[asked[s.position]] = s.data
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return out

    def read_chunks(
        self, digests: Sequence[str], *, job_id: str = "", timeout: float | None = None
    ) -> dict[str, bytes]:
        """Whole chunks by digest (those held); streamed in parts. ``job_id`` names the reader in
        the server's per-job counters."""
        parts: dict[str, list[bytes]] = {}
        out: dict[str, bytes] = {}
        try:
            with GATE.held():
                for m in self._stub.ReadChunks(
                    cache_pb2.ReadChunksRequest(digests=list(digests), job_id=job_id),
                    timeout=self._t(timeout),
                ):
                    if m.missing:
                        continue
                    parts.setdefault(m.digest, []).append(m.data)
                    if m.last:
                        out[m.digest] = b"".join(parts.pop(m.digest))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return out

    def open_chunks(
        self, digests: Sequence[str], *, timeout: float | None = None, retry: bool = True
    ) -> tuple[str, list[Grant]]:
        """(node, grants): paths of held chunks, valid on ``node`` only."""
        r = self._call(
            self._stub.OpenChunks,
            cache_pb2.OpenChunksRequest(digests=list(digests)),
            timeout=timeout,
            idempotent=True,
            retry=retry,
        )
        return r.node, [Grant(g.digest, g.path, g.size) for g in r.grants]

    def put_chunks(
        self, chunks: Iterable[tuple[str, bytes]], dataset: str = "", *, timeout: float | None = None
    ) -> cache_pb2.PutChunksResponse:
        """Insert chunks; the answer says which were stored, already present, or refused and why."""

        def gen() -> Iterator[cache_pb2.ChunkData]:
            for d, data in chunks:
                n = len(data)
                for off in range(0, max(n, 1), _PART):
                    yield cache_pb2.ChunkData(
                        digest=d,
                        data=data[off : off + _PART],
                        offset=off,
                        last=off + _PART >= n,
                        dataset=dataset,
                    )

        try:
            with GATE.held():
                resp: cache_pb2.PutChunksResponse = self._stub.PutChunks(gen(), timeout=self._t(timeout))
            return resp
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def report_corrupt(self, digest: str, *, timeout: float | None = None, retry: bool = True) -> bool:
        """Ask the server to re-verify a chunk; True when it was corrupt and is now dropped."""
        req = cache_pb2.ReportCorruptRequest(digest=digest)
        dropped: bool = self._call(
            self._stub.ReportCorrupt, req, timeout=timeout, idempotent=True, retry=retry
        ).dropped
        return dropped

    def report_progress(
        self,
        job_id: str,
        dataset: str,
        epoch: int,
        consumed: Sequence[str] = (),
        timings: Sequence[tuple[float, float, int, int]] = (),
        *,
        user: str = "",
        dataset_bytes: int = 0,
        finished: bool = False,
        miss_read_s: float = 0.0,
        timeout: float | None = None,
        retry: bool = True,
    ) -> cache_pb2.ReportProgressResponse:
        """Progress of a job this epoch (consumed chunks) and its mini-batch timings
        (hit fraction, seconds, bytes, samples); answers the dataset's allocation.
        ``miss_read_s``: the backing store's read of one all-miss batch (0: not measured)."""
        req = cache_pb2.ReportProgressRequest(
            job_id=job_id,
            dataset=dataset,
            user=user,
            epoch=epoch,
            consumed=list(consumed),
            timings=[
                cache_pb2.BatchTiming(hit_fraction=h, seconds=s, bytes=b, samples=n) for h, s, b, n in timings
            ],
            dataset_bytes=dataset_bytes,
            finished=finished,
            miss_read_s=miss_read_s,
        )
        # Re-sending consumed chunks is harmless (a set union), and timings are samples.
        resp: cache_pb2.ReportProgressResponse = self._call(
            self._stub.ReportProgress, req, timeout=timeout, idempotent=True, retry=retry
        )
        return resp

    def stats(self, *, timeout: float | None = None) -> cache_pb2.CacheStats:
        stats: cache_pb2.CacheStats = self._call(
            self._stub.GetStats, cache_pb2.GetStatsRequest(), timeout=timeout, idempotent=True
        )
        return stats

    def allocations(self, *, timeout: float | None = None) -> cache_pb2.GetAllocationsResponse:
        resp: cache_pb2.GetAllocationsResponse = self._call(
            self._stub.GetAllocations, cache_pb2.GetAllocationsRequest(), timeout=timeout, idempotent=True
        )
        return resp
