"""What decoding an extent costs per codec on this host: the figures behind the planner's
``DECODE_S_PER_BYTE`` (services/store/_planner.py). JSON on stdout.

    python -m microco.benchmarks.store_codecs [--rows 1000000] [--rounds 7] [--parquet FILE]
    python -m microco.benchmarks.store_codecs --disk [--rows 4000000] [--rounds 5]

``--disk``: the figure behind the planner's ``DISK_S_PER_BYTE`` instead: a column subset (every
other column) of column-major extents of each compressed codec read as a node reads it, cold
(the file evicted from the page cache with ``posix_fadvise(DONTNEED)`` just before) and warm,
interleaved; wall seconds per byte of the file read from disk, ``(cold - warm) / bytes read``
(the time a read waits for the disk beyond its decoding), medians.

The rows are cut as a node's extents are (``write_extent``: one record batch per sub-bucket,
``--batches`` of them) and read as a node reads them (``open_extent`` then ``select`` of every
column: each column of each batch decoded once, on the reading thread). Per codec: process CPU
seconds per byte of decoded Arrow data (the catalog's ``bytes``, what the planner's estimates
count), the median of ``--rounds`` rounds, the codecs interleaved in a rotating order. The data
is synthetic and seeded (integers, prices, decimals, dates and strings of several
cardinalities, none of them a benchmark's table), or ``--parquet FILE``'s rows."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from microco.services.store import CODECS, open_extent, to_plain_strings, write_extent

WORDS = [
    "amber", "basalt", "cinder", "delta", "ember", "fjord", "granite", "harbor", "island", "juniper",
    "kestrel", "lagoon", "meadow", "nectar", "orchid", "prairie", "quartz", "ridge", "summit", "tundra",
]  # fmt: skip


def synthetic(rows: int, seed: int = 7) -> pa.Table:
    """Mixed columns of the kinds analytic tables hold, seeded (no benchmark's data)."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    start = datetime.date(2000, 1, 1).toordinal() - datetime.date(1970, 1, 1).toordinal()
    cents = rng.integers(100, 10_000_000, rows)
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64) * 3 + rng.integers(0, 3, rows)),
            "ref": pa.array(rng.integers(0, rows // 4 + 1, rows, dtype=np.int64)),
            "count": pa.array(rng.integers(1, 100, rows, dtype=np.int64)),
            "amount": pa.array(cents / 100.0),
            "price": pa.array([Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(15, 2)),
            "ratio": pa.array(rng.random(rows)),
            "day": pa.array((start + rng.integers(0, 3650, rows)).astype(np.int32), pa.date32()),
            "flag": pa.array(words[rng.integers(0, 3, rows)]),
            "kind": pa.array(words[rng.integers(0, len(WORDS), rows)]),
            "label": pa.array(
                [
                    " ".join(x)
                    for x in words[rng.integers(0, len(WORDS), (rows, 3))].tolist()  # free text
                ]
            ),
        }
    )


def _buckets(rows: int, batches: int) -> list[list[int]]:
    size = -(-rows // batches)
    return [[k, 0, min(size, rows - k * size)] for k in range(batches) if k * size < rows]


def _bucketed(table: pa.Table, batches: int) -> tuple[list[list[int]], pa.Table]:
    """``table`` cut in ``batches`` record batches, as an extent's buckets, and those buckets."""
    buckets = _buckets(table.num_rows, batches)
    cut = table.combine_chunks()
    pieces, off = [], 0
    for b in buckets:
        pieces.append(cut.slice(off, b[2]).combine_chunks().to_batches()[0])
        off += b[2]
    return buckets, pa.Table.from_batches(pieces)


def measure(table: pa.Table, rounds: int, batches: int, directory: Path) -> dict[str, Any]:
    buckets, rows = _bucketed(table, batches)
    files: dict[str, Path] = {}
    sizes: dict[str, int] = {}
    data_bytes = 0
    for codec in CODECS:
        p = directory / f"{codec}.arrow"
        size, _checksum, sized = write_extent(p, rows, buckets, codec)
        files[codec], sizes[codec] = p, size
        data_bytes = sum(b[3] for b in sized)
    cpu: dict[str, list[float]] = {c: [] for c in CODECS}
    for k in range(rounds + 1):  # the first round warms the page cache and the code paths
        order = CODECS[k % len(CODECS) :] + CODECS[: k % len(CODECS)]
        for codec in order:
            t0 = time.process_time()
            table_read, _n = open_extent(files[codec]).select(None, None)
            _ = [c.chunks for c in table_read.columns]
            dt = time.process_time() - t0
            if k:
                cpu[codec].append(dt)
    return {
        "rows": table.num_rows,
        "columns": table.num_columns,
        "batches": len(buckets),
        "data_bytes": data_bytes,
        "codecs": {
            c: {
                "file_bytes": sizes[c],
                "cpu_s": statistics.median(cpu[c]),
                "cpu_s_per_byte": statistics.median(cpu[c]) / data_bytes,
                "rounds": cpu[c],
            }
            for c in CODECS
        },
    }


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def measure_disk(table: pa.Table, rounds: int, batches: int, directory: Path) -> dict[str, Any]:
    """Cold and warm wall seconds of reading every other column of one extent per compressed
    codec (column-major, as nodes write), the codecs and cold/warm interleaved."""
    buckets, rows = _bucketed(table, batches)
    cols = rows.schema.names[::2]
    codecs = [c for c in CODECS if c != "none"]
    files = {}
    for codec in codecs:
        files[codec] = directory / f"{codec}.arrow"
        write_extent(files[codec], rows, buckets, codec, 2)
    runs: dict[str, dict[str, list[float]]] = {c: {"cold": [], "warm": [], "disk_bytes": []} for c in codecs}
    for k in range(rounds + 1):
        order = codecs[k % len(codecs) :] + codecs[: k % len(codecs)]
        for codec in order:
            for state in ("cold", "warm"):
                if state == "cold":
                    _evict(files[codec])
                before = _read_bytes()
                t0 = time.perf_counter()
                got, _n = open_extent(files[codec]).select(None, cols)
                _ = [c.chunks for c in got.columns]
                dt = time.perf_counter() - t0
                if k:  # the first round warms the code paths
                    runs[codec][state].append(dt)
                    if state == "cold":
                        runs[codec]["disk_bytes"].append(_read_bytes() - before)
    out: dict[str, Any] = {"rows": table.num_rows, "columns_read": cols, "codecs": {}}
    for codec in codecs:
        cold, warm = statistics.median(runs[codec]["cold"]), statistics.median(runs[codec]["warm"])
        disk = statistics.median(runs[codec]["disk_bytes"])
        out["codecs"][codec] = {
            "cold_s": cold,
            "warm_s": warm,
            "disk_bytes": disk,
            "disk_s_per_byte": (cold - warm) / disk if disk else None,
            "rounds": runs[codec],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m microco.benchmarks.store_codecs", description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows (default 1M)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=64, help="record batches (sub-buckets) per extent")
    ap.add_argument("--parquet", default="", help="measure this file's rows instead of synthetic ones")
    ap.add_argument("--disk", action="store_true", help="cold reads from disk instead (DISK_S_PER_BYTE)")
    args = ap.parse_args(argv)
    if args.parquet:
        # the first rows, in the types the store keeps (plain strings: a string_view slice
        # counts the whole shared buffers in its nbytes)
        first = next(pq.ParquetFile(args.parquet).iter_batches(batch_size=args.rows))
        table = to_plain_strings(pa.Table.from_batches([first]))
    else:
        table = synthetic(args.rows)
    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()[0]
    # on the disk (not a tmpfs /tmp: its pages cannot be evicted)
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:
        if args.disk:
            out = measure_disk(table, args.rounds, args.batches, Path(d))
        else:
            out = measure(table, args.rounds, args.batches, Path(d))
    out.update(
        benchmark="store_codecs_disk" if args.disk else "store_codecs",
        data=args.parquet or "synthetic",
        started_utc=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        load_start=load,
        load_end=os.getloadavg()[0],
    )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
