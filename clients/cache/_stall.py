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
    """One batch's reads as the loader did them."""

    hits: int
    misses: int
    hit_read_s: float
    miss_read_s: float
    batch_bytes: int


def stall_timings(read: BatchRead, wait_s: float, compute_s: float) -> list[Timing]:
    """The (up to two) timing points for one batch: see the module's docstring."""
    n = read.hits + read.misses
    if n <= 0:
        return []
    wait_s = max(0.0, wait_s)
    compute_s = max(0.0, compute_s)
    total = read.hit_read_s + read.miss_read_s
    if total > 0:
        hit_part = wait_s * read.hit_read_s / total
    else:
        hit_part = wait_s * read.hits / n
    miss_part = wait_s - hit_part
    out: list[Timing] = []
    if read.hits:
        out.append((1.0, compute_s + n * hit_part / read.hits, read.batch_bytes, read.hits))
    if read.misses:
        out.append((0.0, compute_s + n * miss_part / read.misses, read.batch_bytes, read.misses))
    return out
