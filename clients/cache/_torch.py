"""PyTorch integration: a batch sampler with substitutable hits and a dataset that reads
whole mini-batches through the cache (``DataLoader(ds, batch_sampler=sampler)``).

    loader = QuiverLoader(index, store, batch_size=64, dataset="imagenet", job_id=job, server=addr)
    ds = QuiverDataset(loader, transform=decode)
    dl = torch.utils.data.DataLoader(ds, batch_sampler=QuiverBatchSampler(loader), collate_fn=...)
    for epoch in range(n):
        dl.batch_sampler.set_epoch(epoch)
        for batch in dl: ...

To read ahead while the step computes (the loader's reader thread; the time the step still
waits is measured and drives the cache's allocation), iterate batches instead:

    ds = QuiverIterableDataset(loader, transform=decode, collate_fn=collate)
    dl = torch.utils.data.DataLoader(ds, batch_size=None)   # or make_dataloader(..., read_ahead=True)
    for epoch in range(n):
        ds.set_epoch(epoch)
        for batch in dl: ...

torch is imported lazily by ``microco.clients.cache`` so the rest works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data as tud

from ._loader import QuiverLoader


class QuiverBatchSampler(tud.Sampler[list[int]]):
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


class QuiverDataset(tud.Dataset[Any]):
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


class QuiverIterableDataset(tud.IterableDataset[Any]):
    """The mini-batches of an epoch, read ahead by the loader's reader thread while the step
    computes (``loader.prefetch_batches``); every sample exactly once. Use with
    ``DataLoader(ds, batch_size=None)`` and ``num_workers=0`` (the reader thread is the
    parallelism; the loader's threads and channel do not go to worker processes)."""

    def __init__(
        self,
        loader: QuiverLoader,
        transform: Callable[[bytes, str], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.loader = loader
        self.transform = transform
        self.collate_fn = collate_fn
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        if info is not None and info.num_workers > 0:
            raise RuntimeError(
                "QuiverIterableDataset reads ahead in its own thread: use DataLoader(..., num_workers=0)"
            )
        paths = self.loader.index.samples
        for indices, data in self.loader.epoch(self.epoch):
            items = (
                [self.transform(d, paths[i].path) for i, d in zip(indices, data, strict=True)]
                if self.transform
                else data
            )
            yield self.collate_fn(items) if self.collate_fn else items


def make_dataloader(
    loader: QuiverLoader,
    transform: Callable[[bytes, str], Any] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    read_ahead: bool = False,
) -> tud.DataLoader[Any]:
    """A ``DataLoader`` wired to ``loader`` (in-process: the cache reads are already parallel).
    ``read_ahead``: batches come from a reader thread ahead of the step
    (``QuiverIterableDataset``; call ``dl.dataset.set_epoch(e)``); otherwise the batch sampler
    chooses them and the step reads them (``dl.batch_sampler.set_epoch(e)``)."""
    if read_ahead:
        return tud.DataLoader(
            QuiverIterableDataset(loader, transform, collate_fn), batch_size=None, num_workers=0
        )
    sampler = QuiverBatchSampler(loader)
    ds = QuiverDataset(loader, transform, sampler)
    return tud.DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn or (lambda x: x), num_workers=0)
