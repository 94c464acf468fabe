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

To decode and transform in worker processes (``num_workers > 0``, fork or spawn), the
loader still chooses each batch in this process and the workers read and transform it:

    dl = make_dataloader(loader, transform=decode, collate_fn=collate, num_workers=4)
    for epoch in range(n):
        dl.batch_sampler.set_epoch(epoch)   # a QuiverDataLoader
        for batch in dl: ...

torch is imported lazily by ``microco.clients.cache`` so the rest works without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data as tud

from microco.clients import telemetry

from ._client import CacheClient
from ._loader import QuiverLoader
from ._workers import ReadPlan, ReadReport


class QuiverBatchSampler(tud.Sampler[list[int]]):
    """Yields the indices of each mini-batch, chosen with substitutable hits. Every sample
    exactly once per epoch; call ``set_epoch`` before each epoch (as with DistributedSampler)."""

    def __init__(self, loader: QuiverLoader, plans: bool = False) -> None:
        self.loader = loader
        self.epoch = 0
        self._hits: set[int] = set()
        # Batches read by DataLoader worker processes: yield ``ReadPlan``s (``_workers.py``).
        self.plans = plans

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        if self.plans:
            self.loader.begin_worker_epoch()
            try:
                for indices, hits in self.loader.batches(self.epoch):
                    yield self.loader.plan_read(indices, hits)
            finally:
                self.loader._held = None
            return
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
        self.loader: QuiverLoader | None = loader
        self.index = loader.index
        self.transform = transform
        self.sampler = sampler
        self._reader = loader.worker_reader()
        # For reads in a worker process with no plan (a user's own sampler): where to look.
        self._made_in = os.getpid()
        srv = loader.client
        self._address = srv.address if isinstance(srv, CacheClient) else ""
        self._where = (loader.node if loader.direct_read else "", loader.dataset, loader.job_id)

    def __getstate__(self) -> dict[str, Any]:
        # To a spawned worker: the reader and the transform, not the loader (its threads,
        # locks and channels stay in the main process, which makes the choices).
        state = dict(self.__dict__)
        state["loader"] = state["sampler"] = None
        return state

    def __len__(self) -> int:
        return len(self.index)

    def _out(self, i: int, data: bytes) -> Any:
        return self.transform(data, self.index.samples[i].path) if self.transform else data

    def __getitem__(self, i: int) -> Any:
        if self.loader is None or os.getpid() != self._made_in:
            return self._out(i, self._read_unplanned([i])[0])
        return self._out(i, self.loader.read([i])[0])

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if isinstance(indices, ReadPlan):  # in a worker: read as planned, report what it did
            data, report = self._reader.read(indices)
            t0 = time.perf_counter()
            items = [self._out(i, d) for i, d in zip(indices, data, strict=True)]
            report.work_s += time.perf_counter() - t0  # (the worker's time a hit does not save)
            return _Items(items, report)
        if self.loader is None or os.getpid() != self._made_in:
            data = self._read_unplanned(list(indices))
            return [self._out(i, d) for i, d in zip(indices, data, strict=True)]
        hits = self.sampler.take_hits(indices) if self.sampler is not None else indices
        return [self._out(i, d) for i, d in zip(indices, self.loader.read(indices, hits), strict=True)]

    def _read_unplanned(self, indices: list[int]) -> list[bytes]:
        """Samples asked for in a worker process by a sampler of the user's own (a plain
        ``DataLoader(ds, sampler=DistributedSampler(ds), num_workers=N)``), not a plan from
        the loader's batch sampler. The loader's channels and threads are the parent's (a fork
        copies them dead: the read waited forever) or absent (spawn), so the worker's own
        reader asks the loader's server which are cached and reads them as a plan: hits from
        the cache, the rest from the backing store, every byte hashed. Nothing is inserted and
        nothing counted (there is no epoch to share a chunk's read with)."""
        plan = ReadPlan(indices)
        plan.node, plan.dataset, plan.job_id = self._where
        if self._address:
            hits = self._reader.cached_at(self._address, indices, plan.dataset, plan.job_id)
            if hits:
                plan.sources = {self._address: hits}
                plan.direct = (self._address,) if plan.node else ()
        data: list[bytes] = self._reader.read(plan)[0]
        return data


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
                "QuiverIterableDataset reads ahead in its own thread: use DataLoader(..., num_workers=0), "
                "or QuiverDataLoader / make_dataloader(..., num_workers=N) to read in worker processes"
            )
        paths = self.loader.index.samples
        for indices, data in self.loader.epoch(self.epoch):
            items = (
                [self.transform(d, paths[i].path) for i, d in zip(indices, data, strict=True)]
                if self.transform
                else data
            )
            yield self.collate_fn(items) if self.collate_fn else items


class _Items(list[Any]):
    """A worker's transformed samples of one plan, with its ``ReadReport``."""

    def __init__(self, items: list[Any], report: ReadReport) -> None:
        super().__init__(items)
        self.report = report


class Delivered:
    """What a worker sends back for one batch: the collated batch and its ``ReadReport``
    (unwrapped by ``QuiverDataLoader`` in the main process)."""

    def __init__(self, batch: Any, report: ReadReport) -> None:
        self.batch = batch
        self.report = report

    def pin_memory(self) -> Delivered:
        from torch.utils.data._utils.pin_memory import pin_memory

        return Delivered(pin_memory(self.batch), self.report)  # type: ignore[no-untyped-call]


class _Collate:
    """The user's ``collate_fn`` (picklable when it is), keeping each batch's report."""

    def __init__(self, fn: Callable[[list[Any]], Any] | None) -> None:
        self.fn = fn

    def __call__(self, items: list[Any]) -> Any:
        t0 = time.perf_counter()
        out = self.fn(list(items)) if self.fn is not None else list(items)
        if not isinstance(items, _Items):
            return out
        items.report.work_s += time.perf_counter() - t0
        return Delivered(out, items.report)


class QuiverDataLoader(tud.DataLoader[Any]):
    """A ``DataLoader`` whose worker processes read and transform the batches the loader
    chooses in this process (``num_workers > 0``; any start method).

    The batch sampler (here) picks each batch with substitutable hits, exactly once per epoch,
    and plans its reads; a worker reads it (hits from the cache through channels of its own,
    the rest from the backing store) and runs ``transform`` and ``collate_fn``; the batch is
    counted (hit statistics, position for ``state_dict``, finished chunks reported to the
    server) when it reaches the step. ``transform`` and ``collate_fn`` must pickle for
    ``spawn``. Call ``dl.batch_sampler.set_epoch(e)`` before each epoch."""

    def __init__(
        self,
        loader: QuiverLoader,
        transform: Callable[[bytes, str], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        *,
        num_workers: int,
        **kwargs: Any,
    ) -> None:
        if num_workers < 1:
            raise ValueError("QuiverDataLoader is for num_workers >= 1 (use make_dataloader for 0)")
        sampler = QuiverBatchSampler(loader, plans=True)
        super().__init__(
            QuiverDataset(loader, transform, sampler),
            batch_sampler=sampler,
            collate_fn=_Collate(collate_fn),
            num_workers=num_workers,
            **kwargs,
        )
        self.quiver = loader

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        loader = self.quiver
        read = None
        handed: float | None = None
        # With the job's telemetry stream (the scheduler hook's) the step is timed there, as
        # with the loader's reader thread: the wait is added to it, the compute read back.
        stream = telemetry.current()
        loader._pipelined = True  # (the batches are read ahead of the step, by the workers)
        stop_listening = loader._listen(stream) if stream is not None else None
        try:
            it = super().__iter__()  # (starts the workers and the epoch's first choices)
            while True:
                t0 = time.perf_counter()
                if handed is not None and stream is None:  # the step computed since then
                    compute = t0 - handed
                    loader.stats.compute_s += compute
                    if read is not None:
                        loader._add_timings(loader._meter.timings(read, compute))
                try:
                    out = next(it)
                except StopIteration:
                    return
                wait = time.perf_counter() - t0
                loader.stats.stall_s += wait
                batch, read = out, None
                if isinstance(out, Delivered):
                    # (each worker reads a batch of its own: num_workers batches are read at once)
                    batch, read = out.batch, loader.delivered(out.report, readers=self.num_workers)
                if stream is not None:
                    stream.add_data_wait(wait)
                    loader._delivered = read
                handed = time.perf_counter()
                yield batch
        finally:
            if stop_listening is not None:
                stop_listening()
            loader._pipelined = False


def make_dataloader(
    loader: QuiverLoader,
    transform: Callable[[bytes, str], Any] | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    read_ahead: bool = False,
    num_workers: int = 0,
    **kwargs: Any,
) -> tud.DataLoader[Any]:
    """A ``DataLoader`` wired to ``loader``. ``num_workers > 0``: a ``QuiverDataLoader``,
    whose worker processes read and transform the batches chosen here (``kwargs`` go to the
    ``DataLoader``: ``multiprocessing_context``, ``persistent_workers``, ...).
    ``read_ahead``: batches come from a reader thread ahead of the step
    (``QuiverIterableDataset``; call ``dl.dataset.set_epoch(e)``); otherwise the batch sampler
    chooses them and the step reads them (``dl.batch_sampler.set_epoch(e)``)."""
    if num_workers > 0:
        if read_ahead:
            raise ValueError(
                "read_ahead is the in-process reader thread: with num_workers > 0 the workers read"
            )
        return QuiverDataLoader(loader, transform, collate_fn, num_workers=num_workers, **kwargs)
    if read_ahead:
        return tud.DataLoader(
            QuiverIterableDataset(loader, transform, collate_fn), batch_size=None, num_workers=0
        )
    sampler = QuiverBatchSampler(loader)
    ds = QuiverDataset(loader, transform, sampler)
    return tud.DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn or (lambda x: x), num_workers=0)
