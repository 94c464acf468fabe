"""The cache a moved job read through before: a peer it finds in its own checkpoint.

A job moved to another host (migrated by the scheduler, restarted elsewhere) leaves its
working set in the cache of the host it left, where the other jobs of its dataset may keep it
warm. The loader's position (``QuiverLoader.state_dict``) names the cache server it read
through; a loader that resumes from it on a host with another server asks that one too, as a
peer (the interface of ``Peers``: ``holders``/``failed``/``close``), for the chunks its own
cache lacks: they are hits, read over the network instead of from the backing store, and the
background prefetch copies them into the new host's cache. No directory is needed (Quiver's
``Peers`` find holders through Redis; a job knows where it came from).

Bounded: one lookup per batch of misses; the first waits for the connection (TLS included)
for at most ``connect_s``, apart from the lookup's own deadline ``timeout_s`` (a handshake slowed
by a busy host is not a server that does not answer; a refused connection fails at once); a
server that does not answer is asked again only after ``retry_s``, and after ``MAX_FAILURES``
failures never again (a restarted or removed server at a stale address costs at most that many
short calls); one that held none of the chunks asked for ``MAX_EMPTY`` times in a row is not
asked again (the working set has left it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import grpc

from microco.common.errors import MicrocoError

from ._client import CacheClient

log = logging.getLogger(__name__)

#: Failures after which the old server is not asked again.
MAX_FAILURES = 3
#: Answers in a row holding none of the chunks asked for, after which it is not asked again.
MAX_EMPTY = 64


class OriginPeer:
    """The cache server at ``address``, asked for chunks of ``dataset`` this host lacks."""

    def __init__(
        self,
        address: str,
        dataset: str,
        *,
        retry_s: float = 5.0,
        timeout_s: float = 2.0,
        connect_s: float = 10.0,
    ) -> None:
        self.address = address
        self.dataset = dataset
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.connect_s = connect_s
        self._connected = False
        self.failures = 0
        self.empty = 0  # answers in a row that held none of the chunks asked for
        self._down_until = 0.0
        self._client: CacheClient | None = None

    @property
    def usable(self) -> bool:
        return (
            self.failures < MAX_FAILURES and self.empty < MAX_EMPTY and time.monotonic() >= self._down_until
        )

    def _get(self) -> CacheClient:
        if self._client is None:
            self._client = CacheClient(self.address, timeout=10)
        return self._client

    def holders(self, digests: Sequence[str]) -> dict[str, CacheClient]:
        """Digest -> the old server, for those of ``digests`` it holds now."""
        if not digests or not self.usable:
            return {}
        client = self._get()
        if not self._connected and not self._connect(client):
            log.warning("the cache this job moved from cannot be reached at %s", self.address)
            self.failed(client)
            return {}
        try:
            # (No job id: the old host's server must not take the job for one of its own.)
            held = client.lookup(list(digests), self.dataset, timeout=self.timeout_s, retry=False)
        except MicrocoError as exc:
            log.warning("the cache this job moved from does not answer: %s", exc)
            self.failed(client)
            return {}
        self.empty = 0 if held else self.empty + 1
        return dict.fromkeys(held, client)

    def _connect(self, client: CacheClient) -> bool:
        """Wait until the channel is ready, for at most ``connect_s``; False at once when the
        connection fails (nothing listens there, the handshake is refused)."""
        settled = threading.Event()
        state: list[grpc.ChannelConnectivity] = []

        def watch(now: grpc.ChannelConnectivity) -> None:
            if now in (
                grpc.ChannelConnectivity.READY,
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN,
            ):
                state.append(now)
                settled.set()

        channel = client._channel
        channel.subscribe(watch, try_to_connect=True)
        try:
            settled.wait(self.connect_s)
        finally:
            channel.unsubscribe(watch)
        self._connected = bool(state) and state[0] is grpc.ChannelConnectivity.READY
        return self._connected

    def failed(self, client: CacheClient, retry_s: float | None = None) -> None:
        self.failures += 1
        self._down_until = time.monotonic() + (self.retry_s if retry_s is None else retry_s)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._connected = False
