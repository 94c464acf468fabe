"""What every typed microco client shares: discovery of a service through etcd, channels, and
calls with a deadline, retried only on UNAVAILABLE and only when the call is idempotent."""

from ._channel import channel_for, dial
from ._client import ServiceClient, call_with_retry

__all__ = ["ServiceClient", "call_with_retry", "channel_for", "dial"]
