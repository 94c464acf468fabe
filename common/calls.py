from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from .election import NOT_LEADER
from .errors import MicrocoError, Unavailable, from_rpc_error
from .forkgate import GATE

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
            with GATE.held():  # a fork waits for the call (common/forkgate.py)
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
    deadline. Subclasses add one method per RPC, each passing ``idempotent`` honestly.

    A client built with :meth:`from_etcd` follows its service: after a call finds no instance
    where it was (a restart on a new port, a crash with another instance alive) or a standby of an
    elected service, it looks the service up in etcd again (the leader first) and sends the call
    there, when sending it again cannot do anything twice, for at most ``failover_s``."""

    service_name = ""
    # Tries an idempotent call gets within its one deadline (UNAVAILABLE only); a caller that
    # prefers to answer "unavailable" sooner lowers it on its instance.
    attempts = 4
    # How long a call of a client built with ``from_etcd`` keeps looking for the service again
    # (a fail-over: the leader's lease expiring, a standby elected) while some instance is registered.
    failover_s = 20.0

    def __init__(self, channel: grpc.Channel, default_timeout: float = 10.0) -> None:
        self._channel = channel
        self.default_timeout = default_timeout
        self._own_kv: Any = None

    @classmethod
    def from_etcd(cls, kv: Any = None, default_timeout: float = 10.0) -> Any:
        """A client of a live instance found in etcd (the leader, for an elected service):
        ``kv``'s, else the platform's as ``find_etcd`` finds it (``MICROCO_ETCD``, then the local
        stack). It follows the service when it moves (see the class)."""
        from .channel import RedialingChannel, dial, pick_instance

        own = None
        if kv is None:
            from .discovery import connect_etcd

            kv = own = connect_etcd()
        try:
            channel = RedialingChannel(lambda: dial(pick_instance(kv, cls.service_name).address))
        except BaseException:
            if own is not None:
                own.close()
            raise
        client = cls(channel, default_timeout)
        client._own_kv = own  # kept for the look-ups after a move; closed with the client
        return client

    @classmethod
    def from_address(cls, address: str, default_timeout: float = 10.0) -> Any:
        from .channel import dial

        return cls(dial(address), default_timeout)

    def _failover(self, err: MicrocoError, resend: bool, started: float, deadline: float) -> bool:
        """After ``err``: whether to send the call again, once the service was looked up anew.
        Only for a client that follows its service, only for UNAVAILABLE, only when sending again
        cannot do anything twice (``resend``: the call is idempotent, or it never reached a
        serving instance: no connection, or a standby refused it), and for at most
        ``failover_s`` within the call's deadline. Gives up at once when no instance is
        registered at all."""
        from .channel import RedialingChannel

        channel = self._channel
        if not isinstance(channel, RedialingChannel) or not isinstance(err, Unavailable):
            return False
        if not (resend or never_served(err)):
            return False
        now = time.monotonic()
        if now - started > self.failover_s or now >= deadline:
            return False
        time.sleep(min(0.25, max(deadline - now, 0)))
        try:
            channel.redial()
        except Unavailable:
            return False  # nothing registered: no fail-over is under way
        return True

    def _call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        timeout: float | None,
        idempotent: bool,
        retry: bool = True,
    ) -> T:
        started = time.monotonic()
        deadline = started + (timeout if timeout is not None else self.default_timeout)
        while True:
            try:
                return call_with_retry(
                    method,
                    request,
                    timeout=deadline - time.monotonic(),
                    idempotent=idempotent and retry,
                    attempts=self.attempts,
                )
            except MicrocoError as err:
                if not self._failover(err, idempotent and retry, started, deadline):
                    raise

    def close(self) -> None:
        self._channel.close()
        if self._own_kv is not None:
            self._own_kv.close()
            self._own_kv = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["RETRYABLE", "ServiceClient", "call_with_retry", "never_served"]
