"""Chunks the cache refused while other jobs waited on their in-flight claim.

A claimed chunk's put can be refused (the cache is full of chunks it values more, or the
dataset is over its allocation). Before, the claim ended there and every job waiting on it read
the chunk from the backing store itself: the claim saved nothing. Now the server keeps such a
chunk in memory, outside the allocation, for a short time (``TTL_S``): lookups answer it
present and reads serve it, so the waiters get it without a second backing-store read. It is
never counted in the ledger, never evicts anything and is never advertised to peers.

Memory is bounded: at most ``MAX_BYTES`` held at once (the oldest go first when a new one
does not fit; a chunk larger than the bound is not kept), each for at most ``TTL_S`` seconds
on the core's clock, and dropped at once when the chunk is stored for real. A waiter that
comes after the copy expired reads the backing store, as it did before.

Pure state over a clock; the core holds the lock.
"""

from __future__ import annotations

from collections import OrderedDict

#: Bytes of refused chunks kept for their waiters at most.
MAX_BYTES = 64 << 20
#: How long a refused chunk is kept for its waiters (seconds): longer than a loader waits for
#: a chunk in flight (2 s) plus its read, short enough that the bytes are not a second cache.
TTL_S = 10.0


class Transient:
    """digest -> (bytes, expiry on the core's clock), bounded in bytes."""

    def __init__(self, max_bytes: int = MAX_BYTES, ttl_s: float = TTL_S) -> None:
        if max_bytes < 0 or ttl_s < 0:
            raise ValueError("transient bounds must not be negative")
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.used = 0
        self.kept = 0  # chunks kept so far
        self.served = 0  # reads served from a kept chunk
        self._held: OrderedDict[str, tuple[bytes, float]] = OrderedDict()

    def __contains__(self, d: object) -> bool:
        return d in self._held

    def __len__(self) -> int:
        return len(self._held)

    def expire(self, now: float) -> None:
        for d in [d for d, (_, until) in self._held.items() if until <= now]:
            self.drop(d)

    def keep(self, d: str, data: bytes, now: float) -> bool:
        """Keep ``data`` for ``ttl_s``; False when it cannot fit the bound at all."""
        self.expire(now)
        if len(data) > self.max_bytes or self.ttl_s <= 0:
            return False
        self.drop(d)
        while self.used + len(data) > self.max_bytes:
            self.drop(next(iter(self._held)))
        self._held[d] = (data, now + self.ttl_s)
        self.used += len(data)
        self.kept += 1
        return True

    def get(self, d: str, now: float) -> bytes | None:
        h = self._held.get(d)
        if h is None:
            return None
        if h[1] <= now:
            self.drop(d)
            return None
        self.served += 1
        return h[0]

    def drop(self, d: str) -> None:
        h = self._held.pop(d, None)
        if h is not None:
            self.used -= len(h[0])
