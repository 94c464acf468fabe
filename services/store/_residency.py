"""What of each extent is in memory on its node: the planner's input for choosing among replicas
that the query does not otherwise tell apart (docs/store.md, "Replicas in memory").

A read of an extent costs its node two things the catalog alone cannot tell: **the disk**, for the
bytes of the file not in the OS page cache (a cold read of a column subset of a column-major extent
reads those columns' ranges; of a batch-major one, the whole file), and **decoding**, for the
columns not already held decoded in the node's extent cache (``NodeStore``'s open extents). Both
change with the workload: the queries before this one, other processes' reads (a JVM beside the
store), the cache's evictions. So each node answers, for the tables asked about, per extent file:

- its size and the bytes of it in the page cache, and for a column-major file each column's range
  and the bytes of that range in the page cache (``cachestat(2)`` per range where the kernel has
  it, else ``mincore(2)`` over a read-only map of the file; no page is read, none faulted in);
- per column, the share of the extent's batches held decoded in its extent cache.

The coordinator asks every live node at planning time, at most once per ``MAX_AGE_S`` for the same
tables (``StoreCore.residency``), in parallel, each call bounded by ``TIMEOUT_S``; an answer not
had (a node slow or down) leaves its extents unknown, which costs them as before (no disk term).
The planner turns it into seconds (``_planner.read_estimate``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# A residency answer this recent is reused for the next plans (seconds). A cold query's pages
# enter the page cache while it runs; a plan made within a second of the last one sees what the
# queries before it left, give or take the one still running.
MAX_AGE_S = 1.0
# How long planning waits for a node's answer (seconds); a node not answering in time is left
# unknown for this plan, not waited on.
TIMEOUT_S = 0.5

_PAGE = mmap.PAGESIZE


class _Libc:
    """``mmap``/``mincore``/``munmap`` through ctypes (Linux, and other systems with mincore(2));
    ``ok`` is False where they cannot be had, and then nothing is reported resident or not."""

    def __init__(self) -> None:
        self.ok = False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            libc.syscall.restype = ctypes.c_long
            self.libc = libc
            self.ok = True
        except (OSError, AttributeError):
            pass


_LIBC = _Libc()
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Cachestat(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint64)
        for n in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


# cachestat(2) (Linux 6.5+): a file range's pages in the page cache in one call, without a map;
# 451 in the generic system call table and on x86-64 alike. Measured on a node's 129 extent files
# at scale factor 10 (a whole file and each column's range): 33-41 ms against mincore's 115-129 ms
# (docs/store.md, "Replicas in memory"). Where the call is refused (an older kernel: ENOSYS),
# mincore is used.
_SYS_CACHESTAT = 451
_cachestat_ok = _LIBC.ok and os.uname().sysname == "Linux"


def cached_bytes(fd: int, ranges: list[tuple[int, int]]) -> list[int] | None:
    """Bytes of each ``(offset, length)`` range of the open file ``fd`` in the page cache (whole
    pages, at most the range's length), by ``cachestat(2)``; None where it cannot be had."""
    global _cachestat_ok
    if not _cachestat_ok:
        return None
    out = []
    rng, stat = _CachestatRange(), _Cachestat()
    call = _LIBC.libc.syscall
    for off, n in ranges:
        if n <= 0:
            out.append(0)
            continue
        rng.off, rng.len = off, n
        if call(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(stat), 0) != 0:
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
                _cachestat_ok = False
            return None
        out.append(min(int(stat.nr_cache) * _PAGE, n))
    return out


def file_residency(
    path: str | Path, size: int, ranges: list[tuple[int, int]] | None
) -> tuple[int, list[int] | None] | None:
    """The bytes of the file (``size`` bytes) in the page cache, and of each of its ``ranges``
    (a column-major extent's columns; None: none asked): ``cachestat(2)`` where the kernel has it,
    else ``mincore(2)``. None where neither can be had."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        got = cached_bytes(fd, [(0, size), *(ranges or [])])
    finally:
        os.close(fd)
    if got is not None:
        return got[0], (got[1:] if ranges is not None else None)
    pages = resident_pages(path, size)
    if pages is None:
        return None
    cum = np.concatenate(([0], np.cumsum(pages, dtype=np.int64)))
    return range_bytes(cum, 0, size), (
        [range_bytes(cum, o, n) for o, n in ranges] if ranges is not None else None
    )


def resident_pages(path: str | Path, size: int | None = None) -> np.ndarray | None:
    """One bool per page of the file: in the page cache or not (``mincore(2)`` over a read-only
    shared map of it; the map is not touched, so nothing is read). None where it cannot be had."""
    if not _LIBC.ok:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        n = os.fstat(fd).st_size if size is None else size
        if n <= 0:
            return np.zeros(0, dtype=bool)
        libc = _LIBC.libc
        addr = libc.mmap(None, n, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            return None
        try:
            vec = np.zeros((n + _PAGE - 1) // _PAGE, dtype=np.uint8)
            if libc.mincore(addr, n, vec.ctypes.data) != 0:
                return None
        finally:
            libc.munmap(addr, n)
        return (vec & 1).astype(bool)
    finally:
        os.close(fd)


def range_bytes(cum: np.ndarray, off: int, n: int) -> int:
    """Bytes of ``[off, off + n)`` in resident pages, ``cum`` the running count of resident pages
    (``cum[i]``: resident pages before page ``i``): whole pages, at most ``n``."""
    if n <= 0:
        return 0
    first, last = off // _PAGE, (off + n - 1) // _PAGE
    return min(int(cum[last + 1] - cum[first]) * _PAGE, n)


def column_ranges(path: Path) -> tuple[list[str], list[tuple[int, int]]] | None:
    """A column-major extent's column names and byte ranges (its header; ``_layout``), or None
    for a batch-major one (layout 1: a column's buffers are spread over the file)."""
    import pyarrow as pa

    from ._layout import COLUMNAR_MAGIC

    with open(path, "rb") as f:
        head = f.read(16)
        if head[: len(COLUMNAR_MAGIC)] != COLUMNAR_MAGIC:
            return None
        header = json.loads(f.read(int.from_bytes(head[8:16], "little")))
    schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(header["schema"])))
    return list(schema.names), [(int(o), int(n)) for o, n in header["columns"]]


# ------------------------------------------------------------------------ the coordinator's side


@dataclass(frozen=True)
class ExtentResidency:
    """One extent file's residency on its node, as it answered."""

    size: int  # the file's bytes
    resident: int  # of them in the page cache
    # column-major files: each column's file bytes and the bytes of them in the page cache
    columns: dict[str, tuple[int, int]] | None
    decoded: dict[str, float]  # per column, the share of its batches held decoded (absent: 0)

    @classmethod
    def from_wire(cls, names: list[str], rec: list[Any]) -> ExtentResidency:
        size, resident, col_bytes, col_resident, decoded = rec[:5]
        own = rec[5] if len(rec) > 5 else names
        cols = None
        if col_bytes is not None:
            cols = {c: (int(b), int(r)) for c, b, r in zip(own, col_bytes, col_resident, strict=True)}
        return cls(int(size), int(resident), cols, {str(k): float(v) for k, v in (decoded or {}).items()})

    def disk_bytes(self, cols: list[str] | tuple[str, ...]) -> float:
        """Bytes a read of ``cols`` would read from disk: for a column-major file, the parts of
        those columns' ranges not in the page cache (a column held decoded reads nothing); for a
        batch-major one, the part of the file not in the page cache (its reads pull the whole
        file: docs/store.md, "Cold Q6 and Q19") unless every column is held decoded."""
        if self.columns is None:
            need = max((1 - self.decoded.get(c, 0.0) for c in cols), default=0.0)
            return need * max(self.size - self.resident, 0)
        out = 0.0
        for c in cols:
            b, r = self.columns.get(c, (0, 0))
            out += (1 - self.decoded.get(c, 0.0)) * max(b - r, 0)
        return out

    def file_share(self, cols: list[str] | tuple[str, ...]) -> float:
        """The share of what a read of ``cols`` would read from the file that is in the page cache
        (1.0 when it reads nothing), for EXPLAIN."""
        if self.columns is None:
            return self.resident / self.size if self.size else 1.0
        total = sum(self.columns.get(c, (0, 0))[0] for c in cols)
        res = sum(min(self.columns.get(c, (0, 0))) for c in cols)
        return res / total if total else 1.0


class Residency:
    """A snapshot of the residency of the extents of some tables: extent id -> ``ExtentResidency``
    (an extent missing: its node did not answer, or it was written since: unknown)."""

    def __init__(self) -> None:
        self.extents: dict[str, ExtentResidency] = {}
        # (table, replica) -> its extents' ids, for ``signature``
        self.groups: dict[tuple[str, int], list[str]] = {}
        self.cache_bytes: dict[str, int] = {}  # node -> its extent cache's capacity, as it said
        self.nodes = 0  # nodes that answered
        self.asked = 0  # nodes asked
        self.ask_s: float | None = None  # seconds this plan waited asking (None: answers reused)

    def describe(self) -> str:
        """EXPLAIN's line: where the answers came from."""
        how = "reused" if self.ask_s is None else f"asked now, {self.ask_s * 1e3:.1f} ms"
        return f"residency: {self.nodes} of {self.asked} nodes said what of the tables is in memory ({how})"

    def get(self, extent_id: str) -> ExtentResidency | None:
        return self.extents.get(extent_id)

    def merge(self, answer: dict[str, Any], node: str = "") -> None:
        """Add one node's answer (``NodeStore.residency``)."""
        if "cache_bytes" in answer:
            self.cache_bytes[node] = int(answer["cache_bytes"])
        for table, t in answer.get("tables", {}).items():
            names = list(t.get("columns", []))
            for eid, rec in t.get("extents", {}).items():
                self.extents[eid] = ExtentResidency.from_wire(names, rec)
                part = eid.split("-")
                replica = (
                    int(part[1][1:]) if len(part) > 1 and part[1][:1] == "r" and part[1][1:].isdigit() else -1
                )
                self.groups.setdefault((table, replica), []).append(eid)

    def signature(self, quantum: float = 0.25) -> str:
        """A coarse digest for plan caches: per table and replica, the share of its extents' file
        bytes in memory, rounded to ``quantum``; a cached plan is reused while every replica stays
        in the same step."""
        out = []
        for (table, replica), ids in sorted(self.groups.items()):
            size = sum(self.extents[e].size for e in ids)
            res = sum(self.extents[e].resident for e in ids)
            out.append(f"{table}/{replica}:{round(res / size / quantum) if size else '-'}")
        return ",".join(out)
