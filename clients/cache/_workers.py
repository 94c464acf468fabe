"""Reading a mini-batch in a data-loading worker process (``DataLoader(num_workers>0)``).

The choice stays in the main process: the loader's sampler picks each batch (substitutable
hits, every sample exactly once per epoch, the position ``state_dict`` saves) and
``QuiverLoader.plan_read`` turns it into a ``ReadPlan``: the indices, where each hit is
cached (a server's address), the chunks to read whole on a miss and where to insert them,
and the bytes of chunks the main process holds itself. A worker reads the plan with a
``WorkerReader``: hits from the cache (granted files on this host, else streamed), the rest
from the backing store, every byte hashed against its digest. The reader is built in the
worker itself on first use (its own gRPC channels, its own threads), so nothing of the main
process's channels or locks is used after a fork, and it pickles for ``spawn``. What it did
comes back as a ``ReadReport`` with the batch, and the main process counts it
(``QuiverLoader.delivered``) when the batch reaches the training step.
"""

from __future__ import annotations

import gc
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from microco.common.errors import MicrocoError

from ._backing import BackingStore, read_run, sample_runs
from ._client import CacheClient
from ._digest import digest
from ._index import DatasetIndex


class ReadPlan(list[int]):
    """A batch's sample indices (a list, as a batch sampler yields) with how to read them."""

    seq: int
    sources: dict[str, list[int]]  # server address -> hits cached there
    direct: tuple[str, ...]  # addresses whose granted files may be read on this host
    node: str
    inline: dict[int, bytes]  # hits whose chunk the main process holds
    whole: dict[int, str]  # chunk index -> address to insert it into ("" for none)
    dataset: str
    job_id: str

    def __init__(self, indices: list[int], seq: int = 0) -> None:
        super().__init__(indices)
        self.seq = seq
        self.sources = {}
        self.direct = ()
        self.node = ""
        self.inline = {}
        self.whole = {}
        self.dataset = ""
        self.job_id = ""


@dataclass
class ReadReport:
    """What a worker did for one plan: which samples came from a cache, the backing store's
    bytes, the read times, whole chunks inserted or refused, servers that failed."""

    seq: int
    from_cache: list[int] = field(default_factory=list)
    hit_read_s: float = 0.0
    backing_read_s: float = 0.0
    backing_bytes: int = 0
    fill_bytes: int = 0
    batch_bytes: int = 0
    miss_bytes: int = 0
    ahead: list[tuple[int, float]] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    failed_servers: list[str] = field(default_factory=list)
    corrupt_reported: int = 0
    #: Seconds the worker spent on the batch besides reading it (the transform and collate).
    work_s: float = 0.0


class WorkerReader:
    """Reads ``ReadPlan``s in one process; rebuilt after a fork (by pid), never shared."""

    def __init__(self, index: DatasetIndex, store: BackingStore, threads: int = 8) -> None:
        self.index = index
        self.store = store
        self.threads = threads
        self._pid = -1
        self._made_in = os.getpid()  # (a later pid without unpickling: a forked child)
        self._clients: dict[str, CacheClient] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"index": self.index, "store": self.store, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["index"], state["store"], state["threads"])  # type: ignore[misc]

    def _own(self) -> None:
        if self._pid != os.getpid():  # a fresh process (fork or spawn): nothing inherited
            if os.getpid() != self._made_in:
                # A forked worker leaves the parent's objects to the parent: frozen out of this
                # process's collections, so a cycle the parent had not yet collected (a gRPC
                # channel of an earlier client) is not finalised here, where its native
                # destructor meets locks the fork copied held and aborts the process (seen in CI,
                # session 39: abseil's "Check w->waitp->cond == nullptr failed", then "Fatal
                # Python error: Aborted" while garbage-collecting in a DataLoader worker).
                gc.freeze()
            self._pid = os.getpid()
            self._clients = {}
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="quiver-worker")

    def _client(self, address: str) -> CacheClient:
        c = self._clients.get(address)
        if c is None:
            c = self._clients[address] = CacheClient(address)
        return c

    def _cached(self, plan: ReadPlan, report: ReadReport) -> dict[int, bytes]:
        out: dict[int, bytes] = dict(plan.inline)
        for address, hits in plan.sources.items():
            try:
                client = self._client(address)
                got = self._direct(client, plan, hits, report) if address in plan.direct else None
                if got is None:
                    got = self._stream(client, plan, hits)
                out.update(got)
            except MicrocoError:  # its hits come from the backing store; the loader is told
                report.failed_servers.append(address)
        return out

    def _direct(
        self, client: CacheClient, plan: ReadPlan, hits: list[int], report: ReadReport
    ) -> dict[int, bytes] | None:
        chunks = sorted({self.index.chunk_of(i).digest for i in hits})
        node, grants = client.open_chunks(chunks, timeout=5, retry=False)
        if node != plan.node:
            return None
        paths = {g.digest: g.path for g in grants}
        out: dict[int, bytes] = {}
        for i in hits:
            ref = self.index.samples[i]
            c = self.index.chunks[ref.chunk].digest
            path = paths.get(c)
            if path is None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:  # evicted since the grant: a miss
                continue
            try:
                data = os.pread(fd, ref.size, ref.offset)
            finally:
                os.close(fd)
            if digest(data) == ref.digest:
                out[i] = data
            else:  # a flipped byte or a replaced file: the server checks the chunk
                paths.pop(c, None)
                try:
                    if client.report_corrupt(c, timeout=5, retry=False):
                        report.corrupt_reported += 1
                except MicrocoError:
                    pass
        return out

    def _stream(self, client: CacheClient, plan: ReadPlan, hits: list[int]) -> dict[int, bytes]:
        reads = []
        for i in hits:
            ref = self.index.samples[i]
            reads.append((self.index.chunks[ref.chunk].digest, ref.offset, ref.size, ref.digest))
        data = client.read_samples(reads, plan.job_id, timeout=30)
        return {
            i: d
            for i, d in zip(hits, data, strict=True)
            if d is not None and digest(d) == self.index.samples[i].digest
        }

    def cached_at(self, address: str, indices: list[int], dataset: str, job_id: str) -> list[int]:
        """Which of ``indices`` sit in a chunk the server at ``address`` holds now (asked from
        this process, on its own channel); none when the server does not answer."""
        self._own()
        chunks = sorted({self.index.chunk_of(i).digest for i in indices})
        try:
            held, _room = self._client(address).lookup_room(chunks, dataset, job_id, timeout=5, retry=False)
        except MicrocoError:
            return []
        return [i for i in indices if self.index.chunk_of(i).digest in held]

    def read(self, plan: ReadPlan) -> tuple[list[bytes], ReadReport]:
        """The bytes of ``plan``'s samples, in its order, and what reading them took."""
        self._own()
        assert self._pool is not None
        report = ReadReport(plan.seq)
        t0 = time.perf_counter()
        got = self._cached(plan, report)
        report.hit_read_s = time.perf_counter() - t0
        report.from_cache = [i for i in plan if i in got]
        rest = [i for i in plan if i not in got]
        wanted = [i for i in rest if self.index.samples[i].chunk not in plan.whole]
        for c in sorted(plan.whole):
            wanted.extend(s.index for s in self.index.samples_of(self.index.chunks[c]))
        t0 = time.perf_counter()
        runs = sample_runs([self.index.samples[i] for i in wanted])
        fetched = {
            ref.index: data
            for run, got_run in zip(
                runs, self._pool.map(lambda run: read_run(self.store, run), runs), strict=True
            )
            for ref, data in zip(run, got_run, strict=True)
        }
        t_back = report.backing_read_s = time.perf_counter() - t0
        total = sum(map(len, fetched.values()))
        report.backing_bytes = total
        rest_set = set(rest)
        for i, data in fetched.items():
            if i not in rest_set:
                cost = t_back * len(data) / total if total else 0.0
                report.ahead.append((i, cost))
                report.fill_bytes += len(data)
        for i in rest:
            got[i] = fetched[i]
        for c, address in sorted(plan.whole.items()):
            chunk = self.index.chunks[c]
            data = b"".join(fetched[s.index] for s in self.index.samples_of(chunk))
            try:
                r = self._client(address).put_chunks([(chunk.digest, data)], plan.dataset, timeout=30)
                (report.stored if (r.stored or r.present) else report.refused).append(c)
            except MicrocoError:
                report.refused.append(c)
                report.failed_servers.append(address)
        report.batch_bytes = sum(len(got[i]) for i in plan)
        report.miss_bytes = sum(len(got[i]) for i in rest)
        return [got[i] for i in plan], report
