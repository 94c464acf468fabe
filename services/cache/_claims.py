"""In-flight claims: one backing-store read of a chunk for every job that misses it at once.

A job about to read a whole chunk from the backing store claims it at the server (``Lookup``
with ``claim``). While the claim holds, a lookup by any other job answers the chunk as *in
flight*: its substitutable sampler takes other misses first and reads the chunk as a hit once
inserted, or waits for it (bounded) when it has nothing else to take. A claim ends when the
chunk is put (stored, present or refused: a refused chunk is kept briefly for its waiters,
``_transient``), when its holder is forgotten (finished, gone past the job TTL), or when its
lease runs out (a holder that died, or a read slower than the lease). A claim decides only who reads first: a chunk is
never refused to a reader because of one, and an expired claim is a second read, never a lost
chunk.

Pure state over a clock; the core holds the lock and does the waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Lease a claim gets when the client asks for none (seconds).
DEFAULT_LEASE_S = 10.0
#: Longest lease a client may ask for: a dead holder delays the others at most this long.
MAX_LEASE_S = 60.0
#: Longest a lookup may wait for chunks in flight (seconds); it holds a server thread.
MAX_WAIT_S = 5.0
#: Claims one server keeps at most (oldest expire first when over).
MAX_CLAIMS = 1 << 16


class Claims:
    """digest -> (holder job, expiry on the core's clock)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def expire(self, now: float) -> None:
        for d in [d for d, (_, until) in self._held.items() if until <= now]:
            del self._held[d]

    def holder(self, d: str, now: float) -> str | None:
        h = self._held.get(d)
        if h is None or h[1] <= now:
            return None
        return h[0]

    def claim(self, digests: Iterable[str], job: str, now: float, lease_s: float) -> list[str]:
        """Claim each digest for ``job`` unless another job holds it; the digests granted (a
        holder claiming again renews its lease)."""
        if not job:
            return []
        lease = DEFAULT_LEASE_S if lease_s <= 0 else min(lease_s, MAX_LEASE_S)
        granted = []
        for d in digests:
            h = self.holder(d, now)
            if h is not None and h != job:
                continue
            self._held.pop(d, None)  # (re-inserted last: the oldest claims go first when full)
            self._held[d] = (job, now + lease)
            granted.append(d)
        while len(self._held) > MAX_CLAIMS:
            del self._held[next(iter(self._held))]
        return granted

    def in_flight(self, digests: Sequence[str], job: str, now: float) -> list[str]:
        """Those of ``digests`` claimed by a job other than ``job``."""
        out = []
        for d in digests:
            h = self.holder(d, now)
            if h is not None and h != job:
                out.append(d)
        return out

    def release(self, digests: Iterable[str]) -> bool:
        """End the claims on ``digests`` (whoever holds them); True when one ended."""
        ended = False
        for d in digests:
            ended |= self._held.pop(d, None) is not None
        return ended

    def forget(self, jobs: Iterable[str]) -> bool:
        """End every claim held by ``jobs``; True when one ended."""
        gone = set(jobs)
        if not gone:
            return False
        ds = [d for d, (j, _) in self._held.items() if j in gone]
        for d in ds:
            del self._held[d]
        return bool(ds)

    def until(self, d: str) -> float | None:
        h = self._held.get(d)
        return None if h is None else h[1]
