"""Dataset index: samples named by content, grouped deterministically into chunks.

Indexing is a pure function of the bytes: files are taken in path order, each file is one
sample or, under a record format (``_records``: TFRecord, WebDataset tar, lines, ...), many,
and the samples are cut into chunks of about ``chunk_bytes``; a chunk's bytes are its samples'
bytes concatenated, and its name is their digest. So the same data registered twice, by
anyone, yields the same digests, and one cached copy serves everyone who holds it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._digest import digest, is_digest
from ._records import Window, check_format, frames, record_spans

INDEX_VERSION = 1  # one file, one sample (unchanged, so such indexes keep their digests)
RECORDS_INDEX_VERSION = 2  # samples are byte ranges of their files
DEFAULT_CHUNK_BYTES = 4 << 20
INDEX_DIR = ".quiver"


@dataclass(frozen=True)
class SampleRef:
    """Where a sample sits: its file, digest, chunk and byte range inside the chunk; ``start``
    its offset in the file when it is one record of many (-1: the whole file)."""

    index: int
    path: str
    digest: str
    size: int
    chunk: int
    offset: int
    start: int = -1


@dataclass(frozen=True)
class ChunkRef:
    """A chunk: the samples ``first .. first+count-1`` concatenated, named by their digest."""

    index: int
    digest: str
    first: int
    count: int
    size: int


@dataclass(frozen=True)
class DatasetIndex:
    """The immutable index of one dataset's contents."""

    samples: tuple[SampleRef, ...]
    chunks: tuple[ChunkRef, ...]
    chunk_bytes: int
    records: str = "file"
    _by_chunk_digest: dict[str, ChunkRef] = field(default_factory=dict, compare=False, repr=False)
    #: Each file's stamp key (``_backing.file_stamps``), in ``files()`` order, taken *before* it
    #: was read for this index, where known: a file whose stamp differs since may hold other
    #: bytes (the loader checks it at each epoch). Not part of the index's bytes or digest (it
    #: describes this host's copy).
    stamps: Sequence[int] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_chunk_digest.update({c.digest: c for c in self.chunks})

    def files(self) -> list[str]:
        """The paths of the files holding samples, sorted (each once)."""
        return sorted({s.path for s in self.samples})

    @property
    def total_bytes(self) -> int:
        return sum(c.size for c in self.chunks)

    def __len__(self) -> int:
        return len(self.samples)

    def chunk_of(self, sample_index: int) -> ChunkRef:
        return self.chunks[self.samples[sample_index].chunk]

    def chunk_by_digest(self, chunk_digest: str) -> ChunkRef | None:
        return self._by_chunk_digest.get(chunk_digest)

    def samples_of(self, chunk: ChunkRef) -> Sequence[SampleRef]:
        return self.samples[chunk.first : chunk.first + chunk.count]

    def split_chunk(self, chunk: ChunkRef, data: bytes) -> list[bytes]:
        """The samples' bytes inside a chunk's bytes."""
        return [data[s.offset : s.offset + s.size] for s in self.samples_of(chunk)]

    def to_bytes(self) -> bytes:
        """Canonical serialisation; its digest names the index."""
        doc: dict[str, object] = {
            "version": INDEX_VERSION,
            "chunk_bytes": self.chunk_bytes,
            "samples": [[s.path, s.size, s.digest] for s in self.samples],
            "chunks": [c.count for c in self.chunks],
            "chunk_digests": [c.digest for c in self.chunks],
        }
        if self.records != "file":
            # Records: each path once, each sample (file number, offset in it, size, digest).
            files = sorted({s.path for s in self.samples})
            number = {p: i for i, p in enumerate(files)}
            doc.update(
                version=RECORDS_INDEX_VERSION,
                records=self.records,
                files=files,
                samples=[[number[s.path], s.start, s.size, s.digest] for s in self.samples],
            )
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @property
    def digest(self) -> str:
        return digest(self.to_bytes())

    @classmethod
    def from_bytes(cls, raw: bytes, expect_digest: str | None = None) -> DatasetIndex:
        """Parse an index, refusing one whose digest is not ``expect_digest``."""
        from microco.common.errors import FailedPrecondition, InvalidArgument

        if expect_digest is not None and digest(raw) != expect_digest:
            raise FailedPrecondition(f"index does not match its digest {expect_digest[:12]}...")
        try:
            doc = json.loads(raw)
            version = doc.get("version")
            if version == INDEX_VERSION:
                records = "file"
                rows = [(str(p), int(n), str(d), -1) for p, n, d in doc["samples"]]
            elif version == RECORDS_INDEX_VERSION:
                records = check_format(str(doc["records"]))
                files = [str(p) for p in doc["files"]]
                rows = [(files[int(f)], int(n), str(d), int(st)) for f, st, n, d in doc["samples"]]
            else:
                raise InvalidArgument(f"unsupported index version {version!r}")
            counts = [int(c) for c in doc["chunks"]]
            chunk_digests = [str(d) for d in doc["chunk_digests"]]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise InvalidArgument(f"malformed dataset index: {exc}") from exc
        return _assemble(rows, counts, chunk_digests, int(doc["chunk_bytes"]), records)


def plan_chunks(sizes: Sequence[int], chunk_bytes: int) -> list[int]:
    """How many consecutive samples go in each chunk: close a chunk once it reaches
    ``chunk_bytes`` (a sample larger than that is a chunk of its own)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    counts: list[int] = []
    n = acc = 0
    for size in sizes:
        if _closes(n, acc, size, chunk_bytes):
            counts.append(n)
            n = acc = 0
        n += 1
        acc += size
    if n:
        counts.append(n)
    return counts


def _closes(n: int, acc: int, size: int, chunk_bytes: int) -> bool:
    """Whether a chunk of ``n`` samples and ``acc`` bytes closes before a sample of ``size``."""
    return n > 0 and acc + size > chunk_bytes


def _assemble(
    rows: Sequence[tuple[str, int, str, int]],
    counts: Sequence[int],
    chunk_digests: Sequence[str],
    chunk_bytes: int,
    records: str = "file",
) -> DatasetIndex:
    from microco.common.errors import InvalidArgument

    if sum(counts) != len(rows) or len(counts) != len(chunk_digests):
        raise InvalidArgument("index chunk table does not cover its samples")
    samples: list[SampleRef] = []
    chunks: list[ChunkRef] = []
    i = 0
    for ci, (count, cd) in enumerate(zip(counts, chunk_digests, strict=True)):
        if not is_digest(cd):
            raise InvalidArgument(f"bad chunk digest {cd!r}")
        off = 0
        for _ in range(count):
            path, size, sd, start = rows[i]
            if not is_digest(sd):
                raise InvalidArgument(f"bad sample digest {sd!r}")
            samples.append(SampleRef(i, path, sd, size, ci, off, start))
            off += size
            i += 1
        chunks.append(ChunkRef(ci, cd, i - count, count, off))
    return DatasetIndex(tuple(samples), tuple(chunks), chunk_bytes, records)


def build_index(
    files: Iterable[tuple[str, int]],
    read: Callable[[str], bytes],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    records: str = "file",
    read_range: Callable[[str, int, int], bytes] | None = None,
) -> DatasetIndex:
    """Index a dataset: read each file once (``read(path)``), hash samples and chunks.

    ``files`` is (path, size), taken in path order; ``progress(nbytes)`` is called per file.
    ``records``: what a sample is (``_records``): a whole file (``file``) or each record of a
    file (``tfrecord``, ``tar``, ``lines``, ``npy``, ``fixed:N``). Chunks are cut as
    ``plan_chunks`` cuts them, over the sizes read. With ``read_range(path, start, size)``
    a file of records is read in pieces, not whole: ``fixed:N`` records (whose spans follow
    from its size) in pieces of about ``FIXED_PIECE_BYTES``, the other formats framed record
    by record through a ``Window`` (``_records.frames``, pieces of ``PIECE_BYTES``): a token
    file, a JSON-lines file or a shard larger than memory indexes (the same index either way).
    """
    import blake3

    from microco.common.errors import InvalidArgument

    records = check_format(records)
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    whole = records == "file"
    rows: list[tuple[str, int, str, int]] = []
    counts: list[int] = []
    chunk_digests: list[str] = []
    h, n, acc = blake3.blake3(), 0, 0
    fixed = int(records[6:]) if records.startswith("fixed:") and read_range is not None else 0
    framed = records != "file" and not fixed and read_range is not None
    for path, _size in sorted(files):
        try:
            if framed:
                pieces = _framed_pieces(path, read_range, _size, records)  # type: ignore[arg-type]
            elif fixed:
                pieces = _fixed_pieces(path, read_range, fixed)  # type: ignore[arg-type]
            else:
                pieces = iter([(0, read(path))])
            covered = 0
            for base, data in pieces:
                view = memoryview(data)
                try:
                    spans = [(0, len(data))] if framed else record_spans(records, data)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"{path}: {exc} (registered with --records {records})") from None
                for start, length in spans:
                    if _closes(n, acc, length, chunk_bytes):
                        counts.append(n)
                        chunk_digests.append(h.hexdigest())
                        h, n, acc = blake3.blake3(), 0, 0
                    piece = view[start : start + length]
                    # The size read wins over the listed one: the index describes the bytes hashed.
                    rows.append((path, length, digest(piece), -1 if whole else base + start))
                    h.update(piece)
                    n += 1
                    acc += length
                if progress:
                    # (a framed file: up to this record's end, its framing included)
                    progress(base + len(data) - covered if framed else len(data))
                    covered = base + len(data)
                view = piece = memoryview(b"")  # (this piece freed before the next is read)
                del data
            if progress and framed and _size > covered:
                progress(_size - covered)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise InvalidArgument(
                f"{path}: gone from the dataset while it was being indexed ({type(exc).__name__}): "
                "register it again once it holds still"
            ) from None
    if n:
        counts.append(n)
        chunk_digests.append(h.hexdigest())
    if not rows:
        raise InvalidArgument(f"no {records} records in the dataset's files")
    return _assemble(rows, counts, chunk_digests, chunk_bytes, records)


FIXED_PIECE_BYTES = 8 << 20


def _framed_pieces(
    path: str, read_range: Callable[[str, int, int], bytes], size: int, records: str
) -> Iterable[tuple[int, bytes]]:
    """Each record of a file as an (offset, bytes) piece, framed by its format (``frames``)
    and read through a ``Window``: a shard (a TFRecord, a tar, a JSON-lines file...) is never
    read whole (a 1 GB JSON-lines file peaked at 1.16 GB RSS to register, now 173 MB)."""
    from microco.common.errors import InvalidArgument

    w = Window(lambda start, n: read_range(path, start, n), size)
    try:
        for start, length in frames(records, w):
            data = w.get(start, length)
            if len(data) != length:
                raise InvalidArgument(
                    "it changed while it was being indexed: register it again once it holds still"
                )
            yield start, data
    except InvalidArgument as exc:
        raise InvalidArgument(f"{path}: {exc} (registered with --records {records})") from None


def _fixed_pieces(
    path: str, read_range: Callable[[str, int, int], bytes], size: int
) -> Iterable[tuple[int, bytes]]:
    """A file of ``size``-byte records as (offset, bytes) pieces of whole records, read one at
    a time until a short piece (its end); an empty file is one empty piece."""
    step = max(size, FIXED_PIECE_BYTES // size * size)
    base = 0
    while True:
        data = read_range(path, base, step)
        if len(data) % size:
            # (what the whole-file parser says of the whole file)
            from microco.common.errors import InvalidArgument

            raise InvalidArgument(
                f"{path}: a file of {base + len(data)} bytes is not a whole number of {size}-byte records "
                f"(registered with --records fixed:{size})"
            )
        short = len(data) < step
        if data or not base:
            yield base, data
        del data  # (one piece in memory at a time)
        if short:
            return
        base += step


def included(files: Sequence[tuple[str, int]], include: str) -> list[tuple[str, int]]:
    """The (path, size) of ``files`` whose path or name matches the glob ``include`` (all of
    them when it is empty)."""
    import fnmatch

    if not include:
        return list(files)
    return [
        (p, n)
        for p, n in files
        if fnmatch.fnmatchcase(p, include) or fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], include)
    ]


def index_store(
    store: Any,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    records: str = "file",
    include: str = "",
) -> DatasetIndex:
    """Index every file of a backing store (``records``: see ``build_index``), or those whose
    path (relative to the dataset's root) or name matches the glob ``include`` (a folder as
    TFDS writes it: ``*.tfrecord-*`` beside ``dataset_info.json``). A store whose
    ``chunk_per_file`` is true (a store table: its files' sizes are known only once read)
    makes each file a chunk of its own."""
    files = included(store.list_files(), include)
    if not files:
        from microco.common.errors import InvalidArgument

        which = f" matching {include!r}" if include else ""
        raise InvalidArgument(f"dataset at {store.url!r} has no files{which}")
    if getattr(store, "chunk_per_file", False):
        if records != "file":
            from microco.common.errors import InvalidArgument

            raise InvalidArgument(
                f"a store table's samples are its extents: record format {records!r} does not apply"
            )
        # (a chunk size of one byte makes every file a chunk of its own; the index records the
        # sizes read)
        chunk_bytes = 1
    from array import array
    from dataclasses import replace

    from ._backing import file_stamps

    # Stamped before the reads: a file rewritten while it is indexed then shows as changed
    # (and is hashed again) rather than passing as the bytes indexed.
    listed = [p for p, _ in files]
    stamps = file_stamps(store, listed)
    index = build_index(files, store.read, chunk_bytes, progress, records, getattr(store, "read_range", None))
    if stamps is None:
        return index
    key = dict(zip(listed, stamps, strict=True))
    return replace(index, stamps=array("q", (key[p] for p in index.files())))


def index_path(index_digest: str) -> str:
    """Where an index is kept beside its data (relative to the dataset root)."""
    return f"{INDEX_DIR}/index-{index_digest}.json"
