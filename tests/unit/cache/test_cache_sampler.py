"""Exactly once per epoch, whatever the cache holds (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microco.clients.cache._sampler import BatchMode, SubstitutableSampler


@settings(max_examples=110, deadline=None)
@given(
    n=st.integers(0, 300),
    batch=st.integers(1, 40),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    cache_seed=st.integers(0, 2**16),
    density=st.floats(0.0, 1.0),
    drop_last=st.booleans(),
)
def test_every_sample_exactly_once_under_any_cache_state(n, batch, k, seed, cache_seed, density, drop_last):
    rng = random.Random(cache_seed)

    # The cache answers anything: a random subset that changes every call, sometimes lying
    # about indices it was not asked about.
    def is_cached(cands):
        return {i for i in cands if rng.random() < density} | {n + 5}

    s = SubstitutableSampler(n, batch, seed=seed, substitution=k, drop_last=drop_last)
    for epoch in range(2):
        s.start_epoch(epoch)
        modes = list(BatchMode)
        seen = []
        order = (lambda i: (i * 7919) % 13) if rng.random() < 0.5 else None
        while (b := s.next_batch(is_cached, modes[rng.randrange(3)], order)) is not None:
            assert set(b.hits) <= set(b.indices)
            seen.append(b.indices)
        flat = [i for b in seen for i in b]
        assert len(flat) == len(set(flat))
        if drop_last:
            assert all(len(b) == batch for b in seen) and len(flat) == n - n % batch
        else:
            assert sorted(flat) == list(range(n))
            assert all(len(b) == batch for b in seen[:-1])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), batch=st.integers(1, 20), cached=st.sets(st.integers(0, 199)))
def test_hits_are_taken_first_when_the_window_holds_enough(n, batch, cached):
    s = SubstitutableSampler(n, batch, seed=1, substitution=4)
    s.start_epoch(0)
    while s.remaining:
        window = s.unseen()[: 4 * batch]
        in_window = [i for i in window if i in cached]
        b = s.next_batch(lambda c: cached)
        assert b is not None
        assert len(b.hits) == min(len(in_window), len(b.indices))


def test_static_cache_gives_hit_rate_of_cached_fraction():
    n, batch = 1000, 10
    cached = set(range(0, n, 2))
    s = SubstitutableSampler(n, batch, seed=3, substitution=10)
    s.start_epoch(0)
    batches = s.batches(lambda c: cached)
    assert sum(len(b.hits) for b in batches) == len(cached)  # every cached sample is a hit
    assert all(b.hit_fraction == 1.0 for b in batches[: len(batches) // 3])  # hits come early


def test_restore_resumes_the_epoch_exactly():
    s = SubstitutableSampler(50, 7, seed=9)
    s.start_epoch(4)
    first = s.next_batch(lambda c: set())
    saved = s.unseen()
    rest = s.batches(lambda c: set())
    t = SubstitutableSampler(50, 7, seed=9)
    t.restore(4, saved)
    assert t.batches(lambda c: set()) == rest
    assert sorted(first.indices + tuple(i for b in rest for i in b.indices)) == list(range(50))
    with pytest.raises(ValueError):
        t.restore(0, [1, 1])
    with pytest.raises(RuntimeError):
        SubstitutableSampler(3, 1).next_batch(lambda c: set())


def test_hit_order_finishes_chunks_first():
    s = SubstitutableSampler(40, 4, seed=2, substitution=10)
    s.start_epoch(0)
    chunk = {i: i // 8 for i in range(40)}
    b = s.next_batch(lambda c: set(c), hit_order=lambda i: 0 if chunk[i] == 3 else 1)
    assert b is not None and {chunk[i] for i in b.indices} == {3}
