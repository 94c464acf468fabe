"""Session 41's held-out round, through a real cache server process and etcd: nanoGPT's training
data (``train.bin``, uint16 tokens, read in blocks of ``block_size + 1`` tokens: inputs and the
targets shifted by one), registered with ``microco cache register --records fixed:N``, read by
two jobs at once through a cache of half the file. Every block is compared with the file through
``np.memmap``, as nanoGPT's ``get_batch`` reads it."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from microco.cli import main
from microco.clients.cache import LocalStore, open_loader

pytestmark = pytest.mark.integration

BLOCK = 64
RECORD = (BLOCK + 1) * 2


class _Counting(LocalStore):
    """The backing store, counting the bytes each job reads from it."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.bytes_read = 0
        self._lock = threading.Lock()

    def read(self, path: str) -> bytes:
        data = super().read(path)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def read_range(self, path: str, start: int, size: int) -> bytes:
        data = super().read_range(path, start, size)
        with self._lock:
            self.bytes_read += len(data)
        return data


def test_two_jobs_read_random_blocks_of_one_token_file_once_each(
    tmp_path, etcd_endpoint, etcd_kv, cache_server
):
    # Misses of one big file were read with every gap up to 64 KB between them: each epoch of
    # each job read ~20x the file from the backing store (each gap other samples' bytes).
    n = 4000
    tokens = np.random.default_rng(0).integers(0, 50257, size=n * (BLOCK + 1), dtype=np.uint16)
    (tmp_path / "owt").mkdir()
    tokens.tofile(tmp_path / "owt" / "train.bin")
    tokens[:1000].tofile(tmp_path / "owt" / "val.bin")
    path = str(tmp_path / "owt" / "train.bin")
    size = n * RECORD
    e = ["cache", "--etcd", etcd_endpoint]
    assert main([*e, "register", "owt", path, "--records", f"fixed:{RECORD}", "--chunk-size", "32K"]) == 0
    server = cache_server(capacity=str(size // 2))
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    report: dict[str, list[tuple[bool, int]]] = {}
    failed: list[BaseException] = []

    def job(name: str, seed: int) -> None:
        store = _Counting(path)
        loader = open_loader(
            etcd_kv, "owt", server=server.address, batch_size=12, job_id=name, store=store, seed=seed
        )
        try:
            out = []
            for epoch in range(3):
                seen: Counter[int] = Counter()
                before = store.bytes_read
                for indices, raws in loader.epoch(epoch):
                    for i, raw in zip(indices, raws, strict=True):
                        start = loader.index.samples[i].start // 2
                        block = np.frombuffer(raw, np.uint16)
                        x, y = block[:-1], block[1:]
                        assert np.array_equal(x, mm[start : start + BLOCK])
                        assert np.array_equal(y, mm[start + 1 : start + 1 + BLOCK])
                        seen[i] += 1
                out.append((seen == Counter(range(n)), store.bytes_read - before))
            report[name] = out
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failed.append(exc)
        finally:
            loader.close()

    threads = [threading.Thread(target=job, args=(f"gpt-{k}", k)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    if failed:
        raise failed[0]
    assert set(report) == {"gpt-0", "gpt-1"}
    for name, epochs in report.items():
        for epoch, (once, read) in enumerate(epochs):
            assert once, (name, epoch)  # every block exactly once an epoch
            # The cold epoch reads the file (and chunks another job had in flight); later ones
            # what the cache did not hold. Never whole stretches of the file for a few blocks.
            assert read <= 1.5 * size, (name, epoch, read, size)
