"""Data-parallel ranks: each epoch is partitioned across ranks, exactly once, whatever each
rank's cache answers."""

from __future__ import annotations

import random

import pytest

from microco.services.cache import SubstitutableSampler


@pytest.mark.parametrize("world,n", [(2, 101), (3, 64), (4, 7)])
def test_ranks_partition_every_epoch_exactly_once(world, n):
    rng = random.Random(world * n)
    for epoch in range(3):
        seen = []
        for rank in range(world):
            s = SubstitutableSampler(n, 5, seed=11, substitution=4, num_replicas=world, rank=rank)
            s.start_epoch(epoch)
            # Each rank's cache answers differently (and randomly): substitution must stay
            # inside the rank's share.
            mine = [i for b in s.batches(lambda c: {i for i in c if rng.random() < 0.4}) for i in b.indices]
            assert len(mine) == s.shard_size and len(set(mine)) == len(mine)
            seen += mine
        assert sorted(seen) == list(range(n)), epoch


def test_bad_rank_is_refused():
    with pytest.raises(ValueError):
        SubstitutableSampler(10, 2, num_replicas=2, rank=2)
