"""A loader's side of in-flight claims (the server's is ``services/cache/_claims``).

Two jobs of one dataset that run together miss the same chunks: without this, each reads a
chunk it misses from the backing store, though the other is reading it at that moment. Here
the job that reads a chunk whole claims it at its cache server first (one ``Lookup`` with
``claim``); every lookup answers which chunks another job has in flight, and:

- the substitutable sampler takes in-flight misses last (``miss_order``): other misses first,
  by when the chunk may have been inserted and is offered as a hit;
- a batch that must take an in-flight miss (nothing else left to take) waits for it, bounded
  (``CLAIM_WAIT_S``), and reads it as a hit once inserted; if it did not come (refused by the
  cache, the claim's lease ended) the job reads its samples itself;
- a claim another job won in the meantime is not read: its samples wait the same way.

A spread cache (``SpreadCache``) and batches read in DataLoader worker processes do not claim
(each loader reads as before); a server that does not know claims answers none in flight and
grants every claim (read as before).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from microco.common.errors import MicrocoError

from ._client import CacheClient

if TYPE_CHECKING:
    from ._index import DatasetIndex
    from ._spread import SpreadCache


class InFlight:
    """Mixin of ``QuiverLoader``: the attributes below are the loader's."""

    #: Claim chunks read whole, and wait for those other jobs claimed (False: read as before).
    CLAIMS = True
    #: A claim's lease (seconds): a holder that dies delays the others at most this long.
    CLAIM_LEASE_S = 10.0
    #: How long a batch waits at most for chunks another job has in flight.
    CLAIM_WAIT_S = 2.0

    index: DatasetIndex
    dataset: str
    job_id: str
    _lock: threading.Lock
    _inflight: set[int]

    if TYPE_CHECKING:

        def _server(self) -> CacheClient | SpreadCache | None: ...
        def _server_failed(self, exc: Exception) -> None: ...
        def _read_hits(self, hits: Sequence[int]) -> dict[int, bytes]: ...

    def _claims_init(self) -> None:
        # Chunk digests another job had in flight at the last lookup that asked about them.
        self._elsewhere: set[str] = set()
        self.claims_lost = 0  # whole-chunk reads not made: another job had claimed the chunk
        self.claim_waits = 0  # batches that waited for chunks in flight
        self.claim_waited = 0  # samples those waits then read as hits

    def _note_in_flight(self, asked: Sequence[str], in_flight: set[str]) -> None:
        if not self.CLAIMS:
            return
        with self._lock:
            self._elsewhere.difference_update(asked)
            self._elsewhere |= in_flight

    def _miss_order(self, i: int) -> int:
        """1 for a sample whose chunk another job has in flight (taken after other misses)."""
        return 1 if self.index.chunk_of(i).digest in self._elsewhere else 0

    def _claimer(self) -> CacheClient | None:
        srv = self._server()
        return srv if isinstance(srv, CacheClient) and self.job_id and self.CLAIMS else None

    def _claim_whole(self, whole: set[int], rest: Sequence[int]) -> tuple[set[int], set[int]]:
        """Claim the chunks about to be read whole; (those granted, the chunks of ``rest`` to
        wait for: in flight elsewhere, or held by now)."""
        srv = self._claimer()
        if srv is None:
            return whole, set()
        lost: set[int] = set()
        if whole:
            by_digest = {self.index.chunks[c].digest: c for c in whole}
            asked = sorted(by_digest)
            try:
                ans = srv.lookup_claim(
                    asked,
                    self.dataset,
                    self.job_id,
                    claim=asked,
                    lease_s=self.CLAIM_LEASE_S,
                    timeout=5,
                    retry=False,
                )
            except MicrocoError as exc:
                self._server_failed(exc)
                return whole, set()
            self._note_in_flight(asked, ans.in_flight)
            # (Granted unless held or in flight: a server without claims grants them all.)
            lost = {c for d, c in by_digest.items() if d in ans.in_flight or d in ans.present}
            if lost:
                with self._lock:
                    self._inflight.difference_update(lost)
                self.claims_lost += len(lost)
                whole = whole - lost
        with self._lock:
            elsewhere = set(self._elsewhere)
        waiting = set(lost)
        for i in rest:
            c = self.index.samples[i].chunk
            if c not in whole and self.index.chunks[c].digest in elsewhere:
                waiting.add(c)
        return whole, waiting

    def _await_chunks(self, late: Sequence[int]) -> dict[int, bytes]:
        """Wait (bounded) for the chunks of ``late`` another job has in flight; the samples
        then read as hits (the rest are the caller's to read)."""
        srv = self._claimer()
        if srv is None or not late:
            return {}
        asked = sorted({self.index.chunk_of(i).digest for i in late})
        try:
            ans = srv.lookup_claim(
                asked, self.dataset, self.job_id, wait_s=self.CLAIM_WAIT_S, timeout=5, retry=False
            )
        except MicrocoError as exc:
            self._server_failed(exc)
            return {}
        self._note_in_flight(asked, ans.in_flight)
        self.claim_waits += 1
        got = self._read_hits([i for i in late if self.index.chunk_of(i).digest in ans.present])
        self.claim_waited += len(got)
        return got

    def _claim_one(self, srv: CacheClient | SpreadCache, chunk_digest: str) -> bool:
        """Claim one chunk before a prefetch reads it; False when another job has it in flight
        or it is held (nothing to read), True to read it (claimed, or the server did not answer)."""
        if not isinstance(srv, CacheClient) or not self.job_id or not self.CLAIMS:
            return True
        try:
            ans = srv.lookup_claim(
                [chunk_digest],
                self.dataset,
                self.job_id,
                claim=[chunk_digest],
                lease_s=self.CLAIM_LEASE_S,
                timeout=5,
                retry=False,
            )
        except MicrocoError as exc:
            # Not answered: read it unclaimed (a claim only saves a second read; the insert
            # that follows meets the same server and says what to do).
            self._server_failed(exc)
            return True
        self._note_in_flight([chunk_digest], ans.in_flight)
        return chunk_digest not in ans.in_flight and chunk_digest not in ans.present
