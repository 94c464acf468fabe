"""Re-publishing a cache server's directory after Redis loses it.

The directory (which server holds which chunk) is hot state in Redis: a Redis restart or flush
empties it, and until now a server published only at start, so peers found nothing for the rest
of its life. Alongside its entries each server keeps a marker key (no expiry); a background
thread checks it every ``interval_s`` and, when Redis answers but the marker is gone, publishes
everything the server holds again. Costs one ``EXISTS`` per interval."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from microco.clients.cache import RedisDirectory
from microco.common.hotstate import key

log = logging.getLogger(__name__)


def marker_key(server_id: str) -> str:
    return key("cache", "server", server_id, "published")


class DirectoryKeeper:
    """Keeps ``directory`` complete: ``held()`` lists the digests the server holds now."""

    def __init__(
        self, directory: RedisDirectory, held: Callable[[], Iterable[str]], interval_s: float = 2.0
    ) -> None:
        self.directory, self.held, self.interval_s = directory, held, interval_s
        self.republished = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-directory-keeper", daemon=True)

    @property
    def redis(self) -> Any:
        return self.directory.redis

    def mark(self) -> None:
        """Record that the directory is complete now (after the start-up publication)."""
        import redis

        try:
            self.redis.set(marker_key(self.directory.server_id), b"1")
        except redis.RedisError as exc:
            log.warning("cache directory marker not set: %s", exc)

    def check(self) -> bool:
        """Re-publish if Redis has lost this server's entries; True if it did."""
        import redis

        try:
            if self.redis.exists(marker_key(self.directory.server_id)):
                return False
        except redis.RedisError:
            return False  # Redis is down: look again once it answers
        digests = list(self.held())
        self.directory.withdraw()
        self.directory.add(digests)
        self.mark()
        self.republished += 1
        log.warning("Redis lost the cache directory: re-published %d chunks", len(digests))
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:
                log.exception("cache directory check failed")

    def start(self) -> DirectoryKeeper:
        self.mark()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        import redis

        try:
            self.redis.delete(marker_key(self.directory.server_id))
        except redis.RedisError:
            pass
