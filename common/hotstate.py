"""Redis for hot state.

The rule: Redis holds only what can be lost without losing data — per-iteration telemetry,
which cached chunk sits on which cache server, per-job epoch progress, counters the console
plots. Anything whose loss would lose work (job specs and states, the table catalog and
placement, committed compiler configurations) lives in etcd. Losing Redis costs performance
(a cold cache directory, a gap in a plot), never correctness; code reading it must treat a
miss or a connection error as "unknown", not as a fact.
"""

from __future__ import annotations

import logging
from typing import Any

from .errors import Unavailable

log = logging.getLogger(__name__)

KEY_PREFIX = "microco:"


def connect_redis(url: str, check: bool = True, timeout: float = 2.0) -> Any:
    """A ``redis.Redis`` client for ``url`` (``redis://host:port/db``); ``Unavailable`` naming the
    address when ``check`` and it cannot be reached."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            raise Unavailable(f"cannot reach Redis at {url}: {exc}") from exc
    return client


def key(*parts: str) -> str:
    """A namespaced Redis key: ``key("telemetry", job_id)`` -> ``microco:telemetry:<job_id>``."""
    return KEY_PREFIX + ":".join(parts)


def best_effort(fn: Any, *args: Any, default: Any = None, **kwargs: Any) -> Any:
    """Run a Redis call, logging instead of failing: hot state is an optimisation."""
    import redis

    try:
        return fn(*args, **kwargs)
    except redis.RedisError as exc:
        log.warning("redis call %s failed: %s", getattr(fn, "__name__", fn), exc)
        return default
