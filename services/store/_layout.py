"""Extents: how one super-extent of rows is cut into the three replicas' extents, how rows are
bucketed inside an extent, and the extent file format.

For replica ``r`` with partition function ``f_r``, extent ``(s, r, p)`` holds the rows of
super-extent ``s`` with ``f_r(row) = p``. Inside it rows are ordered by the *other* two replicas'
partitions ``(f_a(row), f_b(row))`` and every non-empty ``(i, j)`` sub-bucket is one Arrow record
batch of an Arrow IPC file. So the rows of extent ``(s, a, i)`` that sit in ``(s, r, p)`` are the
batches with first index ``i``: to rebuild a lost extent ``(s, a, i)`` a node reads just those
batches from every extent of replica ``r`` (about as many bytes as were lost, from many nodes).

Every extent file carries a BLAKE3 checksum of its bytes, kept in the catalog; a node verifies it
before it serves the extent, so a corrupt file is detected and not served.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._partition import PartitionSpec, partition_ids
from ._placement import REPLICAS

BUCKETS_META = b"microco.buckets"
# The codec of an extent's record batches (absent: uncompressed, as extents written before
# compression were). Arrow IPC compresses each buffer of each batch with it.
COMPRESSION_META = b"microco.compression"
CODECS = ("zstd", "lz4", "none")
DEFAULT_COMPRESSION = "zstd"
TABLES_KEPT = 8  # column sets of whole-extent reads kept assembled per open extent
# Extent file layouts. 1: an Arrow IPC file of the sub-bucket batches, each batch holding every
# column's buffers side by side (row-major by batch: a read of a few columns touches pages all
# over the file). 2: column-major, each column its own contiguous Arrow IPC file of the same
# sub-bucket batches, behind a header (``COLUMNAR_MAGIC``) giving each column's byte range: a
# read of k columns reads k ranges. Both stay readable; nodes write ``EXTENT_LAYOUT`` unless told
# (``--extent-layout``). docs/store.md, "Column-major extents".
LAYOUTS = (1, 2)
EXTENT_LAYOUT = 2
COLUMNAR_MAGIC = b"MCOEXT2\x00"  # 8 bytes; a layout-1 file starts with Arrow's b"ARROW1\x00\x00"
_ALIGN = 64  # each column's segment starts at a multiple of it (Arrow's buffer alignment)
ZSTD_LEVEL = 1  # measured: level 3 is 0.5% smaller on TPC-H lineitem and writes ~2x slower


def check_codec(codec: str, what: str = "extent codec") -> str:
    """``codec`` when it names one of ``CODECS``; else a clear ``ValueError``."""
    if codec not in CODECS:
        raise ValueError(f"unknown {what} {codec!r}: one of {', '.join(CODECS)}")
    return codec


def write_options(compression: str | None) -> pa.ipc.IpcWriteOptions:
    """IPC write options for ``compression`` (``zstd``, ``lz4``, ``none``/None)."""
    if compression in (None, "", "none"):
        return pa.ipc.IpcWriteOptions()
    check_codec(compression, "extent compression")
    codec = pa.Codec("zstd", ZSTD_LEVEL) if compression == "zstd" else pa.Codec("lz4_frame")
    return pa.ipc.IpcWriteOptions(compression=codec)


def others(replica: int) -> tuple[int, int]:
    """The two replicas whose partition functions bucket the rows of ``replica``'s extents."""
    a, b = (r for r in range(REPLICAS) if r != replica)
    return a, b


@dataclass
class ExtentMeta:
    """One extent in the catalog."""

    id: str
    super_extent: int
    replica: int
    partition: int
    node: str
    rows: int
    bytes: int
    checksum: str
    # [i, j, rows, bytes] per non-empty sub-bucket, in file batch order; i, j index the
    # partitions of others(replica)[0] and [1].
    buckets: list[list[int]] = field(default_factory=list)
    state: str = "ok"  # ok | corrupt
    # the file's size on its node (compressed); 0 in records written before compression, whose
    # files were the uncompressed ``bytes``. ``bytes`` is the Arrow data's size, what a read yields.
    file_bytes: int = 0
    # the codec its file was written with ("" in records written before codecs per replica)
    codec: str = ""
    # the column each of its sub-buckets is sorted on (its replica's partition column, then the
    # rest: ``sort_order``); "" in records of extents written unsorted (before session 38)
    sorted: str = ""

    @property
    def stored_bytes(self) -> int:
        return self.file_bytes or self.bytes

    @property
    def written_codec(self) -> str:
        """Its file's codec; in older records, what their node wrote then (uncompressed files
        before compression, whose ``file_bytes`` is 0; the default codec after)."""
        return self.codec or (DEFAULT_COMPRESSION if self.file_bytes else "none")

    def to_json(self) -> dict[str, Any]:
        # what ``dataclasses.asdict`` gives, written out: asdict deep-copies field by field, and
        # an extent's bucket list (up to P*P entries) made it most of a catalog commit's time
        return {
            "id": self.id,
            "super_extent": self.super_extent,
            "replica": self.replica,
            "partition": self.partition,
            "node": self.node,
            "rows": self.rows,
            "bytes": self.bytes,
            "checksum": self.checksum,
            "buckets": [list(b) for b in self.buckets],
            "state": self.state,
            "file_bytes": self.file_bytes,
            "codec": self.codec,
            "sorted": self.sorted,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExtentMeta:
        return cls(**d)

    def bucket_rows(self, other_replica: int, partition: int) -> int:
        """Rows of this extent that partition ``partition`` of ``other_replica`` holds too."""
        pos = others(self.replica).index(other_replica)
        return sum(b[2] for b in self.buckets if b[pos] == partition)

    def bucket_bytes(self, other_replica: int, partition: int) -> int:
        pos = others(self.replica).index(other_replica)
        return sum(b[3] for b in self.buckets if b[pos] == partition)


def new_extent_id(super_extent: int, replica: int, partition: int) -> str:
    # A fresh suffix per write attempt: a retried or rebuilt extent never collides with the
    # orphan of an attempt that failed half-way.
    return f"s{super_extent:06d}-r{replica}-p{partition:04d}-{uuid.uuid4().hex[:8]}"


def assign_partitions(table: pa.Table, specs: Sequence[PartitionSpec]) -> list[np.ndarray]:
    """Partition ids of every row under each replica's function."""
    return [partition_ids(spec, table.column(spec.column)) for spec in specs]


def _total_order_key(col: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray | None:
    """``col`` as a sort key of a total order, or None when Arrow cannot sort it (lists,
    structs, dictionaries, ...). A float column becomes its IEEE 754 total order as unsigned
    integers (``-0.0`` before ``0.0``, every NaN payload a place of its own: Arrow's sort holds
    both zeros equal and every NaN equal, and their rows' order would then be the input's);
    nulls stay nulls (sorted last)."""
    typ = col.type
    if pa.types.is_floating(typ):
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_float16(typ):
            return None
        width = np.int32 if pa.types.is_float32(typ) else np.int64
        bits = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset : arr.offset + len(arr)].astype(
            np.int64
        )
        # negative: every bit flipped (larger magnitude sorts first); else the sign bit set
        sign = np.int64(1) << np.int64(63 if width is np.int64 else 31)
        key = np.where(bits < 0, ~bits, bits | sign).view(np.uint64)
        if width is np.int32:
            key = key & np.uint64(0xFFFFFFFF)
        return pa.array(
            key, pa.uint64(), mask=arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
        )
    if (
        pa.types.is_integer(typ)
        or pa.types.is_boolean(typ)
        or pa.types.is_temporal(typ)
        or pa.types.is_decimal(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or pa.types.is_string_view(typ)
        or pa.types.is_binary_view(typ)
    ):
        return col
    return None


def sort_order(table: pa.Table, first: Sequence[Any], column: str | None) -> np.ndarray:
    """Row positions of ``table`` in the store's total order of an extent's rows: by the arrays
    ``first`` (the cell: which sub-bucket), then ``column`` (the replica's partition column;
    None: none), then every other column Arrow can sort, in the schema's order, each ascending
    with nulls last (``_total_order_key``). Rows equal in all of them are equal in every column
    but those Arrow cannot sort, so the order of a sub-bucket's rows (and its bytes) depends on
    its rows, not on the order they came in: an extent rebuilt from another replica's buckets
    is the same bytes as the one lost."""
    keys: dict[str, Any] = {f"__first{i}": a for i, a in enumerate(first)}
    names = ([column] if column is not None else []) + [n for n in table.schema.names if n != column]
    for i, name in enumerate(names):
        key = _total_order_key(table.column(name))
        if key is not None:
            keys[f"__k{i}"] = key
    if not keys:
        return np.arange(table.num_rows)
    t = pa.table(keys)
    order = pc.sort_indices(t, sort_keys=[(k, "ascending", "at_end") for k in t.schema.names])
    return np.asarray(order)


def sorted_column(spec: PartitionSpec, schema: pa.Schema) -> str:
    """The column an extent of a replica partitioned by ``spec`` is sorted on within each of its
    sub-buckets: its partition column, where Arrow can sort its type ("" otherwise)."""
    if spec.column not in schema.names:
        return ""
    return spec.column if _total_order_key(pa.array([], schema.field(spec.column).type)) is not None else ""


def bucketed_extents(
    table: pa.Table,
    specs: Sequence[PartitionSpec],
    pids: list[np.ndarray] | None = None,
    replicas: Sequence[int] = tuple(range(REPLICAS)),
    sort: bool = True,
) -> dict[tuple[int, int], tuple[pa.Table, list[list[int]]]]:
    """Cut ``table`` (one super-extent's rows) into every replica's extents.

    Returns ``{(replica, partition): (rows ordered by sub-bucket, [[i, j, rows], ...])}`` for the
    non-empty extents; the table's batches are exactly the sub-buckets.

    Why one sort serves all three replicas' cells: a row's cell is ``(p0, p1, p2)``, its
    partition under each replica's function, and the sub-bucket ``(i, j)`` of extent ``(r, p)``
    is exactly the cell with ``p`` at position ``r`` and ``i, j`` at the other two. So the rows
    are sorted by cell and every sub-bucket of a replica is a zero-copy slice of one sorted table.
    Inside a cell each replica's rows are in its own total order (``sort_order``: its partition
    column first, so a group-by on it finds runs of equal keys, ``_runs``): one sort and gather
    per replica written (session 38; before, one gather served all three, rows in a cell kept in
    the order they came; ``sort=False`` still writes that layout, for comparisons)."""
    if pids is None:
        pids = assign_partitions(table, specs)
    assert len(specs) == REPLICAS == 3, "extents are bucketed by the two other replicas"
    _, n1, n2 = (s.count for s in specs)
    key = (pids[0].astype(np.int64) * n1 + pids[1].astype(np.int64)) * n2 + pids[2].astype(np.int64)
    uniq, counts = np.unique(key, return_counts=True)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cells: dict[tuple[int, int, int], tuple[int, int]] = {}
    for k, st, c in zip(uniq.tolist(), starts.tolist(), counts.tolist(), strict=True):
        rest, c2 = divmod(k, n2)
        c0, c1 = divmod(rest, n1)
        cells[(c0, c1, c2)] = (st, c)
    wanted = sorted(set(replicas))
    cell_key = pa.array(key, pa.int64())
    subs: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for cell, (st, c) in cells.items():
        for r in wanted:
            a, b = others(r)
            subs.setdefault((r, cell[r]), []).append((cell[a], cell[b], st, c))
    ordered_by: dict[int, pa.Table] = {}
    if not sort:
        by_cell = table.take(pa.array(np.argsort(key, kind="stable"))).combine_chunks()
    for r in wanted:
        column = sorted_column(specs[r], table.schema) or None
        ordered_by[r] = (
            table.take(pa.array(sort_order(table, [cell_key], column))).combine_chunks() if sort else by_cell
        )
    out: dict[tuple[int, int], tuple[pa.Table, list[list[int]]]] = {}
    for (r, p), pieces in sorted(subs.items()):
        pieces.sort()
        batches = []
        index = []
        for i, j, st, c in pieces:
            piece = ordered_by[r].slice(st, c)
            got = piece.to_batches()
            if len(got) != 1:  # a column chunked inside this cell: one batch per sub-bucket
                got = piece.combine_chunks().to_batches()
            batches.extend(got)
            index.append([i, j, c])
        out[(r, p)] = (pa.Table.from_batches(batches, schema=table.schema), index)
    return out


def extent_path(data_dir: str | Path, table: str, extent_id: str) -> Path:
    return Path(data_dir) / "tables" / table / f"{extent_id}.arrow"


def check_layout(layout: int) -> int:
    """``layout`` when it is one of ``LAYOUTS``; else a clear ``ValueError``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown extent layout {layout!r}: one of {', '.join(map(str, LAYOUTS))}")
    return layout


def _pad(n: int) -> bytes:
    return b"\x00" * (-n % _ALIGN)


def _columnar_parts(
    schema: pa.Schema, batches: list[pa.RecordBatch], options: pa.ipc.IpcWriteOptions
) -> list[Any]:
    """Layout 2's bytes, as a list of buffers to write one after another: the magic, the header's
    length (8 bytes, little-endian) and the header (JSON: the schema with its metadata, Arrow IPC
    serialised and hex-encoded; ``columns``: each column's ``[offset, length]`` in the file), then
    each column's segment (an Arrow IPC file of that one column, one batch per sub-bucket),
    every one starting at a multiple of ``_ALIGN``."""
    segments = []
    for i, f in enumerate(schema):
        one = pa.schema([f])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, one, options=options) as writer:
            for batch in batches:
                writer.write_batch(pa.RecordBatch.from_arrays([batch.column(i)], schema=one))
        segments.append(sink.getvalue())
    schema_hex = schema.serialize().to_pybytes().hex()

    def header_for(columns: list[list[int]]) -> bytes:
        return json.dumps(
            {"layout": 2, "schema": schema_hex, "batches": len(batches), "columns": columns}
        ).encode()

    # the header's size depends on the offsets it lists, which depend on its size: lay the
    # segments out after a header sized with room to spare, then write it padded to that room
    guess = header_for([[2**40, 2**40] for _ in segments])
    start = 16 + len(guess) + len(_pad(16 + len(guess)))
    columns, off = [], start
    for seg in segments:
        columns.append([off, seg.size])
        off += seg.size + len(_pad(seg.size))
    header = header_for(columns)
    header += b" " * (len(guess) - len(header))
    parts: list[Any] = [COLUMNAR_MAGIC, len(header).to_bytes(8, "little"), header, _pad(16 + len(header))]
    for seg in segments:
        parts += [seg, _pad(seg.size)]
    return parts


def _canonical(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch``'s columns copied into buffers of their own (offset 0, a string column's offsets
    from 0 and its data just the referenced bytes), without the validity bitmap of a flat
    column that has no null. What an IPC writer makes of an array depends on such things (a
    slice of a larger buffer, a bitmap allocated for rows that all have values), and they depend
    on how the rows were made (taken here, or received over Flight), not on their values: an
    extent rebuilt from another replica's buckets differed from the one lost in its bytes and
    in its index's sizes. One copy of the extent's columns per write."""
    cols = []
    for col in batch.columns:
        arr = pa.concat_arrays([col])
        bufs = arr.buffers()
        if arr.null_count == 0 and bufs and bufs[0] is not None and arr.type.num_fields == 0:
            arr = pa.Array.from_buffers(
                arr.type, len(arr), [None, *bufs[1:]], null_count=0, offset=arr.offset
            )
        cols.append(arr)
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def write_extent(
    path: Path,
    rows: pa.Table,
    buckets: list[list[int]],
    compression: str | None = DEFAULT_COMPRESSION,
    layout: int = EXTENT_LAYOUT,
) -> tuple[int, str, list[list[int]]]:
    """Write an extent file (one record batch per sub-bucket, each compressed with
    ``compression``; ``layout`` 2: column-major, 1: batch-major, see ``LAYOUTS``), fsync it, and
    return ``(file bytes, checksum, buckets with their uncompressed byte sizes)``. Written to a
    temporary name and renamed, so a crash never leaves a half-written file under the extent's
    name."""
    check_layout(layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    batches = rows.to_batches()
    if len(batches) != len(buckets):
        # Rows arrived re-chunked (e.g. over Flight): cut them again at the bucket boundaries.
        combined = rows.combine_chunks()
        batches, off = [], 0
        for b in buckets:
            batches.append(combined.slice(off, b[2]).combine_chunks().to_batches()[0] if b[2] else None)
            off += b[2]
        batches = [x for x in batches if x is not None]
    batches = [_canonical(b) for b in batches]
    sized = [[b[0], b[1], b[2], int(batch.nbytes)] for b, batch in zip(buckets, batches, strict=True)]
    meta = {**(rows.schema.metadata or {}), BUCKETS_META: json.dumps(sized).encode()}
    options = write_options(compression)
    if options.compression:
        meta[COMPRESSION_META] = str(compression).encode()
    schema = rows.schema.with_metadata(meta)
    # Serialise in memory and hash those bytes, then write them once: hashing the file after
    # writing it read every byte back (a second pass over the extent on every append).
    if layout == 1:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema, options=options) as writer:
            for batch in batches:
                writer.write_batch(batch)
        parts: list[Any] = [sink.getvalue()]
    else:
        parts = _columnar_parts(schema, batches, options)
    h = blake3.blake3()
    size = 0
    tmp = path.with_suffix(f".tmp-{uuid.uuid4().hex[:6]}")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                view = memoryview(part)
                h.update(view)
                f.write(view)
                size += view.nbytes
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A write that failed (a full disk) leaves nothing: its part-written file held the room
        # the next write needed, under a name nothing collects (session 40).
        tmp.unlink(missing_ok=True)
        raise
    return size, h.hexdigest(), sized


def file_checksum(path: Path) -> str:
    h = blake3.blake3()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _strip(schema: pa.Schema) -> pa.Schema:
    meta = {k: v for k, v in (schema.metadata or {}).items() if k not in (BUCKETS_META, COMPRESSION_META)}
    return schema.with_metadata(meta) if meta else schema.remove_metadata()


class _BatchMajor:
    """Layout 1's columns: an Arrow IPC file whose batches hold every column; a read of some
    columns goes through a reader that decodes only those (``included_fields``)."""

    def __init__(self, source: pa.MemoryMappedFile, reader: pa.ipc.RecordBatchFileReader) -> None:
        self._source = source
        self._readers: dict[tuple[int, ...], pa.ipc.RecordBatchFileReader] = {(): reader}
        self.schema = reader.schema  # with the extent's metadata
        self.num_batches = reader.num_record_batches

    def batch(self, k: int) -> pa.RecordBatch:
        """Batch ``k`` whole (an uncompressed extent's: views of the map)."""
        return self._readers[()].get_batch(k)

    def read(self, fields: tuple[int, ...], keep: Sequence[int]) -> dict[int, list[pa.Array]]:
        """``{batch: [column of each field]}`` for the batches ``keep``, decoded."""
        reader = self._readers.get(fields)
        if reader is None:
            # one thread: a batch's buffers are a sub-bucket's (tens of kB each), and Arrow's
            # pool costs more to hand them out than it saves (measured: 28% less CPU to read
            # four lineitem columns of 512 batches; docs/store.md)
            opts = pa.ipc.IpcReadOptions(included_fields=list(fields), use_threads=False)
            reader = self._readers[fields] = pa.ipc.open_file(self._source, options=opts)
        return {k: reader.get_batch(k).columns for k in keep}

    def prefetch(self, fields: Sequence[int]) -> None:
        """Nothing: a column's buffers are spread over the file (the kernel's read-ahead around
        each brings in the other columns' too; docs/store.md)."""


class _ColumnMajor:
    """Layout 2's columns: each one its own Arrow IPC file (the extent's batches of that column)
    at a byte range the header gives, so a read of k columns touches k ranges of the file."""

    def __init__(self, path: Path, header: dict[str, Any], size: int) -> None:
        self._path = path
        self.schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(header["schema"])))
        self.ranges: list[tuple[int, int]] = [(int(o), int(n)) for o, n in header["columns"]]
        if len(self.ranges) != len(self.schema) or any(o < 0 or o + n > size for o, n in self.ranges):
            raise ValueError(f"extent {path}: its header's column ranges do not fit the file")
        self.num_batches = int(header["batches"])
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # No read-around on a fault: the kernel's (here 8 MiB: read_ahead_kb) would bring in the
        # neighbouring columns, which is what this layout avoids. The selected columns' ranges
        # are read ahead explicitly, whole (``prefetch``); a fault outside them (a column's
        # footer) reads its page alone.
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self._map.madvise(mmap.MADV_RANDOM)
        self._whole = pa.py_buffer(self._map)  # zero-copy: the map
        self._readers: dict[int, pa.ipc.RecordBatchFileReader] = {}

    def _reader(self, i: int) -> pa.ipc.RecordBatchFileReader:
        reader = self._readers.get(i)
        if reader is None:
            off, n = self.ranges[i]
            # one thread, as layout 1's reads (above)
            opts = pa.ipc.IpcReadOptions(use_threads=False)
            reader = pa.ipc.open_file(pa.BufferReader(self._whole.slice(off, n)), options=opts)
            if reader.num_record_batches != self.num_batches:
                raise ValueError(f"extent {self._path}: column {i} holds {reader.num_record_batches} batches")
            self._readers[i] = reader
        return reader

    def read(self, fields: tuple[int, ...], keep: Sequence[int]) -> dict[int, list[pa.Array]]:
        out: dict[int, list[pa.Array]] = {k: [] for k in keep}
        whole = len(keep) == self.num_batches
        for i in fields:
            reader = self._reader(i)
            chunks = reader.read_all().column(0).chunks if whole else None
            if chunks is not None and len(chunks) == self.num_batches:
                for k in keep:  # keep is every batch, in order
                    out[k].append(chunks[k])
            else:
                for k in keep:
                    out[k].append(reader.get_batch(k).column(0))
        return out

    def prefetch(self, fields: Sequence[int]) -> None:
        """Ask the kernel to read the ranges of ``fields`` now, all of them at once and ahead of
        their decoding (``POSIX_FADV_WILLNEED``: asynchronous; the map's faults then find the
        pages in the page cache). A hint: where it is not available, the faults read them."""
        if not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(self._path, os.O_RDONLY)
        except OSError:
            return
        try:
            for i in fields:
                off, n = self.ranges[i]
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


class OpenExtent:
    """An extent file opened once (memory-mapped): its sub-bucket index and its batches. Extent
    files are immutable (written to a temporary name, renamed), so an open extent stays valid for
    as long as the file version it was read from (path, mtime, size) is the one on disk.

    An uncompressed extent's batches are views of the map (no process memory). A compressed
    extent decompresses a column of a batch the first time a read selects both, and keeps it:
    ``resident`` counts those bytes, which the node's cache of open extents bounds
    (``NodeStore``). So a query decompresses only the columns it reads, and a recovery read of
    one bucket only that bucket's batches. Either layout (``LAYOUTS``) reads the same; a
    column-major one (2) touches only the selected columns' bytes of the file."""

    def __init__(self, columns: _BatchMajor | _ColumnMajor, layout: int) -> None:
        schema = columns.schema
        meta = schema.metadata or {}
        index = json.loads(meta.get(BUCKETS_META, b"[]"))
        n = columns.num_batches
        self.layout = layout
        self.codec = meta.get(COMPRESSION_META, b"none").decode()
        self.compressed = self.codec != "none"
        self.schema = _strip(schema)  # without the bucket index metadata
        self._cols = columns
        self._lock = threading.Lock()
        # whole-extent reads by their columns: the table assembled once (views of the batches'
        # columns, no copy), so a repeated query's read builds no batch objects (a few µs each,
        # ~64 per extent: a fifth of a small matched fragment's time on its node)
        self._tables: OrderedDict[tuple[int, ...], pa.Table] = OrderedDict()
        self._batches: list[pa.RecordBatch | None] = [None] * n  # uncompressed: views of the map
        self._columns: list[dict[int, pa.Array]] = [{} for _ in range(n)]  # compressed: decoded ones
        self.resident = 0  # bytes of decompressed columns held
        # columns taken as reads select them: every compressed extent, and a column-major one
        # whatever its codec (its columns' views of the map built up front would read every
        # column's footer); a batch-major uncompressed one's batches are views built here
        self._lazy = self.compressed or layout == 2
        sized = len(index) == n and all(len(ix) >= 4 for ix in index)
        if not self._lazy:
            assert isinstance(columns, _BatchMajor)
            for k in range(n):
                self._batches[k] = columns.batch(k).replace_schema_metadata(self.schema.metadata)
        if len(index) != n:  # an extent without a bucket index: no bucket selects anything
            index = [[-1, -1] for _ in range(n)]
        self.index: tuple[tuple[int, ...], ...] = tuple(tuple(ix) for ix in index)
        # per batch: bytes, uncompressed (RecordBatch.nbytes costs per call; counted once)
        self.sizes: tuple[int, ...] = tuple(
            int(ix[3]) if sized else int(self._batch(k, range(len(self.schema))).nbytes)
            for k, ix in enumerate(index)
        )

    def decoded_shares(self) -> dict[str, float]:
        """Per column held decoded, the share of the extent's batches it is held for (a column
        not held: absent)."""
        n = len(self._columns)
        if not n:
            return {}
        with self._lock:
            counts: dict[int, int] = {}
            for have in self._columns:
                for i in have:
                    counts[i] = counts.get(i, 0) + 1
        return {self.schema.field(i).name: c / n for i, c in counts.items()}

    def _load(self, fields: Sequence[int], keep: Sequence[int]) -> None:
        """Decode the columns ``fields`` of the batches ``keep`` not decoded yet. Under
        ``_lock``, lazily decoded extents only."""
        missing = tuple(sorted({i for k in keep for i in fields if i not in self._columns[k]}))
        if not missing:
            return
        # their ranges read ahead, whole (column-major only; in the order selected): a bucket's
        # batches are a part of them, but read so are never slower than read by faults
        self._cols.prefetch([i for i in dict.fromkeys(fields) if i in missing])
        # the batches lacking any of them (a column is decoded for the batches read so far)
        todo = [k for k in keep if any(i not in self._columns[k] for i in missing)]
        for k, cols in self._cols.read(missing, todo).items():
            have = self._columns[k]
            for i, col in zip(missing, cols, strict=True):
                if i not in have:
                    have[i] = col
                    if self.compressed:  # an uncompressed column is a view of the map
                        self.resident += int(col.nbytes)

    def _batch(self, k: int, fields: Sequence[int]) -> pa.RecordBatch:
        """Batch ``k`` with ``fields`` (indices into the schema, in that order). Under ``_lock``
        for lazily decoded extents."""
        if not self._lazy:
            b = self._batches[k]
            assert b is not None
            return (
                b
                if len(fields) == len(self.schema) and list(fields) == sorted(fields)
                else b.select(list(fields))
            )
        have = self._columns[k]
        if not fields:  # no column (count(*)): the batch's rows, nothing decompressed
            ix = self.index[k]
            rows = ix[2] if len(ix) > 2 else len(next(iter(have.values())))
            empty = pa.RecordBatch.from_arrays([pa.nulls(rows)], names=["_"]).select([])
            return empty.replace_schema_metadata(self.schema.metadata)
        self._load(fields, [k])
        return pa.RecordBatch.from_arrays(
            [have[i] for i in fields],
            schema=pa.schema([self.schema.field(i) for i in fields], metadata=self.schema.metadata),
        )

    @property
    def batches(self) -> tuple[pa.RecordBatch, ...]:
        everything = range(len(self.schema))
        with self._lock:
            if self._lazy:
                self._load(everything, range(len(self.index)))
            return tuple(self._batch(k, everything) for k in range(len(self.index)))

    def _keep(self, bucket: tuple[int, int] | None) -> list[int]:
        """The batches a read of ``bucket`` (None: the whole extent) selects, in order."""
        if bucket is None:
            return list(range(len(self.index)))
        pos, part = bucket
        return [k for k, ix in enumerate(self.index) if ix[pos] == part]

    def _fields(self, columns: Sequence[str] | None) -> list[int]:
        if columns is None:
            return list(range(len(self.schema)))
        fields = []
        for c in columns:
            i = self.schema.get_field_index(c)
            if i < 0:
                raise KeyError(f"no column {c!r} in this extent")
            fields.append(i)
        return fields

    def _rows(self, k: int) -> int:
        ix = self.index[k]
        if len(ix) > 2 and ix[2] >= 0:
            return int(ix[2])
        with self._lock:
            return self._batch(k, [0] if len(self.schema) else []).num_rows

    def take(
        self, bucket: tuple[int, int] | None, columns: Sequence[str] | None, positions: Sequence[int]
    ) -> tuple[pa.Table, int]:
        """The rows at ``positions`` (in ascending order, into what ``select(bucket, columns)``
        returns) of ``columns``, decoding only the batches they are in (a late-materialized top-k
        fetches its few winners' other columns: ``_exec.late_rows``). Returns ``(rows, bytes of
        the batches read)``; a position outside the selection is an ``IndexError``."""
        keep = self._keep(bucket)
        fields = self._fields(columns)
        starts = np.cumsum([0] + [self._rows(k) for k in keep])
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= starts[-1]):
            raise IndexError(f"row positions outside the extent's {int(starts[-1])} rows")
        which = np.searchsorted(starts, pos, side="right") - 1
        need = sorted(set(which.tolist()))
        with self._lock:
            if self._lazy and fields:
                self._load(fields, [keep[j] for j in need])
            batches = [self._batch(keep[j], fields) for j in need]
        out = pa.schema([self.schema.field(i) for i in fields], metadata=self.schema.metadata)
        sub = pa.Table.from_batches(batches, schema=out)
        offset = dict(zip(need, np.cumsum([0] + [b.num_rows for b in batches])[:-1].tolist(), strict=True))
        at = [offset[j] + int(p - starts[j]) for p, j in zip(pos.tolist(), which.tolist(), strict=True)]
        return sub.take(pa.array(at, pa.int64())), sum(self.sizes[keep[j]] for j in need)

    def select(
        self, bucket: tuple[int, int] | None = None, columns: Sequence[str] | None = None
    ) -> tuple[pa.Table, int]:
        keep = self._keep(bucket)
        fields = self._fields(columns)
        read = sum(self.sizes[k] for k in keep)
        key = tuple(fields)
        with self._lock:
            if bucket is None and key in self._tables:
                self._tables.move_to_end(key)
                return self._tables[key], read
            if self._lazy and fields:
                self._load(fields, keep)
            batches = [self._batch(k, fields) for k in keep]
        out = pa.schema([self.schema.field(i) for i in fields], metadata=self.schema.metadata)
        table = pa.Table.from_batches(batches, schema=out)
        if bucket is None:
            with self._lock:
                self._tables[key] = table
                while len(self._tables) > TABLES_KEPT:
                    self._tables.popitem(last=False)
        return table, read


def extent_layout(path: Path) -> int:
    """The layout (``LAYOUTS``) of an extent file, by its first bytes."""
    with open(path, "rb") as f:
        return 2 if f.read(len(COLUMNAR_MAGIC)) == COLUMNAR_MAGIC else 1


def open_extent(path: Path) -> OpenExtent:
    """Open an extent file of either layout, memory-mapped: only the batches (and, compressed,
    the columns of them) a query selects are touched. Every read of an extent's rows goes
    through here (``NodeStore.read``: queries, the Flight endpoints, rebuilds and recodes)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(16)
        if head[: len(COLUMNAR_MAGIC)] == COLUMNAR_MAGIC:
            n = int.from_bytes(head[8:16], "little")
            size = os.fstat(f.fileno()).st_size
            if n > size - 16:
                raise ValueError(f"extent {path}: its header is cut off")
            header = json.loads(f.read(n))
            if header.get("layout") != 2:
                raise ValueError(f"extent {path}: unknown layout {header.get('layout')!r}")
            return OpenExtent(_ColumnMajor(path, header, size), 2)
    source = pa.memory_map(str(path), "r")
    return OpenExtent(_BatchMajor(source, pa.ipc.open_file(source)), 1)


def read_extent(
    path: Path, bucket: tuple[int, int] | None = None, columns: Sequence[str] | None = None
) -> tuple[pa.Table, int]:
    """Rows of an extent file; with ``bucket=(pos, part)`` only the sub-buckets whose index at
    ``pos`` (0 or 1, see ``others``) is ``part``. Returns ``(rows, bytes read)``. Memory-mapped,
    so only the selected batches' bytes are touched (the table keeps the mapping alive)."""
    return open_extent(path).select(bucket, columns)
