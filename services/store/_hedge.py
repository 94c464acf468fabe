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

This module is the policy only: given how long each fragment of a stage has run (those still
running) or took (those finished), which nodes straggle; and when a node whose fragment runs long
is asked whether it is there, and how many unanswered asks mean it has stopped (``probe``,
``silent``; the asking is ``_liveness.Probes``). Constants, with why:"""

from __future__ import annotations

import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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
# A stage whose like fragments all run on one node has no sibling to compare with. Its expected
# time is then the plan's own estimate: its bytes read at the seconds per byte that fragments of
# the same shape took on this coordinator lately (``Rates``: the median of the last ``RATES_KEPT``;
# seconds alone for fragments that read no planned bytes), the same measure the siblings give,
# taken from earlier queries instead of this one. Those ran under another moment's load, so the
# bar is wider than a sibling's: ``PRIOR_MULTIPLE`` = 3 (twice Spark's multiplier; on this 2-core
# machine one repeated query's fragment varies by up to ~2x with the load of its neighbours), and
# never under ``FLOOR_S``. With no history of its shape (the first such query) nothing is hedged.
PRIOR_MULTIPLE = 3.0
RATES_KEPT = 8
# A node that has *stopped answering* (paused, hung, cut off) is told apart from one that is
# merely slow by asking it (``_liveness.Probes``: the mechanism): while a stage's fragment on a
# node has run ``PROBE_AFTER_S``, the coordinator asks the node about the fragment's task (the
# ``probe`` action: is it running, what has it read) every ``PROBE_EVERY_S``, each ask given
# ``PROBE_TIMEOUT_S`` to answer. A node that misses ``PROBE_MISSES`` probes in a row, each time
# while another node (the round's witness) answered its own probe in time, is hedged at once,
# without waiting for a bar above. Why these:
# - after 0.2 s: a fragment that ends sooner is never asked (most of a small query's); a paused
#   node is first asked 0.2 s into its fragment, well inside a sub-second query.
# - every 0.15 s, 0.25 s each: a node that answers is answering within milliseconds here (a
#   cheap action: a lookup under a lock, no disk); a quarter second is far above that on a
#   loaded host (the gRPC server's threads are not the fragments'), and two of them in a row
#   span 0.4 s of silence, under the 0.5 s ``FLOOR_S`` a slow fragment is given.
# - 2 in a row (K): one missed probe is what a single stall of the node's process (a GC pause,
#   a burst of scheduling on a loaded host) or a lost packet gives; two need 0.4 s of silence.
#   More would add 0.15 s each to the detection of a node that is gone, the budget of a query
#   that should end within about twice its healthy time.
# - the witness: a probe that goes unanswered while a probe to another node in the same round
#   answered in time says the node is silent, not that the coordinator (or its host, or its
#   network) is too busy to hear anyone; a round where the witness is late too counts for
#   nothing, so an overloaded coordinator does not hedge its healthy queries.
# A node that answers its probes (alive, perhaps slow) is left to the bars above.
PROBE_AFTER_S = 0.2
PROBE_EVERY_S = 0.05
PROBE_TIMEOUT_S = 0.25
PROBE_MISSES = 2
# (``PROBE_EVERY_S`` was 0.15 s until session 36: a round's phase, up to the whole interval, is
# part of the detection of a node that stops between two rounds; at 0.05 s it is at most a tenth
# of a sub-second query's budget, for one cheap call to the node and one to the witness each
# 0.05 s while a fragment runs past ``PROBE_AFTER_S``.)
# A node is *prompt* when it answers a probe within ``PROMPT_S``: a node that is there answers in
# milliseconds (a lookup under a lock), so an unanswered probe tells something only when the
# round's witness answered within this (else the coordinator, its host or its network may be what
# is slow, and the rules below wait for the rounds' deadlines: the misses above).
PROMPT_S = 0.05
# A node whose probe has gone unanswered ``HEDGE_AFTER_S`` while the round's witness was prompt is
# hedged at once, without waiting for the round's deadline and a second round's (session 36: two
# decided misses took 0.4 s of silence plus the rounds' phase, ~0.5 s after a pause, which is
# most of a half-second query's budget of ~2x). The first answer wins, as Dean & Barroso's hedged
# requests ("The Tail at Scale", 2013): the loser is cancelled. Why 0.2 s: four times the witness's
# bound, ~100x a node's answer; a node that stalls that long while another answers within 50 ms
# has stopped or is stalled as long as the fragment's own budget can bear; and the hedge started
# then still finds its reads decoded by the warm-up begun at ``WARM_AFTER_S`` (a cold share's
# decoding took 0.25-0.5 s here: the hedge's read waits on it rather than repeating it). Its
# cost, a false hedge, is a second run of the share on another replica's node while the first
# answers (cancelled when it does), counted (the benchmark's ``healthy_hedged``, measured beside
# CPU burners). 0: only the misses hedge.
HEDGE_AFTER_S = 0.2
# A node whose probe has gone unanswered for ``WARM_AFTER_S`` while the round's witness answered
# within that time (or that has missed a probe), not yet silent, has its hedge's reads *warmed*:
# the query is planned as the hedge would be (without the node) and the nodes that plan reads
# from are asked to decode those extents' columns into their caches (the ``warm`` action),
# nothing run, no answer made (``StoreCore._warm``). If the node goes on to miss its probes, the
# hedge starts and finds its extents decoded, or being decoded (a hedge's rerun on a replica no
# query has read spent about a third of its time decoding: docs/store.md, session 35); if the
# node answers a probe in time, the warm-up is cancelled. Why 0.05 s: a node that is there
# answers a probe within milliseconds (the witness's answer, within ``PROMPT_S``, says the
# coordinator hears), so a twentieth of a second is still ~50x that, and it comes 0.15 s before
# the hedge (``HEDGE_AFTER_S``), which then waits on the decoding under way rather than
# starting it (a cold share's decoding: 0.25-0.5 s here). What a false one costs is stated and bounded: the
# decoding of the share's columns on the nodes of another replica (into their caches, least
# recently used evicted first; no query's answer, no network result), at most once per node per
# query, counted (EXPLAIN's ``warm:`` lines; the benchmark's ``healthy_warmed``). 0: none.
WARM_AFTER_S = 0.05
# (0.1 s until session 36, checked only when a round was sent or decided: 0.15 s after the
# unanswered probe. Now 0.05 s, the witness prompt, and the stage's wait wakes at that moment:
# the warm-up starts ~0.1 s sooner, which the hedge at ``HEDGE_AFTER_S`` needs to find its reads
# decoded.)
RATE_SHAPES = 1024  # shapes remembered (least recently seen forgotten first)


# Fragments compare only with their like: the same operation and SQL over the same tables
# (``shape``); a gather's fragment of a small table finishes in milliseconds beside the big
# table's, which is no straggler. Among alike fragments each is expected to take the finished
# ones' seconds per byte read (``weight``: the bytes of its sources), so a node holding three
# partitions is not a straggler beside one holding two; fragments that read no planned bytes
# (a shuffle's reducers) compare by their seconds alone.


@dataclass(frozen=True)
class Fragment:
    """One task of a stage as the policy sees it."""

    node: str
    shape: str  # which fragments are alike (``shape``)
    weight: float  # the bytes it reads (``weight``; 0: unknown)
    seconds: float  # how long it has run (running) or took (finished)
    done: bool


def _sources(x: Any) -> Iterator[dict[str, Any]]:
    """Every source (an extent read) of a task, wherever it sits in it (its sides, its inputs)."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "sources" and isinstance(v, list):
                yield from (src for src in v if isinstance(src, dict))
            else:
                yield from _sources(v)
    elif isinstance(x, list):
        for v in x:
            yield from _sources(v)


def shape(task: dict[str, Any]) -> str:
    """What a task is, leaving out where its data lies: its operation, SQL and the tables its
    sources read."""
    tables = {str(src.get("table")) for src in _sources(task)}
    return f"{task.get('op')}\0{task.get('sql', '')}\0{','.join(sorted(tables))}"


def weight(task: dict[str, Any]) -> float:
    """The bytes a task's sources read, wherever they sit in it (0 when it has none)."""
    return sum(float(src.get("bytes") or 0) for src in _sources(task))


class Rates:
    """Seconds per byte read of the fragments that ended on this coordinator, by shape (the
    last ``RATES_KEPT`` of each; a fragment that read no planned bytes counts its seconds): what
    a fragment with no sibling on another node is expected to take (``HedgePolicy.bars``)."""

    def __init__(self, kept: int = RATES_KEPT, shapes: int = RATE_SHAPES) -> None:
        self.kept, self.shapes = kept, shapes
        self._lock = threading.Lock()
        self._by: OrderedDict[tuple[str, bool], deque[float]] = OrderedDict()

    def add(self, kind: str, weight: float, seconds: float) -> None:
        key = (kind, weight > 0)
        with self._lock:
            got = self._by.get(key)
            if got is None:
                got = self._by[key] = deque(maxlen=self.kept)
            got.append(seconds / weight if weight > 0 else seconds)
            self._by.move_to_end(key)
            while len(self._by) > self.shapes:
                self._by.popitem(last=False)

    def expect(self, kind: str, weight: float) -> float | None:
        """What a fragment of shape ``kind`` reading ``weight`` bytes is expected to take (s), or
        None with no history of the shape."""
        with self._lock:
            got = self._by.get((kind, weight > 0))
            if not got:
                return None
            rate = statistics.median(got)
        return rate * weight if weight > 0 else rate


@dataclass(frozen=True)
class HedgePolicy:
    floor_s: float = FLOOR_S
    multiple: float = MULTIPLE
    quorum: float = QUORUM
    prior_multiple: float = PRIOR_MULTIPLE
    probe_after_s: float = PROBE_AFTER_S
    probe_every_s: float = PROBE_EVERY_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    probe_misses: int = PROBE_MISSES  # 0: nodes are not probed (only the bars above)
    warm_after_s: float = WARM_AFTER_S  # 0: a hedge's reads are not warmed ahead of it
    prompt_s: float = PROMPT_S  # the witness must have answered within this (``warm``, ``unanswered``)
    hedge_after_s: float = HEDGE_AFTER_S  # 0: only ``probe_misses`` decided misses hedge

    def probe(self, ran_s: float) -> bool:
        """Is a node whose fragment has run ``ran_s`` seconds to be probed?"""
        return self.probe_misses > 0 and ran_s >= self.probe_after_s

    def silent(self, misses: int) -> bool:
        """Has a node that missed ``misses`` probes in a row (each while the round's witness
        answered) stopped answering? Then it is hedged at once."""
        return self.probe_misses > 0 and misses >= self.probe_misses

    def warm(self, waited_s: float, witness_s: float) -> bool:
        """Are the reads of the hedge of a node whose probe has gone unanswered ``waited_s`` while
        the round's witness answered in ``witness_s`` to be warmed ahead of it? (A node that
        missed a probe has waited ``probe_timeout_s``.)"""
        return (
            self.probe_misses > 0
            and self.warm_after_s > 0
            and waited_s >= self.warm_after_s
            and witness_s <= self.prompt_s
        )

    def unanswered(self, waited_s: float, witness_s: float) -> bool:
        """Is a node whose probe has gone unanswered ``waited_s`` while the round's witness
        answered in ``witness_s`` to be hedged at once, before its round is decided a miss?"""
        return (
            self.probe_misses > 0
            and self.hedge_after_s > 0
            and waited_s >= self.hedge_after_s
            and witness_s <= self.prompt_s
        )

    def due(self, waited_s: float) -> float | None:
        """Seconds until a probe unanswered ``waited_s`` (the witness prompt) passes the next of
        ``warm_after_s`` and ``hedge_after_s``, when one is still ahead: when the stage's wait
        is to look again."""
        ahead = [
            t - waited_s
            for t in (self.warm_after_s, self.hedge_after_s)
            if self.probe_misses > 0 and t > 0 and t > waited_s
        ]
        return min(ahead) if ahead else None

    def bars(
        self, fragments: Sequence[Fragment], prior: Callable[[str, float], float | None] | None = None
    ) -> dict[int, tuple[float, float]]:
        """For each running fragment (by its index) whose like fragments (same ``shape``, on other
        nodes) have finished in quorum: the seconds it may run before its node is hedged,
        ``multiple`` times what the finished ones' median seconds per byte give for its bytes,
        and no less than ``floor_s``; each as (bar, what the finished ones give: expected). A
        running fragment with no like fragment on another node is given, when ``prior`` (shape,
        bytes -> expected seconds: ``Rates.expect``) knows its shape, ``prior_multiple`` times
        that, no less than ``floor_s``."""
        out: dict[int, tuple[float, float]] = {}
        groups: dict[str, list[int]] = {}
        for i, f in enumerate(fragments):
            groups.setdefault(f.shape, []).append(i)
        for idx in groups.values():
            for i in idx:
                f = fragments[i]
                if f.done:
                    continue
                others = [fragments[j] for j in idx if fragments[j].node != f.node]
                if not others and prior is not None:
                    guess = prior(f.shape, f.weight)
                    if guess is not None:
                        out[i] = (max(self.floor_s, self.prior_multiple * guess), guess)
                    continue
                finished = [o for o in others if o.done]
                if not finished or len(finished) < self.quorum * (len(others) + 1):
                    continue
                if f.weight > 0 and all(o.weight > 0 for o in finished):
                    expect = statistics.median(o.seconds / o.weight for o in finished) * f.weight
                else:
                    expect = statistics.median(o.seconds for o in finished)
                out[i] = (max(self.floor_s, self.multiple * expect), expect)
        return out

    def stragglers(
        self, fragments: Sequence[Fragment], prior: Callable[[str, float], float | None] | None = None
    ) -> set[str]:
        """The nodes with a running fragment past its bar (``bars``)."""
        return {
            fragments[i].node
            for i, (bar, _) in self.bars(fragments, prior).items()
            if fragments[i].seconds >= bar
        }
