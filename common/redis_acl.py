"""Redis ACL users, one per kind of client (issue 16): each reaches only its own keys, with only
the commands it uses; none may run ``FLUSHALL``, ``CONFIG``, ``KEYS``, ``DEBUG``, ``SHUTDOWN``
or another client's commands. The ``default`` user (the password the stack makes) stays the
administrator's: ``microco status``, the health checks, the stack itself.

Each user's password is derived from the administrator's (HMAC-SHA256), so whoever sets Redis
up (the stack, the ``pki`` job of compose and Kubernetes) makes every user's from the one
secret, while a client holding its own password cannot derive another's nor the
administrator's. A client names its user in ``MICROCO_REDIS_USER`` (``connect_redis``).

Rules are written for Redis 6.2 (the local stack's embedded server) and 7.x (the images) alike:
``~pattern`` key patterns, ``+command`` and ``+command|subcommand`` only."""

from __future__ import annotations

import hashlib
import hmac

ENV_REDIS_USER = "MICROCO_REDIS_USER"
#: What every client runs on connecting (redis-py's ``CLIENT SETINFO`` is refused and ignored).
_CONNECT = "+ping +auth +hello +select +client|setname"
ROLES: dict[str, str] = {
    # cache servers: the cache directory (chunk -> servers), their own status and markers
    "cache": f"~microco:cache:* {_CONNECT} +sadd +srem +smembers +del +set +get +exists +expire",
    # jobs (their loaders): read the cache directory, nothing else
    "job": f"~microco:cache:dir:* {_CONNECT} +smembers",
    # the console: its plot series
    "console": f"~microco:console:* {_CONNECT} +rpush +ltrim +expire +lrange +llen",
}
#: The user each service of the platform connects as; the agent's is handed to its jobs.
SERVICE_ROLES = {"cache": "cache", "agent": "job", "console": "console"}


def role_password(admin_password: str, role: str) -> str:
    """``role``'s password, derived from the administrator's."""
    return hmac.new(
        admin_password.encode(), f"microco-redis-user:{role}".encode(), hashlib.sha256
    ).hexdigest()


def acl_config(admin_password: str) -> list[str]:
    """Redis configuration lines defining every role's user (for a config file, never a command
    line: they carry passwords)."""
    return [
        f"user {role} reset on >{role_password(admin_password, role)} resetchannels {rules}"
        for role, rules in ROLES.items()
    ]


def service_redis_env(admin_password: str, service: str) -> tuple[str, str]:
    """``(user, password)`` a platform service connects to Redis with: ``("", "")`` for one that
    does not use Redis (it gets no password at all)."""
    role = SERVICE_ROLES.get(service)
    if role is None or not admin_password:
        return "", ""
    return role, role_password(admin_password, role)
