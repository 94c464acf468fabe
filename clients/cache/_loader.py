"""The framework-neutral Quiver data loader: substitutable hits, prefetch, fallback.

``QuiverLoader.epoch(e)`` yields mini-batches ``(indices, samples)``. For each batch the
sampler offers the cache ``substitution x batch_size`` candidates, takes those whose chunk
is cached, defers misses to later in the epoch, and reads what remains from the backing
store. Hits are read straight from the granted chunk files when the cache server is on
this host, else streamed. A background prefetcher reads whole unseen chunks from the
backing store and inserts them where the allocation allows. After each batch the loader
tells the server which chunks it has fully consumed this epoch (so co-ordinated eviction
can free them) and how long the batch took with how many hits (benefit estimation).

Nothing here may lose a sample: a cache server that dies, answers garbage or drops a chunk
only turns hits into backing-store reads, and every byte read is checked against its digest.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import sys
import threading
import time
from array import array
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from microco.clients import telemetry
from microco.common.errors import MicrocoError, Unavailable

from ._backing import BackingStore, file_stamps, read_run, sample_runs
from ._client import CacheClient
from ._digest import digest
from ._exchange import Exchange, ExchangeSampler, check_resumable
from ._index import DatasetIndex, SampleRef
from ._inflight import InFlight
from ._origin import OriginPeer
from ._peers import Peers
from ._position import ints, job_seen, merge_positions
from ._sampler import BatchMode, SubstitutableSampler
from ._spread import SpreadCache
from ._stall import BatchRead, StallMeter

log = logging.getLogger(__name__)


@dataclass
class LoaderStats:
    """What one loader did: samples by source, bytes from the backing store, fallbacks."""

    hits: int = 0
    misses: int = 0
    backing_bytes: int = 0
    cache_bytes: int = 0
    prefetched_chunks: int = 0
    prefetch_rejected: int = 0
    server_failures: int = 0
    server_moves: int = 0  # times the server was found again at a new address (re-resolved)
    corrupt_reported: int = 0
    hit_fallbacks: int = 0  # chosen as hits, but had to be read from the backing store
    # Samples of chunks this loader read whole from the backing store on a miss this epoch,
    # served later from that copy: misses (their bytes came from the backing store), not hits.
    chunk_fetched: int = 0
    remote_hits: int = 0  # served by another host's cache server
    peer_chunks: int = 0  # chunks the prefetcher copied from another host's cache, not the backing store
    staged_served: int = 0
    # Seconds the training step waited for data (with prefetch_batches > 0, only what the
    # reader ahead of it could not hide), and seconds it computed between batches.
    stall_s: float = 0.0
    compute_s: float = 0.0
    # The cache's fill: bytes read from the backing store for later batches (the rest of a
    # chunk fetched whole on a miss) and their share of the reads' seconds. Counted apart from
    # the misses: it is not what a miss costs (see ``_stall.py``).
    fill_bytes: int = 0
    fill_s: float = 0.0
    # The batch time with every sample a miss and with every sample a hit, summed over the
    # batches that priced both (what the server's benefit estimate is fitted to).
    all_miss_batch_s: float = 0.0
    all_hit_batch_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def cache_saving(self) -> float:
        """The share of an all-miss batch's time that all hits save, as measured (0: none)."""
        m = self.all_miss_batch_s
        return max(0.0, (m - self.all_hit_batch_s) / m) if m > 0 else 0.0


class QuiverLoader(InFlight):
    """Reads a registered dataset through a cache server with substitutable hits.

    ``index``/``store``: the dataset's verified index and its backing store. ``server``: the
    (same-host) cache server's address, or None to read the backing store only. ``job_id``
    names this job to the server (co-ordinated eviction, allocation). ``substitution``:
    candidates offered per batch, in batches. ``prefetch``: insert unseen chunks in the
    background; ``chunk_fetch``: on a miss read the whole untouched chunk into the cache.
    ``direct_read``: read granted chunk files when the server is on ``node`` (default
    ``MICROCO_NODE`` or the hostname), else stream. ``peers``: other hosts' servers.
    ``substitutable=False, insert_misses=True`` makes the generic read-through cache
    client the benchmark compares against. ``exchange``: the ranks of a data-parallel job
    trade substitutable hits (``ExchangeSampler``; ``TorchExchange()`` under
    ``torch.distributed``); world size and rank are then the exchange's.
    """

    #: How the benefit estimate prices a miss (``_stall.PRICES``): the step's stall, or the link's time.
    MISS_PRICE = "stall"
    #: Resumed from a position taken on another host's cache (``load_state_dict``): ask that
    #: cache for the chunks this host's lacks (``_origin``), when no other peers are given.
    FOLLOW_ORIGIN = True
    #: How long a lookup, open or report to the cache server may take before the loader reads
    #: the backing store instead (the server is then left alone for ``retry_server_s``).
    RPC_TIMEOUT_S = 5.0

    def __init__(
        self,
        index: DatasetIndex,
        store: BackingStore,
        *,
        batch_size: int,
        dataset: str,
        job_id: str,
        server: str | CacheClient | SpreadCache | None | bool = None,
        user: str = "",
        seed: int = 0,
        substitution: int = 10,
        drop_last: bool = False,
        prefetch: bool = True,
        direct_read: bool = True,
        node: str | None = None,
        fetch_workers: int = 8,
        probe_batches: int = 3,
        retry_server_s: float = 2.0,
        substitutable: bool = True,
        insert_misses: bool = False,
        chunk_fetch: bool | None = None,
        peers: Peers | None = None,
        prefetch_batches: int = 2,
        world_size: int | None = None,
        rank: int | None = None,
        resolve_server: Callable[[], str | None] | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self.index = index
        self.store = store
        self.dataset = dataset
        self.job_id = job_id
        self.user = user
        self.batch_size = batch_size
        if exchange is not None:
            world_size, rank = exchange.world_size, exchange.rank
        world_size, rank = _ranks(world_size, rank)
        self.world_size, self.rank = world_size, rank
        if world_size > 1:
            # Each rank reports its own consumption: a chunk is done once every rank is.
            self.job_id = job_id = f"{job_id}/rank{rank}"
        self.sampler: SubstitutableSampler | ExchangeSampler
        # With hits exchanged between ranks every rank knows every rank's progress: chunks are
        # counted consumed for the whole job (a rank may take samples of any chunk).
        self.exchange = exchange
        if exchange is not None:
            self.sampler = ExchangeSampler(
                len(index),
                batch_size,
                exchange,
                seed=seed,
                substitution=substitution if substitutable else 1,
                drop_last=drop_last,
            )
        else:
            self.sampler = SubstitutableSampler(
                len(index),
                batch_size,
                seed=seed,
                substitution=substitution if substitutable else 1,
                drop_last=drop_last,
                num_replicas=world_size,
                rank=rank,
            )
        self._epoch_total = 0  # samples this rank is given in the current epoch
        if server is False or server is True:
            if server is True:
                raise ValueError("server must be an address, a CacheClient, or None/False for no cache")
            server = None
        self.client: CacheClient | SpreadCache | None = (
            CacheClient(server) if isinstance(server, str) else server
        )
        # No server known yet but a way to find one (etcd): the loader reads the backing store
        # and keeps looking (``_server``), so a cache registered late is still used.
        will_cache = self.client is not None or resolve_server is not None
        # A cache spread over hosts: chunks are placed on their owners (``_spread``).
        self.spread = self.client if isinstance(self.client, SpreadCache) else None
        if self.spread is not None:  # owners with bounded loads: few chunks are not lumped
            self.spread.place(dataset, {c.digest: c.size for c in index.chunks})
        self._owned: tuple[tuple[str, ...], dict[str, int]] | None = None
        # Read-through: put single-sample chunks read from the backing store into the cache
        # (the generic cache's behaviour, used by the LRU baseline).
        self.insert_misses = insert_misses
        # Quiver: a miss fetches its whole chunk when the cache has room for it; the chunk's
        # other samples are then hits later this epoch (substitutable), so nothing is read twice.
        self.chunk_fetch = (substitutable and will_cache) if chunk_fetch is None else chunk_fetch
        # Bytes each server (by placement key; "" for a single server) could admit now.
        self._room: dict[str, int] = {}
        self._puts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quiver-put")
        self._behind: Future[None] | None = None
        self._inflight: set[int] = set()
        # Chunks read whole on a miss this epoch: their other samples are not hits.
        self._fetched: set[int] = set()
        # Chunks fetched whole and on their way into the cache: served from here meanwhile.
        self._staged: dict[str, bytes] = {}
        self._claims_init()  # chunks other jobs read whole now (``_inflight``)
        # Other hosts' servers (through the Redis directory), and where remote chunks were seen.
        self.peers: Peers | OriginPeer | None = peers
        self._remote: dict[str, CacheClient] = {}
        self.prefetch = prefetch and will_cache
        self.direct_read = direct_read
        self.node = node if node is not None else os.environ.get("MICROCO_NODE", socket.gethostname())
        self.probe_batches = probe_batches
        self.retry_server_s = retry_server_s
        self.stats = LoaderStats()
        self._pool = ThreadPoolExecutor(max_workers=fetch_workers, thread_name_prefix="quiver-fetch")
        self._fetch_workers = fetch_workers
        self._down_until = 0.0
        # How to find the server again (etcd) when it stops answering: a restarted server
        # listens on a new port. Asked at most once per ``retry_server_s``.
        self._resolve_server = resolve_server
        self._reresolve = False
        self._grants: dict[str, str] = {}
        self._lock = threading.Lock()
        self._consumed_left: list[int] = []
        self._share: list[int] = []
        self._prefetch_stop = threading.Event()
        self._prefetch_thread: threading.Thread | None = None
        self._seed = seed
        self._epoch = -1
        self._timings: list[tuple[float, float, int, int]] = []
        # ``epoch()`` reads up to this many batches ahead of the training step, in a thread.
        self.prefetch_batches = prefetch_batches
        self._pipelined = False
        self._last_read: BatchRead | None = None
        self._delivered: BatchRead | None = None  # the batch the step in progress trains on
        # The samples the training step has been given this epoch (not those a reader ahead
        # has chosen): the position a checkpoint saves (``state_dict``), and one restored.
        self._seen_in_epoch: set[int] = set()
        # What the job had been given before this rank's share was split (a position resumed
        # with another number of ranks), and what this rank knows the job has been given
        # (every rank's steps, with hits exchanged): the job-wide position (``_position``).
        self._base: set[int] = set()
        self._job_seen: set[int] = set()
        self._resume: tuple[int, set[int], set[int]] | None = None  # (epoch, base, seen)
        self.resume_epoch: int | None = None  # after ``load_state_dict``: the epoch to continue
        # Samples read with a whole chunk for a later batch (their wait is carried to it).
        self._read_ahead: set[int] = set()
        self._meter = StallMeter(price=self.MISS_PRICE)
        # Batches read in DataLoader worker processes (``plan_read``/``delivered``): each
        # batch's finished chunks, held until the batch reaches the step; plans in flight.
        self._held: list[list[str]] | None = None
        self._plans: dict[int, tuple[list[int], list[int], list[str], list[int], list[int]]] = {}
        self._plan_seq = 0
        self._batch_bytes = int(index.total_bytes / max(1, len(index)) * batch_size)
        # Each file's stamp when last known to hold the registered bytes (``_check_unchanged``):
        # the registration's where this host kept it, else taken at the first epoch.
        self._stamps = array("q", index.stamps) if index.stamps is not None else None
        self._paths: list[str] | None = None
        self._caches = will_cache or peers is not None

    # -- server access, failing soft
    def _server(self) -> CacheClient | SpreadCache | None:
        if time.monotonic() < self._down_until:
            return None
        if self.client is None:
            return self._find_server_first()
        if self._reresolve:
            self._find_server_again()
        return self.client

    def _lookup(
        self, srv: CacheClient | SpreadCache, chunks: Sequence[str]
    ) -> tuple[set[str], dict[str, int]]:
        """(chunks held, room per server) from the server, or from each chunk's owner."""
        if isinstance(srv, SpreadCache):
            return srv.lookup_rooms(chunks, self.dataset, self.job_id)
        in_flight: set[str] = set()
        held, room = srv.lookup_room(
            chunks, self.dataset, self.job_id, timeout=self.RPC_TIMEOUT_S, retry=False, in_flight=in_flight
        )
        self._note_in_flight(chunks, in_flight)
        return held, {"": room}

    def _room_key(self, chunk_digest: str) -> str:
        return self.spread.owner_key(chunk_digest) if self.spread is not None else ""

    def _owned_bytes(self, keys: list[str]) -> dict[str, int]:
        """Bytes of this dataset each server owns (cached per membership)."""
        from ._placement import owned_bytes

        key = tuple(sorted(keys))
        if self._owned is None or self._owned[0] != key:
            sizes = {c.digest: c.size for c in self.index.chunks}
            self._owned = (key, owned_bytes(sizes, list(key)))
        return self._owned[1]

    def _find_server_first(self) -> CacheClient | None:
        """No server was registered when the loader opened: ask etcd again (at most once per
        ``retry_server_s``) and use the one found from then on."""
        if self._resolve_server is None:
            return None
        with self._lock:
            if self.client is not None:
                return self.client if isinstance(self.client, CacheClient) else None
            self._down_until = time.monotonic() + self.retry_server_s
            try:
                address = self._resolve_server()
            except Exception as exc:  # noqa: BLE001 - etcd trouble: read the backing store meanwhile
                log.warning("cannot look the cache server up: %s", exc)
                return None
            if not address:
                return None
            self.client = CacheClient(address)
            self._down_until = 0.0
        log.info("cache server found: %s", address)
        return self.client

    def _find_server_again(self) -> None:
        """After UNAVAILABLE: ask etcd where the server is now and switch to it if it moved."""
        with self._lock:
            if not self._reresolve or self._resolve_server is None:
                return
            self._reresolve = False
            old = self.client
            if not isinstance(old, CacheClient):
                return
            try:
                address = self._resolve_server()
            except Exception as exc:  # noqa: BLE001 - etcd trouble: keep the address we have
                log.warning("cannot look the cache server up again: %s", exc)
                return
            if not address or old is None or address == old.address:
                return
            self.client = CacheClient(address)
            self.stats.server_moves += 1
        log.warning("cache server moved: %s -> %s", old.address, address)
        old.close()

    def _server_failed(self, exc: Exception) -> None:
        self.stats.server_failures += 1
        self._down_until = time.monotonic() + self.retry_server_s
        if isinstance(exc, Unavailable) and self._resolve_server is not None:
            self._reresolve = True
        with self._lock:
            self._grants.clear()
        log.warning("cache server unavailable, reading from the backing store: %s", exc)

    def cached(self, candidates: Sequence[int]) -> set[int]:
        """Which candidate samples sit in a cached chunk now (this host's server, a peer's,
        or a chunk this loader holds while it is being inserted)."""
        chunks = sorted({self.index.chunk_of(i).digest for i in candidates})
        # What this loader holds is looked at before the server too: an insert finishing while
        # the server is asked leaves its chunk in neither answer otherwise (it is dropped from
        # the staged set only once the server holds it), and its samples would be read twice.
        with self._lock:
            present: set[str] = set(self._staged)
        srv = self._server()
        if srv is not None:
            try:
                held, self._room = self._lookup(srv, chunks)
                present |= held
            except MicrocoError as exc:
                self._server_failed(exc)
        if self.peers is not None:
            remote = self.peers.holders([c for c in chunks if c not in present])
            with self._lock:
                if len(self._remote) > 65536:
                    self._remote.clear()
                self._remote.update(remote)
            present |= remote.keys()
        with self._lock:
            present |= self._staged.keys()
        return {i for i in candidates if self.index.chunk_of(i).digest in present}

    # -- reading
    def _submit_reads(self, wanted: Sequence[int]) -> list[tuple[list[SampleRef], Future[list[bytes]]]]:
        """The backing store's reads of ``wanted``, in parallel: a run of neighbouring records of
        one file (``sample_runs``) in one read, a whole-file sample in one of its own."""
        runs = sample_runs([self.index.samples[i] for i in wanted])
        return [(run, self._pool.submit(read_run, self.store, run)) for run in runs]

    def _read_direct(self, srv: CacheClient, hits: Sequence[int]) -> dict[int, bytes] | None:
        """Hits read from granted chunk files; None when ``srv`` is not on this host."""
        chunks = sorted({self.index.chunk_of(i).digest for i in hits})
        # One call per batch for every chunk read, even with grants at hand: it is also how
        # the server learns of these hits (recency for LRU; a grant for what it still holds).
        node, grants = srv.open_chunks(chunks, timeout=self.RPC_TIMEOUT_S, retry=False)
        if node != self.node:
            return None
        with self._lock:
            for c in chunks:
                self._grants.pop(c, None)
            self._grants.update({g.digest: g.path for g in grants})
        out: dict[int, bytes] = {}
        by_chunk: dict[str, list[int]] = {}
        for i in hits:
            by_chunk.setdefault(self.index.chunk_of(i).digest, []).append(i)
        for c, members in by_chunk.items():
            path = self._grants.get(c)
            if path is None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:  # evicted since the grant: misses
                with self._lock:
                    self._grants.pop(c, None)
                continue
            try:
                for i in members:
                    ref = self.index.samples[i]
                    self._check_direct(srv, c, i, os.pread(fd, ref.size, ref.offset), out)
            finally:
                os.close(fd)
        return out

    def _check_direct(
        self, srv: CacheClient | SpreadCache, c: str, i: int, data: bytes, out: dict[int, bytes]
    ) -> None:
        if digest(data) == self.index.samples[i].digest:
            out[i] = data
            return
        # Stale grant (the file was replaced) or a flipped byte: let the server check.
        with self._lock:
            self._grants.pop(c, None)
        try:
            if srv.report_corrupt(c, timeout=self.RPC_TIMEOUT_S, retry=False):
                self.stats.corrupt_reported += 1
        except MicrocoError:
            pass

    def _read_hits(self, hits: Sequence[int]) -> dict[int, bytes]:
        staged: dict[int, bytes] = {}
        with self._lock:
            for i in hits:
                ref = self.index.samples[i]
                data = self._staged.get(self.index.chunks[ref.chunk].digest)
                if data is not None:
                    staged[i] = data[ref.offset : ref.offset + ref.size]
        rest = [i for i in hits if i not in staged]
        self.stats.staged_served += len(staged)
        staged.update(self._read_cached(rest))
        return staged

    def _read_cached(self, hits: Sequence[int]) -> dict[int, bytes]:
        out = self._read_local(hits)
        if self.peers is None:
            return out
        by_peer: dict[int, tuple[CacheClient, list[int]]] = {}
        with self._lock:
            for i in hits:
                peer = self._remote.get(self.index.chunk_of(i).digest)
                if i not in out and peer is not None:
                    by_peer.setdefault(id(peer), (peer, []))[1].append(i)
        for peer, idxs in by_peer.values():
            reads = [
                (
                    self.index.chunk_of(i).digest,
                    self.index.samples[i].offset,
                    self.index.samples[i].size,
                    self.index.samples[i].digest,
                )
                for i in idxs
            ]
            try:
                data = peer.read_samples(reads, self.job_id, timeout=30)
            except MicrocoError as exc:
                log.warning("peer cache server failed, reading from the backing store: %s", exc)
                self.peers.failed(peer)
                continue
            for i, d in zip(idxs, data, strict=True):
                if d is not None and digest(d) == self.index.samples[i].digest:
                    out[i] = d
                    self.stats.remote_hits += 1
        return out

    def _read_local(self, hits: Sequence[int]) -> dict[int, bytes]:
        srv = self._server()
        if srv is None or not hits:
            return {}
        if isinstance(srv, SpreadCache):
            return self._read_spread(srv, hits)
        try:
            if self.direct_read:
                got = self._read_direct(srv, hits)
                if got is not None:
                    return got
                self.direct_read = False  # the server is elsewhere: stream from now on
            return self._stream(srv, hits)
        except MicrocoError as exc:
            self._server_failed(exc)
            return {}

    def _read_spread(self, spread: SpreadCache, hits: Sequence[int]) -> dict[int, bytes]:
        """Hits from each chunk's owner: granted files when it is on this host, else streamed."""
        by_chunk: dict[str, list[int]] = {}
        for i in hits:
            by_chunk.setdefault(self.index.chunk_of(i).digest, []).append(i)
        out: dict[int, bytes] = {}
        for m, chunks in spread.split(by_chunk).items():
            mine = [i for c in chunks for i in by_chunk[c]]
            client = spread.client(m)
            try:
                got = self._read_direct(client, mine) if self.direct_read and m.node == self.node else None
                out.update(got if got is not None else self._stream(client, mine))
            except MicrocoError as exc:
                spread.failed(m, exc)
        return out

    def _stream(self, srv: CacheClient, hits: Sequence[int]) -> dict[int, bytes]:
        reads = []
        for i in hits:
            ref = self.index.samples[i]
            reads.append((self.index.chunks[ref.chunk].digest, ref.offset, ref.size, ref.digest))
        data = srv.read_samples(reads, self.job_id, timeout=30)
        out = {}
        for i, d in zip(hits, data, strict=True):
            # The server verified the sample, but the client trusts only its own hash.
            if d is not None and digest(d) == self.index.samples[i].digest:
                out[i] = d
        return out

    def read(self, indices: Sequence[int], hits: Sequence[int] = ()) -> list[bytes]:
        """Bytes of ``indices``: ``hits`` from the cache where it still has them, the rest
        (and any hit that failed) from the backing store, in parallel."""
        hit_set = set(hits)
        t0 = time.perf_counter()
        got = self._read_hits([i for i in indices if i in hit_set])
        t_hits = time.perf_counter() - t0
        rest = [i for i in indices if i not in got]
        self.stats.hit_fallbacks += sum(1 for i in rest if i in hit_set)
        whole = self._chunks_to_fetch(rest, indices)
        # Claimed first: a chunk another job reads whole now is waited for, not read again.
        whole, waiting = self._claim_whole(whole, rest)
        wanted = [i for i in rest if self.index.samples[i].chunk not in whole | waiting]
        for c in sorted(whole):
            wanted.extend(s.index for s in self.index.samples_of(self.index.chunks[c]))
        t0 = time.perf_counter()
        reads = self._submit_reads(wanted)
        if waiting:  # (while this batch's own reads go on)
            late = [i for i in rest if self.index.samples[i].chunk in waiting]
            tw = time.perf_counter()
            arrived = self._await_chunks(late)
            t_hits += time.perf_counter() - tw  # what the hits among them cost
            got.update(arrived)
            rest = [i for i in rest if i not in arrived]
            more = [i for i in late if i not in arrived]
            wanted += more
            reads += self._submit_reads(more)
            t0 += time.perf_counter() - tw
        fetched = {ref.index: data for run, f in reads for ref, data in zip(run, f.result(), strict=True)}
        t_back = max(0.0, time.perf_counter() - t0)
        fetched_bytes = sum(map(len, fetched.values()))
        self.stats.backing_bytes += fetched_bytes
        # The fetch's wall time, apportioned by bytes: samples used now carry their share into
        # this batch's miss time, the rest of a whole chunk carry theirs to the batch using them.
        rest_now = set(rest)
        miss_s = 0.0
        ahead: list[tuple[int, float]] = []
        for i, data in fetched.items():
            cost = t_back * len(data) / fetched_bytes if fetched_bytes else 0.0
            if i in rest_now:
                miss_s += cost
            else:
                ahead.append((i, cost))
                self._read_ahead.add(i)
                self.stats.fill_bytes += len(data)
                self.stats.fill_s += cost
        for i in rest:
            got[i] = fetched[i]
        self._fetched.update(whole)
        if whole:
            puts = []
            for c in sorted(whole):
                chunk = self.index.chunks[c]
                puts.append((chunk.digest, b"".join(fetched[s.index] for s in self.index.samples_of(chunk))))
            with self._lock:
                self._staged.update(puts)
            self._put_async(puts)
        if self.insert_misses and rest:
            # Read-through, written behind by at most one batch: the insert overlaps the next
            # batch's reads, yet the cache's recency order stays the order of the reads.
            self._put_behind(
                [(self.index.chunk_of(i).digest, got[i]) for i in rest if self.index.chunk_of(i).count == 1]
            )
        rest_set = set(rest)
        served = [i for i in indices if i not in rest_set]
        real = [i for i in served if self.index.samples[i].chunk not in self._fetched]
        self.stats.chunk_fetched += len(served) - len(real)
        # Samples of a chunk fetched whole earlier this epoch are misses: their cost is their
        # share of that fetch (plus their share of this read), not the cheap read from memory.
        hit_s = t_hits * len(real) / len(served) if served else 0.0
        miss_s += t_hits - hit_s
        used_ahead = tuple(i for i in served if i in self._read_ahead)
        self._read_ahead.difference_update(used_ahead)
        real_set = set(real)
        self._last_read = BatchRead(
            hits=len(real),
            misses=len(indices) - len(real),
            hit_read_s=hit_s,
            miss_read_s=miss_s,
            ahead=tuple(ahead),
            used_ahead=used_ahead,
            batch_bytes=sum(len(got[i]) for i in indices),
            miss_bytes=sum(len(got[i]) for i in indices if i not in real_set),
            overlapped=self._pipelined,
        )
        stream = telemetry.current()
        if stream is not None and not self._pipelined:
            # Read in the step: the step waited for it, and the stream times the step.
            stream.add_data_wait(t_hits + t_back)
            self._delivered, self._last_read = self._last_read, None
        self.stats.hits += len(real)
        self.stats.misses += len(indices) - len(real)
        self.stats.cache_bytes += sum(len(got[i]) for i in real)
        return [got[i] for i in indices]

    def _chunks_to_fetch(self, misses: Sequence[int], batch: Sequence[int]) -> set[int]:
        """Chunks worth reading whole for these misses: none of their samples was read before
        this batch this epoch (so nothing is read twice) and the cache has room for them."""
        if not self.chunk_fetch or self._server() is None or not self._consumed_left:
            # (Outside an epoch, e.g. map-style ``dataset[i]``, there is no epoch to share a
            # whole chunk's read with: read just the samples asked for.)
            return set()
        in_batch: dict[int, int] = {}
        for i in batch:
            c = self.index.samples[i].chunk
            in_batch[c] = in_batch.get(c, 0) + 1
        out: set[int] = set()
        with self._lock:
            for i in misses:
                c = self.index.samples[i].chunk
                chunk = self.index.chunks[c]
                untouched = self._consumed_left[c] + in_batch[c] == self._share[c] == chunk.count
                # (A chunk whose samples are all in this batch costs no extra read at all.)
                if c in out or c in self._inflight or not untouched:
                    continue
                k = self._room_key(chunk.digest)
                if self._room.get(k, 0) < chunk.size:
                    if self.spread is None:
                        break
                    continue  # (another server may still have room for another chunk)
                self._room[k] -= chunk.size
                out.add(c)
                self._inflight.add(c)
        return out

    def _put_sync(self, chunks: list[tuple[str, bytes]]) -> None:
        srv = self._server()
        if not chunks or srv is None:
            return
        try:
            srv.put_chunks(chunks, self.dataset, timeout=30)
        except MicrocoError as exc:
            self._server_failed(exc)

    def _put_behind(self, chunks: list[tuple[str, bytes]]) -> None:
        if self._behind is not None:
            self._behind.result()
        self._behind = self._puts.submit(self._put_sync, chunks) if chunks else None

    def _put_async(self, chunks: list[tuple[str, bytes]]) -> None:
        if not chunks:
            return

        def put() -> None:
            srv = self._server()
            kept: set[str] = set()
            try:
                if srv is not None:
                    r = srv.put_chunks(chunks, self.dataset, timeout=30)
                    kept = set(r.stored) | set(r.present)
            except MicrocoError as exc:
                self._server_failed(exc)
            finally:
                with self._lock:
                    for d, _ in chunks:
                        # A chunk the cache refused stays staged until this job consumed it:
                        # its samples were read once and are not read again.
                        if d in kept:
                            self._staged.pop(d, None)
                        ref = self.index.chunk_by_digest(d)
                        if ref is not None:
                            self._inflight.discard(ref.index)

        self._puts.submit(put)

    # -- epochs
    def _shares(self) -> list[int]:
        """Samples of each chunk in this rank's share of the current epoch (the job's, when
        ranks exchange hits)."""
        if self.world_size == 1 or self.exchange is not None:
            return [c.count for c in self.index.chunks]
        share = [0] * len(self.index.chunks)
        for i in self.sampler.unseen():
            share[self.index.samples[i].chunk] += 1
        return share

    def __len__(self) -> int:
        if isinstance(self.sampler, ExchangeSampler):
            return self.sampler.steps
        n = self.sampler.shard_size
        return n // self.batch_size if self.sampler.drop_last else -(-n // self.batch_size)

    def epoch(self, epoch: int) -> Iterator[tuple[list[int], list[bytes]]]:
        """The mini-batches of ``epoch``: every sample exactly once. With ``prefetch_batches``
        > 0 a reader thread fetches that many batches ahead (hits and misses) while the
        training step computes; the time the step still waits is what is measured."""
        if self.prefetch_batches <= 0:
            for indices, _hits in self.batches(epoch):
                yield indices, self.read(indices, _hits)
            return
        yield from self._pipelined_epoch(epoch)

    def _pipelined_epoch(self, epoch: int) -> Iterator[tuple[list[int], list[bytes]]]:
        q: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch_batches)
        stop = threading.Event()
        end = object()

        def put(item: object) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        # With hits exchanged between ranks each batch choice is a collective: every rank's
        # reader must make as many as the others. A token per batch the step has taken (and
        # the read-ahead's to start with) bounds the choices; a step that stops early leaves
        # its reader to spend the tokens it was given (choosing, not reading), so every rank
        # makes the same number of choices however the threads are timed.
        tokens = threading.Semaphore(self.prefetch_batches + 1) if self.exchange is not None else None

        def produce() -> None:
            gen = self.batches(epoch)
            try:
                while True:
                    if tokens is not None:
                        while not tokens.acquire(timeout=0.1):
                            if stop.is_set():
                                return
                    elif stop.is_set():
                        return
                    try:
                        indices, hits = next(gen)
                    except StopIteration:
                        return
                    taken = self._taken(indices)  # (the generator is paused at this batch)
                    if stop.is_set():
                        continue
                    data = self.read(indices, hits)
                    if not put((indices, data, self._last_read, taken)) and tokens is None:
                        return
            except BaseException as exc:  # noqa: BLE001 - handed to the training step, raised there
                put(exc)
            finally:
                gen.close()  # final progress report
                put(end)

        self._pipelined = True
        reader = threading.Thread(target=produce, name="quiver-reader", daemon=True)
        reader.start()
        pending: tuple[BatchRead | None, float] | None = None
        delivered = None
        # With the job's telemetry stream (the scheduler hook's), the step is timed there once:
        # this loader adds its wait for data and reads the step's compute back from the record.
        stream = telemetry.current()
        stop_listening = self._listen(stream) if stream is not None else None
        try:
            while True:
                t0 = time.perf_counter()
                if delivered is not None:
                    compute = t0 - delivered
                    self.stats.compute_s += compute
                    if pending is not None and pending[0] is not None:
                        self._add_timings(self._meter.timings(pending[0], compute))
                item = q.get()
                if tokens is not None:
                    tokens.release()
                wait = time.perf_counter() - t0
                if item is end:
                    break
                if isinstance(item, BaseException):
                    raise item
                indices, data, read, taken = item
                self.stats.stall_s += wait
                with self._lock:
                    self._seen_in_epoch.update(indices)
                    self._job_seen.update(taken)
                if stream is not None:
                    stream.add_data_wait(wait)
                    self._delivered = read
                else:
                    pending = (read, wait)
                    delivered = time.perf_counter()
                yield indices, data
        finally:
            if stop_listening is not None:
                stop_listening()
            stop.set()
            reader.join()
            self._pipelined = False
            # The reader made the epoch's last report when it ran out of batches; the last
            # batch's timings were taken after that, when its step ended.
            self._flush_timings()

    def _listen(self, stream: telemetry.StepTelemetry) -> Callable[[], None]:
        """Take each step's wait and compute from the stream's record: the batch delivered
        last is the one that step trained on (its reads give the hit/miss split)."""
        self._delivered = None

        def on_step(rec: telemetry.StepRecord) -> None:
            read, self._delivered = self._delivered, None
            if read is None:
                return
            if not self._pipelined:
                # Read in the step itself: the whole read was the wait (added in ``read``).
                self.stats.stall_s += rec.data_wait_s
            self.stats.compute_s += rec.compute_s
            self._add_timings(self._meter.timings(read, rec.compute_s))

        return stream.subscribe(on_step)

    def _add_timings(self, timings: list[tuple[float, float, int, int]]) -> None:
        with self._lock:
            self._timings.extend(timings)
            ends = {h: s for h, s, _, _ in timings}
            if 0.0 in ends and 1.0 in ends:
                self.stats.all_miss_batch_s += ends[0.0]
                self.stats.all_hit_batch_s += ends[1.0]

    def batches(self, epoch: int) -> Generator[tuple[list[int], list[int]], None, None]:
        """Only the choice of batches (indices, those chosen as hits), reads left to the caller;
        progress and timing reports are made as batches are taken."""
        self._start_epoch(epoch)
        stream = telemetry.current() if not self._pipelined else None
        stop_listening = self._listen(stream) if stream is not None else None
        try:
            b = 0
            last = None
            done: list[str] = []
            while True:
                probe = epoch < 2 and b < 2 * self.probe_batches
                mode = (
                    (BatchMode.MISSES_ONLY if b % 2 == 0 else BatchMode.HITS_ONLY)
                    if probe
                    else BatchMode.PREFER_HITS
                )
                now = time.perf_counter()
                if (
                    stream is None
                    and last is not None
                    and not self._pipelined
                    and self._last_read is not None
                ):
                    # Read in the step itself (no reader ahead): the whole read is a wait.
                    _prev, t0 = last
                    r, self._last_read = self._last_read, None
                    wait = r.hit_read_s + r.miss_read_s
                    self.stats.stall_s += wait
                    self.stats.compute_s += max(0.0, now - t0 - wait)
                    self._add_timings(self._meter.timings(r, now - t0 - wait))
                if isinstance(self.sampler, ExchangeSampler):
                    batch = self.sampler.next_batch(self.cached, mode, self._hit_order, self._fetcher)
                else:
                    batch = self.sampler.next_batch(self.cached, mode, self._hit_order, self._miss_order)
                now = time.perf_counter()
                # The previous batch has been read by now: its finished chunks may go.
                self._report(done)
                done = []
                if batch is None:
                    break
                taken = self._taken(batch.indices)
                done = self._consume(taken)
                if self._held is not None:  # read in worker processes: reported on delivery
                    self._held.append(done)
                    done = []
                if not self._pipelined and self._held is None:  # (a reader ahead, or a worker,
                    # counts a batch when it is handed over)
                    with self._lock:
                        self._seen_in_epoch.update(batch.indices)
                        self._job_seen.update(taken)
                last = (batch, now)
                b += 1
                yield list(batch.indices), sorted(batch.hits)
        finally:
            if stop_listening is not None:
                stop_listening()
            self._prefetch_stop.set()
            self._report(done)

    def _taken(self, indices: Sequence[int]) -> list[int]:
        """The samples the whole job takes in the step that gives this rank ``indices``: every
        rank's, when ranks exchange hits (each knows all), else this rank's."""
        if isinstance(self.sampler, ExchangeSampler):
            return [i for t in self.sampler.last_taken for i in t]
        return list(indices)

    def _fetcher(self, i: int) -> int:
        # With hits exchanged: the rank that fetches (and prefetches) ``i``'s chunk whole while
        # no rank has touched it (the same answer on every rank: the job's progress is known to
        # all alike); -1 (any rank: the misses stay spread over the links) once touched.
        c = self.index.samples[i].chunk
        if self._consumed_left[c] == self._share[c] == self.index.chunks[c].count:
            return c % self.world_size
        return -1

    def _hit_order(self, i: int) -> int:
        # Prefer hits in chunks this job has nearly finished: a finished chunk can be evicted,
        # which makes room for the prefetcher while the link would otherwise idle.
        return self._consumed_left[self.index.samples[i].chunk]

    # Every rank's ``state_dict()`` -> the job's position (``TorchHook`` calls it when a job
    # resumes with another number of ranks than it saved: ``merge_positions``).
    merge_state_dicts = staticmethod(merge_positions)

    def state_dict(self) -> dict[str, object]:
        """Where the training step is in the dataset: the epoch and the samples it has been
        given in it. A checkpoint holds it (``TorchHook(..., sampler=loader)``); a job restarted
        from it (resumed elsewhere, say) continues the epoch with exactly the samples it had not
        seen, whatever the cache then holds.

        With hits exchanged between ranks (or with one rank) it is also the whole job's position
        (``job_complete``: every rank knows every rank's steps; taken at a step boundary, as
        DDP's checkpoints are), which loaders of any number of ranks load. With a static split
        of several ranks it is this rank's alone: ``merge_positions`` of every rank's is the
        job's."""
        with self._lock:
            return {
                "epoch": self._epoch,
                "seen": sorted(self._seen_in_epoch),
                "num_samples": len(self.index),
                "rank": self.rank,
                "world_size": self.world_size,
                "epoch_done": len(self._seen_in_epoch) >= self._epoch_total,
                "base": sorted(self._base),
                "job_seen": sorted(self._job_seen | self._seen_in_epoch | self._base),
                "job_complete": self.exchange is not None or self.world_size == 1,
                # where its working set is cached: a loader resumed on another host asks it
                "cache_server": self.client.address if isinstance(self.client, CacheClient) else "",
            }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Continue from ``state_dict()``'s position: the next ``epoch(resume_epoch)`` yields
        only the samples not seen in it. A position after an epoch's last batch resumes at the
        next epoch: work a loop does after an epoch (an LR schedule's step, say) is due first
        when ``resume_epoch`` is past the epoch the checkpoint was taken in.

        A job-wide position (one rank's, when ranks exchange hits or there is one rank; or
        ``merge_positions`` of every rank's) resumes with any number of ranks, the job grown or
        shrunk since: the samples no rank had been given are split again over the ranks now,
        so every sample of the epoch is still given exactly once. Every rank loads the same
        position. One rank's position of a static split resumes only that rank."""
        n, seen = state.get("num_samples"), state.get("seen")
        if n != len(self.index) or not isinstance(seen, list):
            raise ValueError(f"the saved position is for {n} samples; this dataset has {len(self.index)}")
        self._follow_origin(state.get("cache_server"))
        epoch = int(state.get("epoch", -1))  # type: ignore[call-overload]
        if epoch < 0:
            self._resume, self.resume_epoch = None, 0
            return
        whole = job_seen(state)
        done = state.get("epoch_done")
        if whole is None:
            saved = (state.get("rank"), state.get("world_size"))
            if saved != (self.rank, self.world_size):
                raise ValueError(
                    f"the saved position is rank {saved[0]}'s of {saved[1]} ranks that split the epoch "
                    f"statically, and this is rank {self.rank} of {self.world_size}: load every rank's "
                    "position merged (merge_positions([...every rank's state_dict()])), or exchange "
                    "hits between ranks (exchange=TorchExchange()), whose every rank's position is "
                    "the job's"
                )
            if done if isinstance(done, bool) else len(seen) >= self.sampler.shard_size:
                self._resume, self.resume_epoch = None, epoch + 1
                return
            base = set(ints(state, "base"))
            self._resume, self.resume_epoch = (epoch, base, {int(i) for i in seen}), epoch
            return
        if any(not 0 <= i < len(self.index) for i in whole):
            raise ValueError("the saved position names samples out of range")
        if done if isinstance(done, bool) else len(whole) >= len(self.index):
            self._resume, self.resume_epoch = None, epoch + 1
            return
        if isinstance(self.sampler, ExchangeSampler):  # refused now, not in the reader thread
            check_resumable(
                len(self.index) - len(whole), self.batch_size, self.world_size, self.sampler.drop_last, epoch
            )
        self._resume, self.resume_epoch = (epoch, whole, set()), epoch

    def _follow_origin(self, origin: object) -> None:
        """The position was taken reading through the cache server ``origin``: when that is
        not this loader's, it becomes this loader's peer (unless peers were given)."""
        if not self.FOLLOW_ORIGIN or not isinstance(origin, str) or not origin or self.peers is not None:
            return
        mine = self.client.address if isinstance(self.client, CacheClient) else ""
        if origin != mine:
            self.peers = OriginPeer(origin, self.dataset)

    def _check_unchanged(self) -> None:
        """Refuse to go on with a dataset whose files were rewritten since they were known to
        hold the registered bytes: a cache hit is the registered bytes (checked by digest), so a
        rewritten file would be served stale from the cache while its misses are refused. One
        stamp per file per epoch (a stat; a listing for an fsspec store); a file whose stamp
        changed is read again and every sample of it hashed (a ``touch`` or a copy of the same
        bytes passes, and its new stamp is kept). Without any cache nothing stale can be served
        (every read is checked), so nothing is stamped."""
        if not self._caches:
            return
        if self._paths is None:
            self._paths = self.index.files()
        paths = self._paths
        now = file_stamps(self.store, paths)
        if now is None:
            return
        if self._stamps is not None and len(self._stamps) == len(now) and now != self._stamps:
            base = self._stamps
            changed = [paths[k] for k in range(len(paths)) if now[k] != base[k]]
            by_path: dict[str, list[SampleRef]] = {p: [] for p in changed}
            for ref in self.index.samples:
                if ref.path in by_path:
                    by_path[ref.path].append(ref)
            for path in changed:  # (FailedPrecondition naming it, changed or gone)
                for run in sample_runs(by_path[path]):
                    read_run(self.store, run)
        self._stamps = now

    def _start_epoch(self, epoch: int) -> None:
        self._check_unchanged()
        self._epoch = epoch
        self.sampler.start_epoch(epoch)
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] != epoch:
            resume = None
        base: set[int] = resume[1] if resume is not None else set()
        seen: set[int] = resume[2] if resume is not None else set()
        if base and isinstance(self.sampler, SubstitutableSampler):
            self.sampler.resplit(epoch, base)  # (this rank's share of what the job had not seen)
        self._share = self._shares()
        self._consumed_left = list(self._share)
        with self._lock:
            self._seen_in_epoch = set(seen)
            self._base = set(base)
            self._job_seen = base | seen
        finished: list[str] = []
        if isinstance(self.sampler, ExchangeSampler):
            if resume is not None:  # (a collective: every rank resumes the same position)
                self.sampler.restore(epoch, sorted(seen), sorted(base))
                seen_by_job = set(range(len(self.index))) - set(self.sampler.unseen())
                with self._lock:
                    self._job_seen = set(seen_by_job)
                for i in seen_by_job:
                    c = self.index.samples[i].chunk
                    self._consumed_left[c] -= 1
                    if self._consumed_left[c] == 0:
                        finished.append(self.index.chunks[c].digest)
        elif seen:
            self.sampler.restore(epoch, [i for i in self.sampler.unseen() if i not in seen])
            for i in seen:
                c = self.index.samples[i].chunk
                self._consumed_left[c] -= 1
                if self._consumed_left[c] == 0:
                    finished.append(self.index.chunks[c].digest)
        self._epoch_total = self.sampler.shard_size
        if isinstance(self.sampler, ExchangeSampler):  # (its share counts from the restore on)
            self._epoch_total += len(seen)
        self._fetched = set()
        self._read_ahead = set()
        self._meter.carry.clear()
        self._last_read = None
        self._report([])
        # Chunks with none of this rank's samples this epoch: done for this rank from the start.
        elsewhere = [c.digest for c, n in zip(self.index.chunks, self._share, strict=True) if n == 0]
        elsewhere += finished  # (and those the job consumed before it was restarted)
        for i in range(0, len(elsewhere), 50_000):
            self._report(elsewhere[i : i + 50_000])
        if self.prefetch:
            self._prefetch_stop.set()
            if self._prefetch_thread is not None:
                self._prefetch_thread.join()
            self._prefetch_stop = threading.Event()
            self._prefetch_thread = threading.Thread(
                target=self._prefetch_loop,
                args=(epoch, self._prefetch_stop),
                name="quiver-prefetch",
                daemon=True,
            )
            self._prefetch_thread.start()

    def _consume(self, indices: Sequence[int]) -> list[str]:
        done = []
        with self._lock:
            for i in indices:
                c = self.index.samples[i].chunk
                self._consumed_left[c] -= 1
                if self._consumed_left[c] == 0:
                    done.append(self.index.chunks[c].digest)
        return done

    def _report(self, consumed: list[str]) -> None:
        with self._lock:  # read by now: a chunk kept for this job is not needed any more
            for d in consumed:
                self._staged.pop(d, None)
        srv = self._server()
        if srv is None:
            return
        with self._lock:
            timings, self._timings = self._timings, []
        try:
            if isinstance(srv, SpreadCache):  # each server is told the bytes it owns
                srv.report_progress(
                    self.job_id,
                    self.dataset,
                    self._epoch,
                    consumed,
                    timings,
                    user=self.user,
                    dataset_bytes=self._owned_bytes,
                    miss_read_s=self._meter.miss_read_s,
                )
            else:
                srv.report_progress(
                    self.job_id,
                    self.dataset,
                    self._epoch,
                    consumed,
                    timings,
                    user=self.user,
                    dataset_bytes=self.index.total_bytes,
                    miss_read_s=self._meter.miss_read_s,
                    timeout=self.RPC_TIMEOUT_S,
                    retry=False,
                )
        except MicrocoError as exc:
            self._server_failed(exc)

    def _prefetch_loop(self, epoch: int, stop: threading.Event) -> None:
        """Insert whole chunks this job has not started this epoch, until the epoch ends;
        when the server refuses, wait for consumption to free room."""
        order = list(range(len(self.index.chunks)))
        random.Random(self._seed * 7 + epoch * 131 + hash(self.job_id) % 1000).shuffle(order)
        if self.exchange is not None:  # ranks that know the job's progress share the work out
            order = [c for c in order if c % self.world_size == self.rank]  # (as ``_fetcher``)
        self._insert_chunks(order, stop, wait_when_full=True)

    def warm(self, max_chunks: int | None = None) -> int:
        """Synchronously insert chunks (in index order) until the server is full or refuses;
        the number stored. For a job that wants a warm cache before its first epoch."""
        if self.client is None:
            return 0
        if not self._consumed_left or self.sampler.remaining == 0:
            # Between epochs: warm for the next one, in which every chunk is needed again
            # (reported as that epoch, so the server does not count them consumed).
            self._share = [c.count for c in self.index.chunks]  # every rank needs them again
            self._consumed_left = list(self._share)
            self._epoch += 1
        self._report([])  # the server must know this job pins the chunks it is about to get
        before = self.stats.prefetched_chunks
        order = list(range(len(self.index.chunks)))[: max_chunks if max_chunks is not None else None]
        self._insert_chunks(order, threading.Event(), wait_when_full=False)
        return self.stats.prefetched_chunks - before

    def _insert_chunks(self, order: list[int], stop: threading.Event, wait_when_full: bool) -> None:
        pos = 0
        # Spread over servers: a chunk whose owner is full now waits for a later pass, while
        # chunks owned by servers with room go in (one full server must not stop the others).
        deferred: list[int] = []
        while not stop.is_set():
            if pos >= len(order):
                if not deferred or not wait_when_full:
                    return
                stop.wait(0.1)
                order, deferred, pos = deferred, [], 0
                continue
            srv = self._server()
            if srv is None:
                if not wait_when_full:
                    return
                stop.wait(0.2)
                continue
            window: list[int] = []
            while pos < len(order) and len(window) < 16:
                c = order[pos]
                with self._lock:
                    untouched = 0 < self._consumed_left[c] == self._share[c]
                    staged = self.index.chunks[c].digest in self._staged
                if untouched and not staged:
                    window.append(c)
                pos += 1
            if not window:
                continue
            try:
                present, rooms = self._lookup(srv, [self.index.chunks[c].digest for c in window])
            except MicrocoError as exc:
                # The server did not answer (slow or gone): ask about these chunks again on a
                # later pass (when waiting for room; ``warm`` gives up at once).
                self._server_failed(exc)
                deferred.extend(window)
                continue
            for at, c in enumerate(window):
                if stop.is_set():
                    return
                chunk = self.index.chunks[c]
                with self._lock:
                    untouched = 0 < self._consumed_left[c] == self._share[c]
                    busy = c in self._inflight
                    if not busy and untouched and chunk.digest not in present:
                        self._inflight.add(c)
                if chunk.digest in present or not untouched or busy:
                    continue
                k = self._room_key(chunk.digest)
                if rooms.get(k, 0) < chunk.size and (self.spread is not None or not wait_when_full):
                    with self._lock:
                        self._inflight.discard(c)
                    if self.spread is not None:
                        deferred.append(c)
                        continue
                    return
                try:
                    done = self._insert_one(srv, c, stop, wait_when_full and self.spread is None)
                finally:
                    with self._lock:
                        self._inflight.discard(c)
                if done is None:  # the server failed: this chunk and the window's rest later
                    if not wait_when_full:
                        return
                    deferred.extend(window[at:])
                    break
                if not done:
                    if self.spread is None:
                        return
                    deferred.append(c)
                    continue
                rooms[k] = rooms.get(k, 0) - chunk.size

    def _insert_one(
        self, srv: CacheClient | SpreadCache, c: int, stop: threading.Event, wait_when_full: bool
    ) -> bool | None:
        """Read chunk ``c`` from the backing store once the cache has room, and insert it.
        False to stop inserting (full and not waiting); None when the server did not answer
        (the chunk is to be tried again later)."""
        chunk = self.index.chunks[c]
        while not stop.is_set():
            try:
                present, rooms = self._lookup(srv, [chunk.digest])
            except MicrocoError as exc:
                self._server_failed(exc)
                return None
            with self._lock:
                untouched = 0 < self._consumed_left[c] == self._share[c]
            if present or not untouched:
                return True
            if rooms.get(self._room_key(chunk.digest), 0) >= chunk.size:
                break
            if not wait_when_full:
                return False
            # Full of chunks someone still needs: wait until consumption frees room.
            stop.wait(0.05)
        else:
            return False
        if not self._claim_one(srv, chunk.digest):
            return True  # held by now, or another job reads it now
        data = self._from_peer(chunk.digest)
        if data is None:
            try:
                runs = sample_runs(self.index.samples_of(chunk))
                data = b"".join(b"".join(read_run(self.store, run)) for run in runs)
            except (OSError, MicrocoError) as exc:  # (a sample changed since registration: the step says so)
                log.warning("prefetch read failed: %s", exc)
                return True
            self.stats.backing_bytes += len(data)
        try:
            r = srv.put_chunks([(chunk.digest, data)], self.dataset, timeout=30)
        except MicrocoError as exc:
            self._server_failed(exc)
            r = None
        if r is not None and r.stored:
            self.stats.prefetched_chunks += 1
        elif r is None or r.rejected:
            self.stats.prefetch_rejected += 1
            # Read once, never twice: keep it for this job until it has consumed it.
            with self._lock:
                if self._consumed_left[c] > 0:
                    self._staged[chunk.digest] = data
            if r is None:
                return None  # (the staged copy serves this job; other chunks are tried later)
            return wait_when_full
        return True

    def _from_peer(self, chunk_digest: str) -> bytes | None:
        """Chunk ``chunk_digest`` whole from a peer holding it (checked), else None."""
        if self.peers is None:
            return None
        peer = self.peers.holders([chunk_digest]).get(chunk_digest)
        if peer is None:
            return None
        try:
            data = peer.read_chunks([chunk_digest], job_id=self.job_id, timeout=30).get(chunk_digest)
        except MicrocoError as exc:
            log.warning("peer cache server failed, reading from the backing store: %s", exc)
            self.peers.failed(peer)
            return None
        if data is None or digest(data) != chunk_digest:
            return None
        self.stats.peer_chunks += 1
        return data

    def _flush_timings(self) -> None:
        """Send the timings taken since the last progress report (none lost at an epoch's end)."""
        with self._lock:
            pending = bool(self._timings)
        if pending:
            self._report([])

    def finish(self) -> None:
        """Tell the server this job is done (it pins nothing any more) and stop background work."""
        self._prefetch_stop.set()
        self._flush_timings()  # a finished job's report carries no timings: they go first
        srv = self._server()
        if srv is not None:
            try:
                srv.report_progress(
                    self.job_id,
                    self.dataset,
                    self._epoch,
                    finished=True,
                    timeout=self.RPC_TIMEOUT_S,
                    retry=False,
                )
            except MicrocoError:
                pass

    def close(self) -> None:
        self.finish()
        if self._prefetch_thread is not None:
            self._prefetch_thread.join(timeout=5)
        self._puts.shutdown(wait=True)
        if self.peers is not None:
            self.peers.close()
        self._pool.shutdown(wait=False)

    # -- reads in DataLoader worker processes (``_workers.py``; the choice stays here)
    def begin_worker_epoch(self) -> None:
        """Before an epoch whose batches worker processes read (``plan_read``): finished
        chunks are then reported when each batch reaches the step, not when it is chosen
        (a worker may read it several batches later), and plans a stopped epoch left behind
        are dropped."""
        with self._lock:
            for _i, _t, _d, whole, _h in self._plans.values():
                self._inflight.difference_update(whole)
        self._plans.clear()
        self._held = []

    def worker_reader(self) -> Any:
        """A ``WorkerReader`` over this dataset, for worker processes (it pickles; it opens
        its own channels in the process that uses it)."""
        from ._workers import WorkerReader

        return WorkerReader(self.index, self.store, threads=self._fetch_workers)

    def _address_of(self, srv: CacheClient | SpreadCache, chunk_digest: str) -> tuple[str, bool]:
        """(address of the server holding or owning a chunk, whether it is on this host)."""
        if isinstance(srv, SpreadCache):
            m = srv.owner(chunk_digest)
            return (m.address, m.node == self.node) if m is not None else ("", False)
        return srv.address, True

    def plan_read(self, indices: Sequence[int], hits: Sequence[int]) -> Any:
        """A ``ReadPlan`` for a batch just chosen by ``batches()``: where each hit is cached,
        which missed chunks to read whole and insert (as ``read`` would), and the bytes of
        chunks held here. Nothing is read here; ``delivered`` counts the worker's report."""
        from ._workers import ReadPlan

        self._plan_seq += 1
        plan = ReadPlan(list(indices), self._plan_seq)
        plan.node, plan.dataset, plan.job_id = self.node, self.dataset, self.job_id
        done = self._held.pop() if self._held else []
        hit_set = set(hits)
        chosen = [i for i in indices if i in hit_set]
        with self._lock:
            for i in chosen:
                ref = self.index.samples[i]
                data = self._staged.get(self.index.chunks[ref.chunk].digest)
                if data is not None:
                    plan.inline[i] = data[ref.offset : ref.offset + ref.size]
            remote = dict(self._remote)
        srv = self._server()
        direct: set[str] = set()
        for i in chosen:
            if i in plan.inline:
                continue
            d = self.index.chunk_of(i).digest
            peer = remote.get(d)
            if peer is not None and peer.address:
                plan.sources.setdefault(peer.address, []).append(i)
            elif srv is not None:
                address, here = self._address_of(srv, d)
                if address:
                    plan.sources.setdefault(address, []).append(i)
                    if here and self.direct_read:
                        direct.add(address)
        plan.direct = tuple(sorted(direct))
        whole = self._chunks_to_fetch([i for i in indices if i not in hit_set], indices)
        if srv is not None:
            for c in whole:
                plan.whole[c] = self._address_of(srv, self.index.chunks[c].digest)[0]
        with self._lock:
            for c in [c for c, a in plan.whole.items() if not a]:
                del plan.whole[c]
                self._inflight.discard(c)
        self._fetched.update(plan.whole)
        self._plans[plan.seq] = (list(indices), self._taken(indices), done, sorted(plan.whole), chosen)
        return plan

    def delivered(self, report: Any, readers: int = 1) -> BatchRead | None:
        """A worker's ``ReadReport`` for a batch now handed to the step: counts it as ``read``
        does (hits only for samples served from a cache, not from a chunk this loader read
        whole), moves the position on, reports the batch's finished chunks. The batch's reads
        for the stall meter (``readers``: the workers reading batches at once), or None for a
        plan this loader did not make (a stopped epoch's)."""
        rec = self._plans.pop(report.seq, None)
        if rec is None:
            return None
        indices, taken, done, whole, hits = rec
        with self._lock:
            self._inflight.difference_update(whole)
            self._seen_in_epoch.update(indices)
            self._job_seen.update(taken)
        for address in dict.fromkeys(report.failed_servers):
            self._worker_server_failed(address)
        from_cache = set(report.from_cache)
        served = [i for i in indices if i in from_cache]
        real = [i for i in served if self.index.samples[i].chunk not in self._fetched]
        st = self.stats
        st.chunk_fetched += len(served) - len(real)
        st.hits += len(real)
        st.misses += len(indices) - len(real)
        st.hit_fallbacks += sum(1 for i in hits if i not in from_cache)
        st.backing_bytes += report.backing_bytes
        real_bytes = sum(self.index.samples[i].size for i in real)
        st.cache_bytes += real_bytes
        st.fill_bytes += report.fill_bytes
        st.fill_s += sum(s for _, s in report.ahead)
        st.corrupt_reported += report.corrupt_reported
        hit_s = report.hit_read_s * len(real) / len(served) if served else 0.0
        miss_s = report.hit_read_s - hit_s
        if report.backing_bytes:
            miss_s += report.backing_read_s * report.miss_bytes / report.backing_bytes
        used_ahead = tuple(i for i in served if i in self._read_ahead)
        self._read_ahead.difference_update(used_ahead)
        self._read_ahead.update(i for i, _ in report.ahead)
        self._report(done)
        return BatchRead(
            hits=len(real),
            misses=len(indices) - len(real),
            hit_read_s=hit_s,
            miss_read_s=miss_s,
            ahead=tuple(report.ahead),
            used_ahead=used_ahead,
            batch_bytes=report.batch_bytes,
            miss_bytes=report.batch_bytes - real_bytes,
            overlapped=True,
            readers=max(1, readers),
            work_s=report.work_s,
        )

    def _worker_server_failed(self, address: str) -> None:
        exc = Unavailable(f"cache server {address} failed a worker's read")
        if isinstance(self.client, SpreadCache):
            for m in self.client.members():
                if m.address == address:
                    self.client.failed(m, exc)
        elif isinstance(self.client, CacheClient) and self.client.address == address:
            self._server_failed(exc)
        elif self.peers is not None:
            with self._lock:
                peer = next((p for p in self._remote.values() if p.address == address), None)
            if peer is not None:
                self.peers.failed(peer)


def _ranks(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """(world size, rank): as given, else from an initialised ``torch.distributed`` process
    group, else one rank."""
    # Only a process that already imported torch can have a process group: importing it here
    # would cost seconds to every loader that does not use torch.
    dist = sys.modules.get("torch.distributed")
    if (world_size is None or rank is None) and dist is not None:
        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size() if world_size is None else world_size
            rank = dist.get_rank() if rank is None else rank
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size (got rank {rank} of {world_size})")
    return world_size, rank
