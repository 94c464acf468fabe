"""Speculative re-execution of a straggling node's share of a query (``services/store/_hedge.py``,
``StoreCore._with_retries``): a node that stops answering without a reset (SIGSTOP, a hung
process, a host cut off) held a query until its registration lease ran out (5 s by default), many
times a sub-second query's healthy time. Now, once its fragments run well past their siblings',
the query is planned again without it (its share read from the other replicas, the other nodes'
fragments kept) and the first plan to answer is used, whole: never parts of two plans, never a
row twice. Here in process: nodes that hang or are slow stay registered (their lease never runs
out), so only a hedge can answer before they do."""

from __future__ import annotations

import logging
import threading
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore
from microco.services.store._hedge import Fragment, HedgePolicy, shape, weight
from microco.services.store._query import Agg, Query

NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
SPECS = [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 4), PartitionSpec("h", "hash", 2)]
SQL = "select k, sum(v) as s, count(*) as n from t group by k"
N = 6000


def _data() -> pa.Table:
    rng = np.random.default_rng(11)
    return pa.table(
        {
            "k": rng.integers(0, 1500, N),
            "g": rng.integers(0, 300, N),
            "h": rng.integers(0, 50, N),
            "v": rng.integers(0, 100, N),
        }
    )


def _want(data: pa.Table) -> list[tuple]:
    got = duckdb.sql("select k, sum(v) s, count(*) n from data group by k").fetchall()
    return sorted(got)


def _rows(t: pa.Table) -> list[tuple]:
    return sorted((r["k"], r["s"], r["n"]) for r in t.to_pylist())


class Stalling(LocalTransport):
    """In-process nodes. Node ``stall`` takes its tasks and answers nothing until ``release`` is
    set (a paused process); it stays registered, as a paused node does until its lease runs out.
    Every task call is counted by node (``ran``)."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.stall: str | None = None
        self.release = threading.Event()
        self.ran: list[str] = []
        self.lock = threading.Lock()

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        with self.lock:
            self.ran.append(node.name)
        if node.name == self.stall:
            self.stalled(node)
        return super().run_task(node, task)

    def stalled(self, node: NodeInfo) -> None:
        self.release.wait(60)


def _store(tr: LocalTransport) -> StoreCore:
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.create_table("t", _data().schema, SPECS)
    core.append("t", _data())
    return core


def _run(fn: Any, tr: Stalling, wait_s: float = 30.0) -> Any:
    """``fn()`` in a thread, which must end while the stalled node still holds its task."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = fn()
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    try:
        thread.start()
        thread.join(wait_s)
        assert not thread.is_alive(), "the query still waits on the stalled node"
    finally:
        tr.release.set()
        thread.join(60)
    assert "error" not in box, box.get("error")
    return box["out"]


def test_the_policy_hedges_a_node_far_behind_its_finished_siblings():
    p = HedgePolicy(floor_s=0.5, multiple=1.5, quorum=0.5)
    run = lambda node, s: Fragment(node, "agg t", 0.0, s, False)  # noqa: E731
    done = lambda node, s: Fragment(node, "agg t", 0.0, s, True)  # noqa: E731
    # like fragments took 0.2 s (median): the bar is the floor, 0.5 s
    assert p.stragglers([run("a", 0.6), done("b", 0.2), done("c", 0.25)]) == {"a"}
    assert p.stragglers([run("a", 0.4), done("b", 0.2), done("c", 0.25)]) == set()
    # they took 1 s: the bar is 1.5 s
    assert p.stragglers([run("a", 1.4), done("b", 1.0)]) == set()
    assert p.stragglers([run("a", 1.6), done("b", 1.0)]) == {"a"}
    # too few finished to compare with: nothing is hedged however long it runs
    assert p.stragglers([run("a", 9.0), run("b", 9.0), run("c", 1.0), done("d", 0.1)]) == set()
    assert p.stragglers([run("a", 9.0)]) == set()
    # a node's own finished fragment is no sibling of its running one
    assert p.stragglers([run("a", 9.0), done("a", 0.1)]) == set()


def test_the_policy_compares_only_like_fragments_and_weighs_them_by_their_bytes():
    p = HedgePolicy(floor_s=0.5, multiple=1.5, quorum=0.5)
    # a gather: the small table's fragment ends at once; the big table's is no straggler for it
    small = Fragment(
        "b", shape({"op": "sql", "sql": "q1", "inputs": {"n": {"sources": [{"table": "n"}]}}}), 0, 0.01, True
    )
    big = Fragment(
        "a", shape({"op": "sql", "sql": "q2", "inputs": {"l": {"sources": [{"table": "l"}]}}}), 0, 3.0, False
    )
    assert small.shape != big.shape and p.stragglers([big, small]) == set()
    # three partitions' bytes against two: expected 1.5x the time of the node with two
    task = {
        "op": "fragment",
        "left": {"sources": [{"table": "t", "bytes": 100}, {"table": "t", "bytes": 200}]},
    }
    assert weight(task) == 300.0 and shape(task) == shape({**task, "left": {"sources": [{"table": "t"}]}})
    two = Fragment("b", "t", 200.0, 1.0, True)
    assert p.stragglers([Fragment("a", "t", 300.0, 2.2, False), two]) == set()  # bar 2.25 s
    assert p.stragglers([Fragment("a", "t", 300.0, 2.3, False), two]) == {"a"}


def test_a_sql_query_with_a_node_that_stopped_answering_is_answered_by_its_hedge(tmp_path):
    data = _data()
    tr = Stalling(str(tmp_path), NODES)
    core = _store(tr)
    healthy, plan = core.sql(SQL)
    holders = sorted(node for node, _ in plan.tasks)
    assert plan.kind == "partition_local" and len(holders) == 2 and not getattr(plan, "hedges", None)
    tr.stall, survivor = holders
    tr.ran.clear()
    # before hedging this waited for the stalled node (here: until released, 60 s)
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert sum(got.column("n").to_pylist()) == N  # no row counted twice, none lost
    [hedge] = plan.hedges
    assert hedge["nodes"] == [tr.stall] and "answer was used" in hedge["outcome"], hedge
    assert tr.stall not in {node for node, _ in plan.tasks}  # the hedge's plan answered
    text = plan.explain_text()
    assert "hedge: answer used: the hedge's" in text, text
    # the survivor's fragment ran once: the hedge kept it (identical in its plan)
    assert tr.ran.count(survivor) == 1, tr.ran
    # left out of the next queries' plans for a while, as a node found unreachable
    assert core.suspected() == {tr.stall}


def test_a_json_model_query_is_hedged_too(tmp_path):
    data = _data()
    tr = Stalling(str(tmp_path), NODES)
    core = _store(tr)
    q = Query("t", group_by=("k",), aggs=(Agg("sum", "v", "s"), Agg("count", "*", "n")))
    healthy, plan = core.query(q)
    tr.stall = sorted(node for node, _ in plan.stages[0])[0]
    got, plan = _run(lambda: core.query(q), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert [h["nodes"] for h in plan.hedges] == [[tr.stall]]
    assert "hedge: answer used: the hedge's" in plan.explain_text()


class SlowThenFast(Stalling):
    """Node ``stall`` is slow but alive: it answers once the hedge has started (a task arrives
    on a node that held no fragment of the first plan); the hedge's new fragments are held until
    the query has returned (``release``, set by ``_run``), so the first plan answers first
    whatever the machine's load (held only until the slow node's own answer was in, the hedge
    could still finish first on a busy machine)."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.holders: set[str] = set()
        self.hedging = threading.Event()

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        if self.stall is not None and node.name not in self.holders:
            self.hedging.set()
            self.release.wait(60)
        return super().run_task(node, task)

    def stalled(self, node: NodeInfo) -> None:
        self.hedging.wait(60)


def test_a_slow_node_that_answers_first_has_its_answer_used_and_the_hedges_ignored(tmp_path):
    data = _data()
    tr = SlowThenFast(str(tmp_path), NODES)
    core = _store(tr)
    healthy, plan = core.sql(SQL)
    tr.holders = {node for node, _ in plan.tasks}
    tr.stall = sorted(tr.holders)[0]
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert tr.hedging.is_set()  # a hedge did start
    assert _rows(got) == _rows(healthy) == _want(data)
    assert sum(got.column("n").to_pylist()) == N
    assert tr.stall in {node for node, _ in plan.tasks}  # the first plan's answer
    [hedge] = plan.hedges
    assert hedge["nodes"] == [tr.stall] and hedge["outcome"].startswith("not used"), hedge
    assert "hedge: answer used: the first plan's" in plan.explain_text()
    assert core.suspected() == set()  # it answered first: not suspected


class _Seen(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle, self.event = needle, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.event.set()


def test_no_hedge_answers_when_no_other_replica_can_serve_the_share(tmp_path):
    """With the other replicas' nodes gone, the query cannot be planned without the straggler:
    its hedge fails at once, and the first plan answers when the slow node does."""
    data = _data()
    tr = Stalling(str(tmp_path), NODES)
    core = _store(tr)
    healthy, plan = core.sql(SQL)
    holders = {node for node, _ in plan.tasks}
    for n in NODES:
        if n.name not in holders:
            tr.kill(n.name)
    tr.stall = sorted(holders)[0]
    seen = _Seen("hedge of")
    logger = logging.getLogger("microco.services.store._core")
    logger.addHandler(seen)
    tr.stalled = lambda node: seen.event.wait(60)  # type: ignore[method-assign]
    try:
        got, plan = core.sql(SQL)
    finally:
        logger.removeHandler(seen)
    assert seen.event.is_set()
    assert _rows(got) == _want(data) and sum(got.column("n").to_pylist()) == N
    [hedge] = plan.hedges
    assert hedge["outcome"].startswith("failed") and "Unavailable" in hedge["outcome"], hedge
    assert "hedge: answer used: the first plan's" in plan.explain_text()


def test_a_hedge_is_not_started_when_hedging_is_off(tmp_path):
    tr = Stalling(str(tmp_path), NODES)
    core = _store(tr)
    core.hedge = None
    _, plan = core.sql(SQL)
    tr.stall = sorted(node for node, _ in plan.tasks)[0]
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(out=core.sql(SQL)), daemon=True)
    thread.start()
    thread.join(1.5)
    assert thread.is_alive()  # waiting on the stalled node, as before hedging
    tr.release.set()
    thread.join(60)
    assert not box["out"][1].hedges
