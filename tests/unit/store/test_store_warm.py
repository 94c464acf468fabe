"""Warming a hedge's reads ahead of it (``StoreCore._warm``, ``_send_warms``, ``_unwarm``; the
node's ``warm`` action, ``NodeStore.warm``; the policy's ``_hedge.HedgePolicy.warm``; the
mechanism's ``_liveness.Probes.waiting``): a node whose liveness probe goes unanswered while
another node answered, not yet enough to be hedged, has the plan its hedge would run made at
once, and the nodes that plan reads from decode those extents into their caches, nothing run and
no answer made; the hedge, if it follows, finds them decoded. The node answering a probe again
cancels the warm-up. Before: a hedge's rerun on a replica no query had read decoded its extents
only once it started (no ``warm`` action, no ``plan.warms``). In process: the silent node stays
registered (its lease never runs out)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _support import wait_until
from test_store_cancel import SPECS_ONE
from test_store_hedge import NODES, SQL, N, Stalling, _data, _rows, _run, _want

from microco.common.errors import InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.store import NodeInfo, StoreCore
from microco.services.store import _nodestore as nodestore_mod
from microco.services.store._hedge import HedgePolicy, Rates
from microco.services.store._liveness import Probes
from microco.services.store._nodestore import NodeStore

WAIT_S = 20.0  # the most any stand-in below waits for what it waits on


class Recording(Stalling):
    """Node ``stall`` takes its tasks and answers nothing until ``release`` (its probes
    included, as a paused process); every task and ``warm`` / ``cancel`` action is recorded, in
    order, by node (``events``)."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.events: list[tuple[str, str]] = []

    def note(self, what: str, node: str) -> None:
        with self.lock:
            self.events.append((what, node))

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        self.note("task", node.name)
        return super().run_task(node, task)

    def action(self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        if name in ("warm", "cancel"):
            self.note(name, node.name)
        if name == "probe" and node.name == self.stall:
            self.release.wait(60)
        return super().action(node, name, body, timeout)


def _core(tr: Stalling, policy: HedgePolicy) -> StoreCore:
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.create_table("t", _data().schema, SPECS_ONE)
    core.append("t", _data())
    core.hedge = policy
    return core


def test_a_node_whose_probe_goes_unanswered_has_its_hedges_reads_warmed_before_the_hedge_runs(tmp_path):
    data = _data()
    tr = Recording(str(tmp_path), NODES)
    # hedged at the fourth probe missed in a row (not at an unanswered one: ``hedge_after_s``
    # 0), warmed once one goes unanswered: however late this busy machine's ticks decide the
    # rounds, the warm-up comes before the hedge
    core = _core(tr, HedgePolicy(probe_misses=4, hedge_after_s=0))
    healthy, plan = core.sql(SQL)
    [node] = {n for n, _ in plan.tasks}
    core.rates = Rates()  # (no history: only the probes can hedge it)
    tr.stall = node
    with tr.lock:
        tr.events.clear()
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert sum(got.column("n").to_pylist()) == N  # every row once
    [hedge] = plan.hedges
    assert hedge["nodes"] == [node] and hedge["expected_from"] == "probe", hedge
    [target] = {n for n, _ in plan.tasks}  # the hedge's plan answered, on another replica's node
    assert target != node
    [warm] = plan.warms
    assert warm["nodes"] == [node] and warm["on"] == [target], warm
    assert warm["outcome"] == "the hedge followed", warm
    assert warm["extents"] >= 1 and warm["bytes"] > 0, warm
    assert warm["witness"] not in (None, node)
    # the warm-up reached the hedge's node before the hedge's task did
    on_target = [what for what, n in tr.events if n == target and what in ("warm", "task")]
    assert on_target[:2] == ["warm", "task"], tr.events
    text = plan.explain_text()
    assert f"warm: {node} had not answered a liveness probe for " in text, text
    assert "the hedge followed" in text, text


class AnswersAgain(Stalling):
    """Node ``stall`` answers no probe until a warm-up of its hedge's reads has reached another
    node, then every probe at once; its task waits until the warm-up
    was cancelled. The warm-up's node takes the ``warm`` only once its cancel has come (so the
    cancel finds it not started: a node remembers it and ends the task as it starts)."""

    def __init__(self, root: str, nodes: list[NodeInfo]) -> None:
        super().__init__(root, nodes)
        self.warmed = threading.Event()
        self.cancelled = threading.Event()
        self.warm_on: list[str] = []
        self.warm_errors: list[BaseException] = []

    def stalled(self, node: NodeInfo) -> None:
        self.cancelled.wait(WAIT_S)

    def action(self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        if name == "probe" and node.name == self.stall:
            self.warmed.wait(WAIT_S)
        if name == "cancel" and node.name in self.warm_on:
            out = super().action(node, name, body, timeout)
            self.cancelled.set()
            return out
        if name == "warm":
            self.warm_on.append(node.name)
            self.warmed.set()
            self.cancelled.wait(WAIT_S)
            try:
                return super().action(node, name, body, timeout)
            except BaseException as exc:
                self.warm_errors.append(exc)
                raise
        return super().action(node, name, body, timeout)


def test_a_warm_up_is_cancelled_when_its_node_answers_a_probe_again(tmp_path):
    data = _data()
    tr = AnswersAgain(str(tmp_path), NODES)
    # never hedged within this test's waits: only the warm-up and its cancel are at stake
    core = _core(tr, HedgePolicy(probe_misses=1000, hedge_after_s=0))
    healthy, plan = core.sql(SQL)
    [node] = {n for n, _ in plan.tasks}
    core.rates = Rates()
    tr.stall = node
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert not plan.hedges, plan.hedges
    assert {n for n, _ in plan.tasks} == {node}  # its own answer
    [warm] = plan.warms
    assert warm["nodes"] == [node], warm
    assert warm["outcome"] == f"cancelled: {node} answered a probe again", warm
    [target] = tr.warm_on
    assert warm["on"] == [target] and target != node
    # the cancel reached the warm-up's node first: it ended the warm-up as it started
    assert tr.stores[target].tasks.stats()["cancelled_before_start"] == 1
    assert [type(e).__name__ for e in tr.warm_errors] == ["TaskCancelled"]
    assert core.suspected() == set()


def test_a_healthy_query_warms_nothing(tmp_path):
    tr = Recording(str(tmp_path), NODES)
    core = _core(tr, HedgePolicy())
    for _ in range(3):
        got, plan = core.sql(SQL)
        assert not plan.warms and not plan.hedges
    assert ("warm", "n0") not in tr.events and not any(what == "warm" for what, _ in tr.events)


def test_the_policy_warms_a_probe_unanswered_a_twentieth_of_a_second_while_the_witness_answered():
    p = HedgePolicy()
    assert p.warm(0.05, 0.0) and p.warm(0.3, 0.05) and p.warm(0.25, 0.01)
    assert not p.warm(0.04, 0.0)  # (not yet)
    assert not p.warm(0.3, 0.06)  # (the witness was slow too: the coordinator may be the slow one)
    assert not HedgePolicy(warm_after_s=0).warm(1.0, 0.0)
    assert not HedgePolicy(probe_misses=0).warm(1.0, 0.0)


def test_the_probes_tell_which_node_has_not_answered_while_the_witness_has():
    """The mechanism alone: a round's asks, the witness's answered, the node's not (yet)."""
    hold = threading.Event()

    def ask(node: str, tids: list[str], timeout: float) -> bool:
        if node == "a":
            hold.wait(WAIT_S)
        return True

    started: list[threading.Thread] = []

    def run(fn: Any) -> None:
        t = threading.Thread(target=fn, daemon=True)
        started.append(t)
        t.start()

    p = Probes(ask, run, every_s=60.0, timeout_s=60.0)
    t0 = time.monotonic()
    p.tick(t0, {"a": ("a", ["t1"]), "b": ("b", ["t2"])}, [("w", "w")])
    wait_until(
        lambda: set(p.waiting(time.monotonic())) == {"a"}, WAIT_S, "b's and w's answers", interval=0.01
    )
    got = p.waiting(t0 + 5.0)
    assert set(got) == {"a"} and got["a"][0] == 5.0 and got["a"][2] == "w" and got["a"][1] >= 0, got
    hold.set()
    for t in started:
        t.join(WAIT_S)
    assert p.waiting(t0 + 5.0) == {}  # (answered: nothing waits)


def _one_extent(tmp_path: Path) -> tuple[NodeStore, str]:
    store = NodeStore("n0", tmp_path / "n0")  # (zstd: its columns are decoded as reads select them)
    rows = pa.table({"k": list(range(5000)), "v": [i * 3 for i in range(5000)], "w": [1.5] * 5000})
    store.put_extent("t", "s000000-r0-p0000-aaaa", rows, [[0, 0, 5000]])
    return store, "s000000-r0-p0000-aaaa"


def test_the_warm_action_decodes_what_a_read_would_and_counts_as_no_read(tmp_path):
    store, eid = _one_extent(tmp_path)
    got = store.warm([{"table": "t", "extent": eid, "bucket": None, "columns": ["k", "v"]}], "w" * 24)
    assert got["extents"] == 1 and got["bytes"] > 0
    [ext] = [v[2] for v in store._open.values()]
    assert ext.decoded_shares() == {"k": 1.0, "v": 1.0}  # the columns asked for, not "w"
    assert store.bytes_read == 0 and store.read_by_replica == {}
    assert store.stats()["tasks_running"] == 0
    # a read of the same selection finds it decoded: the same extent, nothing decoded anew
    resident = store.resident_bytes
    assert store.read("t", eid, None, ["k", "v"]).num_rows == 5000
    assert store.resident_bytes == resident
    # a warm-up whose cancel came first ends as it starts
    store.cancel(["x" * 24])
    with pytest.raises(Exception, match="cancelled"):
        store.warm([{"table": "t", "extent": eid, "columns": ["w"]}], "x" * 24)
    for bad in (
        "no",
        [{"table": "t"}],
        [{"table": "t", "extent": eid, "bucket": [0]}],
        [{"table": "t", "extent": eid, "columns": "k"}],
    ):
        with pytest.raises(InvalidArgument):
            store.warm(bad)
    with pytest.raises(InvalidArgument, match="no column"):
        store.warm([{"table": "t", "extent": eid, "columns": ["nope"]}])


def test_two_reads_of_one_cold_extent_at_once_open_and_decode_it_once(tmp_path, monkeypatch):
    """A query's read and a warm-up (or two queries) meeting on an extent not open yet: before,
    each opened its own copy and decoded it, the second replacing the first in the cache."""
    store, eid = _one_extent(tmp_path)
    both = threading.Barrier(2, timeout=WAIT_S)
    real = nodestore_mod.open_extent

    def opening(p: Path) -> Any:
        both.wait()  # (both reads are past the cache's first look before either opens)
        return real(p)

    monkeypatch.setattr(nodestore_mod, "open_extent", opening)
    p = store.path("t", eid)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(store._opened(p))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    assert len(got) == 2 and got[0] is got[1]
    assert len(store._open) == 1


def test_a_json_model_query_warms_its_hedges_reads_the_same_way(tmp_path):
    from microco.services.store._query import Agg, Query

    tr = Recording(str(tmp_path), NODES)
    core = _core(tr, HedgePolicy(probe_misses=4, hedge_after_s=0))
    q = Query("t", group_by=("k",), aggs=(Agg("sum", "v", "s"), Agg("count", "*", "n")))
    healthy, plan = core.query(q)
    [node] = {n for stage in plan.stages for n, _ in stage}
    core.rates = Rates()
    tr.stall = node
    with tr.lock:
        tr.events.clear()
    got, plan = _run(lambda: core.query(q), tr)
    assert sorted(got.to_pylist(), key=str) == sorted(healthy.to_pylist(), key=str)
    [hedge] = plan.hedges
    [warm] = plan.warms
    assert warm["nodes"] == [node] and warm["outcome"] == "the hedge followed", warm
    [target] = warm["on"]
    on_target = [what for what, n in tr.events if n == target and what in ("warm", "task")]
    assert on_target[:2] == ["warm", "task"], tr.events
