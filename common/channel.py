from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from .election import LEADER_PREFIX
from .errors import Unavailable
from .identity import SERVICE_NAME, Identity, channel_credentials
from .identity import current as current_identity
from .kv import KV
from .registry import ServiceRecord, discover

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


# The platform's own choices (which instance to dial) draw from a generator of their own: a
# training job's seeded ``random`` stream (data order, augmentation) is the job's, and a client
# that dialled with ``random.choice`` took a number from it (even of one instance), so the same
# job drew other numbers with the platform than without it (held out, session 32).
_CHOOSER = random.Random()


def pick_instance(kv: KV, service: str, prefer_leader: bool = True) -> ServiceRecord:
    """A live instance of ``service`` found in etcd. For services that elect a leader, the
    instance the election key names (``/microco/leader/<service>``) is chosen when it is
    registered, else one labelled ``role=leader``, else any."""
    records = discover(kv, service)
    if not records:
        raise Unavailable(f"no live '{service}' service is registered in etcd")
    if prefer_leader:
        raw = kv.get(LEADER_PREFIX + service)
        named = [r for r in records if raw is not None and r.instance_id == raw.decode()]
        if named:
            return named[0]
        leaders = [r for r in records if r.labels.get("role") == "leader"]
        if leaders:
            records = leaders
    return _CHOOSER.choice(records)


def channel_for(kv: KV, service: str, prefer_leader: bool = True) -> grpc.Channel:
    """A channel to a live instance of ``service`` found in etcd (the leader, for services that
    elect one: :func:`pick_instance`)."""
    return dial(pick_instance(kv, service, prefer_leader).address)


class RedialingChannel(grpc.Channel):  # type: ignore[misc]
    """A channel whose target can change under the stubs built on it: ``redial()`` dials again
    (``dial_fn``: e.g. the current leader found in etcd) and every call made after that goes to
    the new channel, through the same stub objects. How a client follows a service that moved
    (an elected service's fail-over, a restart on a new port)."""

    def __init__(self, dial_fn: Callable[[], grpc.Channel]) -> None:
        self._dial = dial_fn
        self._inner = dial_fn()
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> grpc.Channel:
        return self._inner

    def redial(self) -> None:
        """Dial again; the old channel is closed. Raises what ``dial_fn`` raises (``Unavailable``
        when no instance is registered), leaving the old channel in place."""
        new = self._dial()
        with self._lock:
            old, self._inner = self._inner, new
            self._generation += 1
        old.close()

    def _late(self, kind: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _LateMultiCallable(self, kind, method, args, kwargs)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._late("unary_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._late("unary_stream", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._late("stream_unary", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._late("stream_stream", method, args, kwargs)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self._inner.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self._inner.unsubscribe(callback)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> RedialingChannel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _LateMultiCallable:
    """A stub method bound to whichever channel ``RedialingChannel`` holds at call time."""

    def __init__(
        self, owner: RedialingChannel, kind: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._owner, self._kind, self._method = owner, kind, method
        self._args, self._kwargs = args, kwargs
        self._bound: tuple[int, Any] | None = None

    def _target(self) -> Any:
        gen = self._owner._generation
        if self._bound is None or self._bound[0] != gen:
            inner = self._owner._inner
            self._bound = (gen, getattr(inner, self._kind)(self._method, *self._args, **self._kwargs))
        return self._bound[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # with_call, future
        return getattr(self._target(), name)
