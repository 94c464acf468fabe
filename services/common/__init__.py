"""Plumbing every microco service shares: errors mapped to gRPC codes, the etcd key-value layer
with leases, registration, discovery and leader election, Redis for hot state, validated
settings, structured logs, metrics, and the gRPC service lifecycle."""

from .election import LeaderElection
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MicrocoError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    from_rpc_error,
)
from .hotstate import connect_redis
from .kv import KV, EtcdKV, Lease, LeaseKeeper, MemoryKV, WatchEvent
from .logs import configure_logging
from .registry import Registration, ServiceRecord, discover
from .server import ServiceContext, ServiceRuntime, run_service
from .settings import ServiceSettings

__all__ = [
    "KV",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "EtcdKV",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "LeaderElection",
    "Lease",
    "LeaseKeeper",
    "MemoryKV",
    "MicrocoError",
    "NotFound",
    "PermissionDenied",
    "Registration",
    "ResourceExhausted",
    "ServiceContext",
    "ServiceRecord",
    "ServiceRuntime",
    "ServiceSettings",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WatchEvent",
    "configure_logging",
    "connect_redis",
    "discover",
    "from_rpc_error",
    "run_service",
]
