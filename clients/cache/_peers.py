"""Other hosts' cache servers, found through the Redis directory.

A chunk missing from this host's server may sit on another host's: the directory (Redis)
says which server instance holds it, etcd says where that instance listens. Reads from a
peer are streamed (``ReadSamples``) and checked against the digests like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from microco.common.registry import discover

from ._client import CacheClient
from ._directory import RedisDirectory

log = logging.getLogger(__name__)


class Peers:
    """Live cache servers other than ``exclude`` and what they hold."""

    def __init__(self, redis: Any, kv: Any, exclude: str | None = None, refresh_s: float = 5.0) -> None:
        self.directory = RedisDirectory(redis)
        self.kv = kv
        self.exclude = exclude
        self.refresh_s = refresh_s
        self._addresses: dict[str, str] = {}
        self._clients: dict[str, CacheClient] = {}
        self._down: dict[str, float] = {}
        self._refreshed = 0.0

    def _refresh(self) -> None:
        if time.monotonic() - self._refreshed < self.refresh_s:
            return
        self._refreshed = time.monotonic()
        try:
            self._addresses = {
                r.instance_id: r.address for r in discover(self.kv, "cache") if r.address != self.exclude
            }
        except Exception as exc:  # noqa: BLE001 - etcd trouble only costs remote hits
            log.warning("cannot list cache servers: %s", exc)

    def client(self, server_id: str) -> CacheClient | None:
        address = self._addresses.get(server_id)
        if address is None or self._down.get(server_id, 0) > time.monotonic():
            return None
        if server_id not in self._clients:
            self._clients[server_id] = CacheClient(address, timeout=10)
        return self._clients[server_id]

    def failed(self, client: CacheClient, retry_s: float = 5.0) -> None:
        for sid, c in self._clients.items():
            if c is client:
                self._down[sid] = time.monotonic() + retry_s

    def holders(self, digests: Sequence[str]) -> dict[str, CacheClient]:
        """Digest -> a live peer holding it (only digests some peer holds)."""
        if not digests:
            return {}
        self._refresh()
        found = self.directory.holders(list(digests)) or {}
        out = {}
        for d, ids in found.items():
            for sid in sorted(ids):
                c = self.client(sid)
                if c is not None:
                    out[d] = c
                    break
        return out

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
