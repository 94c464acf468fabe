"""Backing stores: where a dataset really lives (a local directory or any fsspec URL).

The cache is only ever an optimisation over a backing store: every sample can always be
read from here. A sample that is one record of a file (``_records``) is read by its byte
range (``read_range``, where the store has one; else the file is read and sliced), and
neighbouring records of one file are read together (``sample_runs``, ``read_run``). ``ThrottledStore`` caps the bandwidth of another store (a token bucket
shared by every reader of it), so benchmarks can model a remote blob store on one machine.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from microco.common.errors import FailedPrecondition

from ._digest import digest

if TYPE_CHECKING:
    from ._index import SampleRef

# Records of one file read in one request when the gap between them is at most this (TFRecord's
# framing, a tar's headers, newlines) and the request at most RUN_BYTES.
RUN_GAP_BYTES = 64 << 10
RUN_BYTES = 16 << 20
# ... and while the run's gaps together are at most its records' bytes, or this (a sector: the
# framing of small records, TFRecord's 16 bytes a record): the gaps are other samples' bytes,
# read again when those are (random 258-byte blocks of one 1.2 MB token file, 12 a batch, read
# 23x the file an epoch with gaps of 64 KB; 2.5x the misses with 8 KB of slack a run).
RUN_SLACK_BYTES = 512

#: A file's stamp (``file_stamps``): what changes when it is rewritten; None: the file is gone.
Stamp = tuple[Any, ...] | None
# What an fsspec listing may say about a file's version (local, S3, GCS, Azure, HTTP, memory).
_CHANGE_KEYS = ("mtime", "LastModified", "last_modified", "updated", "ETag", "etag", "md5Hash", "created")


class BackingStore(Protocol):
    """Read-only access to a dataset's files by path relative to its root."""

    url: str

    def list_files(self) -> list[tuple[str, int]]:
        """Every (relative path, size), sorted by path; hidden entries (``.quiver``...) left out."""
        ...

    def read(self, path: str) -> bytes: ...

    def write(self, path: str, data: bytes) -> None: ...


class LocalStore:
    """A dataset in a local directory, or one file (a shard of records: its folder is the root,
    the file the dataset's only one)."""

    def __init__(self, root: str) -> None:
        path = os.path.abspath(root)
        self.url = path
        self.only: str | None = None
        if os.path.exists(path) and not os.path.isdir(path):  # a file (a pipe: refused when listed)
            path, self.only = os.path.split(path)
        self.root = path
        if not os.path.isdir(self.root):
            from microco.common.errors import NotFound

            raise NotFound(f"dataset directory {self.root!r} does not exist")

    def list_files(self) -> list[tuple[str, int]]:
        if self.only is not None:
            return [(self.only, _regular_size(os.path.join(self.root, self.only), self.only))]
        # Symbolic links are followed, to files and to folders (a dataset assembled from links
        # is common), each link its own samples as a linked file is; a link to a folder that
        # holds it (back up the tree) would loop, and is cut.
        out = []
        above = {self.root: frozenset({os.path.realpath(self.root)})}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            keep = []
            for d in sorted(dirnames):
                real = os.path.realpath(os.path.join(dirpath, d))
                if not d.startswith(".") and real not in above[dirpath]:
                    above[os.path.join(dirpath, d)] = above[dirpath] | {real}
                    keep.append(d)
            dirnames[:] = keep
            for name in filenames:
                if name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                out.append((rel, _regular_size(full, rel)))
        out.sort()
        return out

    def read(self, path: str) -> bytes:
        with open(self._full(path), "rb") as f:
            return f.read()

    def stamps(self, paths: Sequence[str]) -> Iterator[Stamp]:
        """Each file's (size, mtime, ctime, inode), in ``paths``' order: any write, replacement
        or ``touch`` changes one (the ctime cannot be set back by hand, as ``cp -p`` sets an
        mtime back); None for a file that is gone."""
        for path in paths:
            try:
                st = os.stat(self._full(path))
            except OSError:
                yield None
                continue
            yield (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def read_range(self, path: str, start: int, size: int) -> bytes:
        with open(self._full(path), "rb") as f:
            f.seek(start)
            return f.read(size)

    def write(self, path: str, data: bytes) -> None:
        full = self._full(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        tmp = f"{full}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, full)

    def _full(self, path: str) -> str:
        full = os.path.normpath(os.path.join(self.root, path))
        if not full.startswith(self.root + os.sep):
            from microco.common.errors import InvalidArgument

            raise InvalidArgument(f"path {path!r} escapes the dataset root")
        return full


def _regular_size(full: str, rel: str) -> int:
    """The size of a dataset's file ``full`` (``rel`` in messages), refused unless it is a
    regular file, links followed."""
    from microco.common.errors import InvalidArgument

    try:
        st = os.stat(full)
    except OSError as exc:
        raise InvalidArgument(
            f"dataset file {rel!r} cannot be read: {exc.strerror} (a broken symbolic link?): remove it or fix it"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        # A named pipe's read would wait for a writer forever (the registration hung).
        raise InvalidArgument(
            f"dataset entry {rel!r} is not a regular file (a pipe, socket or device): "
            "remove it or register a folder without it"
        )
    return st.st_size


class FsspecStore:
    """A dataset under any fsspec URL (``s3://``, ``gs://``, ``memory://``, ``file://``...)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def list_files(self) -> list[tuple[str, int]]:
        out = []
        prefix = self.root.rstrip("/") + "/"
        for path, info in self.fs.find(self.root, detail=True).items():
            rel = path.removeprefix(prefix)
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            out.append((rel, int(info.get("size") or 0)))
        out.sort()
        return out

    def read(self, path: str) -> bytes:
        with self.fs.open(f"{self.root}/{path}", "rb") as f:
            data: bytes = f.read()
            return data

    def stamps(self, paths: Sequence[str]) -> list[Stamp]:
        """Each file's size and whatever of its listing says it was rewritten (a modification
        time, an ETag or a content hash, as the store lists them), in ``paths``' order: one
        listing, not a round trip per file; None for a file that is gone."""
        prefix = self.root.rstrip("/") + "/"
        listed = {
            path.removeprefix(prefix): info for path, info in self.fs.find(self.root, detail=True).items()
        }
        out: list[Stamp] = []
        for path in paths:
            info = listed.get(path)
            out.append(
                None
                if info is None
                else (int(info.get("size") or 0), *(str(info.get(k)) for k in _CHANGE_KEYS if k in info))
            )
        return out

    def read_range(self, path: str, start: int, size: int) -> bytes:
        data: bytes = self.fs.cat_file(f"{self.root}/{path}", start=start, end=start + size)
        return data

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open(f"{self.root}/{path}", "wb") as f:
            f.write(data)


class ThrottledStore:
    """Wraps a store so that all reads together run at most ``bytes_per_s`` (token bucket).

    ``latency_s`` adds a fixed per-request delay, like the first-byte time of a blob store.
    """

    def __init__(self, inner: BackingStore, bytes_per_s: float, latency_s: float = 0.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.bytes_per_s = float(bytes_per_s)
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._next_free = time.monotonic()
        self.bytes_read = 0
        self.reads = 0

    def __getstate__(self) -> dict[str, object]:
        # To a worker process (spawn): the same rate, a bucket of its own (the link is not
        # shared with the parent's readers across processes).
        return {"inner": self.inner, "bytes_per_s": self.bytes_per_s, "latency_s": self.latency_s}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["inner"], state["bytes_per_s"], state["latency_s"])  # type: ignore[misc]

    def list_files(self) -> list[tuple[str, int]]:
        return self.inner.list_files()

    def stamps(self, paths: Sequence[str]) -> Iterable[Stamp] | None:
        inner = getattr(self.inner, "stamps", None)  # (metadata: not paced)
        out: Iterable[Stamp] | None = inner(paths) if inner is not None else None
        return out

    def write(self, path: str, data: bytes) -> None:
        self.inner.write(path, data)

    def read(self, path: str) -> bytes:
        return self._paced(self.inner.read(path))

    def read_range(self, path: str, start: int, size: int) -> bytes:
        return self._paced(read_span(self.inner, path, start, size))

    def _paced(self, data: bytes) -> bytes:
        # Reserve a slot on the shared link: readers queue behind one another, as on a real pipe.
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + len(data) / self.bytes_per_s
            done = self._next_free + self.latency_s
            self.bytes_read += len(data)
            self.reads += 1
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return data


def file_stamps(store: BackingStore, paths: Sequence[str]) -> array[int] | None:
    """For each of ``paths``, a 64-bit key of what tells that its file may have been rewritten
    (``LocalStore.stamps``), in their order; None where the store cannot tell (a store of a
    user's own). Compact (8 bytes a file: a million files' stamps as tuples took ~250 MB) and
    the same in every process (a digest of the stamp, not Python's salted ``hash``)."""
    stamps = getattr(store, "stamps", None)
    got = stamps(paths) if stamps is not None else None
    if got is None:
        return None
    return array("q", (_stamp_key(st) for st in got))


def _stamp_key(stamp: Stamp) -> int:
    return int.from_bytes(
        hashlib.blake2b(repr(stamp).encode(), digest_size=8).digest(), "little", signed=True
    )


def open_store(url: str, kv: Any = None) -> BackingStore:
    """A store for a local path, ``file://`` URL, ``store://`` URL (a store table,
    ``StoreTable.from_url``: its nodes found through the etcd ``kv``, else the platform's) or
    any other fsspec URL."""
    if url.startswith("store://"):
        from ._table import StoreTable

        return StoreTable.from_url(url, kv)
    if "://" not in url:
        return LocalStore(url)
    if url.startswith("file://"):
        return LocalStore(url[len("file://") :])
    return FsspecStore(url)


def read_span(store: BackingStore, path: str, start: int, size: int) -> bytes:
    """``size`` bytes of ``path`` from ``start``: by range where the store reads ranges, else
    the whole file, sliced (a store of a user's own with only ``read``)."""
    read_range = getattr(store, "read_range", None)
    if read_range is not None:
        data: bytes = read_range(path, start, size)
        return data
    return store.read(path)[start : start + size]


def _changed(ref: SampleRef) -> FailedPrecondition:
    where = f"{ref.path!r}" if ref.start < 0 else f"{ref.path!r} at byte {ref.start}"
    return FailedPrecondition(f"sample {where} changed since the dataset was registered: re-register it")


def read_checked(store: BackingStore, ref: SampleRef) -> bytes:
    """A sample's bytes from the backing store (its file, or its record's range), refused
    unless they hash to the digest the dataset was registered with."""
    data = store.read(ref.path) if ref.start < 0 else read_span(store, ref.path, ref.start, ref.size)
    if digest(data) != ref.digest:
        raise _changed(ref)
    return data


def sample_runs(refs: Sequence[SampleRef]) -> list[list[SampleRef]]:
    """``refs`` grouped into reads: records of one file lying close together (gaps of at most
    ``RUN_GAP_BYTES``, a run of at most ``RUN_BYTES``, its gaps together at most its records'
    bytes or ``RUN_SLACK_BYTES``) form one run; a whole-file sample is a run of its own."""
    runs: list[list[SampleRef]] = []
    useful = waste = 0  # the last run's records' bytes and gaps' bytes
    for ref in sorted(refs, key=lambda r: (r.path, r.start, r.index)):
        last = runs[-1] if runs else None
        gap = ref.start - (last[-1].start + last[-1].size) if last is not None else -1
        if (
            last is not None
            and ref.start >= 0
            and last[-1].path == ref.path
            and last[-1].start >= 0
            and 0 <= gap <= RUN_GAP_BYTES
            and ref.start + ref.size - last[0].start <= RUN_BYTES
            and waste + gap <= max(RUN_SLACK_BYTES, useful + ref.size)
        ):
            last.append(ref)
            useful, waste = useful + ref.size, waste + gap
        else:
            runs.append([ref])
            useful, waste = ref.size, 0
    return runs


def read_run(store: BackingStore, run: Sequence[SampleRef]) -> list[bytes]:
    """The bytes of a run's samples (``sample_runs``), in its order, each checked against its
    digest: one read for the whole run. A file gone since registration is refused as a changed
    one is (``FailedPrecondition``, naming it), not as the store's bare ``FileNotFoundError``."""
    try:
        return _read_run(store, run)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        raise FailedPrecondition(
            f"sample file {run[0].path!r} is gone from the dataset's backing store since it was "
            f"registered ({type(exc).__name__}): re-register it"
        ) from None


def _read_run(store: BackingStore, run: Sequence[SampleRef]) -> list[bytes]:
    if len(run) == 1:
        return [read_checked(store, run[0])]
    base = run[0].start
    span = read_span(store, run[0].path, base, run[-1].start + run[-1].size - base)
    view = memoryview(span)
    out = []
    for ref in run:
        data = bytes(view[ref.start - base : ref.start - base + ref.size])
        if digest(data) != ref.digest:
            raise _changed(ref)
        out.append(data)
    return out
