"""microco.services.store: Instalytics, a table store with heterogeneous 3-way replication.

Each table is stored three times, each copy partitioned on a different column; super-extents keep
the three copies of every row on disjoint node groups (no node and no fault domain holds two);
rows inside each extent are bucketed by the other replicas' partition functions so a lost extent
is rebuilt by reading about as many bytes as were lost. The planner routes a query to the replica
whose partitioning matches it.

Public API: the pure core (partitioning, placement, query model, planner), ``StoreCore`` (the
coordinator's logic over a transport), ``LocalTransport`` (the whole store in one process), and
the services (``python -m microco.services.store`` for the coordinator,
``python -m microco.services.store node`` for a store node).
"""

from ._catalog import Catalog, SuperExtent, TableInfo
from ._core import AppendResult, LocalTransport, StoreCore, Transport, conform, finish
from ._exec import to_plain_strings
from ._flight import FlightTransport
from ._layout import CODECS, ExtentMeta, bucketed_extents, open_extent, write_extent
from ._nodestore import CorruptExtent, NodeStore
from ._partition import HASH, RANGE, PartitionSpec, partition_ids, spec_from_pb
from ._placement import NodeInfo, check_row_copies, place_super_extent
from ._planner import Plan, plan_query
from ._procs import StoreCluster
from ._query import Agg, Join, Query
from ._recovery import RebuildTask, plan_recovery
from ._residency import MAX_AGE_S as RESIDENCY_MAX_AGE_S
from ._sql import duck

__all__ = [
    "CODECS",
    "HASH",
    "RANGE",
    "RESIDENCY_MAX_AGE_S",
    "Agg",
    "AppendResult",
    "Catalog",
    "CorruptExtent",
    "ExtentMeta",
    "FlightTransport",
    "Join",
    "LocalTransport",
    "NodeInfo",
    "NodeStore",
    "PartitionSpec",
    "Plan",
    "Query",
    "RebuildTask",
    "StoreCluster",
    "StoreCore",
    "SuperExtent",
    "TableInfo",
    "Transport",
    "bucketed_extents",
    "check_row_copies",
    "conform",
    "duck",
    "finish",
    "open_extent",
    "partition_ids",
    "place_super_extent",
    "plan_query",
    "plan_recovery",
    "spec_from_pb",
    "to_plain_strings",
    "write_extent",
]
