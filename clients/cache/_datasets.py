"""Dataset registration: index once, keep the index in the cache's state, metadata in etcd.

etcd holds ``/microco/cache/datasets/<owner>/<name>`` -> {url, index digest, sizes, owner};
each user's registrations under a prefix of their own, which etcd lets only that user (and the
jobs they own, administrators and the cache service) read and write (``common/etcd_roles``,
docs/security.md). A name without an owner (``digits``) is the caller's own: a user's, or for a
job its owner's (``MICROCO_JOB_OWNER``, set by the scheduler); ``alice/digits`` names another
user's, for those allowed to read it. The index itself (which names every chunk, and so grants the right to read it) is kept by the
cache under ``MICROCO_HOME`` (see ``_indexstore``), no more readable than the data; nothing
is ever written into the data folder.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from microco.common.errors import InvalidArgument, NotFound
from microco.common.identity import ENV_JOB_OWNER, current, split_name

__all__ = [
    "ENV_JOB_OWNER",
    "PREFIX",
    "DatasetRecord",
    "caller_owner",
    "dataset_key",
    "get_dataset",
    "list_datasets",
    "load_index",
    "register_dataset",
]
from microco.common.kv import KV

from ._backing import open_store
from ._index import DEFAULT_CHUNK_BYTES, DatasetIndex, index_store
from ._indexstore import data_mode, index_file, read_index, read_stamps, write_index
from ._records import check_format

PREFIX = "/microco/cache/datasets/"


@dataclass(frozen=True)
class DatasetRecord:
    """What etcd says about a registered dataset."""

    name: str
    url: str
    index_digest: str
    num_samples: int
    num_chunks: int
    total_bytes: int
    chunk_bytes: int
    owner: str = ""
    registered_at: float = 0.0
    records: str = "file"  # what a sample is: a whole file, or each record of one (``_records``)
    include: str = ""  # a glob: only the files it matches ("": every file)

    @property
    def qualified(self) -> str:
        """``owner/name``: the dataset's name across users (what a job reports to the cache)."""
        return f"{self.owner}/{self.name}" if self.owner else self.name


def caller_owner() -> str:
    """Whose datasets a bare name means for this process: a job's owner (``MICROCO_JOB_OWNER``),
    else the user this process authenticates as (``user:<name>``), else (development mode
    without identities, or a service) the operating system's user."""
    owner = os.environ.get(ENV_JOB_OWNER, "")
    if owner:
        return owner
    me = current()
    if me is not None:
        kind, subject = split_name(me.name)
        if kind == "user":
            return subject
    return getpass.getuser()


def _split(name: str, owner: str | None = None) -> tuple[str, str]:
    """(owner, name) of ``name`` (``owner/name`` or a bare name: ``owner``, default the caller's)."""
    if "/" in name:
        who, _, short = name.partition("/")
    else:
        who, short = (owner or caller_owner()), name
    _check_name(short)
    _check_name(who, "owner")
    return who, short


def dataset_key(name: str, owner: str | None = None) -> str:
    """The etcd key of dataset ``name`` (see :func:`_split`)."""
    who, short = _split(name, owner)
    return f"{PREFIX}{who}/{short}"


def _check_name(name: str, what: str = "dataset name") -> None:
    if not name or "/" in name or len(name) > 200 or name.startswith("."):
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters; at most 200)"
        raise InvalidArgument(f"bad {what} {shown}: use letters, digits, '-', '_' or '.'")


def register_dataset(
    kv: KV,
    name: str,
    url: str,
    *,
    owner: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    home: str | None = None,
    records: str = "file",
    include: str = "",
) -> tuple[DatasetRecord, DatasetIndex]:
    """Index the dataset at ``url`` and record it as ``name`` under ``owner`` (default: the
    caller, :func:`caller_owner`; another user's prefix only for an administrator). ``records``:
    what a sample is, a whole file (``file``) or each record of one (``tfrecord``, ``tar``,
    ``lines``, ``npy``, ``fixed:N``; see ``_records``); ``include``: a glob, only the files it
    matches (by path or name). Re-registering
    the same bytes under the same name is a no-op (it also puts the index in this host's cache
    state if it was missing); other bytes under a taken name are refused, leaving nothing behind.
    ``home``: the MICROCO_HOME whose cache keeps the index (default: the environment's)."""
    owner, name = _split(name, owner)
    records = check_format(records)
    store = open_store(url, kv)
    index = index_store(store, chunk_bytes, progress, records, include)
    raw = index.to_bytes()
    rec = DatasetRecord(
        name=name,
        url=store.url,
        index_digest=index.digest,
        num_samples=len(index),
        num_chunks=len(index.chunks),
        total_bytes=index.total_bytes,
        chunk_bytes=chunk_bytes,
        owner=owner,
        registered_at=time.time(),
        records=records,
        include=include,
    )
    key = dataset_key(name, owner)
    existing = kv.get_json(key)
    if existing is not None and not (
        existing.get("index_digest") == rec.index_digest and existing.get("url") == rec.url
    ):
        from microco.common.errors import AlreadyExists

        raise AlreadyExists(
            f"dataset {name!r} is already registered with other contents ({existing.get('url')})"
        )
    mode, gid = data_mode(store)
    write_index(raw, index.digest, mode, gid, home, index.stamps)
    if existing is not None:
        return DatasetRecord(**existing), index
    kv.put_json(key, asdict(rec))
    return rec, index


def get_dataset(kv: KV, name: str, owner: str | None = None) -> DatasetRecord:
    """The record of dataset ``name``: ``owner/name``, or a bare name among ``owner``'s
    (default: the caller's, :func:`caller_owner`)."""
    who, short = _split(name, owner)
    doc = kv.get_json(f"{PREFIX}{who}/{short}")
    if doc is None:
        raise NotFound(f"no dataset named {short!r} of {who!r} (see `microco cache datasets`)")
    return DatasetRecord(**doc)


def list_datasets(kv: KV, owner: str | None = None, everyone: bool = False) -> list[DatasetRecord]:
    """``owner``'s datasets (default: the caller's); ``everyone``: every user's (for those etcd
    lets read them all: administrators and the platform's services)."""
    prefix = PREFIX if everyone else f"{PREFIX}{_split('x', owner)[0]}/"
    recs = (DatasetRecord(**doc) for k, doc in kv.get_prefix_json(prefix) if "/" in k[len(PREFIX) :])
    return sorted(recs, key=lambda r: (r.owner, r.name))


def load_index(  # type: ignore[no-untyped-def]
    record: DatasetRecord, store=None, home: str | None = None, rebuild: bool = True
) -> DatasetIndex:
    """Read a dataset's index from the cache's state (or, for datasets registered by older
    versions, from beside its data), verified against the digest in etcd. Not there (a
    dataset registered on another host) and ``rebuild``: index the data again, once."""
    store = store or open_store(record.url)
    raw = read_index(record.index_digest, store, home)
    if raw is None and rebuild:
        # Registered on another host (or by another user): the same bytes give the same
        # index, so index them here once, keep it only if it is the registered one.
        import logging

        logging.getLogger(__name__).warning(
            "index of %r not on this host: indexing %s again (once)", record.name, record.url
        )
        index = index_store(store, record.chunk_bytes, records=record.records, include=record.include)
        if index.digest == record.index_digest:
            mode, gid = data_mode(store)
            write_index(index.to_bytes(), index.digest, mode, gid, home, index.stamps)
            return index
        from microco.common.errors import FailedPrecondition

        raise FailedPrecondition(
            f"dataset {record.name!r} at {record.url} changed since it was registered: register it again"
        )
    if raw is None:
        raise NotFound(
            f"index of {record.name!r} is not on this host ({index_file(record.index_digest, home)}): "
            f"run `microco cache register {record.name} {record.url}` here (the same bytes give the "
            "same index, so this only indexes them again)"
        )
    index = DatasetIndex.from_bytes(raw, record.index_digest)
    stamps = read_stamps(record.index_digest, home)
    return replace(index, stamps=stamps) if stamps is not None else index
