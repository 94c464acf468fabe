"""Dataset registration: index once, keep the index beside the data, metadata in etcd.

etcd holds ``/microco/cache/datasets/<name>`` -> {url, index digest, sizes, owner}; the
index itself (which names every chunk, and so grants the right to read it) sits beside the
data in ``.quiver/``, readable by exactly those who can read the data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ._backing import open_store
from ._index import DEFAULT_CHUNK_BYTES, DatasetIndex, index_path, index_store
from microco.common.errors import InvalidArgument, NotFound
from microco.common.kv import KV

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
        raise InvalidArgument(f"bad dataset name {name!r}: use letters, digits, '-', '_' or '.'")


def register_dataset(
    kv: KV,
    name: str,
    url: str,
    *,
    owner: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
) -> tuple[DatasetRecord, DatasetIndex]:
    """Index the dataset at ``url`` and record it as ``name``. Re-registering the same bytes
    under the same name is a no-op; other bytes under a taken name are refused."""
    _check_name(name)
    store = open_store(url)
    index = index_store(store, chunk_bytes, progress)
    raw = index.to_bytes()
    store.write(index_path(index.digest), raw)
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
    if existing is not None:
        if existing.get("index_digest") == rec.index_digest and existing.get("url") == rec.url:
            return DatasetRecord(**existing), index
        from microco.common.errors import AlreadyExists

        raise AlreadyExists(
            f"dataset {name!r} is already registered with other contents ({existing.get('url')})"
        )
    kv.put_json(key, asdict(rec))
    return rec, index


def get_dataset(kv: KV, name: str) -> DatasetRecord:
    doc = kv.get_json(PREFIX + name)
    if doc is None:
        raise NotFound(f"no dataset named {name!r} (see `microco cache datasets`)")
    return DatasetRecord(**doc)


def list_datasets(kv: KV) -> list[DatasetRecord]:
    return sorted((DatasetRecord(**doc) for _, doc in kv.get_prefix_json(PREFIX)), key=lambda r: r.name)


def load_index(record: DatasetRecord, store=None) -> DatasetIndex:  # type: ignore[no-untyped-def]
    """Read a dataset's index from beside its data, verified against the digest in etcd."""
    store = store or open_store(record.url)
    try:
        raw = store.read(index_path(record.index_digest))
    except FileNotFoundError:
        raise NotFound(
            f"index of {record.name!r} missing at {record.url}/{index_path(record.index_digest)}"
        ) from None
    return DatasetIndex.from_bytes(raw, record.index_digest)
