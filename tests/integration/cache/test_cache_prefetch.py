"""The reader ahead of the training step: every sample exactly once per epoch (also when the
step stops early), reads overlap the step, and waits are measured."""

from __future__ import annotations

import threading

import pytest

from microco.clients.cache import QuiverLoader
from microco.services.cache import LocalStore, build_index


def _setup(root, address, **kw):
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 8000)
    return idx, store


def test_prefetching_reader_gives_every_sample_once_per_epoch(make_dataset, tmp_path, inproc_cache):
    files = make_dataset(tmp_path / "d", n=90, size=2000)
    address, _core = inproc_cache(100_000)  # about half the dataset
    idx, store = _setup(tmp_path / "d", address)
    loader = QuiverLoader(
        idx, store, batch_size=8, dataset="d", job_id="j", server=address, prefetch_batches=3
    )
    try:
        for epoch in range(3):
            seen = []
            for indices, samples in loader.epoch(epoch):
                assert samples == [files[idx.samples[i].path] for i in indices]
                seen += indices
            assert sorted(seen) == list(range(90)), epoch
        # A step that stops early leaves no reader behind, and the next epoch is whole again.
        for n, _ in enumerate(loader.epoch(3)):
            if n == 2:
                break
        assert not [t for t in threading.enumerate() if t.name == "quiver-reader"]
        seen = [i for indices, _ in loader.epoch(4) for i in indices]
        assert sorted(seen) == list(range(90))
        s = loader.stats
        assert s.hits + s.misses >= 90 * 4 + 3 * 8 and s.hits > 0  # (+ what was read ahead)
        assert s.stall_s > 0 and s.compute_s >= 0
    finally:
        loader.close()


class _GatedStore:
    """A backing store that records which samples were asked for."""

    def __init__(self, inner):
        self.inner = inner
        self.url = inner.url
        self.asked: list[str] = []
        self.more = threading.Event()

    def list_files(self):
        return self.inner.list_files()

    def read(self, path):
        self.asked.append(path)
        if len(self.asked) > 8:
            self.more.set()
        return self.inner.read(path)


def test_reader_fetches_the_next_batch_while_the_step_computes(make_dataset, tmp_path):
    make_dataset(tmp_path / "d", n=40, size=500)
    store = _GatedStore(LocalStore(str(tmp_path / "d")))
    idx = build_index(store.list_files(), store.inner.read, 4000)
    loader = QuiverLoader(idx, store, batch_size=8, dataset="d", job_id="j", server=False, prefetch_batches=2)
    try:
        it = loader.epoch(0)
        next(it)  # the step now "computes" on batch 0, asking for nothing ...
        # ... yet the reader goes on to the next batch (a bound, not a timing: it is prompt).
        assert store.more.wait(30), "the reader did not read ahead of the step"
        rest = [i for indices, _ in it for i in indices]
        assert len(rest) == 32
    finally:
        loader.close()


def test_two_ranks_read_each_sample_once_across_ranks(make_dataset, tmp_path, inproc_cache):
    files = make_dataset(tmp_path / "d", n=90, size=2000)
    address, _core = inproc_cache(100_000)
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 8000)
    ranks = [
        QuiverLoader(
            idx, store, batch_size=8, dataset="d", job_id="ddp", server=address, world_size=2, rank=r
        )
        for r in range(2)
    ]
    try:
        assert {ld.job_id for ld in ranks} == {"ddp/rank0", "ddp/rank1"}
        for epoch in range(3):
            got: dict[int, list[int]] = {0: [], 1: []}

            def run(r: int, epoch: int = epoch, got: dict[int, list[int]] = got) -> None:
                for indices, samples in ranks[r].epoch(epoch):
                    assert samples == [files[idx.samples[i].path] for i in indices]
                    got[r] += indices

            threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not set(got[0]) & set(got[1]) and sorted(got[0] + got[1]) == list(range(90)), epoch
            assert len(got[0]) == len(got[1]) == 45 and len(ranks[0]) == 6
        assert sum(ld.stats.hits for ld in ranks) > 0  # the ranks share the cache
    finally:
        for ld in ranks:
            ld.close()


def test_torch_dataloader_reading_ahead(make_dataset, tmp_path, inproc_cache):
    torch = pytest.importorskip("torch")
    from microco.clients.cache import make_dataloader

    files = make_dataset(tmp_path / "d", n=50, size=1000)
    address, _core = inproc_cache(30_000)
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 4000)
    loader = QuiverLoader(idx, store, batch_size=8, dataset="d", job_id="t", server=address)
    dl = make_dataloader(
        loader,
        transform=lambda data, path: (data, path),
        collate_fn=list,
        read_ahead=True,
    )
    try:
        assert len(dl) == 7
        for epoch in range(2):
            dl.dataset.set_epoch(epoch)
            got = [p for batch in dl for data, p in batch if files[p] == data]
            assert sorted(got) == sorted(files), epoch
        assert loader.stats.hits + loader.stats.misses == 100 and loader.stats.hits > 0
        assert torch.utils.data.get_worker_info() is None
    finally:
        loader.close()
