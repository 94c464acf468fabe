"""microco.common: what every layer above the generated API shares, server and client alike.

Errors mapped to gRPC codes and back, the etcd key-value layer with leases, registration,
discovery and leader election, finding the platform (argument, environment, the local stack's
state file), Redis for hot state, structured logs, channels to a discovered
service with deadline-bounded, allow-listed retries, and the health probe (``.health``, imported
where used: it needs gRPC's health-checking package, which a training process importing a
client library does not). Nothing here starts a server: the gRPC service lifecycle, settings and metrics live in :mod:`microco.services.runtime`,
so a training process that imports the client libraries loads no server code.
"""

from .calls import ServiceClient, call_with_retry
from .channel import channel_for, dial
from .discovery import (
    Found,
    PlatformNotFound,
    connect_etcd,
    etcd_endpoint,
    find_etcd,
    find_redis,
    redis_url,
    stack_home,
)
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

__all__ = [
    "KV",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "EtcdKV",
    "FailedPrecondition",
    "Found",
    "Internal",
    "InvalidArgument",
    "LeaderElection",
    "Lease",
    "LeaseKeeper",
    "MemoryKV",
    "MicrocoError",
    "NotFound",
    "PermissionDenied",
    "PlatformNotFound",
    "Registration",
    "ResourceExhausted",
    "ServiceClient",
    "ServiceRecord",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WatchEvent",
    "call_with_retry",
    "channel_for",
    "configure_logging",
    "connect_etcd",
    "connect_redis",
    "dial",
    "discover",
    "etcd_endpoint",
    "find_etcd",
    "find_redis",
    "from_rpc_error",
    "redis_url",
    "stack_home",
]
