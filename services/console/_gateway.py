"""How the console reaches the platform: etcd (registry, control state), Redis (hot state, the
console's own plot series) and the services' gRPC APIs, found through etcd.

Each system is "in this build" when its protos and service are installed, and "running" when an
instance is registered in etcd. Views of a system that is absent say so instead of inventing data.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc

from microco.common import ServiceClient, dial
from microco.common.channel import pick_instance
from microco.common.errors import Unavailable, Unimplemented
from microco.common.health import check_health
from microco.common.hotstate import connect_redis
from microco.common.kv import KV
from microco.common.registry import ServiceRecord, discover

from ._config import ConsoleConfig

if TYPE_CHECKING:  # the clients are imported on first use: a system may be absent from the build
    from microco.clients.agent import AgentDirectory
    from microco.clients.cache import CacheClient
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.scheduler import SchedulerClient
    from microco.clients.store import StoreClient

log = logging.getLogger(__name__)

C = TypeVar("C", bound=ServiceClient)

# Tries per idempotent call within the console's deadline: a page answers "unavailable" soon
# rather than waiting out a long retry.
ATTEMPTS = 2


@dataclass(frozen=True)
class System:
    """One platform system the console can show: its service name in the registry, the module of
    its generated gRPC code and the module that runs the service (both there: in this build)."""

    name: str
    service: str
    grpc_module: str
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
            "microco.services.scheduler",
        ),
        System(
            "agent",
            "agent",
            "microco.api.agent.v1.agent_pb2_grpc",
            "microco.services.agent",
        ),
        System(
            "cache",
            "cache",
            "microco.api.cache.v1.cache_pb2_grpc",
            "microco.services.cache",
        ),
        System(
            "store",
            "store",
            "microco.api.store.v1.store_pb2_grpc",
            "microco.services.store",
        ),
        System(
            "compiler",
            "compiler",
            "microco.api.compiler.v1.compiler_pb2_grpc",
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
        self._clients: dict[tuple[str, str], ServiceClient] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="console-health")
        self._agents: AgentDirectory | None = None

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

    def record(self, name: str, record: ServiceRecord | None = None) -> ServiceRecord:
        """The instance of system ``name`` to call: ``record`` when given, else the leader or any
        live one, found in etcd at every call (a new leader is used as soon as it registers)."""
        system = SYSTEMS[name]
        if not system.in_build():
            raise Unimplemented(f"{name}: not available in this build")
        if record is None:
            records = self.services(system.service)
            if not records:
                raise Unavailable(f"{name}: no live instance is registered in etcd (is it running?)")
            # the elected leader (the election key first, then the label), as every client picks
            record = pick_instance(self.kv, system.service)
        return record

    def _client(self, name: str, record: ServiceRecord | None, make: type[C]) -> C:
        """The typed client of ``name`` on the chosen instance's shared channel, with the
        console's deadline and attempts (retries are common's ``call_with_retry``: only
        UNAVAILABLE, only for calls the client marks idempotent)."""
        address = self.record(name, record).address
        channel = self._channel(address)
        with self._lock:
            client = self._clients.get((name, address))
            if client is None:
                client = make(channel, self.config.rpc_timeout_s)
                client.attempts = ATTEMPTS
                self._clients[(name, address)] = client
        return cast(C, client)

    # The typed clients (Unimplemented when the system is not in this build, Unavailable when no
    # instance is registered).
    def scheduler(self) -> SchedulerClient:
        from microco.clients.scheduler import SchedulerClient

        return self._client("scheduler", None, SchedulerClient)

    def cache(self, record: ServiceRecord | None = None) -> CacheClient:
        from microco.clients.cache import CacheClient

        return self._client("cache", record, CacheClient)

    def store(self) -> StoreClient:
        from microco.clients.store import StoreClient

        return self._client("store", None, StoreClient)

    def compiler(self) -> RemoteExplorer:
        from microco.clients.compiler import RemoteExplorer

        return self._client("compiler", None, RemoteExplorer)

    def agents(self) -> AgentDirectory:
        """The directory of node agents, to read job logs through (the scheduler is part of the
        build when a job was found)."""
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
            self._clients.clear()
