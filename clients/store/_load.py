"""How long the append of a file may take, and how far it got.

A load's time grows with the file: a fixed deadline that fits a small file on a fast machine cuts
a big one off on a slow machine (scale factor 10's ``lineitem``, 2.5 GB of Parquet, took over 600 s
on a loaded 2-core machine and failed with DeadlineExceeded after 16 minutes of work). So a file's
append gets at least ``LOAD_FLOOR_S`` and otherwise as long as the file takes at the slowest rate
a loaded machine was seen to load (``LOAD_MIN_MB_PER_S`` of file bytes). ``LoadProgress`` counts
what has been sent, for a progress bar and for the message of a load that still runs out of time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from microco.common.errors import InvalidArgument

LOAD_FLOOR_S = 600.0  # no file's append gets less (the client's long-call default)
LOAD_MIN_MB_PER_S = (
    0.5  # the slowest load rate allowed for (file bytes; SF 10 loaded at ~2.4 MB/s at load 15-45)
)


def load_deadline_s(
    size_bytes: int, *, floor_s: float = LOAD_FLOOR_S, min_mb_per_s: float = LOAD_MIN_MB_PER_S
) -> float:
    """Seconds the append of a file of ``size_bytes`` may take: ``floor_s``, or the file's time at
    ``min_mb_per_s`` when that is longer."""
    if size_bytes < 0:
        raise InvalidArgument(f"a file's size cannot be negative (got {size_bytes})")
    if min_mb_per_s <= 0 or floor_s <= 0:
        raise InvalidArgument("a load's floor and minimum rate must be positive")
    return max(floor_s, size_bytes / 1e6 / min_mb_per_s)


def file_deadline_s(path: str | Path) -> float:
    """``load_deadline_s`` of the files a path names (one, a directory's, a glob's: their bytes
    together; ``InvalidArgument`` when there are none)."""
    from ._files import sources

    return load_deadline_s(sum(f.stat().st_size for f in sources(path)[0]))


def file_rows(path: str | Path) -> int | None:
    """Parquet files' row count from their footers (no data read); ``None`` for text (unknown
    until read)."""
    from ._files import file_kind, sources

    files = sources(path)[0]
    if all(file_kind(f) == "parquet" for f in files):
        import pyarrow.parquet as pq

        return sum(int(pq.ParquetFile(f).metadata.num_rows) for f in files)
    return None


class LoadProgress:
    """Rows and batches handed to the append stream so far; ``on_batch(rows_in_batch)`` is called
    for each (a progress bar's ``update``)."""

    def __init__(
        self, total_rows: int | None = None, on_batch: Callable[[int], object] | None = None
    ) -> None:
        self.total_rows = total_rows
        self.rows = 0
        self.batches = 0
        self.on_batch = on_batch

    def wrap(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            self.rows += b.num_rows
            self.batches += 1
            if self.on_batch is not None:
                self.on_batch(b.num_rows)
            yield b

    def describe(self) -> str:
        of = f" of {self.total_rows:,}" if self.total_rows is not None else ""
        return f"{self.rows:,}{of} rows sent"
