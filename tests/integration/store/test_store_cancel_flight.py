"""A query task cancelled over Flight (``services/store/_cancel.py``): a real store node's Flight
server with mutual TLS, the coordinator's identity running a fragment by id on it, and its
``cancel`` action. Only the coordinator may cancel (as every node action), and only its calls
name a task by an id (a reader's id is dropped). A few seconds."""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import pyarrow.flight as flight
import pytest
from _support import issued, wait_until

from microco.clients.store import flight_client
from microco.services.store._cancel import TaskCancelled
from microco.services.store._flight import FlightTransport, StoreFlightServer
from microco.services.store._nodestore import NodeStore
from microco.services.store._placement import NodeInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLOW = "select sum(a.range * b.range) as s from range(200000) a, range(200000) b"


@pytest.fixture()
def node(tmp_path):
    server = StoreFlightServer(NodeStore("n1", tmp_path / "n1"))
    threading.Thread(target=server.serve, daemon=True).start()
    assert server.identity is not None  # the suite runs secure
    yield server
    server.shutdown()


def _until(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    wait_until(cond, timeout_s, what, interval=0.02)


def test_the_coordinator_cancels_a_running_fragment_over_flight(node):
    from microco.common.kv import MemoryKV

    transport = FlightTransport(MemoryKV())  # calls as service:store, the coordinator
    info = NodeInfo("n1", "r0", f"grpc+tls://127.0.0.1:{node.port}")
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = transport.run_task(info, {"op": "sql", "inputs": {}, "sql": SLOW, "tid": "e" * 24})
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        _until(lambda: node.store.tasks.stats()["tasks_running"] == 1, "the task did not start")
        got = transport.action(info, "cancel", {"tasks": ["e" * 24, "f" * 24]})
        assert got == {"cancelled": ["e" * 24], "not_running": ["f" * 24]}
        thread.join(60)
        assert not thread.is_alive(), "the fragment ran on"
        assert isinstance(box.get("error"), TaskCancelled), box  # the node's error, as it sent it
        assert node.store.tasks.log["e" * 24] == "cancelled while running: stopped"
        assert transport.action(info, "stats", {})["cancelled_running"] == 1
    finally:
        transport.close()


def test_only_the_coordinator_may_cancel_and_name_a_task(node):
    address = f"127.0.0.1:{node.port}"
    for who in ("user:mallory", "service:store-node"):
        client = flight_client(address, issued(who))
        try:
            with pytest.raises(flight.FlightUnauthorizedError, match="only service:store may"):
                list(client.do_action(flight.Action("cancel", json.dumps({"tasks": ["x"]}).encode())))
        finally:
            client.close()
    # a peer node's SQL task (a reducer's) may run there, but its id is not kept: only the
    # coordinator's calls can be cancelled by id
    client = flight_client(address, issued("service:store-node"))
    try:
        ticket = {"op": "sql", "inputs": {}, "sql": "select 1 as x", "tid": "g" * 24}
        assert client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all().num_rows == 1
    finally:
        client.close()
    assert node.store.cancel(["g" * 24]) == {"cancelled": [], "not_running": ["g" * 24]}
    assert "g" * 24 not in {t for t in node.store.tasks.running}
    assert node.store.stats()["cancelled_running"] == 0


def test_a_query_whose_grpc_caller_gives_up_is_cancelled_on_its_node(tmp_path):
    """The coordinator's gRPC service (mutual TLS) over in-process nodes, one of which holds its
    task (its extent reads wait, as a hung disk's): a client whose deadline passes leaves; the
    service's query ends and the task is cancelled on its node (its own record), rather than the
    query running on for nobody. Hedging is off, so nothing else ends it."""
    import numpy as np
    import pyarrow as pa

    from microco.api.store.v1 import store_pb2_grpc
    from microco.clients.store import StoreClient
    from microco.common.errors import DeadlineExceeded, Unavailable
    from microco.common.kv import MemoryKV
    from microco.services.runtime import ServiceRuntime, ServiceSettings
    from microco.services.store import LocalTransport, PartitionSpec, StoreCore
    from microco.services.store._service import StoreServicer

    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.hedge = None
    rng = np.random.default_rng(5)
    data = pa.table(
        {"k": rng.integers(0, 500, 4000), "g": rng.integers(0, 9, 4000), "v": rng.integers(0, 9, 4000)}
    )
    core.create_table(
        "t",
        data.schema,
        [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 4), PartitionSpec("v", "hash", 2)],
    )
    core.append("t", data)
    sql = "select k, sum(v) s from t group by k"
    _, plan = core.sql(sql)
    stalled = sorted(n for n, _ in plan.tasks)[0]
    store, release = tr.stores[stalled], threading.Event()
    original = store.read

    def read(*args: Any, **kwargs: Any) -> Any:
        release.wait(60)
        return original(*args, **kwargs)

    store.read = read  # type: ignore[method-assign]
    rt = ServiceRuntime(ServiceSettings(name="store", metrics_port=-1))
    rt.add_service(store_pb2_grpc.add_StoreCoordinatorServiceServicer_to_server, StoreServicer(core), "store")
    rt.start(register=False)
    client = StoreClient.from_address(rt.address)
    try:
        with pytest.raises((DeadlineExceeded, Unavailable)):
            client.sql(sql, timeout=1.0)
        _until(lambda: any(c["node"] == stalled for c in core.cancels), "the query ran on for nobody")
        [tid] = [t for c in core.cancels if c["node"] == stalled for t in c["cancelled"]]
        assert store.tasks.log[tid] == "cancelled while running"
        release.set()
        _until(lambda: store.tasks.log.get(tid) == "cancelled while running: stopped", "task did not stop")
    finally:
        release.set()
        client.close()
        rt.stop(grace=0)


def test_the_coordinator_probes_a_running_task_and_no_one_else_may(node):
    """The liveness probe (``probe`` action, ``StoreCore._probe_stage``): the coordinator asks
    a node about a fragment running long on it, with a short deadline of its own; the node says
    it runs, for how long and what it has read. A node action: refused to anyone but
    ``service:store``."""
    from microco.common.kv import MemoryKV

    transport = FlightTransport(MemoryKV())  # calls as service:store, the coordinator
    info = NodeInfo("n1", "r0", f"grpc+tls://127.0.0.1:{node.port}")

    def run() -> None:  # (cancelled at the end: its error is not this test's)
        with contextlib.suppress(Exception):
            transport.run_task(info, {"op": "sql", "inputs": {}, "sql": SLOW, "tid": "h" * 24})

    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        _until(lambda: node.store.tasks.stats()["tasks_running"] == 1, "the task did not start")
        got = transport.action(info, "probe", {"tasks": ["h" * 24, "i" * 24]}, timeout=5.0)
        assert set(got["running"]) == {"h" * 24} and got["not_running"] == ["i" * 24], got
        assert got["running"]["h" * 24]["s"] >= 0 and got["running"]["h" * 24]["cancelled"] is False
        assert transport.action(info, "stats", {})["probes"] == 1
        address = f"127.0.0.1:{node.port}"
        for who in ("user:mallory", "service:store-node"):
            client = flight_client(address, issued(who))
            try:
                with pytest.raises(flight.FlightUnauthorizedError, match="only service:store may"):
                    list(client.do_action(flight.Action("probe", json.dumps({"tasks": ["h" * 24]}).encode())))
            finally:
                client.close()
        assert node.store.stats()["probes"] == 1  # (the refused ones were never answered)
        with pytest.raises(Exception, match="must be a list"):
            transport.action(info, "probe", {"tasks": "h"}, timeout=5.0)
    finally:
        node.store.cancel(["h" * 24])
        thread.join(60)
        transport.close()


def test_the_coordinator_warms_a_hedges_reads_and_no_one_else_may(node):
    """The warm-up of a hedge's reads (``warm`` action, ``StoreCore._warm``): the coordinator asks
    a node to decode extents' columns into its cache ahead of a hedge; the node answers what it
    decoded and counts it as no query's read. A node action: refused to anyone but
    ``service:store``."""
    import pyarrow as pa

    from microco.common.kv import MemoryKV

    rows = pa.table({"k": list(range(4000)), "v": list(range(4000))})
    eid = "s000000-r1-p0000-abcd"
    node.store.put_extent("t", eid, rows, [[0, 0, 4000]])
    transport = FlightTransport(MemoryKV())  # calls as service:store, the coordinator
    info = NodeInfo("n1", "r0", f"grpc+tls://127.0.0.1:{node.port}")
    read = {"table": "t", "extent": eid, "bucket": None, "columns": ["k"]}
    try:
        address = f"127.0.0.1:{node.port}"
        for who in ("user:mallory", "service:store-node"):
            client = flight_client(address, issued(who))
            try:
                with pytest.raises(flight.FlightUnauthorizedError, match="only service:store may"):
                    list(client.do_action(flight.Action("warm", json.dumps({"reads": [read]}).encode())))
            finally:
                client.close()
        assert node.store.stats()["open_extents"] == 0  # (the refused ones decoded nothing)
        got = transport.action(info, "warm", {"reads": [read], "tid": "w" * 24}, timeout=10.0)
        assert got["extents"] == 1 and got["bytes"] >= 4000 * 8, got
        assert node.store.stats()["open_extents"] == 1 and node.store.stats()["tasks_running"] == 0
        assert node.store.bytes_read == 0  # (no query read it)
        with pytest.raises(Exception, match="must be a list"):
            transport.action(info, "warm", {"reads": "t"}, timeout=5.0)
    finally:
        transport.close()
