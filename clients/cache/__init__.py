"""Client side of Quiver, the shared training-data cache, and what both ends share.

* Content addressing and indexing: ``digest``, ``DatasetIndex``, ``SampleRef``, ``ChunkRef``,
  ``build_index``, ``index_store``; record formats (a sample per TFRecord record, WebDataset
  tar sample, line, ``.npy`` row or N bytes of a file: ``RECORD_FORMATS``, ``tar_sample``);
  backing stores ``open_store``, ``LocalStore``,
  ``ThrottledStore``; the substitutable sampler core ``SubstitutableSampler``; the Redis
  directory of what is cached where, ``RedisDirectory``. The cache server builds on these.

* ``CacheClient``: typed gRPC client of one cache server.
* ``register_dataset``, ``get_dataset``, ``list_datasets``, ``load_index``: datasets in etcd,
  indexes beside the data.
* ``QuiverLoader``: substitutable-hit data loading with prefetch and backing-store fallback;
  ``Peers``: other hosts' cache servers through the Redis directory (remote streaming);
  ``SpreadCache``: a cache spread over hosts (each chunk on its owner by rendezvous hashing,
  ``chunk_owner``, over the live cache servers in etcd); ``ExchangeSampler`` with
  ``ThreadExchange``/``TorchExchange``: data-parallel ranks trading substitutable hits.
* ``open_loader``: a loader for a registered dataset by name.
* ``cache_overview``: every server's stats and allocations (with reasons) as plain dicts.
* PyTorch: ``QuiverBatchSampler``, ``QuiverDataset``, ``QuiverIterableDataset`` (read ahead),
  ``QuiverDataLoader`` (worker processes read and transform), ``make_dataloader`` (imported on use);
  tf.data: ``quiver_tf_dataset`` (imported on use).
"""

from __future__ import annotations

from typing import Any

from ._backing import BackingStore, FsspecStore, LocalStore, ThrottledStore, open_store
from ._client import CacheClient, Grant
from ._datasets import (
    ENV_JOB_OWNER,
    DatasetRecord,
    caller_owner,
    get_dataset,
    list_datasets,
    load_index,
    register_dataset,
)
from ._digest import digest, directory_locator, file_locator, is_digest
from ._directory import RedisDirectory
from ._exchange import Exchange, ExchangeSampler, ThreadExchange, TorchExchange
from ._index import (
    DEFAULT_CHUNK_BYTES,
    ChunkRef,
    DatasetIndex,
    SampleRef,
    build_index,
    included,
    index_path,
    index_store,
)
from ._jobs import (
    JOB_DATASETS_PREFIX,
    WARM_PREFIX,
    forget_job_dataset,
    forget_warm,
    job_dataset,
    job_datasets,
    publish_job_dataset,
    report_warm,
    warm_report,
)
from ._loader import LoaderStats, QuiverLoader
from ._overview import allocation_to_dict, cache_overview, stats_to_dict
from ._peers import Peers
from ._placement import owned_bytes
from ._placement import owner as chunk_owner
from ._position import merge_positions
from ._records import check_format, record_spans, tar_sample
from ._sampler import Batch, BatchMode, SubstitutableSampler
from ._spread import Member, SpreadCache, members_from_records
from ._table import (
    StoreTable,
    decode_sample,
    index_store_table,
    materialise_query,
    query_table,
    replica_partitioned_by,
)

RECORD_FORMATS = ("file", "lines", "tfrecord", "tar", "npy", "idx", "fixed:N")  # see check_format

_LAZY = {
    "QuiverBatchSampler": "_torch",
    "QuiverDataset": "_torch",
    "QuiverDataLoader": "_torch",
    "QuiverIterableDataset": "_torch",
    "make_dataloader": "_torch",
    "quiver_tf_dataset": "_tf",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)


def open_loader(
    kv: Any,
    name: str,
    *,
    server: str | None | bool = None,
    store: Any = None,
    redis_url: str | None = None,
    spread: bool = False,
    **kwargs: Any,
) -> QuiverLoader:
    """A ``QuiverLoader`` for the registered dataset ``name`` (index verified against etcd).

    ``kv`` is the platform's etcd; None finds it as every client does
    (``microco.common.find_etcd``: ``MICROCO_ETCD``, then the local stack).
    ``server`` is the cache server's address; None (the default) finds one in etcd (this
    host's first), and with none running the loader reads from the backing store only;
    ``False`` asks for no cache at all (the backing store only, no discovery). With ``redis_url``
    the loader also reads chunks that other hosts' cache servers hold (the Redis directory).
    ``spread=True``: one cache spread over every live cache server in etcd (each chunk looked
    up on, inserted into and read from its owner; ``SpreadCache``); ``server`` is then unused.
    """
    from microco.common.discovery import connect_etcd
    from microco.common.errors import InvalidArgument

    kv = kv if kv is not None else connect_etcd()
    rec = get_dataset(kv, name)
    store = store or open_store(rec.url, kv)
    index = load_index(rec, store)
    cache: Any = server
    if spread:
        cache = SpreadCache(kv)
        server = None
    elif server is False:
        cache = server = None
    elif server is None:
        # Found in etcd, and found again there if it stops answering (restarted elsewhere) or
        # if none is registered yet (the loader reads the backing store until one is).
        node = kwargs.get("node")
        cache = server = find_server(kv, node)
        kwargs.setdefault("resolve_server", lambda: find_server(kv, node))
    elif not isinstance(server, str):
        raise InvalidArgument("server must be an address, None (find one) or False (no cache)")
    if redis_url and "peers" not in kwargs:
        from microco.common.hotstate import connect_redis

        kwargs["peers"] = Peers(connect_redis(redis_url, check=False), kv, exclude=server)
    # (reported as ``owner/name``: two users' datasets of one name are two datasets to the cache)
    return QuiverLoader(index, store, dataset=rec.qualified, server=cache, **kwargs)


def find_server(kv: Any, node: str | None = None) -> str | None:
    """Address of a cache server from etcd: one on ``node`` (default: this host) if any."""
    import os
    import socket

    from microco.common.registry import discover

    node = node or os.environ.get("MICROCO_NODE", socket.gethostname())
    records = discover(kv, "cache")
    local = [r for r in records if r.labels.get("node") == node]
    candidates = local or records
    return candidates[0].address if candidates else None


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ENV_JOB_OWNER",
    "JOB_DATASETS_PREFIX",
    "RECORD_FORMATS",
    "WARM_PREFIX",
    "BackingStore",
    "Batch",
    "BatchMode",
    "CacheClient",
    "ChunkRef",
    "DatasetIndex",
    "DatasetRecord",
    "Exchange",
    "ExchangeSampler",
    "FsspecStore",
    "Grant",
    "LoaderStats",
    "LocalStore",
    "Member",
    "Peers",
    "QuiverBatchSampler",
    "QuiverDataLoader",
    "QuiverDataset",
    "QuiverIterableDataset",
    "QuiverLoader",
    "RedisDirectory",
    "SampleRef",
    "SpreadCache",
    "StoreTable",
    "SubstitutableSampler",
    "ThreadExchange",
    "ThrottledStore",
    "TorchExchange",
    "allocation_to_dict",
    "build_index",
    "cache_overview",
    "caller_owner",
    "check_format",
    "chunk_owner",
    "decode_sample",
    "digest",
    "directory_locator",
    "file_locator",
    "find_server",
    "forget_job_dataset",
    "forget_warm",
    "get_dataset",
    "included",
    "index_path",
    "index_store",
    "index_store_table",
    "is_digest",
    "job_dataset",
    "job_datasets",
    "list_datasets",
    "load_index",
    "make_dataloader",
    "materialise_query",
    "members_from_records",
    "merge_positions",
    "open_loader",
    "open_store",
    "owned_bytes",
    "publish_job_dataset",
    "query_table",
    "quiver_tf_dataset",
    "record_spans",
    "register_dataset",
    "replica_partitioned_by",
    "report_warm",
    "stats_to_dict",
    "tar_sample",
    "warm_report",
]
