"""A cache spread over hosts: several cache servers hold disjoint parts of a dataset.

``SpreadCache`` stands where a loader's single ``CacheClient`` would. Each chunk has one
owner among the live cache servers registered in etcd (rendezvous hashing over their
placement keys, ``_placement``): a chunk's lookup and its insert go to its owner; hits are
read from the owner (the loader reads granted files directly when the owner is on its host,
and streams otherwise). Co-ordinated eviction spans the servers because every loader reports
its progress (the chunks it has consumed this epoch, its batch timings) to every server, and
each server is told that the dataset's size is the bytes of the chunks it owns: its allocation
for the dataset is bounded by its share, so a dataset's allocation is split over the servers
in proportion to what each owns.

A server's placement key is its ``node`` label (one cache server per host; a restarted server
keeps its share), else its instance id. A server that fails a call is skipped for
``retry_s``: its chunks read as misses and its inserts as refused, so nothing is lost and
nothing moves; one whose etcd lease expires leaves the placement, and only its chunks move.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from microco.api.cache.v1 import cache_pb2
from microco.common.errors import MicrocoError

from ._client import CacheClient
from ._placement import owner, place

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One cache server of the spread: its placement key, address and host."""

    key: str
    address: str
    node: str = ""


def members_from_records(records: Iterable[Any]) -> list[Member]:
    """Members from the registry's ``ServiceRecord``s: keyed by node (one server per host),
    by ``node/instance`` where two live servers claim one node, by instance id with no node."""
    recs = sorted(records, key=lambda r: (r.labels.get("node", ""), r.instance_id))
    nodes: dict[str, int] = {}
    for r in recs:
        n = r.labels.get("node", "")
        nodes[n] = nodes.get(n, 0) + 1
    out = []
    for r in recs:
        n = r.labels.get("node", "")
        key = n if n and nodes[n] == 1 else (f"{n}/{r.instance_id}" if n else r.instance_id)
        out.append(Member(key, r.address, n))
    return out


class SpreadCache:
    """Routes a loader's cache calls to each chunk's owner among several cache servers.

    ``kv``: etcd, where the live servers are found (every ``refresh_s``), those whose labels
    include ``labels`` (e.g. ``{"pool": "train"}`` for servers started with ``--label
    pool=train``; all by default); or ``members``, a fixed list. The methods mirror ``CacheClient``'s that the loader uses and never raise for
    one server's failure (that server is skipped for ``retry_s``)."""

    def __init__(
        self,
        kv: Any = None,
        *,
        members: Sequence[Member] | None = None,
        labels: Mapping[str, str] | None = None,
        refresh_s: float = 2.0,
        retry_s: float = 2.0,
        timeout: float = 10.0,
    ) -> None:
        if kv is None and members is None:
            raise ValueError("SpreadCache needs etcd (kv) or a list of members")
        self.kv = kv
        self.labels = dict(labels or {})
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.timeout = timeout
        self.address = "spread"
        self.failures = 0
        self._lock = threading.Lock()
        self._members: list[Member] = sorted(members or [], key=lambda m: m.key)
        self._refreshed = -1e18 if members is None else float("inf")
        self._clients: dict[str, CacheClient] = {}
        self._down: dict[str, float] = {}
        # Datasets placed with bounded loads (``place``): name -> chunk sizes, and the placement
        # for the current membership.
        self._datasets: dict[str, dict[str, int]] = {}
        self._placed: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}

    # -- membership and placement
    def members(self) -> list[Member]:
        """The live servers (from etcd at most every ``refresh_s``), by placement key."""
        now = time.monotonic()
        if self.kv is not None and now - self._refreshed >= self.refresh_s:
            from microco.common.registry import discover

            try:
                found = members_from_records(
                    r
                    for r in discover(self.kv, "cache")
                    if all(r.labels.get(k) == v for k, v in self.labels.items())
                )
            except Exception as exc:  # noqa: BLE001 - etcd trouble: keep the servers we know
                log.warning("cannot list cache servers: %s", exc)
                found = None
            with self._lock:
                self._refreshed = now
                if found is not None and found != self._members:
                    log.info("cache servers: %s", [m.key for m in found])
                    self._members = found
        with self._lock:
            return list(self._members)

    def place(self, dataset: str, chunk_sizes: Mapping[str, int]) -> None:
        """Place ``dataset``'s chunks (digest -> size) with bounded loads (``_placement.place``),
        so that few chunks are not lumped on one server. A loader places its dataset; chunks of
        no placed dataset go by rendezvous alone."""
        with self._lock:
            self._datasets[dataset] = dict(chunk_sizes)
            self._placed.pop(dataset, None)

    def _placement(self, dataset: str, keys: tuple[str, ...]) -> dict[str, str]:
        with self._lock:
            got = self._placed.get(dataset)
            if got is None or got[0] != keys:
                got = self._placed[dataset] = (keys, place(self._datasets[dataset], keys))
            return got[1]

    def _owner_key(self, chunk_digest: str, keys: tuple[str, ...]) -> str | None:
        for name in list(self._datasets):
            if chunk_digest in self._datasets[name]:
                return self._placement(name, keys).get(chunk_digest)
        return owner(chunk_digest, keys)

    def owned_bytes(self, dataset: str, keys: Sequence[str]) -> dict[str, int]:
        """Server key -> bytes of placed ``dataset``'s chunks it owns among ``keys``."""
        sizes = self._datasets[dataset]
        out = dict.fromkeys(sorted(set(keys)), 0)
        for d, k in self._placement(dataset, tuple(out)).items():
            out[k] += sizes[d]
        return out

    def owner(self, chunk_digest: str, members: Sequence[Member] | None = None) -> Member | None:
        ms = self.members() if members is None else members
        k = self._owner_key(chunk_digest, tuple(sorted(m.key for m in ms)))
        return next((m for m in ms if m.key == k), None)

    def owner_key(self, chunk_digest: str) -> str:
        m = self.owner(chunk_digest)
        return m.key if m is not None else ""

    def split(self, chunk_digests: Iterable[str]) -> dict[Member, list[str]]:
        """Owner -> the given chunks it owns (servers that are down left out)."""
        ms = self.members()
        keys = tuple(sorted(m.key for m in ms))
        by_key = {m.key: m for m in ms}
        out: dict[Member, list[str]] = {}
        now = time.monotonic()
        for d in chunk_digests:
            k = self._owner_key(d, keys)
            if k is None or self._down.get(k, 0) > now:
                continue
            out.setdefault(by_key[k], []).append(d)
        return out

    def client(self, m: Member) -> CacheClient:
        with self._lock:
            c = self._clients.get(m.key)
            if c is None or c.address != m.address:
                if c is not None:
                    c.close()
                c = self._clients[m.key] = CacheClient(m.address, timeout=self.timeout)
            return c

    def failed(self, m: Member, exc: Exception) -> None:
        self.failures += 1
        self._down[m.key] = time.monotonic() + self.retry_s
        log.warning("cache server %s unavailable, its chunks read as misses: %s", m.key, exc)

    def _live(self) -> list[Member]:
        now = time.monotonic()
        return [m for m in self.members() if self._down.get(m.key, 0) <= now]

    # -- the calls a loader makes
    def lookup_rooms(
        self, chunk_digests: Sequence[str], dataset: str, job_id: str
    ) -> tuple[set[str], dict[str, int]]:
        """(chunks held by their owners, owner key -> bytes of ``dataset`` it could admit now).
        Every live server is asked for its room, with the chunks it owns."""
        groups = self.split(chunk_digests)
        held: set[str] = set()
        rooms: dict[str, int] = {}
        for m in self._live():
            try:
                present, rooms[m.key] = self.client(m).lookup_room(
                    groups.get(m, []), dataset, job_id, timeout=5, retry=False
                )
            except MicrocoError as exc:
                self.failed(m, exc)
                continue
            held |= present
        return held, rooms

    def put_chunks(
        self, chunks: Sequence[tuple[str, bytes]], dataset: str = "", **_kw: Any
    ) -> cache_pb2.PutChunksResponse:
        """Each chunk to its owner; one answer for all (a chunk with no live owner is refused)."""
        data = dict(chunks)
        out = cache_pb2.PutChunksResponse()
        placed: set[str] = set()
        for m, ds in self.split(data).items():
            try:
                r = self.client(m).put_chunks([(d, data[d]) for d in ds], dataset, timeout=30)
            except MicrocoError as exc:
                self.failed(m, exc)
                continue
            out.stored.extend(r.stored)
            out.present.extend(r.present)
            out.rejected.extend(r.rejected)
            placed.update(ds)
        for d in data:
            if d not in placed:
                out.rejected.add(digest=d, reason="no_server", detail="no live cache server owns it")
        return out

    def report_corrupt(self, chunk_digest: str, **_kw: Any) -> bool:
        m = self.owner(chunk_digest)
        if m is None:
            return False
        try:
            return self.client(m).report_corrupt(chunk_digest, timeout=5, retry=False)
        except MicrocoError as exc:
            self.failed(m, exc)
            return False

    def report_progress(
        self,
        job_id: str,
        dataset: str,
        epoch: int,
        consumed: Sequence[str] = (),
        timings: Sequence[tuple[float, float, int, int]] = (),
        *,
        user: str = "",
        dataset_bytes: int | Callable[[list[str]], Mapping[str, int]] = 0,
        finished: bool = False,
        miss_read_s: float = 0.0,
        **_kw: Any,
    ) -> None:
        """To every live server: the consumed chunks (so that each evicts only what every job
        has finished), the timings (each server's benefit estimate; the sample counts go to
        one server only, so hits and misses summed over servers are exact), and the
        dataset's size *on that server*: ``dataset_bytes(keys)`` -> the bytes each owns."""
        live = self._live()
        keys = [m.key for m in self.members()]
        sizes = dataset_bytes(keys) if callable(dataset_bytes) else {}
        zeroed = [(h, s, b, 0) for h, s, b, _n in timings]
        for j, m in enumerate(live):
            size = sizes.get(m.key, 0) if callable(dataset_bytes) else dataset_bytes
            try:
                self.client(m).report_progress(
                    job_id,
                    dataset,
                    epoch,
                    consumed,
                    timings if j == 0 else zeroed,
                    user=user,
                    dataset_bytes=size,
                    finished=finished,
                    miss_read_s=miss_read_s,
                    timeout=5,
                    retry=False,
                )
            except MicrocoError as exc:
                self.failed(m, exc)

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self) -> SpreadCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
