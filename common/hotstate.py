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

    extra = {} if "@" in url.split("//", 1)[-1] else {"password": redis_password()}
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, **extra)
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            raise Unavailable(f"cannot reach Redis at {url}: {exc}") from exc
    return client


ENV_REDIS_PASSWORD = "MICROCO_REDIS_PASSWORD"
ENV_REDIS_PASSWORD_FILE = "MICROCO_REDIS_PASSWORD_FILE"


def redis_password() -> str | None:
    """Redis's password when the URL carries none: ``MICROCO_REDIS_PASSWORD``, the file
    ``MICROCO_REDIS_PASSWORD_FILE`` names, else the local stack's (``<home>/pki/redis.password``,
    readable by the stack's owner only)."""
    import os
    from pathlib import Path

    from .discovery import stack_home

    if os.environ.get(ENV_REDIS_PASSWORD):
        return os.environ[ENV_REDIS_PASSWORD]
    path = Path(os.environ.get(ENV_REDIS_PASSWORD_FILE) or stack_home() / "pki" / "redis.password")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


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
