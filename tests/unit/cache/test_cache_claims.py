"""In-flight claims in the in-process core: one backing read of a chunk for every job that
misses it at once; a claim ends at the put, with its holder, or at its lease (no sockets)."""

from __future__ import annotations

import threading

import pytest
from _support import wait_until

from microco.clients.cache import digest
from microco.clients.cache._sampler import SubstitutableSampler
from microco.common.errors import InvalidArgument
from microco.services.cache import _limits as lim
from microco.services.cache._chunkstore import ChunkStore
from microco.services.cache._claims import MAX_LEASE_S
from microco.services.cache._core import CacheCore

A, B = b"a" * 100, b"b" * 100
DA, DB = digest(A), digest(B)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def core(tmp_path):
    clock = _Clock()
    c = CacheCore(ChunkStore(str(tmp_path / "chunks")), 10_000, clock=clock, job_ttl_s=5.0)
    c.clock_ = clock  # type: ignore[attr-defined]
    return c


def _until(cond, what: str) -> None:
    wait_until(cond, 30, what, interval=0.005)


def test_a_claimed_chunk_is_in_flight_to_other_jobs_only_until_it_is_put(core):
    r = core.lookup_claim([DA, DB], "d", job="j1", claim=[DA])
    assert r.claimed == [DA] and r.in_flight == [] and r.present == []
    # The other job sees it in flight and cannot claim it; the holder may claim it again.
    r2 = core.lookup_claim([DA, DB], "d", job="j2", claim=[DA, DB])
    assert r2.in_flight == [DA] and r2.claimed == [DB]
    assert core.lookup_claim([DA], "d", job="j1", claim=[DA]).claimed == [DA]
    assert core.lookup_claim([DA, DB], "d", job="j1").in_flight == [DB]
    assert core.put(DA, A, "d").outcome == "stored"
    r3 = core.lookup_claim([DA], "d", job="j2", claim=[DA])
    assert r3.present == [DA] and r3.in_flight == [] and r3.claimed == []  # held: nothing to claim
    assert len(core.claims) == 1  # DB's


def test_a_refused_claimed_chunk_is_kept_briefly_for_its_waiters(tmp_path):
    """The cache refuses a claimed chunk (smaller than it): the job waiting on the claim gets
    the bytes from the server, not from the backing store, for a bounded time and memory."""
    clock = _Clock()
    core = CacheCore(ChunkStore(str(tmp_path / "c")), 50, clock=clock)  # smaller than the chunk
    core.max_wait_s = 60
    core.lookup_claim([DA], "d", job="j1", claim=[DA])
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(core.lookup_claim([DA], "d", job="j2", wait_s=60))
    )
    waiter.start()
    _until(lambda: core._waiters == 1, "the lookup did not wait")
    assert core.put(DA, A, "d").outcome != "stored"
    waiter.join(30)
    # Woken by the refusal, the waiter finds it present (not in flight, not to read itself).
    assert answers and answers[0].present == [DA] and answers[0].in_flight == []
    assert core.lookup_claim([DA], "d", job="j3", claim=[DA]).claimed == []  # nothing to read
    assert dict(core.read_chunks([DA], job="j2")) == {DA: A}
    assert list(core.read_samples([(DA, 10, 5, digest(A[10:15]))], job="j3")) == [(0, A[10:15])]
    # A range outside it or bytes that do not match the sample's digest are a miss.
    assert list(core.read_samples([(DA, 98, 5, digest(A[98:]))])) == [(0, None)]
    assert core.ledger.used == 0 and core.transient.used == len(A)  # outside the allocation
    clock.t += core.transient.ttl_s  # bounded in time: then the backing store, as before
    assert core.lookup_claim([DA], "d", job="j2").present == []
    assert dict(core.read_chunks([DA])) == {DA: None} and core.transient.used == 0


def test_a_refused_chunk_nobody_claimed_is_not_kept_and_the_memory_is_bounded(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path / "c")), 50)
    assert core.put(DA, A, "d").outcome != "stored"  # no claim, nobody waits: not kept
    assert core.lookup([DA]) == [] and len(core.transient) == 0
    core.transient.max_bytes = 150  # room for one chunk of 100 bytes
    core.lookup_claim([DA, DB], "d", job="j1", claim=[DA, DB])
    core.put(DA, A, "d")
    core.put(DB, B, "d")
    assert core.lookup([DA, DB]) == [DB] and core.transient.used == 100  # the oldest went first
    big = b"c" * 200  # larger than the bound: not kept at all
    core.lookup_claim([digest(big)], "d", job="j1", claim=[digest(big)])
    core.put(digest(big), big, "d")
    assert core.lookup([digest(big), DB]) == [DB] and core.transient.used == 100


def test_a_chunk_kept_for_waiters_is_dropped_once_stored(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path / "c")), 150)
    core.lookup_claim([DA], "d", job="j1", claim=[DA])
    core.transient.keep(DA, A, core.clock())
    assert core.put(DA, A, "d").outcome == "stored"
    assert len(core.transient) == 0 and core.transient.used == 0 and core.lookup([DA]) == [DA]


def test_a_waiting_lookup_wakes_when_the_chunk_is_put(core):
    core.lookup_claim([DA], "d", job="j1", claim=[DA])
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(core.lookup_claim([DA], "d", job="j2", wait_s=60))
    )
    core.max_wait_s = 60
    waiter.start()
    _until(lambda: core._waiters == 1, "the lookup did not wait")
    assert not answers
    core.put(DA, A, "d")
    waiter.join(30)
    assert answers and answers[0].present == [DA] and answers[0].in_flight == []


def test_a_wait_is_bounded(core):
    core.lookup_claim([DA], "d", job="j1", claim=[DA])
    core.max_wait_s = 0.01  # the server's cap bounds what a client asks
    r = core.lookup_claim([DA], "d", job="j2", wait_s=60)
    assert r.in_flight == [DA] and r.present == []


def test_a_claim_ends_with_its_lease_or_its_holder(core):
    core.lookup_claim([DA], "d", job="j1", claim=[DA], lease_s=2)
    core.clock_.t += 1.9
    assert core.lookup_claim([DA], "d", job="j2").in_flight == [DA]
    core.clock_.t += 0.2  # the holder died (or is slower than its lease): another may read it
    assert core.lookup_claim([DA], "d", job="j2", claim=[DA]).claimed == [DA]
    # A lease asked for is capped: a dead holder delays the others a bounded time.
    core.lookup_claim([DB], "d", job="j3", claim=[DB], lease_s=1e9)
    core.clock_.t += MAX_LEASE_S + 1
    assert core.lookup_claim([DB], "d", job="j2").in_flight == []
    # A job forgotten (finished, moved away) or gone past the TTL ends its claims at once.
    core.report_progress("j4", "d", 0, [])
    core.lookup_claim([DB], "d", job="j4", claim=[DB])
    core.forget_job("j4")
    assert core.lookup_claim([DB], "d", job="j2").in_flight == []
    core.report_progress("j5", "d", 0, [])
    core.lookup_claim([DB], "d", job="j5", claim=[DB])
    core.report_progress("j5", "d", 0, [], finished=True)
    assert core.lookup_claim([DB], "d", job="j2").in_flight == []
    core.report_progress("j6", "d", 0, [])
    core.lookup_claim([DB], "d", job="j6", claim=[DB], lease_s=MAX_LEASE_S)
    core.clock_.t += 6  # past the job TTL, silent
    core.report_progress("j2", "d", 0, [])
    assert core.lookup_claim([DB], "d", job="j2").in_flight == []


def test_claims_need_a_job_and_a_digest_and_bounded_seconds(core):
    assert core.lookup_claim([DA], "d", job="", claim=[DA]).claimed == []
    assert core.lookup_claim(["x" * 10], "d", job="j", claim=["x" * 10]).claimed == []
    assert lim.seconds(0.5, "wait_s") == 0.5
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="wait_s"):
            lim.seconds(bad, "wait_s")


def test_the_sampler_takes_misses_in_flight_last_and_every_sample_once():
    in_flight = set(range(0, 40, 2))
    s = SubstitutableSampler(40, 4, seed=3, substitution=3)
    s.start_epoch(0)
    seen: list[int] = []
    first = None
    while (b := s.next_batch(lambda w: set(), miss_order=lambda i: 1 if i in in_flight else 0)) is not None:
        first = first or b.indices
        seen += b.indices
    assert sorted(seen) == list(range(40))
    assert not set(first or ()) & in_flight  # other misses were there to take first
    assert set(seen[-4:]) <= in_flight  # what is left at the end is the chunks in flight
