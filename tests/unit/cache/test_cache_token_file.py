"""One large token file, as nanoGPT keeps its training data (``train.bin``: uint16 tokens, read
with ``np.memmap`` in blocks of ``block_size + 1`` tokens), registered with ``--records fixed:N``
(session 41's held-out round): a batch's misses lie anywhere in the file."""

from __future__ import annotations

import random

import numpy as np

from microco.clients.cache import LocalStore, build_index
from microco.clients.cache._backing import read_run, sample_runs

BLOCK = 128  # tokens a step sees; a sample is BLOCK + 1 of them (inputs and shifted targets)
RECORD = (BLOCK + 1) * 2


class _Counting:
    def __init__(self, store: LocalStore) -> None:
        self.store, self.url, self.read_bytes, self.calls = store, store.url, 0, 0

    def read_range(self, path: str, start: int, size: int) -> bytes:
        data = self.store.read_range(path, start, size)
        self.read_bytes += len(data)
        self.calls += 1
        return data


def test_random_blocks_of_one_token_file_read_only_their_own_bytes(tmp_path) -> None:
    # Gaps of up to 64 KB were read as part of a run: 12 random 258-byte blocks of a 1.2 MB file
    # read most of the file (an epoch through a cache of half of it read 23x the file; the gaps
    # are other samples, read again when those are).
    tokens = np.random.default_rng(0).integers(0, 50257, size=4651 * (BLOCK + 1), dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    store = LocalStore(str(tmp_path / "train.bin"))
    idx = build_index(store.list_files(), store.read, 64 << 10, records=f"fixed:{RECORD}")
    mm = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    rng = random.Random(1)
    asked = read = 0
    for _batch in range(20):
        picks = rng.sample(range(len(idx)), 12)
        counting = _Counting(store)
        refs = [idx.samples[i] for i in picks]
        for run in sample_runs(refs):
            for ref, raw in zip(run, read_run(counting, run), strict=True):  # type: ignore[arg-type]
                block = np.frombuffer(raw, np.uint16)
                assert np.array_equal(block, mm[ref.start // 2 : ref.start // 2 + BLOCK + 1])
                x, y = block[:-1], block[1:]  # nanoGPT's get_batch: targets shifted by one
                assert x.shape == y.shape == (BLOCK,)
        asked += 12 * RECORD
        read += counting.read_bytes
    assert read <= 2 * asked, (read, asked)
    # Blocks side by side are still one read.
    counting = _Counting(store)
    runs = sample_runs([idx.samples[i] for i in range(100, 140)])
    assert len(runs) == 1 and len(read_run(counting, runs[0])) == 40  # type: ignore[arg-type]
    assert counting.calls == 1 and counting.read_bytes == 40 * RECORD


def test_a_token_file_is_indexed_in_pieces_not_read_whole(tmp_path) -> None:
    # Registration read the whole file into memory (a 400 MB train.bin: 557 MB peak RSS;
    # OpenWebText's is 17 GB). A fixed:N file's records follow from its size: it is read in pieces.
    import tracemalloc

    from microco.clients.cache import index_store

    record = 64 << 10  # large records: the index itself stays small beside the file
    np.random.default_rng(2).integers(0, 50257, size=(24 << 20) // 2, dtype=np.uint16).tofile(
        tmp_path / "train.bin"
    )
    store = LocalStore(str(tmp_path / "train.bin"))
    tracemalloc.start()
    try:
        idx = index_store(store, 1 << 20, records=f"fixed:{record}")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (12 << 20), peak  # a piece (8 MB) at a time, not the 24 MB file
    whole = build_index(store.list_files(), store.read, 1 << 20, records=f"fixed:{record}")
    assert idx.to_bytes() == whole.to_bytes()  # the same index, digest and all
    assert [s.start for s in idx.samples] == list(range(0, 24 << 20, record))
    # A file that is no whole number of records is refused, as when read whole.
    with open(tmp_path / "train.bin", "ab") as f:
        f.write(b"\0\0")
    import pytest

    from microco.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="not a whole number of 65536-byte records"):
        index_store(LocalStore(str(tmp_path / "train.bin")), 1 << 20, records=f"fixed:{record}")
