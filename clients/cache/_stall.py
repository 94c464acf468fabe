"""What caching would save a training step: per-batch points from counted reads, not waits.

Per batch the loader counts what it read and how long each read took: its hits (samples,
bytes, seconds reading them from the cache) and its misses (samples, bytes, and their share
of the backing-store read, a fetch's wall time apportioned by bytes). Samples a whole-chunk
fetch read for later batches (the cache's *fill*) are not this batch's misses: their share
of the fetch goes with them to the batch that uses them, at its read cost. The step's
compute time is measured by the loader (or the job's telemetry).

The step's *wait* is deliberately not used: a fill (up to a batch of whole chunks at once,
made only when the cache has room) makes the step wait for reads that are not this batch's,
and under load those bursts lengthen, so a compute-bound job would seem to gain from the
cache. Instead each batch gives what reading a whole batch would cost the step, from the
recent read costs of each kind (a window of batches, so hits and misses are priced at the
same moment, on the same machine load, for the same batch). A kind's cost is a line
``fixed + per byte x bytes`` fitted to its recent batches' reads: a batch's read of its hits
pays a call to the server once, however few hits it has, so the fixed part is not scaled up
as a per-byte price would be.

    read_miss = cost of reading the batch's bytes as misses
    read_hit  = cost of reading the batch's bytes as hits
    stall(r)  = max(0, r - compute)   with a reader ahead of the step (reads overlap compute)
              = max(0, (r + work) / N - compute)
                                      with N worker processes, each reading (and transforming:
                                      ``work``) a batch of its own, ahead of the step
              = r                     when the step reads itself

and reports the existing "mini-batch seconds at hit fraction h" model at its two ends:

    all-miss batch = compute + stall(read_miss)   (h = 0, with this batch's miss count)
    all-hit batch  = compute + stall(read_hit)    (h = 1, with this batch's hit count)

The sample counts keep the server's hit/miss counters exact; both points come from every
batch once both costs are known, so the comparison is paired rather than two phases apart.
A compute-bound job whose reads of a batch take less than its compute gains nothing; an
I/O-bound one gains the difference of the two read costs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

Timing = tuple[float, float, int, int]  # (hit fraction, seconds, batch bytes, samples)

#: How a miss is priced: ``stall``, what the step waits for it (the default, above); ``link``,
#: the whole read as if the step waited for all of it, even when a reader ahead hides it: the
#: time the read holds the backing store's link, which other jobs sharing the link pay for.
PRICES = ("stall", "link")


@dataclass(frozen=True)
class BatchRead:
    """One batch's reads as the loader did them. ``ahead``: (sample, seconds) of samples a
    whole-chunk fetch read for later batches (the fill); ``used_ahead``: samples read so by
    an earlier batch and used in this one (their seconds come along). ``miss_bytes``: bytes
    of this batch's misses (None: not counted, costs are then per sample). ``overlapped``: the read
    ran ahead of the step (a reader thread) rather than in it. ``readers``: how many batches are
    read at once ahead of the step (a ``DataLoader``'s worker processes, each reading its own
    batch; 1 for the loader's reader thread), so the step waits for ``1/readers`` of a batch's
    read; ``work_s``: what the reader spent on the batch besides reading it (a worker's
    transform and collate), which a hit does not save."""

    hits: int
    misses: int
    hit_read_s: float
    miss_read_s: float
    batch_bytes: int
    ahead: tuple[tuple[int, float], ...] = ()
    used_ahead: tuple[int, ...] = ()
    miss_bytes: int | None = None
    overlapped: bool = True
    readers: int = 1
    work_s: float = 0.0


class StallMeter:
    """Turns (reads, compute) per batch into timing points (see the module doc). Keeps the
    last ``window`` batches' read costs of each kind, and the read cost of samples fetched
    ahead until the batch that uses them."""

    def __init__(self, window: int = 16, price: str = "stall") -> None:
        if price not in PRICES:
            raise ValueError(f"price must be one of {', '.join(PRICES)}, not {price!r}")
        self.price = price
        #: The latest cost of reading one whole batch as misses, hidden behind compute or not:
        #: the time the job's misses hold the backing store (reported for the shared link's
        #: price in the allocation, ``services/cache/_allocation.py``); 0 until measured.
        self.miss_read_s = 0.0
        self.carry: dict[int, float] = {}
        self._hit: deque[tuple[float, float]] = deque(maxlen=window)  # (seconds, bytes or samples)
        self._miss: deque[tuple[float, float]] = deque(maxlen=window)

    @staticmethod
    def _cost(reads: deque[tuple[float, float]], amount: float) -> float | None:
        """Seconds to read ``amount`` (bytes or samples) of one kind in one batch: a line
        ``fixed + per x amount`` through the recent batches' reads (least squares; each
        batch's read pays a fixed cost, a call or a round trip, once whatever its size), or,
        while their amounts barely differ, their seconds per amount."""
        n = len(reads)
        total = sum(a for _, a in reads)
        if n == 0 or total <= 0:
            return None
        ma = total / n
        ms = sum(s for s, _ in reads) / n
        saa = sum((a - ma) ** 2 for _, a in reads)
        if saa <= (0.1 * ma) ** 2 * n:
            return ms / ma * amount
        per = sum((a - ma) * (s - ms) for s, a in reads) / saa
        fixed = ms - per * ma
        if per < 0:  # reads no slower for more: a fixed cost
            return ms
        if fixed < 0:  # no fixed cost: a line through 0
            return sum(s * a for s, a in reads) / sum(a * a for _, a in reads) * amount
        return fixed + per * amount

    def timings(self, read: BatchRead, compute_s: float) -> list[Timing]:
        n = read.hits + read.misses
        compute_s = max(0.0, compute_s)
        for i, cost in read.ahead:
            self.carry[i] = cost
        miss_s = read.miss_read_s + sum(self.carry.pop(i, 0.0) for i in read.used_ahead)
        if len(self.carry) > 1 << 20:  # samples fetched but never used (an epoch cut short)
            self.carry.clear()
        if n <= 0:
            return []
        if read.miss_bytes is not None:
            miss_bytes = min(max(0, read.miss_bytes), read.batch_bytes)
            size, hit_amount, miss_amount = read.batch_bytes, read.batch_bytes - miss_bytes, miss_bytes
        else:
            size, hit_amount, miss_amount = n, read.hits, read.misses
        if read.hits and hit_amount > 0:
            self._hit.append((max(0.0, read.hit_read_s), hit_amount))
        if read.misses and miss_amount > 0:
            self._miss.append((max(0.0, miss_s), miss_amount))
        out: list[Timing] = []
        for h, r, count in (
            (1.0, self._cost(self._hit, size), read.hits),
            (0.0, self._cost(self._miss, size), read.misses),
        ):
            if r is None:
                continue
            if h == 0.0:
                self.miss_read_s = r
            if read.overlapped and self.price == "stall":
                # N readers each on a batch of its own deliver one every (read + work) / N.
                stall = max(0.0, (r + max(0.0, read.work_s)) / max(1, read.readers) - compute_s)
            else:
                stall = r
            out.append((h, compute_s + stall, read.batch_bytes, count))
        return out


def stall_timings(read: BatchRead, compute_s: float) -> list[Timing]:
    """The (up to two) timing points for one batch, with nothing carried between batches."""
    return StallMeter().timings(read, compute_s)
