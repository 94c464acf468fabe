"""Quiver: a content-addressed, shared training-data cache.

Public API:

* content addressing and indexing: ``digest``, ``DatasetIndex``, ``SampleRef``, ``ChunkRef``,
  ``build_index``, ``index_store``; backing stores ``open_store``, ``LocalStore``,
  ``ThrottledStore``;
* the substitutable sampler core: ``SubstitutableSampler``, ``Batch``, ``BatchMode``;
* policies: ``make_policy`` (``coordinated``, ``lru``), ``allocate``, ``estimate_benefit``;
* the server core: ``ChunkStore``, ``CacheCore``, ``RedisDirectory``; the servicer
  ``CacheServicer``; ``simulate`` for policy studies without I/O;
* ``SchedulerFollower``: the scheduler-aware cache (follows the scheduler's job phases).
"""

from microco.clients.cache import (
    DEFAULT_CHUNK_BYTES,
    BackingStore,
    Batch,
    BatchMode,
    ChunkRef,
    DatasetIndex,
    FsspecStore,
    LocalStore,
    RedisDirectory,
    SampleRef,
    SubstitutableSampler,
    ThrottledStore,
    build_index,
    digest,
    directory_locator,
    file_locator,
    index_path,
    index_store,
    is_digest,
    open_store,
)

from ._allocation import Allocation, BenefitEstimate, JobDemand, allocate, estimate_benefit
from ._chunkstore import ChunkStore, CorruptChunk, DigestMismatch
from ._core import CacheCore, PutResult
from ._eviction import POLICIES, Admission, ConsumptionTracker, EvictionPolicy, Ledger, Outcome, make_policy
from ._follow import SchedulerFollower
from ._servicer import SERVICE_NAME, CacheServicer, parse_size, serve_in_process
from ._simulate import SimResult, simulate

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "POLICIES",
    "SERVICE_NAME",
    "Admission",
    "Allocation",
    "BackingStore",
    "Batch",
    "BatchMode",
    "BenefitEstimate",
    "CacheCore",
    "CacheServicer",
    "ChunkRef",
    "ChunkStore",
    "ConsumptionTracker",
    "CorruptChunk",
    "DatasetIndex",
    "DigestMismatch",
    "EvictionPolicy",
    "FsspecStore",
    "JobDemand",
    "Ledger",
    "LocalStore",
    "Outcome",
    "PutResult",
    "RedisDirectory",
    "SampleRef",
    "SchedulerFollower",
    "SimResult",
    "SubstitutableSampler",
    "ThrottledStore",
    "allocate",
    "build_index",
    "digest",
    "directory_locator",
    "estimate_benefit",
    "file_locator",
    "index_path",
    "index_store",
    "is_digest",
    "make_policy",
    "open_store",
    "parse_size",
    "serve_in_process",
    "simulate",
]
