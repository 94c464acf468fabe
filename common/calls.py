from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from .election import NOT_LEADER
from .errors import MicrocoError, Unavailable, from_rpc_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# Only UNAVAILABLE is retried: the call never reached a serving instance. Anything else
# (INVALID_ARGUMENT, NOT_FOUND, DEADLINE_EXCEEDED...) would fail again or may have run.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


# What gRPC answers when the channel could make no connection at all: the call was never sent.
_NO_CONNECTION = "failed to connect to all addresses"


def never_served(err: MicrocoError) -> bool:
    """Whether an error says the call reached no serving instance, so that sending it again
    elsewhere cannot do anything twice: no connection could be made, or a standby of an elected
    service refused it (``election.NOT_LEADER``)."""
    text = str(err)
    return isinstance(err, Unavailable) and (_NO_CONNECTION in text or NOT_LEADER in text)


def call_with_retry(
    fn: Callable[..., T],
    request: Any,
    *,
    timeout: float,
    idempotent: bool,
    attempts: int = 4,
    backoff_s: float = 0.1,
    on_unavailable: Callable[[], None] | None = None,
) -> T:
    """Call a unary stub method with a deadline budget of ``timeout`` seconds shared by all
    attempts; retry UNAVAILABLE only for idempotent calls. gRPC errors come back as the
    ``MicrocoError`` subclass the server raised."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        attempt += 1
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            from microco.common.errors import DeadlineExceeded

            raise DeadlineExceeded(f"deadline of {timeout:.1f}s spent after {attempt - 1} attempts")
        try:
            return fn(request, timeout=remaining)
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if not idempotent or exc.code() not in RETRYABLE or attempt >= attempts:
                raise err from None
            log.debug("retrying after UNAVAILABLE (%d/%d): %s", attempt, attempts, err)
            if on_unavailable:
                on_unavailable()
            time.sleep(min(backoff_s * 2 ** (attempt - 1), max(deadline - time.monotonic(), 0)))


class ServiceClient:
    """Base of the typed clients: holds the channel (private) and runs calls with a default
    deadline. Subclasses add one method per RPC, each passing ``idempotent`` honestly."""

    service_name = ""
    # Tries an idempotent call gets within its one deadline (UNAVAILABLE only); a caller that
    # prefers to answer "unavailable" sooner lowers it on its instance.
    attempts = 4

    def __init__(self, channel: grpc.Channel, default_timeout: float = 10.0) -> None:
        self._channel = channel
        self.default_timeout = default_timeout

    @classmethod
    def from_etcd(cls, kv: Any = None, default_timeout: float = 10.0) -> Any:
        """A client of a live instance found in etcd: ``kv``'s, else the platform's as
        ``find_etcd`` finds it (``MICROCO_ETCD``, then the local stack)."""
        from .channel import channel_for

        if kv is not None:
            return cls(channel_for(kv, cls.service_name), default_timeout)
        from .discovery import connect_etcd

        own = connect_etcd()
        try:
            return cls(channel_for(own, cls.service_name), default_timeout)
        finally:
            own.close()  # the channel outlives the lookup

    @classmethod
    def from_address(cls, address: str, default_timeout: float = 10.0) -> Any:
        from .channel import dial

        return cls(dial(address), default_timeout)

    def _call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        timeout: float | None,
        idempotent: bool,
        retry: bool = True,
    ) -> T:
        return call_with_retry(
            method,
            request,
            timeout=timeout if timeout is not None else self.default_timeout,
            idempotent=idempotent and retry,
            attempts=self.attempts,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["RETRYABLE", "ServiceClient", "call_with_retry", "never_served"]
