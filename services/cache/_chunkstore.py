"""Chunks on local disk, verified by digest on the way in and on the way out.

Files are named by ``file_locator(digest)``, a one-way name: listing the directory does not
reveal the digests needed to read through the server, and the directory itself is not
listable by other users (mode 0711), so a same-host client can open a chunk file only after
the server granted its path to a request that named the digest. On start-up every file is
re-hashed: the digest recovered from the bytes must give the file's name, otherwise the file
is corrupt and is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from microco.clients.cache import digest, file_locator, is_digest
from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound

log = logging.getLogger(__name__)


class DigestMismatch(InvalidArgument):
    """Bytes offered for a digest do not hash to it."""


class CorruptChunk(FailedPrecondition):
    """A chunk on disk no longer matches its digest (it has been dropped)."""


class ChunkStore:
    """A directory of content-addressed chunk files; thread-safe."""

    MAX_OPEN = 256

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.dir = os.path.join(self.root, "chunks")
        self.tmp = os.path.join(self.root, "tmp")
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(self.tmp, exist_ok=True)
        os.chmod(self.dir, 0o711)
        os.chmod(self.tmp, 0o700)
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._fds: dict[str, int] = {}
        self.dropped_on_start = 0
        self._recover()

    def _recover(self) -> None:
        for name in os.listdir(self.tmp):
            os.unlink(os.path.join(self.tmp, name))
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            with open(path, "rb") as f:
                data = f.read()
            d = digest(data)
            if file_locator(d) != name:
                log.warning("dropping corrupt chunk file %s found at start-up", name)
                os.unlink(path)
                self.dropped_on_start += 1
                continue
            self._sizes[d] = len(data)

    def digests(self) -> dict[str, int]:
        """Digest -> size of everything held (for the server's own bookkeeping only)."""
        with self._lock:
            return dict(self._sizes)

    def __contains__(self, d: object) -> bool:
        return d in self._sizes

    def size(self, d: str) -> int:
        return self._sizes[d]

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def path(self, d: str) -> str:
        return os.path.join(self.dir, file_locator(d))

    def put(self, d: str, data: bytes, verified: bool = False) -> None:
        """Store ``data`` as chunk ``d``; ``DigestMismatch`` if it is not (``verified``: the
        caller has just hashed it)."""
        if not is_digest(d):
            raise InvalidArgument(f"malformed digest {d[:80]!r}")
        if not verified and digest(data) != d:
            raise DigestMismatch(f"bytes do not match digest {d[:12]}...")
        tmp = os.path.join(self.tmp, f"{file_locator(d)}.{threading.get_ident()}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
        except BaseException:
            # a write that failed (a full disk) leaves nothing holding the room (session 40)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._close_fd(d)
        os.replace(tmp, self.path(d))
        with self._lock:
            self._sizes[d] = len(data)

    def _fd(self, d: str) -> int:
        with self._lock:
            fd = self._fds.get(d)
            if fd is None:
                fd = os.open(self.path(d), os.O_RDONLY)
                if len(self._fds) >= self.MAX_OPEN:
                    os.close(self._fds.pop(next(iter(self._fds))))
                self._fds[d] = fd
            return fd

    def _close_fd(self, d: str) -> None:
        with self._lock:
            fd = self._fds.pop(d, None)
        if fd is not None:
            os.close(fd)

    def read(self, d: str, offset: int = 0, length: int = -1) -> bytes:
        """Raw bytes of a chunk (or a range of it); the caller verifies what it reads."""
        size = self._sizes.get(d)
        if size is None:
            raise NotFound("chunk not held here")
        if length < 0:
            length = size - offset
        for _ in range(2):
            try:
                # Open files are kept: a mini-batch reads many samples of the same chunks.
                return os.pread(self._fd(d), length, offset)
            except FileNotFoundError:
                self.drop(d)
                raise NotFound("chunk not held here") from None
            except OSError:  # closed by a concurrent eviction: reopen once
                self._close_fd(d)
        raise NotFound("chunk not held here")

    def read_verified(self, d: str) -> bytes:
        """A whole chunk, checked against its digest; a corrupt one is dropped."""
        data = self.read(d)
        if digest(data) != d:
            self.drop(d)
            raise CorruptChunk(f"chunk {d[:12]}... failed verification and was dropped")
        return data

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def verify(self, d: str) -> bool:
        """Re-hash chunk ``d``; drop it and return False when it does not match."""
        try:
            self.read_verified(d)
            return True
        except (CorruptChunk, NotFound):
            return False

    def drop(self, d: str) -> bool:
        self._close_fd(d)
        with self._lock:
            held = self._sizes.pop(d, None) is not None
        try:
            os.unlink(self.path(d))
        except FileNotFoundError:
            pass
        return held
