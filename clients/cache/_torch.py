"""PyTorch integration: a batch sampler with substitutable hits and a dataset that reads
whole mini-batches through the cache (``DataLoader(ds, batch_sampler=sampler)``).

    loader = QuiverLoader(index, store, batch_size=64, dataset="imagenet", job_id=job, server=addr)
    ds = QuiverDataset(loader, transform=decode)
    dl = torch.utils.data.DataLoader(ds, batch_sampler=QuiverBatchSampler(loader), collate_fn=...)
    for epoch in range(n):
        dl.batch_sampler.set_epoch(epoch)
        for batch in dl: ...

torch is imported lazily by ``microco.clients.cache`` so the rest works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data as tud

from ._loader import QuiverLoader


class QuiverBatchSampler(tud.Sampler):
    """Yields the indices of each mini-batch, chosen with substitutable hits. Every sample
    exactly once per epoch; call ``set_epoch`` before each epoch (as with DistributedSampler)."""

    def __init__(self, loader: QuiverLoader) -> None:
        self.loader = loader
        self.epoch = 0
        self._hits: set[int] = set()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        for indices, hits in self.loader.batches(self.epoch):
            self._hits.update(hits)
            yield indices

    def __len__(self) -> int:
        return len(self.loader)

    def take_hits(self, indices: list[int]) -> list[int]:
        hits = [i for i in indices if i in self._hits]
        self._hits.difference_update(hits)
        return hits


class QuiverDataset(tud.Dataset):
    """Map-style dataset over a registered dataset; ``__getitems__`` reads a mini-batch in
    one go (hits from the cache, the rest from the backing store)."""

    def __init__(
        self,
        loader: QuiverLoader,
        transform: Callable[[bytes, str], Any] | None = None,
        sampler: QuiverBatchSampler | None = None,
    ) -> None:
        self.loader = loader
        self.transform = transform
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.loader.index)

    def _out(self, i: int, data: bytes) -> Any:
        return self.transform(data, self.loader.index.samples[i].path) if self.transform else data

    def __getitem__(self, i: int) -> Any:
        return self._out(i, self.loader.read([i])[0])

    def __getitems__(self, indices: list[int]) -> list[Any]:
        hits = self.sampler.take_hits(indices) if self.sampler is not None else indices
        return [self._out(i, d) for i, d in zip(indices, self.loader.read(indices, hits), strict=True)]


def make_dataloader(
    loader: QuiverLoader,
    transform: Callable[[bytes, str], Any] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> tud.DataLoader:
    """A ``DataLoader`` wired to ``loader`` (in-process: the cache reads are already parallel)."""
    sampler = QuiverBatchSampler(loader)
    ds = QuiverDataset(loader, transform, sampler)
    return tud.DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn or (lambda x: x), num_workers=0)
