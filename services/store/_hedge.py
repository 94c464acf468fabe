"""When a query's share on one node is hedged: speculative re-execution of stragglers.

A node that stops answering without a TCP reset (a paused or hung process, a long GC pause, a
host cut off behind a switch) is noticed only when its registration lease runs out (``_liveness``:
``--lease-ttl-s``, 5 s by default), which for a sub-second query is many times its healthy time.
As MapReduce's backup tasks, Spark's speculation and Dean & Barroso's hedged requests ("The Tail
at Scale", 2013) do, the coordinator does not wait for the lease: once a node's fragments of a
stage are still running well after the other nodes' fragments of the stage finished, the query is
planned again as if that node were lost (its share read from the other replicas; the other
nodes' fragments, identical in the new plan, kept) and the first of the two plans to answer is
used (``StoreCore._with_retries``: the mechanism).

This module is the policy only: given how long each node's fragments of a stage have run (those
still running) and took (those finished), which nodes straggle. Constants, with why:"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

# Never hedge a node's fragments before they have run this long. Below it a second plan costs
# about what it could save (a re-plan, and the node's share run again on nodes that are busy with
# their own), and on a loaded machine a fragment's run varies by a few hundred milliseconds
# without anything being wrong (scheduling on 2 cores, a GC pause): hedging those would double
# the work of healthy queries. Half a second is well under the 5 s lease a paused node holds a
# query to otherwise.
FLOOR_S = 0.5
# ... nor before they have run this many times the median of the finished nodes' times: the
# default multiplier of Spark's speculation (``spark.speculation.multiplier``). A node's share of
# a hash-partitioned table differs from its siblings' by its partitions' sizes (a few percent);
# 1.5x is beyond that, and a node that stopped answering passes it at once.
MULTIPLE = 1.5
# ... nor before at least this share of the stage's nodes have finished: there must be siblings
# to compare with. Spark waits for 75% of a stage's tasks (``spark.speculation.quantile``); a
# store plan on one replica runs on that replica's group, two or three nodes, so one finished
# node of two must be enough.
QUORUM = 0.5


@dataclass(frozen=True)
class HedgePolicy:
    floor_s: float = FLOOR_S
    multiple: float = MULTIPLE
    quorum: float = QUORUM

    def bar(self, finished: Mapping[str, float], running: int) -> float | None:
        """Seconds a node's fragments may run before they are hedged, given the finished nodes'
        times and the number of nodes still running; None while too few have finished."""
        total = len(finished) + running
        if not finished or not running or len(finished) < self.quorum * total:
            return None
        return max(self.floor_s, self.multiple * statistics.median(finished.values()))

    def stragglers(self, running: Mapping[str, float], finished: Mapping[str, float]) -> set[str]:
        """The nodes of ``running`` (node -> seconds its fragments of the stage have run so far)
        to hedge, given ``finished`` (node -> seconds its fragments took)."""
        bar = self.bar(finished, len(running))
        if bar is None:
            return set()
        return {n for n, s in running.items() if s >= bar}
