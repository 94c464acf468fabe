"""Liveness probes of the nodes a query's fragments run long on (``_liveness.Probes``, the
policy's ``_hedge.HedgePolicy.probe`` / ``silent``, ``StoreCore._probe_stage``): a node that stops
answering (paused, hung) is told apart from one that is merely slow by asking it, and is hedged
at once, without waiting for a bar. Before: a stage on one node with no history of its shape was
never hedged (it waited for the node, or its lease), and with history only past 3x its expected
time. In process: the silent node stays registered (its lease never runs out)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
from test_store_cancel import SPECS_ONE
from test_store_hedge import NODES, SQL, N, Stalling, _data, _rows, _run, _want

from microco.common.kv import MemoryKV
from microco.services.store import NodeInfo, StoreCore
from microco.services.store._hedge import HedgePolicy, Rates
from microco.services.store._liveness import Probes


class Silent(Stalling):
    """Node ``stall`` takes its tasks and answers nothing, its probes included, until ``release``
    (a paused process; the probe's deadline is the in-process transport's to ignore: the probes
    judge by the time of the answer, not by the call's end)."""

    def action(self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        if name == "probe" and node.name == self.stall:
            self.release.wait(60)
        return super().action(node, name, body, timeout)


def _one_node_store(tr: Stalling) -> StoreCore:
    core = StoreCore(MemoryKV(), tr, super_extent_rows=10_000, recovery_rate_bytes=0)
    core.create_table("t", _data().schema, SPECS_ONE)
    core.append("t", _data())
    return core


def _stalled_once(tmp_path, policy: HedgePolicy):
    """The one-node store under ``policy`` answers the query healthy, then with its node's
    probes stalled (no history of the query's shape: no bar could hedge it; on the code before,
    it waited for the stalled node: here until released, 60 s): the core, the stalled node, the
    second plan and its one hedge, the answer checked (equal to the healthy one, every row once)."""
    data = _data()
    tr = Silent(str(tmp_path), NODES)
    core = _one_node_store(tr)
    core.hedge = policy
    healthy, plan = core.sql(SQL)
    [node] = {n for n, _ in plan.tasks}
    core.rates = Rates()
    tr.stall = node
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert sum(got.column("n").to_pylist()) == N  # every row once
    [hedge] = plan.hedges
    return core, node, plan, hedge


def test_a_one_node_stage_whose_node_stops_answering_probes_is_hedged_without_a_bar(tmp_path):
    # (the misses alone: the rule below is its own test)
    core, node, plan, hedge = _stalled_once(tmp_path, HedgePolicy(hedge_after_s=0))
    assert hedge["nodes"] == [node] and "answer was used" in hedge["outcome"], hedge
    assert hedge["expected_from"] == "probe" and hedge["probes_missed"] == 2, hedge
    assert hedge["witness"] not in (None, node)
    text = plan.explain_text()
    assert f"hedge: {node} missed 2 liveness probes in a row" in text, text
    assert node not in {n for n, _ in plan.tasks}  # the hedge's plan answered
    assert core.suspected() == {node}


def test_a_node_whose_probe_goes_unanswered_while_the_witness_answers_is_hedged_before_a_miss(tmp_path):
    """Session 36: the hedge starts once a probe has gone unanswered ``hedge_after_s`` while
    the round's witness answered within ``prompt_s``, before its round is decided a miss (and a
    second one). Here the misses could hedge only at the thousandth, and the witness's bound is
    wide (a busy machine's witness is not what is tested): only the new rule can hedge. Before:
    no such rule (nor the policy's fields); the query waited for the node."""
    policy = HedgePolicy(probe_misses=1000, prompt_s=5.0, hedge_after_s=0.2)
    core, node, plan, hedge = _stalled_once(tmp_path, policy)
    assert hedge["nodes"] == [node] and "answer was used" in hedge["outcome"], hedge
    assert hedge["expected_from"] == "probe" and hedge["probe_rule"] == "unanswered", hedge
    assert hedge["probes_missed"] < 1000 and hedge["silent_s"] >= 0.2, hedge
    assert hedge["witness"] not in (None, node)
    text = plan.explain_text()
    assert f"hedge: {node} had not answered a liveness probe for " in text, text
    assert f"while {hedge['witness']} answered in " in text, text
    assert node not in {n for n, _ in plan.tasks}  # the hedge's plan answered
    assert core.suspected() == {node}


def test_the_policy_hedges_a_probe_unanswered_a_fifth_of_a_second_while_the_witness_was_prompt():
    p = HedgePolicy()
    assert p.unanswered(0.2, 0.0) and p.unanswered(0.5, 0.05)
    assert not p.unanswered(0.19, 0.0)  # (not yet: a warm-up at most)
    assert not p.unanswered(1.0, 0.06)  # (the witness was slow: left to the rounds' misses)
    assert not HedgePolicy(hedge_after_s=0).unanswered(1.0, 0.0)
    assert not HedgePolicy(probe_misses=0).unanswered(1.0, 0.0)
    # when the stage's wait is to look again: the warm-up's threshold, then the hedge's
    assert p.due(0.0) == 0.05 and abs(p.due(0.1) - 0.1) < 1e-9 and p.due(0.2) is None
    assert HedgePolicy(probe_misses=0).due(0.0) is None


class Slow(Stalling):
    """Node ``stall`` is slow but there: its task runs, its extent reads waiting until it has
    answered ``answers`` probes (at most 20 s), and it answers every probe at once."""

    answers = 3

    def stalled(self, node: NodeInfo) -> None:  # (the task starts; its reads wait instead)
        store = self.stores[node.name]
        if "read" not in vars(store):
            original = store.read

            def read(*args: Any, **kwargs: Any) -> pa.Table:
                end = time.monotonic() + 20
                while store.tasks.stats().get("probes", 0) < self.answers and time.monotonic() < end:
                    time.sleep(0.02)
                return original(*args, **kwargs)

            store.read = read  # type: ignore[method-assign]


def test_a_slow_node_that_answers_its_probes_is_not_hedged_by_them(tmp_path):
    data = _data()
    tr = Slow(str(tmp_path), NODES)
    core = _one_node_store(tr)
    healthy, plan = core.sql(SQL)
    [node] = {n for n, _ in plan.tasks}
    core.rates = Rates()  # (no bar either: only a probe could hedge it)
    tr.stall = node
    got, plan = _run(lambda: core.sql(SQL), tr)
    assert _rows(got) == _rows(healthy) == _want(data)
    assert not plan.hedges, plan.hedges  # it answered its probes: left to the bars
    assert node in {n for n, _ in plan.tasks}
    # it was asked, about its running task, while the fragment ran long
    assert tr.stores[node].tasks.stats()["probes"] >= Slow.answers
    assert core.suspected() == set()


def test_the_probes_count_misses_in_a_row_only_while_the_witness_answers():
    """The mechanism alone: each round asks the probed nodes and a witness (synchronously here,
    each ask's deadline far away: what is answered is told by the ask, not by timing)."""
    heard = {"a": False, "w": True}
    asked: list[tuple[str, list[str]]] = []

    def ask(node: str, tids: list[str], timeout: float) -> bool:
        asked.append((node, tids))
        return heard[node]

    p = Probes(ask, lambda fn: fn(), every_s=0.0, timeout_s=60.0)
    probe = {"a": ("a", ["t1"])}
    witnesses = [("w", "w"), ("a", "a")]  # (a probed node never witnesses)
    tick = lambda: p.tick(time.monotonic(), probe, witnesses)  # noqa: E731
    misses = lambda: p.misses(time.monotonic()).get("a", (0,))[0]  # noqa: E731
    tick()  # (each tick decides the rounds sent before it, then sends one)
    assert asked == [("w", []), ("a", ["t1"])]
    assert misses() == 0  # (sent, not decided yet)
    tick()
    assert misses() == 1
    heard["w"] = False  # the witness silent too: its rounds tell nothing
    tick()
    assert misses() == 2  # (the round sent while it answered)
    tick()
    tick()
    assert misses() == 2
    heard["w"] = True
    tick()
    tick()
    assert misses() == 3
    assert p.misses(time.monotonic())["a"][2] == "w"
    heard["a"] = True  # it answers: the count starts again
    tick()
    tick()
    assert misses() == 0 and p.answered["a"] >= 1
    # a node no longer probed (its fragment ended) is forgotten
    heard["a"] = False
    p.tick(time.monotonic(), probe, witnesses)
    p.tick(time.monotonic(), {}, witnesses)
    assert p.misses(time.monotonic()) == {}


def test_a_probe_that_never_returns_counts_as_unanswered_and_holds_few_threads():
    """An ask that outlives its deadline (a node that stopped answering, a transport that does
    not keep the deadline) is a miss when its round is due; at most ``outstanding`` of a node's
    asks wait at once."""
    gate = threading.Event()
    started: list[str] = []

    def ask(node: str, tids: list[str], timeout: float) -> bool:
        started.append(node)
        if node == "a":
            gate.wait(30)
        return True

    def run(fn: Any) -> None:
        threading.Thread(target=fn, daemon=True).start()

    p = Probes(ask, run, every_s=0.0, timeout_s=0.05, outstanding=2)
    try:
        for _ in range(6):  # (no witness: a miss is an unanswered ask, whatever the load)
            p.tick(time.monotonic(), {"a": ("a", ["t"])}, [])
            time.sleep(0.06)  # (past each round's deadline: this is the mechanism's clock)
        p.tick(time.monotonic(), {"a": ("a", ["t"])}, [])
        assert started.count("a") == 2  # the rest were not sent: counted unanswered
        assert p.misses(time.monotonic())["a"][0] >= 5
    finally:
        gate.set()


def test_nothing_is_due_once_no_node_is_left_to_probe():
    """A stage whose probed node was hedged still waits on it: the wait must not be woken for
    probes that will not be sent (it spun every 10 ms on the first version)."""
    p = Probes(lambda node, tids, timeout: True, lambda fn: fn(), every_s=0.15, timeout_s=60.0)
    p.tick(time.monotonic(), {"a": ("a", ["t"])}, [])
    assert p.next_due() is not None
    p.tick(time.monotonic(), {}, [])  # (decides the round: every ask ended)
    assert p.next_due() is None


def test_a_node_that_answered_a_later_round_is_not_waiting():
    """Rounds every 0.05 s: a node whose older ask is slow but which answered a newer one is
    alive, not a node that stopped (it must not be warmed for, nor hedged)."""
    first = threading.Event()
    calls: list[str] = []

    def ask(node: str, tids: list[str], timeout: float) -> bool:
        calls.append(node)
        if node == "a" and calls.count("a") == 1:
            first.wait(30)  # (its first ask is slow)
        return True

    threads: list[threading.Thread] = []

    def run(fn: Any) -> None:
        t = threading.Thread(target=fn, daemon=True)
        threads.append(t)
        t.start()

    p = Probes(ask, run, every_s=0.0, timeout_s=60.0)
    t0 = time.monotonic()
    p.tick(t0, {"a": ("a", ["t"])}, [("w", "w")])
    deadline = time.monotonic() + 20
    while set(p.waiting(time.monotonic())) != {"a"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(p.waiting(time.monotonic())) == {"a"}  # (w answered, a not yet)
    p.tick(t0 + 0.001, {"a": ("a", ["t"])}, [("w", "w")])  # a second round, which a answers
    while not all(a.ended for a in p._rounds[-1].asks.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert p.waiting(time.monotonic()) == {}
    finally:
        first.set()
        for t in threads:
            t.join(30)
