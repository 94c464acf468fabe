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


def test_loader_takes_world_size_and_rank_from_torch_distributed(tmp_path):
    import socket

    dist = pytest.importorskip("torch.distributed")
    from microco.clients.cache import QuiverLoader
    from microco.services.cache import LocalStore, build_index

    for i in range(10):
        (tmp_path / f"s{i}").write_bytes(bytes([i]) * 50)
    store = LocalStore(str(tmp_path))
    idx = build_index(store.list_files(), store.read, 200)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ld = QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False)
        assert (ld.world_size, ld.rank, ld.job_id) == (1, 0, "j")
    finally:
        dist.destroy_process_group()
    shares = []
    for rank in range(2):
        ld = QuiverLoader(
            idx, store, batch_size=4, dataset="d", job_id="j", server=False, world_size=2, rank=rank
        )
        assert ld.job_id == f"j/rank{rank}" and len(ld) == 2
        shares.append([i for b, _ in ld.epoch(0) for i in b])
        ld.close()
    assert len(shares[0]) == len(shares[1]) == 5 and sorted(shares[0] + shares[1]) == list(range(10))
    with pytest.raises(ValueError):
        QuiverLoader(idx, store, batch_size=4, dataset="d", job_id="j", server=False, world_size=2, rank=5)
