"""The in-process explorer's state on this host's disk (issue 18: the second run starts tuned).

Without the compiler service, ``LocalExplorer`` kept its explorations in memory, so the next run
of the same model on the same machine explored again from nothing. :class:`FileKV` is the KV the
core already writes to (``CompilerCore``: explorations, committed configurations, per-key compile
costs), kept in one JSON file beside the host's record of compile times
(``_compile_costs.HostCompileCosts``, same directory): the tuned configurations and what compiles
cost on this host are persisted together, and both describe this host only.

Every write re-reads the file and replaces it atomically under an exclusive ``flock`` of a lock
file beside it, so runs of several models in parallel on one host each keep their keys; reads
reload the file when it changed on disk. Leases are in memory only (the core uses none).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from microco.common import InvalidArgument, Lease, MemoryKV

log = logging.getLogger(__name__)


def default_dir() -> Path:
    """Where this host keeps what the compiler learned: ``$MICROCO_COMPILER_HOME``, else
    ``~/.cache/microco`` (also the default home of ``compile_costs.json``)."""
    env = os.environ.get("MICROCO_COMPILER_HOME")
    return Path(env) if env else Path.home() / ".cache" / "microco"


def default_state_path() -> Path:
    """``$MICROCO_COMPILER_STATE``, else ``<default_dir()>/compiler_state.json``."""
    env = os.environ.get("MICROCO_COMPILER_STATE")
    return Path(env) if env else default_dir() / "compiler_state.json"


class FileKV(MemoryKV):
    """A ``MemoryKV`` whose keys (those put without a lease) live in a JSON file."""

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._reload()

    # -- the file
    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp is not None and stamp == self._stamp:
            return
        data: dict[str, str] = {}
        if stamp is not None:
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                if isinstance(raw, dict):
                    data = {str(k): str(v) for k, v in raw.items()}
            except (OSError, ValueError) as exc:
                log.warning("compiler state %s unreadable (%s); starting empty", self.path, exc)
        with self._lock:
            leased = {k: v for k, v in self._data.items() if v[1] is not None}
            self._data = {k: (v.encode("utf-8"), None) for k, v in data.items()}
            self._data.update(leased)
        self._stamp = stamp

    def _write(self) -> None:
        data = {k: v.decode("utf-8") for k, (v, lid) in self._data.items() if lid is None}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".compiler_state.")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:  # a read-only home: the state stays in memory for this run
            log.warning("compiler state not saved to %s (%s)", self.path, exc)
            return
        self._stamp = self._file_stamp()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive across processes (``flock``) and threads, with the file reloaded first."""
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                lock = open(self.path.with_name(self.path.name + ".lock"), "a")
            except OSError:
                lock = None
            try:
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                self._reload()
                yield
            finally:
                if lock is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    lock.close()

    # -- KV
    def get(self, key: str) -> bytes | None:
        self._reload()
        return super().get(key)

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        self._reload()
        return super().get_prefix(prefix)

    def commit(
        self,
        checks: Sequence[tuple[str, bytes | None]] = (),
        puts: Mapping[str, bytes] | None = None,
        deletes: Sequence[str] = (),
        lease: Lease | None = None,
    ) -> bool:
        for value in (puts or {}).values():
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidArgument("FileKV keeps UTF-8 text values only") from exc
        with self._locked():
            ok = super().commit(checks, puts, deletes, lease)
            if ok and (lease is None or deletes):
                self._write()
            return ok

    def delete(self, key: str) -> bool:
        with self._locked():
            gone = super().delete(key)
            if gone:
                self._write()
            return gone

    def delete_prefix(self, prefix: str) -> int:
        with self._locked():
            n = super().delete_prefix(prefix)
            if n:
                self._write()
            return n
