"""Dataset index: samples named by content, grouped deterministically into chunks.

Indexing is a pure function of the bytes: files are taken in path order and cut into chunks
of about ``chunk_bytes``; a chunk's bytes are its samples' bytes concatenated, and its name
is their digest. So the same data registered twice, by anyone, yields the same digests, and
one cached copy serves everyone who holds it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ._digest import digest, is_digest

INDEX_VERSION = 1
DEFAULT_CHUNK_BYTES = 4 << 20
INDEX_DIR = ".quiver"


@dataclass(frozen=True)
class SampleRef:
    """Where a sample sits: its file, digest, chunk and byte range inside the chunk."""

    index: int
    path: str
    digest: str
    size: int
    chunk: int
    offset: int


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
    _by_chunk_digest: dict[str, ChunkRef] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_chunk_digest.update({c.digest: c for c in self.chunks})

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
        doc = {
            "version": INDEX_VERSION,
            "chunk_bytes": self.chunk_bytes,
            "samples": [[s.path, s.size, s.digest] for s in self.samples],
            "chunks": [c.count for c in self.chunks],
            "chunk_digests": [c.digest for c in self.chunks],
        }
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
            if doc.get("version") != INDEX_VERSION:
                raise InvalidArgument(f"unsupported index version {doc.get('version')!r}")
            rows = [(str(p), int(n), str(d)) for p, n, d in doc["samples"]]
            counts = [int(c) for c in doc["chunks"]]
            chunk_digests = [str(d) for d in doc["chunk_digests"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"malformed dataset index: {exc}") from exc
        return _assemble(rows, counts, chunk_digests, int(doc["chunk_bytes"]))


def plan_chunks(sizes: Sequence[int], chunk_bytes: int) -> list[int]:
    """How many consecutive samples go in each chunk: close a chunk once it reaches
    ``chunk_bytes`` (a sample larger than that is a chunk of its own)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    counts: list[int] = []
    n = acc = 0
    for size in sizes:
        if n and acc + size > chunk_bytes:
            counts.append(n)
            n = acc = 0
        n += 1
        acc += size
    if n:
        counts.append(n)
    return counts


def _assemble(
    rows: Sequence[tuple[str, int, str]],
    counts: Sequence[int],
    chunk_digests: Sequence[str],
    chunk_bytes: int,
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
            path, size, sd = rows[i]
            if not is_digest(sd):
                raise InvalidArgument(f"bad sample digest {sd!r}")
            samples.append(SampleRef(i, path, sd, size, ci, off))
            off += size
            i += 1
        chunks.append(ChunkRef(ci, cd, i - count, count, off))
    return DatasetIndex(tuple(samples), tuple(chunks), chunk_bytes)


def build_index(
    files: Iterable[tuple[str, int]],
    read: Callable[[str], bytes],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
) -> DatasetIndex:
    """Index a dataset: read each file once (``read(path)``), hash samples and chunks.

    ``files`` is (path, size) sorted by path; ``progress(nbytes)`` is called per file.
    """
    import blake3

    files = sorted(files)
    counts = plan_chunks([size for _, size in files], chunk_bytes)
    rows: list[tuple[str, int, str]] = []
    chunk_digests: list[str] = []
    it = iter(files)
    for count in counts:
        h = blake3.blake3()
        for _ in range(count):
            path, _size = next(it)
            data = read(path)
            # The size read wins over the listed one: the index describes the bytes hashed.
            rows.append((path, len(data), digest(data)))
            h.update(data)
            if progress:
                progress(len(data))
        chunk_digests.append(h.hexdigest())
    return _assemble(rows, counts, chunk_digests, chunk_bytes)


def index_store(store, chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress=None) -> DatasetIndex:  # type: ignore[no-untyped-def]
    """Index every file of a backing store. A store whose ``chunk_per_file`` is true (a store
    table: its files' sizes are known only once read) makes each file a chunk of its own."""
    files = store.list_files()
    if not files:
        from microco.common.errors import InvalidArgument

        raise InvalidArgument(f"dataset at {store.url!r} has no files")
    if getattr(store, "chunk_per_file", False):
        # (any listed size of at least the chunk size makes every file a chunk of its own; the
        # index records the sizes read)
        files, chunk_bytes = [(path, 1) for path, _ in files], 1
    return build_index(files, store.read, chunk_bytes, progress)


def index_path(index_digest: str) -> str:
    """Where an index is kept beside its data (relative to the dataset root)."""
    return f"{INDEX_DIR}/index-{index_digest}.json"
