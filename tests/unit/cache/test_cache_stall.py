"""Allocation by measured stall time: counted reads in, the two-job decision out (no clock).

The loader's figures per batch are counted quantities (samples, bytes, their read seconds,
the step's compute seconds); these tests give them directly."""

from __future__ import annotations

import pytest

from microco.clients.cache._stall import BatchRead, StallMeter, stall_timings
from microco.services.cache._allocation import JobDemand, allocate, estimate_benefit

MB = 1 << 20


def test_a_batch_is_priced_at_its_kinds_read_costs_per_byte():
    # 6 hits (6 kB, 0.01 s) and 2 misses (2 kB, 0.09 s): a batch of 8 kB costs 8 x 1.667 ms
    # from the cache and 8 x 45 ms from the backing store.
    r = BatchRead(
        6, 2, hit_read_s=0.01, miss_read_s=0.09, batch_bytes=8000, miss_bytes=2000, overlapped=False
    )
    (hit, miss) = stall_timings(r, compute_s=0.2)
    assert hit[0] == 1.0 and hit[3] == 6 and abs(hit[1] - (0.2 + 8000 * 0.01 / 6000)) < 1e-12
    assert miss[0] == 0.0 and miss[3] == 2 and abs(miss[1] - (0.2 + 8000 * 0.09 / 2000)) < 1e-12
    # A reader ahead of the step: a read shorter than the step's compute costs the step nothing.
    (hit, miss) = stall_timings(BatchRead(6, 2, 0.01, 0.09, 8000, miss_bytes=2000), compute_s=0.2)
    assert hit[1] == 0.2 and abs(miss[1] - 0.36) < 1e-12  # 0.2 + (0.36 - 0.2)
    assert stall_timings(BatchRead(0, 0, 0, 0, 0), 1.0) == []


def test_each_batch_gives_both_ends_once_both_costs_are_known():
    # Paired points: a batch of misses only still gives the all-hit end at the hit cost just
    # measured (count 0: the server's hit counter stays exact), under the same compute.
    m = StallMeter()
    assert [
        p[0] for p in m.timings(BatchRead(0, 4, 0.0, 0.4, 4000, miss_bytes=4000, overlapped=False), 0.1)
    ] == [0.0]
    m.timings(BatchRead(4, 0, 0.004, 0.0, 4000, miss_bytes=0, overlapped=False), 0.1)
    pts = m.timings(BatchRead(0, 4, 0.0, 0.4, 4000, miss_bytes=4000, overlapped=False), 0.1)
    assert [(h, round(s, 9), n) for h, s, _, n in pts] == [(1.0, 0.104, 0), (0.0, 0.5, 4)]


def _job_timings(compute_s, miss_s_per_byte, hit_s_per_byte, batch, batch_bytes, batches=40, load=None):
    """What a loader's meter reports over ``batches`` batches read ahead of the step: the
    probe's all-miss and all-hit batches, then mixed ones (half hits). ``load(b)``: how much
    slower the machine reads in batch ``b`` (1: not)."""
    m = StallMeter()
    out = []
    for b in range(batches):
        k = load(b) if load else 1.0
        hits = batch if b % 3 == 1 else 0 if b % 3 == 0 else batch // 2
        mb = batch_bytes * (batch - hits) // batch
        r = BatchRead(
            hits,
            batch - hits,
            k * hit_s_per_byte * (batch_bytes - mb),
            k * miss_s_per_byte * mb,
            batch_bytes,
            miss_bytes=mb,
        )
        out += m.timings(r, compute_s)
    return out


def _two_jobs(load=None):
    # The case: a 300 MB cache; an I/O-bound job on 16 KB samples (compute 5 ms, a
    # batch of 1 MB of misses takes 0.3 s on the throttled store, from the cache 2 ms) and a
    # compute-bound job (0.3 s of compute per batch of 32 MB, whose misses alone take 0.15 s).
    io = _job_timings(0.005, 0.3 / MB, 0.002 / MB, 64, MB, load=load)
    cpu = _job_timings(0.3, 0.15 / (32 * MB), 0.004 / (32 * MB), 64, 32 * MB, load=load)
    est_io = estimate_benefit((h, s) for h, s, _, _ in io)
    est_cpu = estimate_benefit((h, s) for h, s, _, _ in cpu)
    assert est_io is not None and est_cpu is not None
    sizes = {"io": 20_000 * 16 * 1024, "cpu": 262 * MB}
    jobs = [JobDemand("io-job", "io", MB, est_io), JobDemand("cpu-job", "cpu", 32 * MB, est_cpu)]
    return est_io, est_cpu, {a.dataset: a for a in allocate(300 * MB, sizes, jobs)}


def test_two_jobs_io_bound_gets_most_of_the_cache():
    est_io, est_cpu, allocs = _two_jobs()
    assert est_io.gain > 0.9 and est_cpu.gain < 0.05
    assert allocs["io"].bytes >= 0.7 * 300 * MB
    assert "compute-bound" in allocs["cpu"].reason and allocs["cpu"].bytes <= 0.3 * 300 * MB


def test_load_that_changes_between_batches_moves_both_ends_together():
    # The machine reads 1.25x slower in every other stretch of 5 batches: hits and misses are
    # priced from the same recent window, so neither job's gain moves much, and the decision
    # is the same. (Reads that load makes longer than the compute would be a real stall.)
    est_io, est_cpu, allocs = _two_jobs(load=lambda b: 1.25 if (b // 5) % 2 else 1.0)
    assert est_io.gain > 0.9 and est_cpu.gain < 0.05
    assert allocs["io"].bytes >= 0.7 * 300 * MB


def test_two_unmeasured_jobs_both_get_a_probe_share():
    # A cache the size of one dataset, two new jobs: the first name must not take it all,
    # or the other can never be measured (and keeps the cache as "not yet measured" later).
    sizes = {"a-data": 20 * MB, "b-data": 20 * MB}  # each smaller than the probe share (64 MB)
    jobs = [JobDemand("a", "a-data", MB, None), JobDemand("b", "b-data", MB, None)]
    allocs = {a.dataset: a.bytes for a in allocate(20 * MB, sizes, jobs)}
    assert allocs["a-data"] >= 5 * MB and allocs["b-data"] >= 5 * MB
    assert sum(allocs.values()) <= 20 * MB


def test_samples_read_ahead_carry_their_read_cost_not_the_wait():
    m = StallMeter()
    # Batch 1: 2 misses (2 kB, 0.1 s); the chunk fetch also read 6 samples (6 kB) for later.
    r1 = BatchRead(
        0, 2, 0.0, 0.1, 2000, ahead=tuple((i, 0.05) for i in range(10, 16)), miss_bytes=2000, overlapped=False
    )
    (miss1,) = m.timings(r1, compute_s=0.0)
    assert abs(miss1[1] - 0.1) < 1e-12  # the batch's own misses only, not the fill
    # Batch 2 uses the 6 samples read ahead (from memory, no read now): their 0.3 s comes along.
    r2 = BatchRead(0, 6, 0.0, 0.0, 6000, used_ahead=tuple(range(10, 16)), miss_bytes=6000, overlapped=False)
    (miss2,) = m.timings(r2, compute_s=0.0)
    assert abs(miss2[1] - 6000 * 0.4 / 8000) < 1e-12 and not m.carry  # 0.4 s over 8 kB of misses


def _compute_bound_with_fills(meter, batches=30, batch=16, compute_s=0.3, sample_read_s=0.003):
    """A compute-bound job (0.3 s per step) whose reader runs ahead: reading a batch's misses
    alone takes 16 x 3 ms = 0.05 s, hidden behind the step. Every third batch also fills the
    cache: it reads 4 whole chunks (64 samples, used by later batches), a burst that makes
    the step wait (0.2 s, say; the meter that took the wait as the batch's stall charged it
    to misses: a 12% gain). The batches between use the samples read ahead and some hits."""
    out = []
    nxt = 1000
    pending: list[int] = []
    for b in range(batches):
        if b % 3 == 0:
            ahead = tuple((nxt + k, sample_read_s) for k in range(4 * batch))
            nxt += 4 * batch
            pending += [i for i, _ in ahead]
            r = BatchRead(0, batch, 0.0, batch * sample_read_s, batch * 1000, ahead=ahead)
        else:
            used, pending = tuple(pending[: batch // 2]), pending[batch // 2 :]
            r = BatchRead(batch // 2, batch // 2, 0.004, 0.0001, batch * 1000, used_ahead=used)
        out += meter.timings(r, compute_s=compute_s)
    return out


def test_a_compute_bound_job_is_not_credited_the_fill_it_waits_for():
    # Filling the cache (whole chunks read for later batches, only when there is room) is not
    # the cost of a miss: a job whose misses alone hide behind its compute gains ~nothing.
    pts = _compute_bound_with_fills(StallMeter())
    est = estimate_benefit((h, s) for h, s, _, _ in pts)
    assert est is not None
    assert est.gain < 0.05, est


def _first(ests, size=100 * MB):
    """The dataset ranked first when each of ``ests`` (dataset -> estimate) runs one job on
    a dataset of ``size`` with 1 MB batches and the cache holds one dataset."""
    jobs = [JobDemand(f"{ds}-job", ds, MB, est) for ds, est in ests.items()]
    allocs = allocate(size, dict.fromkeys(ests, size), jobs)
    return allocs[0].dataset


def test_jobs_are_compared_by_the_share_of_their_running_time_saved():
    # Same dataset size, same seconds saved per batch of the same bytes. Job a steps in 0.2 s
    # and caching halves it (an epoch of 20 s saves 10 s: half its running time); job b steps
    # in 2 s and caching saves 0.2 s of it (an epoch of 200 s saves 20 s: a tenth). Per hour
    # of running, the cache saves a 30 minutes and b 6: a is first.
    from microco.services.cache._allocation import BenefitEstimate

    a = BenefitEstimate(t_hit=0.1, t_miss=0.2, observations=40)
    b = BenefitEstimate(t_hit=1.8, t_miss=2.0, observations=40)
    assert _first({"a": a, "b": b}) == "a"


def test_a_job_measured_on_a_busier_machine_is_not_preferred_for_it():
    # Job a gains 30%, job b 20%, measured while the machine ran b's reads 3x slower: every
    # one of b's seconds is 3x, its gain is not. a is first.
    from microco.services.cache._allocation import BenefitEstimate

    a = BenefitEstimate(t_hit=0.14, t_miss=0.2, observations=40)
    b = BenefitEstimate(t_hit=3 * 0.16, t_miss=3 * 0.2, observations=40)
    assert _first({"a": a, "b": b}) == "a"


def test_a_reads_fixed_cost_per_batch_is_not_scaled_up_by_batches_with_few_hits():
    # Reading a batch's hits costs 20 ms (a call to the server) plus 1 ms per 16 kB sample. In
    # batches of 64 samples with 2, 4 or 8 hits, a whole batch of hits costs 20 + 64 = 84 ms,
    # not 64 x (20 + 2) / 2 ms: the call is made once per batch, whatever its number of hits.
    m = StallMeter()
    kb16 = 16_000
    for b in range(12):
        hits = (2, 4, 8)[b % 3]
        r = BatchRead(hits, 64 - hits, 0.02 + 0.001 * hits, 0.0, 64 * kb16, miss_bytes=(64 - hits) * kb16)
        m.timings(r, compute_s=0.0)
    (hit,) = [
        p
        for p in m.timings(BatchRead(2, 62, 0.022, 0.0, 64 * kb16, miss_bytes=62 * kb16), 0.0)
        if p[0] == 1.0
    ]
    assert abs(hit[1] - 0.084) < 1e-9, hit


def test_a_miss_priced_by_the_link_counts_its_whole_read_even_when_hidden():
    r = BatchRead(6, 2, 0.01, 0.09, 8000, miss_bytes=2000)  # read ahead of the step
    (hit, miss) = StallMeter(price="link").timings(r, compute_s=0.2)
    assert abs(hit[1] - (0.2 + 8000 * 0.01 / 6000)) < 1e-12  # not hidden behind the compute
    assert abs(miss[1] - 0.56) < 1e-12  # 0.2 + 0.36: the link is held 0.36 s, hidden or not
    with pytest.raises(ValueError, match="price"):
        StallMeter(price="wait")


def _worker_job(readers, compute_s, miss_s, hit_s, work_s, batch_bytes, batches=24):
    """What ``QuiverDataLoader``'s meter reports for a job whose ``readers`` worker processes
    each read (``miss_s`` or ``hit_s`` a batch) and transform (``work_s``) a batch of their own
    ahead of the step: all-miss and all-hit batches alternating."""
    m = StallMeter()
    out = []
    for b in range(batches):
        hit = b % 2 == 1
        r = BatchRead(
            8 if hit else 0,
            0 if hit else 8,
            hit_s if hit else 0.0,
            0.0 if hit else miss_s,
            batch_bytes,
            miss_bytes=0 if hit else batch_bytes,
            readers=readers,
            work_s=work_s,
        )
        out += m.timings(r, compute_s)
    return estimate_benefit((h, s) for h, s, _, _ in out)


def test_a_job_whose_worker_processes_hide_its_reads_gains_nothing():
    # Held out (session 42): make_dataloader(loader, num_workers=4), each worker reading a batch
    # of its own ahead of the step. A batch's misses take 0.12 s to read and 0.01 s to decode,
    # the step computes 0.05 s: four workers hand over a batch every 0.0325 s, so the step never
    # waits, hits or not. The meter priced a worker's read as if it were the only reader ahead
    # (0.05 + 0.07 s an all-miss batch): a 58% "saving", and the job took the cache from one that
    # gains (below). Measured on such a job (8 x 16 kB files a batch, 0.12 s a read, 4 workers):
    # epochs of 1.82 s without a cache and 1.84 s with it, the loader's saving 0.69.
    hidden = _worker_job(4, 0.05, 0.12, 0.002, 0.01, 8 * 16_000)
    assert hidden is not None and hidden.gain < 0.05, hidden
    # With one worker the same reads are not hidden: the step waits 0.12 + 0.01 - 0.05 s.
    one = _worker_job(1, 0.05, 0.12, 0.002, 0.01, 8 * 16_000)
    assert one is not None and abs(one.t_miss - 0.13) < 1e-9 and abs(one.t_hit - 0.05) < 1e-9, one
    # Four workers whose decoding alone outlasts the step: hits save the read's share only.
    busy = _worker_job(4, 0.05, 0.12, 0.002, 0.4, 8 * 16_000)
    assert busy is not None and abs(busy.t_miss - 0.13) < 1e-9 and abs(busy.t_hit - 0.1005) < 1e-9, busy
    # Beside a job that does wait for its reads (one reader, 0.3 s of misses, 5 ms of compute),
    # the one whose workers hide its reads gets no more than room nobody else wants.
    waits = _worker_job(1, 0.005, 0.3, 0.002, 0.0, MB)
    assert waits is not None and waits.gain > 0.9
    sizes = {"hidden": 200 * MB, "waits": 200 * MB}
    jobs = [JobDemand("w4", "hidden", 8 * 16_000, hidden), JobDemand("io", "waits", MB, waits)]
    allocs = {a.dataset: a for a in allocate(200 * MB, sizes, jobs)}
    assert allocs["waits"].bytes == 200 * MB and "compute-bound" in allocs["hidden"].reason
