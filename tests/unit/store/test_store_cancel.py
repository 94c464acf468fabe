"""Cancelling a losing attempt's tasks on their nodes (``services/store/_cancel.py``,
``StoreCore._cancel_losers``), and hedging a stage whose fragments all run on one node
(``_hedge.Rates``). Before: a hedged query's loser ran on to its end (a node had no cancel), and
a stage on one node was never hedged (its node given up only when its lease ran out)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from _support import wait_until
from test_store_hedge import NODES, SQL, Stalling, _data, _rows, _run, _store, _want

from microco.common.errors import Cancelled
from microco.common.kv import MemoryKV
from microco.services.store import NodeInfo, NodeStore, PartitionSpec, StoreCore
from microco.services.store._cancel import TaskCancelled
from microco.services.store._core import node_action
from microco.services.store._hedge import Fragment, HedgePolicy, Rates


def _until(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    wait_until(cond, timeout_s, what, interval=0.02)


class ReadStalling(Stalling):
    """Node ``stall`` takes its task and starts it, then its extent reads wait until ``release``
    (a node stuck mid-task: a paused process, a hung disk): the task is running on the node when
    the hedge answers, so the node's own record shows whether it was cancelled."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.callers: list[str] = []

    def stalled(self, node: NodeInfo) -> None:  # (the task starts; its reads stall instead)
        self.callers.append(threading.current_thread().name)  # the coordinator's calling thread
        store = self.stores[node.name]
        if "read" not in vars(store):
            original = store.read

            def read(*args: Any, **kwargs: Any) -> pa.Table:
                self.release.wait(60)
                return original(*args, **kwargs)

            store.read = read  # type: ignore[method-assign]


def test_a_losers_task_is_cancelled_on_its_node_and_the_winners_answer_is_exact(tmp_path):
    data = _data()
    tr = ReadStalling(str(tmp_path), NODES)
    core = _store(tr)
    healthy, plan = core.sql(SQL)
    tr.stall, survivor = sorted(node for node, _ in plan.tasks)
    node = tr.stores[tr.stall]
    box: dict[str, Any] = {}

    def query() -> Any:
        out = core.sql(SQL)
        # the hedge answered while the stalled node's task was still running on it: the node
        # is told to cancel it (sent off the query's thread), and records it cancelled
        _until(lambda: any(c["node"] == tr.stall for c in core.cancels), "no cancel sent")
        box["cancels"] = [dict(c) for c in core.cancels]
        box["log"] = dict(node.tasks.log)
        return out

    got, plan = _run(query, tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert sum(got.column("n").to_pylist()) == len(data)
    assert "answer was used" in plan.hedges[0]["outcome"]
    [cancel] = [c for c in box["cancels"] if c["node"] == tr.stall]
    [tid] = cancel["tasks"]
    assert cancel["cancelled"] == [tid], cancel  # it was running there
    assert box["log"][tid] == "cancelled while running"
    # released, it stops at its next check instead of running on: its record says so, nothing
    # of it is left running, and the winner's shared task on the survivor was never cancelled
    _until(lambda: node.tasks.log.get(tid) == "cancelled while running: stopped", "task did not stop")
    _until(lambda: node.tasks.stats()["tasks_running"] == 0, "a task still runs")
    assert node.stats()["cancelled_running"] == 1
    assert all(c["node"] != survivor for c in core.cancels)
    assert tr.stores[survivor].tasks.stats()["cancelled_running"] == 0
    # the call to the stalled node waited on a thread of its own, not one of the core's pool
    # (which it held to the call's deadline before)
    assert tr.callers and all(n.startswith("store-call") for n in tr.callers), tr.callers


def test_a_query_without_a_hedge_cancels_nothing(tmp_path):
    tr = Stalling(str(tmp_path), NODES)
    core = _store(tr)
    for _ in range(2):
        core.sql(SQL)
    assert core.cancels == []
    assert all(s.tasks.stats()["cancelled_running"] == 0 for s in tr.stores.values())


def test_a_cancel_of_a_finished_or_unknown_task_is_harmless_and_an_early_one_stops_it(tmp_path):
    store = NodeStore("n0", tmp_path / "n0")
    task = {"op": "sql", "inputs": {}, "sql": "select 42 as x", "tid": "a" * 24}
    assert store.run(task).column("x").to_pylist() == [42]
    # finished, and never seen: nothing to stop; the node goes on answering
    assert node_action(store, "cancel", {"tasks": ["a" * 24, "b" * 24]}) == {
        "cancelled": [],
        "not_running": ["a" * 24, "b" * 24],
    }
    assert store.run({**task, "tid": "c" * 24}).column("x").to_pylist() == [42]
    assert store.run({k: v for k, v in task.items() if k != "tid"}).column("x").to_pylist() == [42]
    # a cancel that came before its task (both queued on a paused node): the task ends at once
    with pytest.raises(TaskCancelled):
        store.run({**task, "tid": "b" * 24})
    assert store.tasks.log["b" * 24] == "cancelled before it started"
    assert store.stats()["cancelled_before_start"] == 1 and store.stats()["tasks_running"] == 0
    with pytest.raises(Exception, match="task ids"):
        node_action(store, "cancel", {"tasks": "a"})


def test_a_cancel_interrupts_a_running_duckdb_fragment(tmp_path):
    """A fragment's SQL that would run for many minutes stops when its task is cancelled
    (DuckDB interrupted), as ``TaskCancelled``, not as the query's SQL error."""
    store = NodeStore("n0", tmp_path / "n0")
    slow = "select sum(a.range * b.range) as s from range(200000) a, range(200000) b"
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = store.run({"op": "sql", "inputs": {}, "sql": slow, "tid": "d" * 24})
        except BaseException as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    _until(lambda: store.tasks.stats()["tasks_running"] == 1, "the task did not start")
    time.sleep(0.2)  # (into DuckDB's run; a cancel before it is seen at its start, too)
    assert store.cancel(["d" * 24])["cancelled"] == ["d" * 24]
    thread.join(60)
    assert not thread.is_alive(), "DuckDB was not interrupted"
    assert isinstance(box.get("error"), TaskCancelled), box
    assert store.tasks.log["d" * 24] == "cancelled while running: stopped"


def test_the_policy_gives_a_stage_on_one_node_its_shapes_measured_seconds_per_byte():
    p = HedgePolicy(floor_s=0.5, multiple=1.5, quorum=0.5, prior_multiple=3.0)
    rates = Rates(kept=8)
    alone = [Fragment("a", "t", 1000.0, 2.0, False)]
    assert p.stragglers(alone, rates.expect) == set()  # no history of its shape: not hedged
    for s in (0.4, 0.5, 0.6):  # seconds per 1000 bytes: median 0.5 ms per byte
        rates.add("t", 1000.0, s)
    assert rates.expect("t", 2000.0) == pytest.approx(1.0)
    # 1000 bytes expected 0.5 s: bar 1.5 s
    assert p.stragglers([Fragment("a", "t", 1000.0, 1.4, False)], rates.expect) == set()
    assert p.stragglers([Fragment("a", "t", 1000.0, 1.6, False)], rates.expect) == {"a"}
    # the floor holds for a small one; another shape's history is not its own
    assert p.stragglers([Fragment("a", "t", 10.0, 0.4, False)], rates.expect) == set()
    assert p.stragglers([Fragment("a", "u", 1000.0, 9.0, False)], rates.expect) == set()
    # a fragment with a sibling on another node still compares with the sibling, not history
    assert (
        p.stragglers(
            [Fragment("a", "t", 1000.0, 1.6, False), Fragment("b", "t", 1000.0, 1.2, True)], rates.expect
        )
        == set()
    )


SPECS_ONE = [PartitionSpec("k", "hash", 1), PartitionSpec("g", "hash", 1), PartitionSpec("h", "hash", 1)]


def test_a_stage_on_one_node_with_its_node_stalled_is_answered_by_a_hedge(tmp_path):
    data = _data()
    tr = Stalling(str(tmp_path), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.create_table("t", data.schema, SPECS_ONE)
    core.append("t", data)
    for _ in range(3):  # earlier queries of the same shape: the coordinator's measure
        healthy, plan = core.sql(SQL)
    [node] = {n for n, _ in plan.tasks}
    tr.stall = node
    # before: nothing to compare with, so it waited for the stalled node (here 60 s)
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    [hedge] = plan.hedges
    assert hedge["nodes"] == [node] and "answer was used" in hedge["outcome"], hedge
    assert hedge["expected_from"] == "history"
    assert "on it alone, expected to take" in plan.explain_text()
    assert node not in {n for n, _ in plan.tasks}


def test_a_query_whose_caller_went_away_ends_and_its_tasks_are_cancelled(tmp_path):
    """The gRPC handler registers ``gone`` (``context.add_callback``); when the caller goes away
    mid-query, the query ends (``Cancelled``) instead of running on, and its running task on
    the node is cancelled there. Hedging is off, so nothing but the caller's leaving ends it."""
    tr = ReadStalling(str(tmp_path), NODES)
    core = _store(tr)
    core.hedge = None
    _, plan = core.sql(SQL)
    tr.stall = sorted(node for node, _ in plan.tasks)[0]
    node = tr.stores[tr.stall]
    callbacks: list[Any] = []
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = core.sql(SQL, callbacks.append)
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    try:
        thread.start()
        _until(lambda: node.tasks.stats()["tasks_running"] == 1, "the stalled task did not start")
        [left] = callbacks
        left()  # the caller went away (gRPC calls it then; also once the call ends, harmlessly)
        thread.join(30)
        assert not thread.is_alive(), "the query ran on after its caller went away"
        assert isinstance(box.get("error"), Cancelled), box
        _until(lambda: any(c["node"] == tr.stall for c in core.cancels), "no cancel sent")
        [tid] = [t for c in core.cancels if c["node"] == tr.stall for t in c["cancelled"]]
        assert node.tasks.log[tid] == "cancelled while running"
    finally:
        tr.release.set()
        thread.join(30)
    _until(lambda: node.tasks.log.get(tid) == "cancelled while running: stopped", "task did not stop")
    # and a query that answered ignores the callback its call's end makes
    got, _ = core.sql(SQL, callbacks.append)
    callbacks[-1]()
    assert got.num_rows > 0


def test_a_task_ended_from_inside_the_registrys_own_lock_does_not_wait_for_itself():
    """A result stream dropped unread ends its task from its generator's ``finally``, which the
    garbage collector may run while that thread holds the task registry's lock (inside its
    ``cancel`` or ``start``): the end must not wait for the lock its own thread holds (issue 19,
    session 31; the registry's lock is reentrant)."""
    from microco.services.store._cancel import TaskRegistry

    reg = TaskRegistry()
    token = reg.start("a" * 24)
    done = threading.Event()

    def inside() -> None:
        with reg._lock:  # as a collector's finaliser run inside ``cancel``
            reg.end(token)
        done.set()

    thread = threading.Thread(target=inside, daemon=True)
    thread.start()
    assert done.wait(10), "ending a task inside the registry's own lock waited for itself"
    assert reg.stats()["tasks_running"] == 0
