"""The store benchmark's query at a node loss (benchmarks/store_node_loss.py): the query in
flight is timed and its answer checked against the healthy one. The store itself at a node loss is tested in tests/integration/store (kill -9 during
queries); here the measurement's own logic, on a client that answers from memory."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from microco.benchmarks.store_node_loss import query_at_node_loss


class _Store:
    """Client and cluster at once: the healthy queries answer at once; the one after them waits
    for the kill (it is in flight when the node dies) and then answers, wrongly when ``wrong``."""

    def __init__(self, wrong: bool = False, trials: int = 3) -> None:
        self.killed: list[str] = []
        self.dead = threading.Event()
        self.wrong, self.trials, self.calls = wrong, trials, 0
        self.last_plan = {"explain": "partial_agg"}

    def query(self, frame):
        self.calls += 1
        if self.calls > self.trials:
            assert self.dead.wait(30)
        time.sleep(0.01)
        return pa.table({"k": [1] if self.killed and self.wrong else [2, 1]})

    def kill(self, name):
        self.killed.append(name)
        self.dead.set()


def test_the_query_in_flight_is_timed_and_its_answer_checked():
    store = _Store()
    out = query_at_node_loss(store, store, "q", None, "store-2", trials=3, log=lambda _: None)
    assert store.killed == ["store-2"] and out["node"] == "store-2"
    assert out["finished"] and out["correct"] and out["error"] is None and len(out["healthy_s"]) == 3
    assert len(out["after_loss_s"]) == 2 and out["after_loss_correct"]
    wrong = _Store(wrong=True)
    assert not query_at_node_loss(wrong, wrong, "q", None, "store-1", trials=3, log=lambda _: None)["correct"]
