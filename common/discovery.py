"""How every client finds the platform: one rule, used by the CLI, the typed clients and the
helpers a training job calls.

Each address is taken from, in order:

1. the explicit argument (``--etcd``, ``etcd=``),
2. the environment (``MICROCO_ETCD``, ``MICROCO_REDIS``; a node agent sets both for its jobs),
3. the state file of the stack ``microco up`` runs on this machine
   (``stack.json`` under ``--home`` / ``home=``, else ``MICROCO_HOME``, else ``~/.microco``),
   when at least one process it records is still alive.

When none gives one the error names each source tried and what it found.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from microco.common.errors import FailedPrecondition

ENV_ETCD = "MICROCO_ETCD"
ENV_REDIS = "MICROCO_REDIS"
ENV_HOME = "MICROCO_HOME"
STATE_FILE = "stack.json"


class PlatformNotFound(FailedPrecondition):
    """No source named an address of the platform (the message says which were tried)."""


@dataclass(frozen=True)
class Found:
    """An address and where it came from (for messages: "etcd 127.0.0.1:2379 from MICROCO_ETCD")."""

    address: str
    source: str


def stack_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The local stack's home: ``home``, else ``MICROCO_HOME``, else ``~/.microco``."""
    if home:
        return Path(home)
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".microco")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped after the kill(0), or between open and read
        return False
    except OSError:
        return True


def _from_state(home: Path, key: str) -> tuple[str, str]:
    """(address, "") from the stack's state file, or ("", why not)."""
    path = home / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return "", f"{path} (absent: no `microco up` from that home)"
    except (OSError, ValueError) as exc:
        return "", f"{path} (unreadable: {exc})"
    procs = state.get("processes") or []
    if procs and not any(pid_alive(int(p.get("pid") or 0)) for p in procs):
        return "", f"{path} (stale: none of its processes is running)"
    value = str(state.get(key) or "")
    return (value, "") if value else ("", f"{path} (names no {key})")


def _find(what: str, key: str, env: str, explicit: str | None, home: Any, flag: str) -> Found:
    tried = []
    if explicit:
        return Found(explicit, "argument")
    tried.append(f"{flag} (not given)")
    if os.environ.get(env):
        return Found(os.environ[env], env)
    tried.append(f"{env} (not set)")
    h = stack_home(home)
    value, why = _from_state(h, key)
    if value:
        return Found(value, str(h / STATE_FILE))
    tried.append(why)
    raise PlatformNotFound(
        f"no {what} to read from: tried " + "; ".join(tried) + f". Pass {flag}, set {env}, "
        "or start the platform with `microco up` (--home/MICROCO_HOME if it runs from another home)"
    )


def find_etcd(etcd: str | None = None, home: str | os.PathLike[str] | None = None) -> Found:
    """The platform's etcd endpoint(s) and where they came from (see the module doc)."""
    return _find("etcd", "etcd", ENV_ETCD, etcd, home, "--etcd")


def find_redis(redis: str | None = None, home: str | os.PathLike[str] | None = None) -> Found:
    """The platform's Redis URL and where it came from (see the module doc)."""
    return _find("Redis", "redis", ENV_REDIS, redis, home, "--redis")


def etcd_endpoint(etcd: str | None = None, home: str | os.PathLike[str] | None = None) -> str:
    return find_etcd(etcd, home).address


def redis_url(redis: str | None = None, home: str | os.PathLike[str] | None = None) -> str:
    return find_redis(redis, home).address


def connect_etcd(etcd: str | None = None, home: str | os.PathLike[str] | None = None) -> Any:
    """An ``EtcdKV`` on the platform's etcd (the caller closes it)."""
    from microco.common.kv import EtcdKV

    return EtcdKV(etcd_endpoint(etcd, home))


__all__ = [
    "ENV_ETCD",
    "ENV_HOME",
    "ENV_REDIS",
    "STATE_FILE",
    "Found",
    "PlatformNotFound",
    "connect_etcd",
    "etcd_endpoint",
    "find_etcd",
    "find_redis",
    "redis_url",
    "stack_home",
]
