"""The servers the security suite attacks (shared by its modules)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from microco.api.agent.v1 import agent_pb2_grpc
from microco.api.cache.v1 import cache_pb2_grpc
from microco.api.compiler.v1 import compiler_pb2_grpc
from microco.api.scheduler.v1 import scheduler_pb2_grpc
from microco.api.store.v1 import store_pb2_grpc
from microco.common.kv import MemoryKV, dumps


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A scheduler, a node agent, a store coordinator, a compiler and a cache server in this process, on one MemoryKV, each
    serving mutual TLS as its own service identity."""
    from microco.clients.compiler.explore import CompilerCore
    from microco.services.agent import NodeAgent
    from microco.services.agent._service import NodeAgentServicer
    from microco.services.cache._chunkstore import ChunkStore
    from microco.services.cache._core import CacheCore
    from microco.services.cache._servicer import CacheServicer
    from microco.services.compiler._servicer import CompilerServicer
    from microco.services.runtime import ServiceRuntime, ServiceSettings
    from microco.services.scheduler._core import SchedulerCore
    from microco.services.scheduler._service import SchedulerServicer
    from microco.services.scheduler.policy import make_policy
    from microco.services.store._core import StoreCore
    from microco.services.store._flight import FlightTransport
    from microco.services.store._service import StoreServicer

    tmp = tmp_path_factory.mktemp("sec")
    kv = MemoryKV()
    agent = NodeAgent(kv, "sec-node", str(tmp / "agent"), virtual_devices=2, preload=[])
    kv.put(agent.key, dumps(agent.record()))  # the node as the scheduler sees it
    core = SchedulerCore(kv, make_policy("fifo"), check_commands=False)
    runtimes = []
    store = StoreServicer(StoreCore(kv, FlightTransport(kv)))

    def serve(name: str, add: Any, servicer: Any) -> str:
        rt = ServiceRuntime(ServiceSettings(name=name, metrics_port=-1))
        rt.add_service(add, servicer, name)
        rt.start(register=False)
        runtimes.append(rt)
        return rt.address

    out = {
        "kv": kv,
        "core": core,
        "agent": agent,
        "scheduler": serve(
            "scheduler",
            scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
            SchedulerServicer(core, None, "fifo"),
        ),
        "agent_address": serve(
            "agent", agent_pb2_grpc.add_NodeAgentServiceServicer_to_server, NodeAgentServicer(agent)
        ),
        "store": serve(
            "store",
            store_pb2_grpc.add_StoreCoordinatorServiceServicer_to_server,
            store,
        ),
        "store_servicer": store,
        "compiler": serve(
            "compiler",
            compiler_pb2_grpc.add_CompilerServiceServicer_to_server,
            CompilerServicer(CompilerCore(kv)),
        ),
        "cache": serve(
            "cache",
            cache_pb2_grpc.add_CacheServiceServicer_to_server,
            CacheServicer(CacheCore(ChunkStore(str(tmp / "cache")), 1 << 20, "coordinated"), kv=kv),
        ),
    }
    yield out
    for rt in runtimes:
        rt.stop(grace=0)
    agent.procs.shutdown()
