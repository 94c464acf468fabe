"""The cache directory in Redis: which cache server holds which chunk.

Keys are ``microco:cache:dir:<directory_locator(digest)>`` -> set of server instance ids, so
the directory tells a client that can name a chunk where to read it, and tells anyone else
nothing. It is hot state: losing Redis costs lookups (clients then ask their local server),
never data, and each server re-publishes what it holds when it starts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from microco.common.hotstate import key

from ._digest import directory_locator

log = logging.getLogger(__name__)


def _dir_key(chunk_digest: str) -> str:
    return key("cache", "dir", directory_locator(chunk_digest))


def _server_key(server_id: str) -> str:
    return key("cache", "server", server_id, "locators")


class RedisDirectory:
    """Publishes one server's chunks and answers "who holds these" for clients."""

    def __init__(self, redis: Any, server_id: str = "") -> None:
        self.redis = redis
        self.server_id = server_id

    def _safe(self, fn: Any, default: Any = None) -> Any:
        import redis

        try:
            return fn()
        except redis.RedisError as exc:
            log.warning("cache directory unavailable: %s", exc)
            return default

    def add(self, digests: Iterable[str]) -> None:
        ds = list(digests)
        if not ds:
            return

        def go() -> None:
            p = self.redis.pipeline(transaction=False)
            for d in ds:
                p.sadd(_dir_key(d), self.server_id)
                p.sadd(_server_key(self.server_id), directory_locator(d))
            p.execute()

        self._safe(go)

    def remove(self, digests: Iterable[str]) -> None:
        ds = list(digests)
        if not ds:
            return

        def go() -> None:
            p = self.redis.pipeline(transaction=False)
            for d in ds:
                p.srem(_dir_key(d), self.server_id)
                p.srem(_server_key(self.server_id), directory_locator(d))
            p.execute()

        self._safe(go)

    def withdraw(self) -> None:
        """Remove every entry of this server (on shutdown, or at start before re-publishing)."""

        def go() -> None:
            locs = self.redis.smembers(_server_key(self.server_id))
            p = self.redis.pipeline(transaction=False)
            for loc in locs:
                p.srem(key("cache", "dir", loc.decode() if isinstance(loc, bytes) else loc), self.server_id)
            p.delete(_server_key(self.server_id))
            p.execute()

        self._safe(go)

    def holders(self, digests: Sequence[str]) -> dict[str, set[str]] | None:
        """Digest -> ids of servers holding it; None when Redis cannot be reached."""

        def go() -> dict[str, set[str]]:
            p = self.redis.pipeline(transaction=False)
            for d in digests:
                p.smembers(_dir_key(d))
            out = {}
            for d, members in zip(digests, p.execute(), strict=True):
                if members:
                    out[d] = {m.decode() if isinstance(m, bytes) else m for m in members}
            return out

        found: dict[str, set[str]] | None = self._safe(go)
        return found
