"""A loader's ranks from an initialised torch.distributed process group (gloo, in-process);
needs PyTorch, whose import alone takes seconds."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.torch
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
