"""What a training step waits for: stall time per mini-batch, split between hits and misses.

The loader measures, per batch, how long reading its hit samples took and how long reading
its misses took (a chunk fetched whole on a miss is apportioned by bytes: the samples used
now carry their share, the rest carry theirs to the batch that uses them), how long the
training step then *waited* for the batch (``wait_s``: zero when a prefetching reader was
ahead) and how long the step computed (``compute_s``). The wait is divided between the
batch's hits and misses in proportion to their read times, giving a per-sample stall for
each kind. What the server is told is the existing "mini-batch seconds at hit fraction h"
model, at its two ends, from these stalls:

    all-miss batch = compute + batch_size x stall per miss        (reported at h = 0)
    all-hit batch  = compute + batch_size x stall per hit         (reported at h = 1)

each with the number of samples of that kind (so the server's hit/miss counters stay exact).
The difference of the two is the time caching saves per batch; relative to the batch time it
is the job's gain. A compute-bound job whose reads are hidden behind compute waits ~0 either
way, so it gains ~nothing and gets little capacity; an I/O-bound one gets most.
"""

from __future__ import annotations

from dataclasses import dataclass

Timing = tuple[float, float, int, int]  # (hit fraction, seconds, batch bytes, samples)


@dataclass(frozen=True)
class BatchRead:
    """One batch's reads as the loader did them. ``ahead``: (sample, seconds) of samples a
    whole-chunk fetch read for later batches; ``used_ahead``: samples read so by an earlier
    batch and used in this one."""

    hits: int
    misses: int
    hit_read_s: float
    miss_read_s: float
    batch_bytes: int
    ahead: tuple[tuple[int, float], ...] = ()
    used_ahead: tuple[int, ...] = ()


class StallMeter:
    """Turns (reads, wait, compute) per batch into timing points. The part of a batch's
    wait spent reading samples for later batches (a whole chunk fetched on a miss) is
    carried to the samples themselves and charged to the batch that uses them: a chunk
    fetch's wait is the cost of all of its samples, not of the one that triggered it."""

    def __init__(self) -> None:
        self.carry: dict[int, float] = {}

    def timings(self, read: BatchRead, wait_s: float, compute_s: float) -> list[Timing]:
        n = read.hits + read.misses
        wait_s = max(0.0, wait_s)
        compute_s = max(0.0, compute_s)
        ahead_s = sum(c for _, c in read.ahead)
        total = read.hit_read_s + read.miss_read_s + ahead_s
        if total > 0:
            share = wait_s / total
            hit_part = read.hit_read_s * share
            miss_part = read.miss_read_s * share
        else:
            share = 0.0
            hit_part = wait_s * read.hits / n if n else 0.0
            miss_part = wait_s - hit_part
        for i, cost in read.ahead:
            self.carry[i] = cost * share
        miss_part += sum(self.carry.pop(i, 0.0) for i in read.used_ahead)
        if len(self.carry) > 1 << 20:  # samples fetched but never used (an epoch cut short)
            self.carry.clear()
        out: list[Timing] = []
        if n <= 0:
            return out
        if read.hits:
            out.append((1.0, compute_s + n * hit_part / read.hits, read.batch_bytes, read.hits))
        if read.misses:
            out.append((0.0, compute_s + n * miss_part / read.misses, read.batch_bytes, read.misses))
        return out


def stall_timings(read: BatchRead, wait_s: float, compute_s: float) -> list[Timing]:
    """The (up to two) timing points for one batch, with nothing carried between batches."""
    return StallMeter().timings(read, wait_s, compute_s)
