"""How the console reaches the platform: etcd (registry, control state), Redis (hot state, the
console's own plot series) and the services' gRPC APIs, found through etcd.

Each system is "in this build" when its protos and service are installed, and "running" when an
instance is registered in etcd. Views of a system that is absent say so instead of inventing data.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from microco.common import call_with_retry, dial
from microco.common.errors import Unavailable, Unimplemented
from microco.common.hotstate import connect_redis
from microco.common.kv import KV
from microco.common.registry import ServiceRecord, discover
from microco.common.health import check_health

from ._config import ConsoleConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class System:
    """One platform system the console can show: its service name in the registry, the module of
    its generated gRPC code and stub class, and the module that runs the service."""

    name: str
    service: str
    grpc_module: str
    stub: str
    service_module: str

    def in_build(self) -> bool:
        try:
            return (
                importlib.util.find_spec(self.grpc_module) is not None
                and importlib.util.find_spec(self.service_module + ".__main__") is not None
            )
        except Exception:  # noqa: BLE001 - a half-installed or broken package is not in this build
            return False


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "scheduler",
            "scheduler",
            "microco.api.scheduler.v1.scheduler_pb2_grpc",
            "SchedulerServiceStub",
            "microco.services.scheduler",
        ),
        System(
            "agent",
            "agent",
            "microco.api.agent.v1.agent_pb2_grpc",
            "NodeAgentServiceStub",
            "microco.services.agent",
        ),
        System(
            "cache",
            "cache",
            "microco.api.cache.v1.cache_pb2_grpc",
            "CacheServiceStub",
            "microco.services.cache",
        ),
        System(
            "store",
            "store",
            "microco.api.store.v1.store_pb2_grpc",
            "StoreCoordinatorServiceStub",
            "microco.services.store",
        ),
        System(
            "compiler",
            "compiler",
            "microco.api.compiler.v1.compiler_pb2_grpc",
            "CompilerServiceStub",
            "microco.services.compiler",
        ),
    )
}


class Gateway:
    """Shared connections of one console process. Thread-safe."""

    def __init__(self, config: ConsoleConfig, kv: KV, redis: Any = None, use_redis: bool = True) -> None:
        self.config = config
        self.kv = kv
        self._redis = redis
        self._redis_tried = redis is not None or not use_redis
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="console-health")
        self._agents: Any = None

    # -- Redis: optional, hot state only
    @property
    def redis(self) -> Any:
        """A Redis client, or None when Redis cannot be reached (plots then have gaps, nothing else)."""
        with self._lock:
            if not self._redis_tried:
                self._redis_tried = True
                try:
                    self._redis = connect_redis(self.config.redis, check=False, timeout=1.0)
                except Exception as exc:  # noqa: BLE001 - hot state is optional
                    log.warning("redis unavailable: %s", exc)
            return self._redis

    # -- registry
    def services(self, name: str | None = None) -> list[ServiceRecord]:
        return discover(self.kv, name)

    def health(self, records: list[ServiceRecord]) -> list[str]:
        timeout = self.config.health_timeout_s
        return list(self._pool.map(lambda r: check_health(r, timeout=timeout), records))

    # -- gRPC
    def system(self, name: str) -> System:
        return SYSTEMS[name]

    def availability(self, name: str) -> tuple[bool, str]:
        """(available, reason): whether a system's view can be filled now, and why not."""
        system = SYSTEMS[name]
        if not system.in_build():
            return False, f"{name}: not available in this build"
        if not self.services(system.service):
            return False, f"{name}: no live instance is registered in etcd (is it running?)"
        return True, ""

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = dial(address)
            return channel

    def stub(self, name: str, record: ServiceRecord | None = None) -> Any:
        """A stub of system ``name``: on ``record``'s instance, else on the leader or any live one."""
        system = SYSTEMS[name]
        if not system.in_build():
            raise Unimplemented(f"{name}: not available in this build")
        if record is None:
            records = self.services(system.service)
            if not records:
                raise Unavailable(f"{name}: no live instance is registered in etcd (is it running?)")
            leaders = [r for r in records if r.labels.get("role") == "leader"]
            record = (leaders or records)[0]
        module = importlib.import_module(system.grpc_module)
        return getattr(module, system.stub)(self._channel(record.address))

    def call(self, method: Callable[..., T], request: Any, *, idempotent: bool = True) -> T:
        """One unary call with the console's deadline; UNAVAILABLE retried only when idempotent."""
        return call_with_retry(
            method, request, timeout=self.config.rpc_timeout_s, idempotent=idempotent, attempts=2
        )

    def agents(self) -> Any:
        """The scheduler's directory of node agents, to read job logs through (the scheduler
        is part of the build when a job was found)."""
        with self._lock:
            if self._agents is None:
                from microco.clients.agent import AgentDirectory

                self._agents = AgentDirectory(self.kv, timeout_s=self.config.rpc_timeout_s)
            return self._agents

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._agents is not None:
                self._agents.close()
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
