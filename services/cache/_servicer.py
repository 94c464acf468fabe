"""gRPC adapter over ``CacheCore``: parse, call, convert. No decisions here."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
from microco.common.errors import InvalidArgument, MicrocoError, ResourceExhausted
from microco.common.hotstate import key
from microco.services.runtime.auth import caller

from . import _limits as lim
from ._authz import DatasetClaims, JobReports, Visibility
from ._core import CacheCore

log = logging.getLogger(__name__)

SERVICE_NAME = cache_pb2.DESCRIPTOR.services_by_name["CacheService"].full_name
#: Largest payload per streamed message: big enough to amortise per-message cost, well under
#: the channel's limit.
MESSAGE_BYTES = 4 << 20
#: Bytes of chunks this server holds in memory while they arrive, over every ``PutChunks``
#: stream at once: a chunk is kept whole until its last part (its digest is checked before
#: anything is evicted for it), and only the server's capacity bounded one, so a caller's
#: streams that never sent ``last`` held up to the capacity each in memory (session 42: 1 GiB
#: capacity, one user's 42 streams). A part past it is refused (RESOURCE_EXHAUSTED); a loader
#: then reads that chunk from the backing store, as at any refused insert.
MAX_RECEIVING_BYTES = 1 << 30


class CacheServicer(cache_pb2_grpc.CacheServiceServicer):
    def __init__(self, core: CacheCore, redis: Any = None, server_id: str = "", kv: Any = None) -> None:
        self.core = core
        self.reports = JobReports(kv)
        self.datasets = DatasetClaims(kv)
        self.visible = Visibility(self.datasets, self.reports)
        self.redis = redis
        self.server_id = server_id
        self.max_receiving = MAX_RECEIVING_BYTES
        self._receiving = 0  # bytes of chunks held by PutChunks streams now
        self._receiving_lock = threading.Lock()

    def _receive(self, n: int, digest: str) -> None:
        """Count ``n`` more bytes held while a chunk arrives, or refuse them past the bound."""
        with self._receiving_lock:
            if self._receiving + n > self.max_receiving:
                raise ResourceExhausted(
                    f"this cache server holds {self._receiving} bytes of arriving chunks, its most is "
                    f"{self.max_receiving}: chunk {digest[:12]}... refused (read it from the backing store)"
                )
            self._receiving += n

    def _received(self, n: int) -> None:
        with self._receiving_lock:
            self._receiving -= n

    def Lookup(
        self, request: cache_pb2.LookupRequest, context: grpc.ServicerContext
    ) -> cache_pb2.LookupResponse:
        digests = lim.digests(list(request.digests), "digests")
        dataset = lim.name(request.dataset, "dataset")
        lim.name(request.job_id, "job_id")
        # only the dataset's owner teaches the server which digests the name holds
        learn = dataset if self.datasets.owns(caller(context), dataset) else ""
        claim = lim.digests(list(request.claim), "claim")
        if not request.job_id and claim:
            raise InvalidArgument("job_id is required to claim chunks")
        r = self.core.lookup_claim(
            digests,
            learn,
            job=request.job_id,
            claim=claim,
            lease_s=lim.seconds(request.claim_lease_s, "claim_lease_s"),
            wait_s=lim.seconds(request.wait_s, "wait_s"),
        )
        return cache_pb2.LookupResponse(
            present=r.present, room_bytes=self.core.room(dataset), in_flight=r.in_flight, claimed=r.claimed
        )

    def ReadSamples(
        self, request: cache_pb2.ReadSamplesRequest, context: grpc.ServicerContext
    ) -> Iterator[cache_pb2.SampleBatch]:
        lim.count(request.samples, "samples", lim.MAX_READS)
        lim.name(request.job_id, "job_id")
        lim.name(request.dataset, "dataset")
        reads = [(s.chunk, s.offset, s.length, s.digest) for s in request.samples]
        for i, r in enumerate(reads):
            lim.sample_read(i, *r)
        batch: list[cache_pb2.SampleData] = []
        size = 0
        for pos, data in self.core.read_samples(reads, job=request.job_id):
            if data is None:
                batch.append(cache_pb2.SampleData(position=pos, missing=True))
            else:
                batch.append(cache_pb2.SampleData(position=pos, data=data))
                size += len(data)
            if size >= MESSAGE_BYTES:
                yield cache_pb2.SampleBatch(samples=batch)
                batch, size = [], 0
        if batch:
            yield cache_pb2.SampleBatch(samples=batch)

    def ReadChunks(
        self, request: cache_pb2.ReadChunksRequest, context: grpc.ServicerContext
    ) -> Iterator[cache_pb2.ChunkData]:
        digests = lim.digests(list(request.digests), "digests")
        job = lim.name(request.job_id, "job_id")
        for d, data in self.core.read_chunks(digests, job=job):
            if data is None:
                yield cache_pb2.ChunkData(digest=d, missing=True, last=True)
                continue
            for off in range(0, max(len(data), 1), MESSAGE_BYTES):
                part = data[off : off + MESSAGE_BYTES]
                yield cache_pb2.ChunkData(
                    digest=d, data=part, offset=off, last=off + MESSAGE_BYTES >= len(data)
                )

    def OpenChunks(
        self, request: cache_pb2.OpenChunksRequest, context: grpc.ServicerContext
    ) -> cache_pb2.OpenChunksResponse:
        digests = lim.digests(list(request.digests), "digests")
        lim.name(request.job_id, "job_id")
        grants = [
            cache_pb2.ChunkGrant(digest=d, path=p, size=n) for d, p, n in self.core.open_chunks(digests)
        ]
        return cache_pb2.OpenChunksResponse(grants=grants, node=self.core.node)

    def PutChunks(
        self, request_iterator: Iterator[cache_pb2.ChunkData], context: grpc.ServicerContext
    ) -> cache_pb2.PutChunksResponse:
        resp = cache_pb2.PutChunksResponse()
        parts: list[bytes] = []
        size = 0
        current = ""
        who = caller(context)
        try:
            for msg in request_iterator:
                if current and msg.digest != current:
                    raise InvalidArgument("a chunk's parts must be contiguous and end with last=true")
                if not current:  # a chunk's first part: may the caller insert it under that name?
                    d = lim.digest_field(msg.digest, "digest")
                    ds = lim.name(msg.dataset, "dataset")
                    self.datasets.check_insert(who, ds, self.core.known_in([d], ds)[0], d)
                current = lim.digest_field(msg.digest, "digest")
                lim.name(msg.dataset, "dataset")
                if size + len(msg.data) > self.core.capacity:
                    # Refused as it streams in: a chunk that can never be admitted is not buffered.
                    raise InvalidArgument(f"chunk larger than this cache's capacity ({self.core.capacity} B)")
                self._receive(len(msg.data), current)
                parts.append(msg.data)
                size += len(msg.data)
                if not msg.last:
                    continue
                data = b"".join(parts)
                parts, current = [], ""
                try:
                    result = self.core.put(msg.digest, data, msg.dataset)
                finally:
                    self._received(size)
                    size = 0
                if result.outcome == "stored":
                    resp.stored.append(result.digest)
                elif result.outcome == "present":
                    resp.present.append(result.digest)
                else:
                    resp.rejected.append(
                        cache_pb2.RejectedChunk(
                            digest=result.digest, reason=result.outcome, detail=result.detail
                        )
                    )
        finally:
            self._received(size)  # a chunk the stream left unfinished
        if current:
            raise InvalidArgument("stream ended inside a chunk (no part with last=true)")
        return resp

    def ReportCorrupt(
        self, request: cache_pb2.ReportCorruptRequest, context: grpc.ServicerContext
    ) -> cache_pb2.ReportCorruptResponse:
        d = lim.digest_field(request.digest, "digest")
        return cache_pb2.ReportCorruptResponse(dropped=self.core.drop_corrupt(d))

    def ReportProgress(
        self, request: cache_pb2.ReportProgressRequest, context: grpc.ServicerContext
    ) -> cache_pb2.ReportProgressResponse:
        lim.name(request.job_id, "job_id", required=True)
        lim.name(request.dataset, "dataset", required=True)
        lim.name(request.user, "user")
        consumed = lim.digests(list(request.consumed), "consumed")
        lim.count(request.timings, "timings", lim.MAX_TIMINGS)
        if request.dataset_bytes < 0 or request.epoch < -1:
            raise InvalidArgument("dataset_bytes and epoch must not be negative")
        if not 0.0 <= request.miss_read_s < 3600.0:  # (NaN fails too)
            raise InvalidArgument("miss_read_s must be seconds, at least 0")
        who = caller(context)
        user = self.reports.check(who, request.job_id, request.user)
        if not self.datasets.owns(who, request.dataset):
            # another's dataset name: its consumption counts only for chunks known to be in it
            consumed = [
                d for d, k in zip(consumed, self.core.known_in(consumed, request.dataset), strict=True) if k
            ]
        alloc = self.core.report_progress(
            request.job_id,
            request.dataset,
            request.epoch,
            consumed,
            [(t.hit_fraction, t.seconds, t.bytes, t.samples) for t in request.timings],
            user=user,
            dataset_bytes=request.dataset_bytes,
            finished=request.finished,
            miss_read_s=request.miss_read_s,
        )
        self._publish()
        if alloc is None:
            return cache_pb2.ReportProgressResponse()
        return cache_pb2.ReportProgressResponse(allocation_bytes=alloc.bytes, reason=alloc.reason)

    def GetStats(
        self, request: cache_pb2.GetStatsRequest, context: grpc.ServicerContext
    ) -> cache_pb2.CacheStats:
        return stats_to_proto(self.visible.stats(caller(context), self.core.stats()))

    def GetAllocations(
        self, request: cache_pb2.GetAllocationsRequest, context: grpc.ServicerContext
    ) -> cache_pb2.GetAllocationsResponse:
        return cache_pb2.GetAllocationsResponse(
            allocations=[
                cache_pb2.Allocation(
                    dataset=a.dataset,
                    bytes=a.bytes,
                    dataset_bytes=a.dataset_bytes,
                    benefit_s_per_gb=a.benefit_s_per_gb,
                    jobs=list(a.jobs),
                    reason=a.reason,
                    used_bytes=used,
                )
                for a, used in self.visible.allocations(
                    caller(context), self.core.allocation_table(), self.core.group_members
                )
            ],
            capacity_bytes=self.core.capacity,
        )

    _last_publish = 0.0

    def _publish(self) -> None:
        """Mirror stats and allocations to Redis for the console (best effort, at most 1/s)."""
        if self.redis is None or time.monotonic() - self._last_publish < 1.0:
            return
        self._last_publish = time.monotonic()
        import redis

        doc = {
            "stats": self.core.stats(),
            "allocations": [
                {**a.__dict__, "jobs": list(a.jobs), "used_bytes": u} for a, u in self.core.allocation_table()
            ],
        }
        try:
            self.redis.set(key("cache", "server", self.server_id, "status"), json.dumps(doc), ex=60)
        except redis.RedisError as exc:
            log.debug("status not published: %s", exc)


def stats_to_proto(s: dict) -> cache_pb2.CacheStats:
    return cache_pb2.CacheStats(
        capacity_bytes=s["capacity_bytes"],
        used_bytes=s["used_bytes"],
        chunks=s["chunks"],
        hits=s["hits"],
        misses=s["misses"],
        policy=s["policy"],
        node=s["node"],
        evictions=s["evictions"],
        corrupt_dropped=s["corrupt_dropped"],
        rejected=s["rejected"],
        bytes_served=s["bytes_served"],
        datasets=[
            cache_pb2.DatasetUsage(dataset=k, bytes=v["bytes"], chunks=v["chunks"])
            for k, v in s["datasets"].items()
        ],
        jobs=s["jobs"],
        job_stats=[
            cache_pb2.JobStats(
                job_id=j["job_id"],
                dataset=j["dataset"],
                hits=j["hits"],
                misses=j["misses"],
                bytes_served=j["bytes_served"],
            )
            for j in s.get("job_stats", [])
        ],
    )


def parse_size(text: str) -> int:
    """``"10G"``, ``"512M"``, ``"1.5GiB"``, ``"1000000"`` -> bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = int(float(t) * mult)
    except ValueError:
        raise InvalidArgument(f"bad size {text!r}: expected e.g. 512M, 10G or a byte count") from None
    if value <= 0:
        raise InvalidArgument(f"size {text!r} must be positive")
    return value


def add_arguments(parser: Any) -> None:
    g = parser.add_argument_group("cache options")
    g.add_argument(
        "--capacity",
        default=os.environ.get("MICROCO_CACHE_CAPACITY", "1G"),
        help="bytes of local disk this server may fill (e.g. 512M, 20G; MICROCO_CACHE_CAPACITY)",
    )
    g.add_argument(
        "--policy",
        default=os.environ.get("MICROCO_CACHE_POLICY", "coordinated"),
        choices=["coordinated", "lru"],
        help="eviction policy: coordinated (Quiver) or lru (baseline)",
    )
    g.add_argument(
        "--job-ttl-s", type=float, default=60.0, help="a job silent this long stops pinning chunks"
    )
    g.add_argument(
        "--no-follow-scheduler",
        dest="follow_scheduler",
        action="store_false",
        help="ignore the scheduler's job phases in etcd (no prefetch for the job about to resume, "
        "suspended jobs' pins kept only for the TTL, finished jobs' pins kept until it runs out)",
    )
    g.add_argument(
        "--shared-link",
        dest="shared_link",
        action="store_true",
        help="the jobs here share one link to their backing store: value a job's caching also by "
        "what its misses cost the others on it, not only by its own step time (off by default: "
        "measured not to pay in the co-design benchmark; docs/cache.md)",
    )


def setup(ctx: Any) -> None:
    """Build the cache service inside the common runtime (used by ``python -m microco.services.cache``)."""
    from microco.clients.cache import RedisDirectory

    from ._chunkstore import ChunkStore

    args = ctx.args
    s = ctx.settings
    store = ChunkStore(str(s.resolved_data_dir() / "cache"))
    try:
        redis = ctx.redis
    except MicrocoError as exc:  # Redis is an optimisation: the cache serves without a directory
        log.warning("no Redis, serving without a directory: %s", exc)
        redis = None
    directory = RedisDirectory(redis, s.instance_id) if redis is not None else None
    core = CacheCore(
        store,
        parse_size(args.capacity),
        args.policy,
        directory=directory,
        node=s.node,
        job_ttl_s=args.job_ttl_s,
        shared_link=getattr(args, "shared_link", False),
    )
    servicer = CacheServicer(core, redis, s.instance_id, kv=ctx.kv)
    if getattr(args, "follow_scheduler", True) and ctx.kv is not None:
        from ._follow import SchedulerFollower

        follower = SchedulerFollower(core, ctx.kv, s.node)

        def follow(_rt: Any) -> None:
            follower.start()

        ctx.runtime.on_start(follow)
        ctx.runtime.on_stop(follower.stop)
    from prometheus_client import REGISTRY

    from ._metrics import CacheCollector

    REGISTRY.register(CacheCollector(core))  # type: ignore[arg-type]
    ctx.runtime.add_service(cache_pb2_grpc.add_CacheServiceServicer_to_server, servicer, SERVICE_NAME)
    if directory is not None:
        from ._republish import DirectoryKeeper

        def held() -> list[str]:
            with core._lock:
                return list(core.ledger.entries)

        keeper = DirectoryKeeper(directory, held).start()
        ctx.runtime.on_stop(keeper.stop)
        ctx.runtime.on_stop(directory.withdraw)


def serve_in_process(servicer: CacheServicer, host: str = "127.0.0.1") -> tuple[Any, str]:
    """A started gRPC server for ``servicer`` in this process, on a free port, serving mutual TLS
    as the cache service (plaintext only in insecure mode): for benchmarks and tests that need a
    real cache server without a stack. Returns (server, address); stop it with ``server.stop``."""
    from concurrent import futures

    from microco.common.identity import server_credentials, service_identity
    from microco.services.runtime.server import HANDSHAKE_TIMEOUT_S, ErrorAndMetricsInterceptor

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=[ErrorAndMetricsInterceptor("cache")],
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
        ],
    )
    cache_pb2_grpc.add_CacheServiceServicer_to_server(servicer, server)
    ident = service_identity("cache")
    if ident is None:
        port = server.add_insecure_port(f"{host}:0")
    else:
        port = server.add_secure_port(f"{host}:0", server_credentials(ident))  # type: ignore[arg-type]
    server.start()
    return server, f"{host}:{port}"
