"""A store node that stops answering without closing its connections (a paused process, a host
cut off: no TCP reset) held a query until each call's deadline, 120 s (a stream's: an hour); a
killed node is noticed at once. Now the coordinator watches the registry while a query waits on
nodes: one that leaves it (its lease ran out) fails the waiting stage at once, and the query
is retried without it (``services/store/_liveness.py``). Measured before the change with a real
cluster and SIGSTOP: a group-by in flight took 121 s; docs/store.md, "A node that stops
answering"."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from microco.clients.store._flight import FlightClients
from microco.common.errors import Unavailable
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore
from microco.services.store import _core as store_core
from microco.services.store._liveness import NodeWatch, nodes_used
from microco.services.store._query import Agg, Query

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
SPECS = [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 4), PartitionSpec("h", "hash", 2)]


class Hanging(LocalTransport):
    """In-process nodes, one of which (``hang``) takes a task and never answers, and whose
    registration then runs out (it leaves ``live_nodes``), as a paused node's lease does."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.hang: str | None = None
        self.release = threading.Event()
        self.abandoned: list[str] = []

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        if node.name == self.hang:
            self.kill(node.name)  # its lease runs out while the call hangs
            self.release.wait(120)
            raise Unavailable(f"{node.name}: deadline exceeded")
        return super().run_task(node, task)

    def put_extent(
        self, node: NodeInfo, table: str, extent_id: str, rows: pa.Table, buckets: list, codec: str = ""
    ) -> dict:
        if node.name == self.hang:
            self.kill(node.name)
            self.release.wait(120)
            raise Unavailable(f"{node.name}: deadline exceeded")
        return super().put_extent(node, table, extent_id, rows, buckets, codec)

    def abandon(self, node: NodeInfo) -> None:
        self.abandoned.append(node.name)


def _in_thread(fn: Any, tr: Hanging) -> Any:
    """``fn()`` in a thread, waited for while the hung node's calls hang (released after)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=run)
    try:
        thread.start()
        # without the watch the call waits for the hung one (released at the end, or by its
        # 120 s deadline); with it, it goes on as soon as the node is seen gone
        thread.join(60)
        assert not thread.is_alive(), "still waiting on a node that left the cluster"
    finally:
        tr.release.set()
        thread.join()
    assert "error" not in box, box.get("error")
    return box["out"]


def test_a_query_waiting_on_a_node_that_leaves_the_cluster_is_retried_without_it(tmp_path):
    rng = np.random.default_rng(5)
    n = 4000
    data = pa.table({"k": rng.integers(0, 900, n), "g": rng.integers(0, 200, n), "h": rng.integers(0, 40, n)})
    tr = Hanging(str(tmp_path), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.node_watch.poll_s = 0.05
    core.create_table("t", data.schema, SPECS)
    core.append("t", data)
    q = Query("t", group_by=("k",), aggs=(Agg("count", "*", "n"),))
    healthy, plan = core.query(q)
    # a node that runs one of the plan's tasks
    tr.hang = sorted({node for stage in plan.stages for node, _ in stage})[0]
    got = _in_thread(lambda: core.query(q)[0], tr)
    assert got.sort_by("k").equals(healthy.sort_by("k"))
    assert tr.hang in core.suspected()  # left out of the next queries' plans for a while
    assert tr.abandoned == [tr.hang]  # its calls handed to the transport to give up


class _Mute(LocalTransport):
    """A node (``mute``) that takes an action and answers nothing until the caller's deadline
    (``timeout``; without one, the Flight call's 120 s: 90 here), as a paused process does."""

    mute = "n0"

    def action(self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None) -> dict:
        if node.name == self.mute:
            time.sleep(90 if timeout is None else timeout)
            raise Unavailable(f"{node.name}: deadline exceeded")
        return super().action(node, name, body, timeout)


def test_the_nodes_status_does_not_wait_on_a_node_that_stopped_answering(tmp_path, monkeypatch):
    """The nodes' status (the console's store page, ``microco store nodes``) asked each live node
    what it read, one after another, each with the action's 120 s deadline: a node paused within
    its lease held it that long. Now at once, each for at most ``STATUS_TIMEOUT_S``."""
    monkeypatch.setattr(store_core, "STATUS_TIMEOUT_S", 0.5)
    data = pa.table({"k": np.arange(300), "g": np.arange(300) % 7, "h": np.arange(300) % 5})
    core = StoreCore(MemoryKV(), _Mute(str(tmp_path), NODES), super_extent_rows=10_000, recovery_rate_bytes=0)
    core.create_table("t", data.schema, SPECS)
    core.append("t", data)
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(out=core.nodes()), daemon=True)
    thread.start()
    thread.join(45)
    assert not thread.is_alive(), "the status still waits on a node that stopped answering"
    got = box["out"]
    by_name = {n["name"]: n for n in got}
    assert by_name["n0"]["alive"] and by_name["n0"]["read_by_replica"] == {}  # it could not say
    assert all(by_name[f"n{i}"]["extents"] > 0 for i in range(6))


def test_an_append_writing_to_a_node_that_leaves_the_cluster_places_its_extents_elsewhere(tmp_path):
    data = pa.table({"k": np.arange(3000), "g": np.arange(3000) % 97, "h": np.arange(3000) % 13})
    tr = Hanging(str(tmp_path), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.node_watch.poll_s = 0.05
    core.create_table("t", data.schema, SPECS)
    tr.hang = "n0"
    assert _in_thread(lambda: core.append("t", data), tr).rows == 3000
    assert "n0" not in {e.node for e in core.catalog.table("t").extents()}
    got, _ = core.query(Query("t", aggs=(Agg("count", "*", "n"), Agg("sum", "k", "s"))))
    assert got.to_pylist() == [{"n": 3000, "s": sum(range(3000))}]


def test_the_nodes_a_stage_uses_are_its_runners_and_those_it_reads_from():
    tasks = [
        ("n1", {"op": "fragment", "sources": [{"node": "n2", "extent": "e"}, {"node": "n1", "extent": "f"}]}),
        ("n3", {"op": "reduce", "peers": {"L": ["n4"], "R": ["n5"]}, "addresses": {"n4": "a", "n6": "b"}}),
        ("n7", {"op": "map", "side": {"sources": [[{"node": "n8"}]]}}),
    ]
    assert nodes_used(tasks) == {f"n{i}" for i in range(1, 9)}


def test_the_watch_names_each_lost_node_once_and_a_registry_it_cannot_read_tells_nothing():
    live = {"a", "b", "c"}
    failing = {"on": False}
    abandoned: list[Any] = []

    def read() -> set[str]:
        if failing["on"]:
            raise Unavailable("etcd down")
        return set(live)

    watch = NodeWatch(read, abandoned.append, poll_s=3600)
    one = watch.register({"a": "addr-a", "b": "addr-b"}, start=False)
    two = watch.register({"b": "addr-b", "c": None}, start=False)
    assert watch.check() == set() and not one.lost and not two.lost
    failing["on"] = True
    live.discard("b")
    assert watch.check() == set() and not one.lost  # no news is not a loss
    failing["on"] = False
    assert watch.check() == {"b"}
    assert one.lost == {"b"} and two.lost == {"b"} and abandoned == ["addr-b"]
    live.discard("c")
    assert watch.check() == {"c"} and abandoned == ["addr-b"]  # (c registered with nothing to give up)
    assert watch.check() == set()  # each loss told once
    one.close()
    two.close()
    assert watch.check() == set()


class _Stalling(flight.FlightServerBase):
    """Sends one batch, then stops answering (as a paused process does) until released."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.release = threading.Event()

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        t = pa.table({"a": [1, 2, 3]})

        def gen() -> Any:
            yield t.to_batches()[0]
            self.release.wait(60)
            yield t.to_batches()[0]

        return flight.GeneratorStream(t.schema, gen())


@pytest.mark.parametrize("how", ["stream", "table"])
def test_aborting_an_address_ends_the_reads_that_wait_on_it(monkeypatch, how):
    monkeypatch.setenv("MICROCO_INSECURE", "1")
    server = _Stalling()
    threading.Thread(target=server.serve, daemon=True).start()
    address = f"grpc://127.0.0.1:{server.port}"
    clients = FlightClients()
    box: dict[str, Any] = {}

    def read() -> None:
        try:
            if how == "stream":
                _schema, batches = clients.do_get_stream(address, {"op": "x"})
                for _ in batches:
                    box["first"] = True
            else:
                clients.do_get(address, {"op": "x"})
        except Exception as exc:  # noqa: BLE001 - the finding
            box["error"] = exc

    thread = threading.Thread(target=read)
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while not clients._reading.get(address) and time.monotonic() < deadline:
            time.sleep(0.01)  # (until the read has begun and waits on the server)
        clients.abort(address)
        thread.join(30)
        assert not thread.is_alive(), "the read still waits on a server that stopped answering"
    finally:
        server.release.set()
        thread.join()
        clients.close()
        server.shutdown()
    assert isinstance(box.get("error"), Unavailable), box
    assert not clients._reading  # nothing left registered


class _Lapsing(LocalTransport):
    """Nodes whose registration lapsed (``lapsed``: not live) while their processes answer."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.lapsed: set[str] = set()

    def live_nodes(self) -> list[NodeInfo]:
        return [n for n in super().live_nodes() if n.name not in self.lapsed]


def _seen_all(tr: LocalTransport, super_extent_rows: int, wait_s: float) -> tuple[StoreCore, pa.Table]:
    """A store over ``tr`` with table ``t`` created (not appended), having seen all six nodes
    live (as any query or the status does), and the rows to append."""
    data = pa.table({"k": np.arange(3000), "g": np.arange(3000) % 97, "h": np.arange(3000) % 13})
    core = StoreCore(MemoryKV(), tr, super_extent_rows=super_extent_rows, recovery_rate_bytes=0)
    core.return_wait_s = wait_s
    core.create_table("t", data.schema, SPECS)
    core.live_nodes()
    return core, data


def test_an_append_waits_for_a_node_whose_lease_lapsed_a_moment_ago(tmp_path):
    """A lease lapse of a moment (a loaded machine) at an append placed the table over the nodes
    live then, for its life: measured, ``orders``' replicas 1 and 2 on one node each. Now a node
    live a moment ago that still answers is waited for (once per append, ``return_wait_s`` at
    most)."""
    tr = _Lapsing(str(tmp_path), NODES)
    core, data = _seen_all(tr, super_extent_rows=10_000, wait_s=30.0)
    tr.lapsed.add("n0")  # its lease lapsed, the process lives...
    threading.Timer(0.5, lambda: tr.lapsed.discard("n0")).start()  # ...and registers again
    core.append("t", data)
    assert {e.node for e in core.catalog.table("t").extents()} == {n.name for n in NODES}


def test_an_append_waits_once_for_a_node_that_answers_but_does_not_register(tmp_path, caplog):
    tr = _Lapsing(str(tmp_path), NODES)
    core, data = _seen_all(tr, super_extent_rows=1000, wait_s=0.3)
    tr.lapsed.add("n1")
    with caplog.at_level("WARNING", logger="microco.services.store._core"):
        assert core.append("t", data).rows == 3000  # three super-extents
    assert "n1" not in {e.node for e in core.catalog.table("t").extents()}
    assert sum("to come back" in r.getMessage() for r in caplog.records) == 1


def test_an_append_does_not_wait_for_a_node_that_died(tmp_path, caplog):
    tr = LocalTransport(str(tmp_path), NODES)
    core, data = _seen_all(tr, super_extent_rows=10_000, wait_s=60.0)
    tr.kill("n1")  # gone: its address answers nothing
    with caplog.at_level("WARNING", logger="microco.services.store._core"):
        assert core.append("t", data).rows == 3000
    assert not any("to come back" in r.getMessage() for r in caplog.records)
