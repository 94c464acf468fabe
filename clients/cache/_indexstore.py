"""Where dataset indexes live: the cache's own state directory, never the user's data folder.

``$MICROCO_CACHE_INDEX_DIR``, else ``$MICROCO_HOME/cache/indexes``, else
``~/.microco/cache/indexes`` (a 0700 directory). An index is named by its digest, written
atomically (a temporary file in the same directory, then a rename), and is no more readable
than the data it describes: it names every chunk, and a chunk's digest is what grants the
right to read it from the cache. Indexes that older versions wrote beside the data
(``<data>/.quiver/index-<digest>.json``) are still read when the cache has none.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from array import array
from pathlib import Path

from ._backing import LocalStore


def index_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """The directory of this user's dataset indexes (not created here)."""
    explicit = os.environ.get("MICROCO_CACHE_INDEX_DIR")
    if home is None and explicit:
        return Path(explicit)
    base = Path(home) if home is not None else Path(os.environ.get("MICROCO_HOME", Path.home() / ".microco"))
    return base / "cache" / "indexes"


def index_file(index_digest: str, home: str | os.PathLike[str] | None = None) -> Path:
    return index_dir(home) / f"index-{index_digest}.json"


def data_mode(store) -> tuple[int, int | None]:  # type: ignore[no-untyped-def]
    """(permission bits, group) an index of ``store``'s data may have: the bits every data file
    grants (the most private file decides), and the files' group when they share one. Data
    that is not a local directory gives 0600 (only its registering user)."""
    if not isinstance(store, LocalStore):
        return 0o600, None
    mode = 0o666
    groups: set[int] = set()
    for path, _ in store.list_files():
        st = os.stat(os.path.join(store.root, path))
        mode &= stat.S_IMODE(st.st_mode)
        groups.add(st.st_gid)
    return mode & 0o666 | 0o600, (groups.pop() if len(groups) == 1 else None)


def write_index(raw: bytes, index_digest: str, mode: int, gid: int | None, home=None, stamps=None) -> Path:  # type: ignore[no-untyped-def]
    """Write ``raw`` as the index ``index_digest`` with at most ``mode``; atomically.
    ``stamps``: the data files' stamps taken before they were read for it (``DatasetIndex.stamps``),
    kept beside it (``index-<digest>.stamps.json``, the same mode) for this host's loaders."""
    if stamps is not None:
        doc = {"stamps": list(stamps)}
        _write_atomic(stamps_file(index_digest, home), json.dumps(doc).encode(), mode, gid, home)
    return _write_atomic(index_file(index_digest, home), raw, mode, gid, home)


def stamps_file(index_digest: str, home: str | os.PathLike[str] | None = None) -> Path:
    return index_dir(home) / f"index-{index_digest}.stamps.json"


def read_stamps(index_digest: str, home=None) -> array[int] | None:  # type: ignore[no-untyped-def]
    """The stamp keys ``write_index`` kept beside the index, if any (None: an index written
    before they were kept, or by another host's registration)."""
    for d in _candidates(home):
        try:
            doc = json.loads((d / f"index-{index_digest}.stamps.json").read_bytes())
            return array("q", doc["stamps"])
        except (FileNotFoundError, NotADirectoryError, PermissionError, ValueError, KeyError, TypeError):
            continue
    return None


def _write_atomic(final: Path, raw: bytes, mode: int, gid: int | None, home) -> Path:  # type: ignore[no-untyped-def]
    d = index_dir(home)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".tmp", dir=d)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
            if gid is not None and mode & 0o070:
                try:
                    os.fchown(f.fileno(), -1, gid)
                except OSError:  # not a member of the data's group: keep it to the owner
                    mode &= ~0o070
            elif mode & 0o070:
                mode &= ~0o070
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return final


def _candidates(home) -> list[Path]:  # type: ignore[no-untyped-def]
    """Index directories to look in: the given home, the environment's, the default home
    (a job's environment may lack MICROCO_HOME; the digest check makes any copy safe)."""
    out = [index_dir(home)] if home is not None else []
    out.append(index_dir())
    out.append(index_dir(Path.home() / ".microco"))
    seen: list[Path] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


def read_index(index_digest: str, store, home=None) -> bytes | None:  # type: ignore[no-untyped-def]
    """The raw index from the cache's directory, else from beside the data (older versions);
    None when neither has it."""
    for d in _candidates(home):
        try:
            return (d / f"index-{index_digest}.json").read_bytes()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
    from ._index import index_path

    try:
        data: bytes = store.read(index_path(index_digest))
        return data
    except (FileNotFoundError, OSError):
        return None
