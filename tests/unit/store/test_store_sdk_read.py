"""``StoreClient.read`` (the SDK's parallel Flight read of a planned table) with a node that fails
or stops answering half-way. Before: a node paused (SIGSTOP) at the read failed it with
``Unavailable`` after the 20 s connect timeout (120 s once streaming), a killed node failed it
at once; measured on a six-node cluster, docs/store.md "A node that stops answering". Now the
read asks for the plan again and starts over without the node once the coordinator stops
planning on it (``clients/store/_read.py``). Real Flight servers in this process; the "plans" are
what the coordinator would answer before and after the node's lease ran out."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from microco.clients.store import _read
from microco.common.errors import Unavailable

pytestmark = pytest.mark.timeout(120)


class _Node(flight.FlightServerBase):
    """Serves its ticket's rows; ``stall``: sends nothing and never ends (a paused process)."""

    def __init__(self, rows: pa.Table, stall: bool = False) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.rows, self.stall = rows, stall
        self.release = threading.Event()
        self.gets = 0
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        self.gets += 1
        if self.stall:
            self.release.wait(60)
        return flight.RecordBatchStream(self.rows)


@dataclass
class _Endpoint:
    address: str
    ticket: bytes = b"{}"


@dataclass
class _Plan:
    endpoints: list[_Endpoint]


class _Coordinator:
    """Plans on ``before`` for the first ``lapse_after`` plans, then on ``after`` (the node's
    lease ran out); counts the plans asked for."""

    def __init__(self, before: list[str], after: list[str], lapse_after: int) -> None:
        self.before, self.after, self.lapse_after = before, after, lapse_after
        self.plans = 0

    def plan(self) -> _Plan:
        self.plans += 1
        nodes = self.before if self.plans <= self.lapse_after else self.after
        return _Plan([_Endpoint(a) for a in nodes])


def _rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"k": pa.array(range(lo, hi), pa.int64())})


def _read_all(coordinator: _Coordinator) -> pa.Table:
    return _read.read_planned(coordinator.plan, lambda _p: _rows(0, 0).schema)


@pytest.fixture(autouse=True)
def _insecure_and_quick(monkeypatch):
    monkeypatch.setenv("MICROCO_INSECURE", "1")
    monkeypatch.setattr(_read, "WATCH_AFTER_S", 0.2)
    monkeypatch.setattr(_read, "WATCH_EVERY_S", 0.2)


def test_a_node_that_stops_answering_is_left_once_the_plan_no_longer_uses_it():
    a, b = _Node(_rows(0, 100)), _Node(_rows(100, 200))
    paused = _Node(_rows(100, 200), stall=True)  # b's rows, on the node that stops answering
    try:
        # two watches see the paused node still planned (its lease lasts), the third does not
        coordinator = _Coordinator([a.address, paused.address], [a.address, b.address], lapse_after=3)
        got = _read_all(coordinator)
        assert sorted(got.column("k").to_pylist()) == list(range(200))
        assert coordinator.plans >= 4  # the first plan, the watches, the plan without it
        assert b.gets == 1
    finally:
        paused.release.set()
        for n in (a, b, paused):
            n.shutdown()


def test_a_killed_node_is_read_again_on_the_plan_without_it():
    a, b = _Node(_rows(0, 100)), _Node(_rows(100, 200))
    with socket.socket() as s:  # a port nothing listens on: connection refused, as a killed node's
        s.bind(("127.0.0.1", 0))
        dead = f"grpc://127.0.0.1:{s.getsockname()[1]}"
    try:
        # the plan still names the dead node twice after the failure (its lease has not run out)
        coordinator = _Coordinator([a.address, dead], [a.address, b.address], lapse_after=3)
        got = _read_all(coordinator)
        assert sorted(got.column("k").to_pylist()) == list(range(200))
        assert coordinator.plans >= 4 and b.gets == 1  # (more when a watch fell in the wait)
    finally:
        a.shutdown()
        b.shutdown()


def test_a_read_that_keeps_losing_nodes_fails_with_the_nodes_error(monkeypatch):
    monkeypatch.setattr(_read, "LOST_WAIT_S", 0.0)  # (a node still planned is read again at once)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"grpc://127.0.0.1:{s.getsockname()[1]}"
    coordinator = _Coordinator([dead], [dead], lapse_after=0)
    with pytest.raises(Unavailable):
        _read_all(coordinator)
    assert coordinator.plans >= _read.ATTEMPTS


def test_a_healthy_read_returns_every_part_in_plan_order():
    nodes = [_Node(_rows(i * 10, i * 10 + 10)) for i in range(10)]  # more than MAX_STREAMS
    try:
        coordinator = _Coordinator([n.address for n in nodes], [], lapse_after=10**6)
        got = _read_all(coordinator)
        assert got.column("k").to_pylist() == list(range(100))
        assert all(n.gets == 1 for n in nodes)
    finally:
        for n in nodes:
            n.shutdown()
