"""Time series the console plots (job state changes, job progress, cache hit counters).

They are hot state: kept in Redis (capped lists under ``microco:console:``) so that every console
instance sees the same history and a console restart keeps it; losing them costs a gap in a plot,
never data. When Redis cannot be reached the console keeps a bounded copy in memory instead.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from typing import Any

from microco.common.hotstate import key

log = logging.getLogger(__name__)

REDIS_RETRY_S = 10.0


def series_key(*parts: str) -> str:
    return key("console", *parts)


class SeriesStore:
    """Append-and-read capped series of JSON points. Redis when it answers, memory otherwise."""

    def __init__(self, redis: Any = None, limit: int = 2000) -> None:
        self.redis = redis
        self.limit = limit
        self._memory: dict[str, deque[str]] = {}
        self._lock = threading.Lock()
        # After a failure Redis is left alone for a while, so that a Redis that hangs (rather than
        # refusing connections) does not make every sample and every page wait for its timeout.
        self._skip_until = 0.0

    def _redis_ok(self, fn: Any, *args: Any) -> tuple[bool, Any]:
        if self.redis is None or time.monotonic() < self._skip_until:
            return False, None
        import redis

        try:
            return True, fn(*args)
        except redis.RedisError as exc:
            log.debug("redis unavailable for console series: %s", exc)
            self._skip_until = time.monotonic() + REDIS_RETRY_S
            return False, None

    def append(self, name: str, point: dict[str, Any]) -> None:
        raw = json.dumps(point, separators=(",", ":"))
        k = series_key(name)

        def push() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(k, raw)
            pipe.ltrim(k, -self.limit, -1)
            pipe.expire(k, 7 * 24 * 3600)  # series of jobs long gone fade away by themselves
            pipe.execute()

        ok, _ = self._redis_ok(push)
        if not ok:
            with self._lock:
                self._memory.setdefault(k, deque(maxlen=self.limit)).append(raw)

    def read(self, name: str, last: int | None = None) -> list[dict[str, Any]]:
        k = series_key(name)
        start = -last if last else 0
        ok, raw = self._redis_ok(lambda: self.redis.lrange(k, start, -1))
        if not ok or not raw:
            with self._lock:
                items = list(self._memory.get(k, ()))
            raw = items[start:] if last else items
        out = []
        for item in raw:
            try:
                out.append(json.loads(item))
            except ValueError:
                continue
        return out

    def last(self, name: str) -> dict[str, Any] | None:
        items = self.read(name, last=1)
        return items[-1] if items else None
