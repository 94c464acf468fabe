"""Allocation by measured stall time: recorded figures in, the two-job decision out (no clock)."""

from __future__ import annotations

from microco.clients.cache._stall import BatchRead, stall_timings
from microco.services.cache._allocation import JobDemand, allocate, estimate_benefit

MB = 1 << 20


def test_wait_is_split_between_hits_and_misses_by_read_time():
    r = BatchRead(hits=6, misses=2, hit_read_s=0.01, miss_read_s=0.09, batch_bytes=8000)
    (hit, miss) = stall_timings(r, wait_s=0.05, compute_s=0.2)
    assert hit[0] == 1.0 and hit[3] == 6 and abs(hit[1] - (0.2 + 8 * 0.005 / 6)) < 1e-12
    assert miss[0] == 0.0 and miss[3] == 2 and abs(miss[1] - (0.2 + 8 * 0.045 / 2)) < 1e-12
    # A reader that was ahead: no wait, so hits and misses cost the step the same.
    (hit, miss) = stall_timings(r, wait_s=0.0, compute_s=0.2)
    assert hit[1] == miss[1] == 0.2
    assert stall_timings(BatchRead(0, 0, 0, 0, 0), 1.0, 1.0) == []


def _job_timings(compute_s, miss_wait_s, hit_wait_s, batch, batch_bytes, batches=40):
    """What a loader records over ``batches`` batches: the probe's all-miss and all-hit
    batches, then mixed ones (half hits), with the given waits."""
    out = []
    for b in range(batches):
        if b % 3 == 0:
            r, wait = BatchRead(0, batch, 0.0, miss_wait_s + 0.01, batch_bytes), miss_wait_s
        elif b % 3 == 1:
            r, wait = BatchRead(batch, 0, hit_wait_s + 0.001, 0.0, batch_bytes), hit_wait_s
        else:
            half = batch // 2
            r = BatchRead(half, batch - half, 0.001, miss_wait_s / 2 + 0.005, batch_bytes)
            wait = (miss_wait_s + hit_wait_s) / 2
        out += stall_timings(r, wait, compute_s)
    return out


def test_two_jobs_io_bound_gets_most_of_the_cache():
    # The case: a 300 MB cache; an I/O-bound job on 16 KB samples (compute 5 ms,
    # a batch of misses waits 0.3 s on a 50 MB/s store) and a compute-bound job (0.3 s of
    # compute per batch, its reads hidden behind compute by the prefetching reader).
    io = _job_timings(compute_s=0.005, miss_wait_s=0.3, hit_wait_s=0.002, batch=64, batch_bytes=MB)
    cpu = _job_timings(compute_s=0.3, miss_wait_s=0.004, hit_wait_s=0.0, batch=64, batch_bytes=32 * MB)
    est_io, est_cpu = (
        estimate_benefit((h, s) for h, s, _, _ in io),
        estimate_benefit((h, s) for h, s, _, _ in cpu),
    )
    assert est_io is not None and est_cpu is not None
    assert est_io.gain > 0.9 and est_cpu.gain < 0.05
    sizes = {"io": 20_000 * 16 * 1024, "cpu": 262 * MB}
    jobs = [JobDemand("io-job", "io", MB, est_io), JobDemand("cpu-job", "cpu", 32 * MB, est_cpu)]
    allocs = {a.dataset: a for a in allocate(300 * MB, sizes, jobs)}
    assert allocs["io"].bytes >= 0.7 * 300 * MB
    assert "compute-bound" in allocs["cpu"].reason and allocs["cpu"].bytes <= 0.3 * 300 * MB


def test_two_unmeasured_jobs_both_get_a_probe_share():
    # A cache the size of one dataset, two new jobs: the first name must not take it all,
    # or the other can never be measured (and keeps the cache as "not yet measured" later).
    sizes = {"a-data": 20 * MB, "b-data": 20 * MB}  # each smaller than the probe share (64 MB)
    jobs = [JobDemand("a", "a-data", MB, None), JobDemand("b", "b-data", MB, None)]
    allocs = {a.dataset: a.bytes for a in allocate(20 * MB, sizes, jobs)}
    assert allocs["a-data"] >= 5 * MB and allocs["b-data"] >= 5 * MB
    assert sum(allocs.values()) <= 20 * MB


def test_a_whole_chunk_fetch_wait_is_carried_to_the_samples_it_read():
    from microco.clients.cache._stall import StallMeter

    m = StallMeter()
    # Batch 1: 2 misses, whose chunk fetch also read 6 samples for later (3x their bytes).
    r1 = BatchRead(0, 2, 0.0, 0.1, 2000, ahead=tuple((i, 0.05) for i in range(10, 16)))
    (miss1,) = m.timings(r1, wait_s=0.4, compute_s=0.0)
    assert abs(miss1[1] - 2 * (0.4 * 0.1 / 0.4) / 2) < 1e-12  # a quarter of the wait is theirs
    # Batch 2 uses the 6 samples read ahead (no wait now): their share of batch 1's wait comes along.
    r2 = BatchRead(0, 6, 0.0, 0.0, 6000, used_ahead=tuple(range(10, 16)))
    (miss2,) = m.timings(r2, wait_s=0.0, compute_s=0.0)
    assert abs(miss2[1] - 0.3) < 1e-12 and not m.carry  # 6 x 0.05 s, over 6 samples x 6


def _compute_bound_with_fills(meter, batches=30, batch=16, compute_s=0.3, sample_read_s=0.003):
    """A compute-bound job (0.3 s per step) whose reader runs ahead: reading a batch's misses
    alone takes 16 x 3 ms = 0.05 s, hidden behind the step. Every third batch also fills the
    cache: it reads 4 whole chunks (64 samples, used by later batches), and that burst makes
    the step wait 0.2 s. The batches between use the samples read ahead and some hits."""
    out = []
    nxt = 1000
    pending: list[int] = []
    for b in range(batches):
        if b % 3 == 0:
            ahead = tuple((nxt + k, sample_read_s) for k in range(4 * batch))
            nxt += 4 * batch
            pending += [i for i, _ in ahead]
            r = BatchRead(0, batch, 0.0, batch * sample_read_s, batch * 1000, ahead=ahead)
            wait = 0.2
        else:
            used, pending = tuple(pending[: batch // 2]), pending[batch // 2 :]
            r = BatchRead(batch // 2, batch // 2, 0.004, 0.0001, batch * 1000, used_ahead=used)
            wait = 0.0
        out += meter.timings(r, wait_s=wait, compute_s=compute_s)
    return out


def test_a_compute_bound_job_is_not_credited_the_fill_it_waits_for():
    # Filling the cache (whole chunks read for later batches, only when there is room) is not
    # the cost of a miss: a job whose misses alone hide behind its compute gains ~nothing.
    from microco.clients.cache._stall import StallMeter

    pts = _compute_bound_with_fills(StallMeter())
    est = estimate_benefit((h, s) for h, s, _, _ in pts)
    assert est is not None
    assert est.gain < 0.05, est
