"""Pure core of the cache: addressing, index, chunking, eviction, allocation (no sockets)."""

from __future__ import annotations

import pytest

from microco.clients.cache import _digest as d
from microco.clients.cache._index import DatasetIndex, build_index, plan_chunks
from microco.common.errors import FailedPrecondition, InvalidArgument
from microco.services.cache._allocation import BenefitEstimate, JobDemand, allocate, estimate_benefit
from microco.services.cache._eviction import (
    ConsumptionTracker,
    Ledger,
    Outcome,
    make_policy,
)


def _files(n: int, size: int = 100, salt: bytes = b"") -> dict[str, bytes]:
    return {f"s{i:04d}.bin": (salt + bytes([i % 251]) * size)[:size] for i in range(n)}


def _index(files: dict[str, bytes], chunk_bytes: int = 350) -> DatasetIndex:
    return build_index([(p, len(b)) for p, b in files.items()], files.__getitem__, chunk_bytes)


def test_digest_and_locators_are_distinct_one_way_names():
    h = d.digest(b"hello")
    assert d.is_digest(h) and not d.is_digest(h.upper()) and not d.is_digest("xyz")
    assert d.file_locator(h) != d.directory_locator(h)
    assert h not in (d.file_locator(h), d.directory_locator(h))


def test_plan_chunks_cuts_at_target_and_keeps_big_samples_alone():
    assert plan_chunks([100] * 7, 350) == [3, 3, 1]
    assert plan_chunks([1000, 10, 10], 350) == [1, 2]
    assert plan_chunks([], 350) == []
    with pytest.raises(ValueError):
        plan_chunks([1], 0)


def test_index_is_deterministic_and_roundtrips():
    files = _files(10)
    a, b = _index(files), _index(dict(reversed(list(files.items()))))
    assert a == b and a.digest == b.digest
    assert [c.count for c in a.chunks] == [3, 3, 3, 1]
    chunk = a.chunks[1]
    data = b"".join(files[s.path] for s in a.samples_of(chunk))
    assert d.digest(data) == chunk.digest and chunk.size == len(data)
    assert a.split_chunk(chunk, data) == [files[s.path] for s in a.samples_of(chunk)]
    raw = a.to_bytes()
    assert DatasetIndex.from_bytes(raw, a.digest) == a
    with pytest.raises(FailedPrecondition):
        DatasetIndex.from_bytes(raw + b" ", a.digest)
    with pytest.raises(InvalidArgument):
        DatasetIndex.from_bytes(b'{"version": 1}')


def test_same_bytes_under_other_names_share_chunk_digests():
    files = _files(6)
    renamed = {f"user2/{p}": b for p, b in files.items()}
    assert [c.digest for c in _index(files).chunks] == [c.digest for c in _index(renamed).chunks]
    other = _index(_files(6, salt=b"x"))
    assert not {c.digest for c in other.chunks} & {c.digest for c in _index(files).chunks}


def test_lru_evicts_least_recently_used():
    led, cons, lru = Ledger(), ConsumptionTracker(), make_policy("lru")
    for k in "abc":
        led.add(k, 10, "ds")
    led.touch("a")
    adm = lru.admit(led, 30, "d", 10, "ds", cons)
    assert adm.outcome is Outcome.ADMIT and adm.victims == ("b",)
    assert lru.admit(led, 30, "a", 10, "ds", cons).outcome is Outcome.PRESENT
    assert lru.admit(led, 30, "z", 31, "ds", cons).outcome is Outcome.TOO_LARGE
    with pytest.raises(InvalidArgument):
        make_policy("fifo")


def test_coordinated_evicts_only_what_every_sharing_job_consumed():
    led, cons, pol = Ledger(), ConsumptionTracker(ttl_s=10), make_policy("coordinated")
    for k in "abc":
        led.add(k, 10, "ds")
    cons.report("job1", "ds", 0, ["a", "b"], now=0)
    cons.report("job2", "ds", 0, ["b"], now=0)
    adm = pol.admit(led, 30, "d", 10, "ds", cons)
    assert adm.victims == ("b",)  # a: job2 has not consumed it yet
    cons.report("job2", "ds", 1, [], now=1)  # a new epoch: nothing consumed by job2 any more
    assert pol.admit(led, 30, "d", 10, "ds", cons).outcome is Outcome.NO_EVICTABLE
    cons.report("job1", "ds", 0, [], now=20)
    assert cons.expire(now=20) == ["job2"]  # a silent job stops pinning chunks
    assert pol.admit(led, 30, "d", 10, "ds", cons).victims == ("a",)


def test_coordinated_honours_quota_and_frees_unused_datasets_first():
    led, cons, pol = Ledger(), ConsumptionTracker(), make_policy("coordinated")
    led.add("old", 10, "gone")  # nobody uses dataset "gone"
    led.add("x", 10, "ds")
    cons.report("j", "ds", 0, ["x"], now=0)
    assert pol.admit(led, 20, "y", 10, "ds", cons).victims == ("old",)
    # Over its quota, ds may only replace its own consumed chunk.
    assert pol.admit(led, 100, "y", 10, "ds", cons, quotas={"ds": 10}).victims == ("x",)
    cons.report("j", "ds", 1, [], now=1)
    adm = pol.admit(led, 100, "y", 10, "ds", cons, quotas={"ds": 10})
    assert adm.outcome is Outcome.OVER_ALLOCATION and not adm.admitted and "allocation" in adm.reason


def test_estimate_benefit_fits_hit_and_miss_times():
    obs = [(0.0, 1.0), (0.0, 1.02), (1.0, 0.2), (1.0, 0.22), (0.5, 0.6)]
    est = estimate_benefit(obs)
    assert est is not None and abs(est.t_miss - 1.0) < 0.05 and abs(est.t_hit - 0.2) < 0.05
    assert 0.7 < est.gain < 0.85
    assert estimate_benefit([(0.5, 1.0), (0.55, 1.0)]) is None  # probe not run yet


def test_allocate_prefers_benefit_per_byte_and_starves_compute_bound():
    io = BenefitEstimate(t_hit=0.1, t_miss=1.0, observations=8)
    compute = BenefitEstimate(t_hit=0.99, t_miss=1.0, observations=8)
    jobs = [
        JobDemand("io1", "imagenet", 1 << 20, io),
        JobDemand("io2", "imagenet", 1 << 20, io),  # shares imagenet: its benefit adds up
        JobDemand("cpu", "text", 1 << 20, compute),
        JobDemand("new", "audio", 1 << 20, None),
    ]
    sizes = {"imagenet": 800, "text": 500, "audio": 300}
    allocs = {a.dataset: a for a in allocate(1000, sizes, jobs, probe_bytes=100)}
    assert (
        allocs["audio"].bytes == 200 and "not yet measured" in allocs["audio"].reason
    )  # 100 probe + leftover
    assert allocs["imagenet"].bytes == 800 and allocs["imagenet"].jobs == ("io1", "io2")
    assert allocs["text"].bytes == 0 and "compute-bound" in allocs["text"].reason
    assert sum(a.bytes for a in allocs.values()) <= 1000


def test_simulated_quiver_beats_lru_of_the_same_capacity():
    from microco.services.cache._simulate import simulate

    lru = simulate("lru", 1200, 8, 600, epochs=2)
    quiver = simulate("quiver", 1200, 8, 600, epochs=2, prefetch_per_batch=1)
    assert 0.08 < lru.hit_rate_per_epoch[-1] < 0.25  # LRU thrashes under random order
    assert quiver.hit_rate_per_epoch[-1] >= 0.5  # at least the cache-to-dataset ratio
    assert quiver.cached_bytes <= 600 and simulate("none", 100, 8, 50, epochs=1).hit_rate_per_epoch == (0.0,)
