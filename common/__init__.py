"""microco.common: what every layer above the generated API shares, server and client alike.

Errors mapped to gRPC codes and back, the etcd key-value layer with leases, registration,
discovery and leader election, Redis for hot state, structured logs, channels to a discovered
service with deadline-bounded, allow-listed retries, and the health probe. Nothing here starts a
server: the gRPC service lifecycle, settings and metrics live in :mod:`microco.services.runtime`,
so a training process that imports the client libraries loads no server code.
"""

from .calls import ServiceClient, call_with_retry
from .channel import channel_for, dial
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
from .health import check_health
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
    "ServiceClient",
    "ServiceRecord",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WatchEvent",
    "call_with_retry",
    "channel_for",
    "check_health",
    "configure_logging",
    "connect_redis",
    "dial",
    "discover",
    "from_rpc_error",
]
