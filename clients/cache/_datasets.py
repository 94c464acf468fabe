"""Dataset registration: index once, keep the index in the cache's state, metadata in etcd.

etcd holds ``/microco/cache/datasets/<name>`` -> {url, index digest, sizes, owner}; the
index itself (which names every chunk, and so grants the right to read it) is kept by the
cache under ``MICROCO_HOME`` (see ``_indexstore``), no more readable than the data; nothing
is ever written into the data folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from microco.common.errors import InvalidArgument, NotFound
from microco.common.kv import KV

from ._backing import open_store
from ._index import DEFAULT_CHUNK_BYTES, DatasetIndex, index_store
from ._indexstore import data_mode, index_file, read_index, write_index

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


def _check_name(name: str) -> None:
    if not name or "/" in name or len(name) > 200 or name.startswith("."):
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters; at most 200)"
        raise InvalidArgument(f"bad dataset name {shown}: use letters, digits, '-', '_' or '.'")


def register_dataset(
    kv: KV,
    name: str,
    url: str,
    *,
    owner: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    home: str | None = None,
) -> tuple[DatasetRecord, DatasetIndex]:
    """Index the dataset at ``url`` and record it as ``name``. Re-registering the same bytes
    under the same name is a no-op (it also puts the index in this host's cache state if it
    was missing); other bytes under a taken name are refused, leaving nothing behind.
    ``home``: the MICROCO_HOME whose cache keeps the index (default: the environment's)."""
    _check_name(name)
    store = open_store(url)
    index = index_store(store, chunk_bytes, progress)
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
    )
    key = PREFIX + name
    existing = kv.get_json(key)
    if existing is not None and not (
        existing.get("index_digest") == rec.index_digest and existing.get("url") == rec.url
    ):
        from microco.common.errors import AlreadyExists

        raise AlreadyExists(
            f"dataset {name!r} is already registered with other contents ({existing.get('url')})"
        )
    mode, gid = data_mode(store)
    write_index(raw, index.digest, mode, gid, home)
    if existing is not None:
        return DatasetRecord(**existing), index
    kv.put_json(key, asdict(rec))
    return rec, index


def get_dataset(kv: KV, name: str) -> DatasetRecord:
    doc = kv.get_json(PREFIX + name)
    if doc is None:
        raise NotFound(f"no dataset named {name!r} (see `microco cache datasets`)")
    return DatasetRecord(**doc)


def list_datasets(kv: KV) -> list[DatasetRecord]:
    return sorted((DatasetRecord(**doc) for _, doc in kv.get_prefix_json(PREFIX)), key=lambda r: r.name)


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
        index = index_store(store, record.chunk_bytes)
        if index.digest == record.index_digest:
            mode, gid = data_mode(store)
            write_index(index.to_bytes(), index.digest, mode, gid, home)
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
    return DatasetIndex.from_bytes(raw, record.index_digest)
