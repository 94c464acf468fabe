"""The store benchmark's query at a node loss (benchmarks/store_node_loss.py): the victim is a
node the plan names, the query in flight is timed and its answer checked against the healthy
one. The store itself at a node loss is tested in tests/integration/store (kill -9 during
queries); here the measurement's own logic, on a client that answers from memory."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from microco.benchmarks.store_node_loss import _victim, query_at_node_loss


def test_the_victim_is_a_node_the_plan_names():
    explain = "agg_local on replica 0 (l_orderkey): store-3 4 extents, store-10 2 extents"
    assert _victim(explain, ["store-1", "store-10", "store-3"], "store-1") == ("store-10", True)
    assert _victim("gather", ["store-1"], "store-1") == ("store-1", False)


class _Store:
    """Client and cluster at once: the healthy queries answer at once; the one after them waits
    for the kill (it is in flight when the node dies) and then answers, wrongly when ``wrong``."""

    def __init__(self, wrong: bool = False, trials: int = 3) -> None:
        self.killed: list[str] = []
        self.dead = threading.Event()
        self.wrong, self.trials, self.calls = wrong, trials, 0
        self.last_plan = {"explain": "partial_agg: store-2 3 extents"}

    def query(self, frame):
        self.calls += 1
        if self.calls > self.trials:
            assert self.dead.wait(30)
        time.sleep(0.01)
        return pa.table({"k": [1] if self.killed and self.wrong else [2, 1]})

    def nodes(self):
        return [{"name": "store-1"}, {"name": "store-2"}]

    def kill(self, name):
        self.killed.append(name)
        self.dead.set()


def test_the_query_in_flight_is_timed_and_its_answer_checked():
    store = _Store()
    out = query_at_node_loss(store, store, "q", None, "store-1", trials=3, log=lambda _: None)
    assert store.killed == ["store-2"] and out["node"] == "store-2" and out["node_named_by_plan"]
    assert out["finished"] and out["correct"] and out["error"] is None and len(out["healthy_s"]) == 3
    assert len(out["after_loss_s"]) == 2 and out["after_loss_correct"]
    wrong = _Store(wrong=True)
    assert not query_at_node_loss(wrong, wrong, "q", None, "store-1", trials=3, log=lambda _: None)["correct"]
