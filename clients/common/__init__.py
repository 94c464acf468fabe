"""What every typed microco client shares: finding the platform (argument, environment, the
local stack's state file), discovery of a service through etcd, channels, and calls with a
deadline, retried only on UNAVAILABLE and only when the call is idempotent."""

from ._channel import channel_for, dial
from ._client import ServiceClient, call_with_retry
from ._discovery import (
    Found,
    PlatformNotFound,
    connect_etcd,
    etcd_endpoint,
    find_etcd,
    find_redis,
    redis_url,
    stack_home,
)

__all__ = [
    "Found",
    "PlatformNotFound",
    "ServiceClient",
    "call_with_retry",
    "channel_for",
    "connect_etcd",
    "dial",
    "etcd_endpoint",
    "find_etcd",
    "find_redis",
    "redis_url",
    "stack_home",
]
