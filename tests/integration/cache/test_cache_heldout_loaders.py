"""Public data-loading code the cache's authors had not met (session 40's held-out round): the
map-style ``QuiverDataset`` under a plain ``DataLoader`` with the user's own sampler, an
ImageFolder-like transform (label from the folder) and worker processes. Every sample is
compared with its file read directly."""

from __future__ import annotations

import random

import torch.utils.data as tud

from microco.clients.cache import LocalStore, QuiverDataset, QuiverLoader, index_store


def _image_folder(root, n: int = 48) -> dict[str, bytes]:
    rng = random.Random(5)
    files = {}
    for i in range(n):
        path = f"class{i % 3}/img{i:03d}.bin"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        files[path] = rng.randbytes(700 + i)
        (root / path).write_bytes(files[path])
    return files


class _Labelled:
    """An ImageFolder-like transform: the bytes and the class of the sample's folder."""

    def __init__(self, classes: list[str]) -> None:
        self.classes = classes

    def __call__(self, raw: bytes, path: str) -> tuple[str, bytes, int]:
        return path, raw, self.classes.index(path.split("/")[0])


def test_a_plain_dataloader_with_a_distributed_sampler_reads_in_workers(tmp_path, inproc_cache) -> None:
    # A user's own sampler (DistributedSampler) and worker processes over the map-style dataset:
    # a forked worker read through the loader's channels and thread pool, copied dead by the
    # fork, and waited forever (no batch came, no error).
    address, _core = inproc_cache(1 << 20)
    root = tmp_path / "images"
    files = _image_folder(root)
    store = LocalStore(str(root))
    idx = index_store(store, 4 << 10)
    loader = QuiverLoader(idx, store, batch_size=8, dataset="images", job_id="j", server=address)
    try:
        half = len(idx.chunks) // 2
        assert loader.warm(max_chunks=half) == half  # half the dataset cached...
        for chunk in idx.chunks[:half]:  # ... and gone from the backing store: read from the cache
            for ref in idx.samples_of(chunk):
                (root / ref.path).unlink()
        ds = QuiverDataset(loader, _Labelled(["class0", "class1", "class2"]))
        seen: list[str] = []
        # (read here first, as a pass without workers does: the loader's threads are then
        # running when the workers are forked)
        for rank, workers in ((0, 0), (0, 2), (1, 2)):
            sampler = tud.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
            dl = tud.DataLoader(
                ds,
                batch_size=6,
                sampler=sampler,
                collate_fn=list,
                num_workers=workers,
                timeout=60 if workers else 0,
            )
            mine = []
            for batch in dl:
                for path, raw, label in batch:
                    assert raw == files[path] and label == int(path[5])
                    mine.append(path)
            assert sorted(mine) == sorted(idx.samples[i].path for i in sampler)
            seen += mine if workers else []
        assert sorted(seen) == sorted(files)
    finally:
        loader.close()
