"""Substitutable hits exchanged between data-parallel ranks: every sample exactly once per
epoch across ranks, equal steps on every rank, whatever each rank's cache answers; a rank short
of hits gets another's unused ones; a restored epoch continues exactly."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from microco.clients.cache import BatchMode, SubstitutableSampler
from microco.clients.cache._exchange import ExchangeSampler, ThreadExchange, step_sizes


def _run(world: int, fn: Callable[[int], object]) -> list[object]:
    out: list[object] = [None] * world
    errors: list[BaseException] = []

    def go(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


@pytest.mark.parametrize(
    "world,n,b,drop",
    [(2, 101, 5, False), (3, 64, 4, False), (4, 9, 2, False), (2, 50, 8, True), (3, 3, 4, False)],
)
def test_every_sample_once_per_epoch_across_ranks_with_equal_steps(world, n, b, drop):
    group = ThreadExchange(world)
    samplers = [
        ExchangeSampler(n, b, group.member(r), seed=3, substitution=3, drop_last=drop) for r in range(world)
    ]

    def rank(r: int) -> list[list[int]]:
        rng = random.Random(r * 7 + n)
        s = samplers[r]
        epochs = []
        for e in range(3):
            s.start_epoch(e)
            # Each rank's cache answers differently every call, even naming samples not asked.
            bs = s.batches(lambda c: {i for i in range(n) if rng.random() < 0.5})
            assert len(bs) == s.steps and all(x.indices for x in bs)
            epochs.append([i for x in bs for i in x.indices])
        return epochs

    got = _run(world, rank)
    for e in range(3):
        seen = [i for r in range(world) for i in got[r][e]]  # type: ignore[index]
        assert len(seen) == len(set(seen))
        expect = n - (n % (world * b) if drop else 0)
        assert len(seen) == expect and set(seen) <= set(range(n)), e


def test_a_rank_short_of_hits_gets_anothers_unused_hits():
    n, b, world = 200, 10, 2
    cached = set(random.Random(1).sample(range(n), 100))

    def hits_taken(exchange: bool) -> list[int]:
        if exchange:
            group = ThreadExchange(world)

            def rank(r: int) -> int:
                s = ExchangeSampler(n, b, group.member(r), seed=5, substitution=4)
                s.start_epoch(0)
                # Rank 0's cache holds everything cached, rank 1's holds nothing it is asked.
                ask = (lambda c: cached & set(c)) if r == 0 else (lambda c: set())
                return sum(len(x.hits) for x in s.batches(ask))

            return _run(world, rank)  # type: ignore[return-value]
        out = []
        for r in range(world):
            s = SubstitutableSampler(n, b, seed=5, substitution=4, num_replicas=world, rank=r)
            s.start_epoch(0)
            ask = (lambda c: cached & set(c)) if r == 0 else (lambda c: set())
            out.append(sum(len(x.hits) for x in s.batches(ask)))
        return out

    static, traded = hits_taken(False), hits_taken(True)
    assert static[1] == 0 and traded[1] > 0  # rank 1 served hits only rank 0 could see
    assert sum(traded) >= sum(static)


def test_a_restored_epoch_continues_with_exactly_the_unseen_samples():
    n, b, world = 57, 4, 3
    group = ThreadExchange(world)

    def rank(r: int) -> tuple[list[int], list[int]]:
        s = ExchangeSampler(n, b, group.member(r), seed=9, substitution=2)
        s.start_epoch(4)
        before = [i for _ in range(3) for i in s.next_batch(lambda c: set(c[::3])).indices]  # type: ignore[union-attr]
        t = ExchangeSampler(n, b, group.member(r), seed=9, substitution=2)  # restarted
        t.restore(4, before)
        after = [i for x in t.batches(lambda c: set(c[::2])) for i in x.indices]
        return before, after

    got = _run(world, rank)
    seen = [i for pair in got for part in pair for i in part]  # type: ignore[union-attr]
    assert sorted(seen) == list(range(n))


def test_step_sizes_give_every_rank_equal_nonempty_steps():
    for n in range(1, 80):
        for w in (1, 2, 3, 5):
            for b in (2, 3, 8):
                if n < w:
                    continue
                sizes = step_sizes(n, b, w)
                assert sum(map(sum, sizes)) == n
                assert all(0 < x <= b for step in sizes for x in step)
    with pytest.raises(ValueError):
        step_sizes(2, 4, 3)


@pytest.mark.parametrize("cached_chunks", [set(), {0, 3, 4, 7, 9}])
def test_a_chunk_no_rank_has_touched_goes_to_one_rank_in_a_step(cached_chunks):
    """The loader reads a missed chunk whole only if no rank has touched it yet and its samples
    in the step are all this rank's: the steering of misses must keep them together, in the
    all-miss probe steps too (before, both ranks took samples of most cold chunks in a probe
    step, so those chunks were read sample by sample and not cached that epoch)."""
    n, b, world, per_chunk = 192, 16, 2, 16
    group = ThreadExchange(world)

    def rank(r: int) -> list[int]:
        s = ExchangeSampler(n, b, group.member(r), seed=11, substitution=10)
        splits = []
        for e in range(2):
            s.start_epoch(e)
            touched: set[int] = set()
            for step in range(s.steps):
                probe = step < 6
                mode = (
                    (BatchMode.MISSES_ONLY if step % 2 == 0 else BatchMode.HITS_ONLY)
                    if probe
                    else (BatchMode.PREFER_HITS)
                )

                def fetcher(i: int, touched: set[int] = touched) -> int:
                    c = i // per_chunk
                    return -1 if c in touched or c in cached_chunks else c % world

                batch = s.next_batch(
                    lambda c: {i for i in c if i // per_chunk in cached_chunks}, mode, None, fetcher
                )
                assert batch is not None
                takers: dict[int, set[int]] = {}
                for q, t in enumerate(s.last_taken):
                    for i in t:
                        takers.setdefault(i // per_chunk, set()).add(q)
                fresh = [c for c in takers if c not in touched and c not in cached_chunks]
                splits += [c for c in fresh if len(takers[c]) > 1]
                touched |= takers.keys()
        return splits

    assert _run(world, rank) == [[], []]
