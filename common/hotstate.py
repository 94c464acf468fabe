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
    """A ``redis.Redis`` client for ``url`` (``redis://host:port/db``, ``rediss://...``,
    ``unix://path``); ``Unavailable`` naming the address when ``check`` and it cannot be reached.

    Unless in insecure mode, a TCP connection is mutual TLS whatever the scheme says: the
    server's certificate must be one of the platform's CA naming the host dialled, and this
    process presents its own credentials (``microco.common.identity``); plus Redis's password."""
    import os

    import redis

    from .redis_acl import ENV_REDIS_USER

    extra: dict[str, Any] = {} if "@" in url.split("//", 1)[-1] else {"password": redis_password()}
    if os.environ.get(ENV_REDIS_USER) and "password" in extra:
        extra["username"] = os.environ[ENV_REDIS_USER]  # this client's ACL user (common/redis_acl)
    extra.update(redis_tls_options(url))
    if extra.get("ssl_certfile") and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://") :]
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, **extra)
    if check:
        try:
            client.ping()
        except redis.RedisError as exc:
            raise Unavailable(f"cannot reach Redis at {url}: {exc}") from exc
    return client


def redis_tls_options(url: str) -> dict[str, Any]:
    """redis-py's TLS options for ``url``: this process's certificate and key (written once to a
    file only its owner may read: the ssl module loads keys from files), the platform's CA, the
    host checked; none in insecure mode or over a unix socket."""
    import ssl

    from . import identity

    if url.startswith("unix://") or identity.insecure():
        return {}
    ident = identity.current()
    if ident is None:
        return {}
    return {
        "ssl_certfile": _key_file(ident.cert_pem, ident.key_pem),
        "ssl_ca_data": ident.ca_pem.decode(),
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_min_version": ssl.TLSVersion.TLSv1_2,
    }


_key_files: dict[bytes, str] = {}


def _key_file(cert_pem: bytes, key_pem: bytes) -> str:
    import atexit
    import os
    import shutil
    import tempfile

    path = _key_files.get(cert_pem)
    if path and os.path.exists(path):
        return path
    d = tempfile.mkdtemp(prefix="microco-redis-tls-")  # 0700
    atexit.register(shutil.rmtree, d, True)
    path = os.path.join(d, "client.pem")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(cert_pem + key_pem)
    _key_files[cert_pem] = path
    return path


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
