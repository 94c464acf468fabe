from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import grpc

from .errors import Unavailable
from .identity import SERVICE_NAME, Identity, channel_credentials
from .identity import current as current_identity
from .kv import KV
from .registry import discover

_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),  # retries are ours, by allow-list
    # A channel of its own: a new channel to a restarted service must not inherit the dead
    # subchannel's reconnect backoff from other channels to the same address.
    ("grpc.use_local_subchannel_pool", 1),
]


def dial(
    address: str, identity: Identity | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel to ``host:port``: mutual TLS with ``identity`` (this process's own by default),
    the server checked to hold a platform service's certificate; plaintext only in insecure
    mode (``MICROCO_INSECURE=1``)."""
    opts = [*_OPTIONS, *options]
    ident = identity if identity is not None else current_identity()
    if ident is None:
        return grpc.insecure_channel(address, options=opts)
    creds = channel_credentials(ident)
    return grpc.secure_channel(
        address, creds, options=[*opts, ("grpc.ssl_target_name_override", SERVICE_NAME)]
    )


def channel_for(kv: KV, service: str, prefer_leader: bool = True) -> grpc.Channel:
    """A channel to a live instance of ``service`` found in etcd. For services that elect a
    leader, the instance labelled ``role=leader`` is chosen when there is one."""
    records = discover(kv, service)
    if not records:
        raise Unavailable(f"no live '{service}' service is registered in etcd")
    if prefer_leader:
        leaders = [r for r in records if r.labels.get("role") == "leader"]
        if leaders:
            records = leaders
    return dial(random.choice(records).address)
