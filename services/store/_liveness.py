"""Nodes that leave the cluster while a query waits on them.

A store node that stops answering without closing its connections (a paused or hung process, a
host that lost power or its network: no TCP reset reaches the coordinator) holds every call to it
until the call's deadline: 120 s for a task, an hour for a stream read batch by batch. Its
registration lease runs out within ``--lease-ttl-s`` (5 s by default) and etcd drops it from the
registry. ``NodeWatch`` reads the registry while queries wait on nodes (only then) and tells
each waiter whose nodes left: the waiting stage fails at once with the node named, and the
query's retry plans without it (its extents read degraded), as after a kill. The watch also
asks the transport to abandon the node's calls: a stream's reader is cancelled; a call still
waiting for its first answer cannot be cancelled through pyarrow's Flight client (closing the
client does not end it), so its thread is left to the call's deadline while the query goes on.

Mechanism only: which nodes a stage uses is ``nodes_used``; what to do about a lost node (retry
without it, suspect it) is the core's."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# how often the registry is read while a query waits on nodes (a lost node is noticed within its
# lease's TTL plus this)
POLL_S = 0.5


def nodes_used(tasks: Iterable[tuple[str, dict[str, Any]]]) -> set[str]:
    """The nodes a stage's tasks use: those that run them and those they read from (a source's
    ``node``, a shuffle reducer's ``peers`` and ``addresses``), found wherever they sit in a task."""
    out: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "node" and isinstance(v, str):
                    out.add(v)
                elif k == "peers" and isinstance(v, dict):
                    out.update(p for side in v.values() for p in side if isinstance(p, str))
                elif k == "addresses" and isinstance(v, dict):
                    out.update(p for p in v if isinstance(p, str))
                else:
                    walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    for node, task in tasks:
        out.add(node)
        walk(task)
    return out


class Watched:
    """One waiter's registration: the nodes it uses (by name: what ``abandon`` is given for
    each), and those of them that left (``lost``)."""

    def __init__(self, watch: NodeWatch, used: dict[str, Any]) -> None:
        self.watch, self.used = watch, dict(used)
        self.lost: set[str] = set()

    def close(self) -> None:
        self.watch._unregister(self)

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeWatch:
    """Reads the live nodes (``live()``: their names) every ``poll_s`` while anything is
    registered; a registered node missing from them is added to its registrations' ``lost``,
    and what it was registered with (e.g. its address) handed to ``abandon`` once. One thread, started when the first waiter registers and ended
    when the last one leaves."""

    def __init__(
        self,
        live: Callable[[], Iterable[str]],
        abandon: Callable[[Any], None] | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.live, self.abandon, self.poll_s = live, abandon, poll_s
        self._lock = threading.Lock()
        self._watched: set[Watched] = set()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def register(self, used: dict[str, Any], start: bool = True) -> Watched:
        """Watch ``used`` (node name -> what ``abandon`` is given) until the registration is
        closed; ``start=False``: not before ``start()`` (a waiter that may not wait long)."""
        w = Watched(self, used)
        with self._lock:
            self._watched.add(w)
        if start:
            self.start()
        return w

    def start(self) -> None:
        """Start the watch's thread if it is not running."""
        with self._lock:
            if self._watched and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="store-node-watch", daemon=True)
                self._thread.start()

    def _unregister(self, w: Watched) -> None:
        with self._lock:
            self._watched.discard(w)
            if not self._watched:
                self._wake.set()

    def check(self) -> set[str]:
        """Read the registry once: the registered nodes that left (each handed to ``abandon``
        and added to the ``lost`` of the registrations that use it)."""
        with self._lock:
            watched = list(self._watched)
        if not watched:
            return set()
        try:
            live = set(self.live())
        except Exception as exc:  # noqa: BLE001 - the registry unreachable tells nothing about the nodes
            log.debug("cannot read the live store nodes: %s", exc)
            return set()
        gone: dict[str, Any] = {}
        for w in watched:
            left = set(w.used) - live - w.lost
            if left:
                w.lost |= left
                gone.update((n, w.used[n]) for n in left)
        for node in sorted(gone):
            log.warning("store node %s left the cluster while a query waited on it", node)
            if self.abandon is not None and gone[node] is not None:
                try:
                    self.abandon(gone[node])
                except Exception as exc:  # noqa: BLE001 - the waiter fails over anyway
                    log.debug("abandoning %s's calls: %s", node, exc)
        return set(gone)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.poll_s)
            self._wake.clear()
            with self._lock:
                if not self._watched:
                    self._thread = None
                    return
            self.check()


class _Ask:
    """One probe of one node: ``when`` it answered (monotonic), None while it has not (or never
    will: an error that says the node cannot be reached)."""

    __slots__ = ("ended", "when")

    def __init__(self) -> None:
        self.ended = False  # the ask returned (answered, or failed)
        self.when: float | None = None


class _Round:
    __slots__ = ("asks", "at", "witness")

    def __init__(self, at: float, asks: dict[str, _Ask], witness: tuple[str, _Ask] | None) -> None:
        self.at, self.asks, self.witness = at, asks, witness


class Probes:
    """Asks the nodes a stage's fragments still run on whether they are there (one stage's wait:
    ``StoreCore._await``), in rounds: each round asks every node given at once, with the ids of
    its tasks, and one witness (another node, with none), each ask on a thread of ``threads``
    (never the queries'), and is decided when every ask ended or ``timeout_s`` passed. A node
    *missed* a round when it did not answer within ``timeout_s`` while the round's witness did
    (with no witness to ask: when it did not answer); a round whose witness was late too counts
    neither way (the coordinator, or every node, is too busy to tell), an answer resets the
    count. ``misses``: each node's misses in a row. At most ``outstanding`` asks of a node wait
    at once (a call that outlives its deadline); a round that would ask it more counts as a
    miss of its own. Mechanism only: when to probe and how many misses mean a node has stopped
    answering are the policy's (``_hedge.HedgePolicy.probe``, ``silent``).

    ``ask(node, tids, timeout_s)``: True when the node answered (what it said is the caller's),
    False when it could not be reached; either may take longer than ``timeout_s`` (then it
    counts as unanswered)."""

    def __init__(
        self,
        ask: Callable[[Any, list[str], float], bool],
        run: Callable[[Callable[[], None]], None],
        every_s: float,
        timeout_s: float,
        outstanding: int = 4,
    ) -> None:
        self.ask, self.run = ask, run
        self.every_s, self.timeout_s, self.outstanding = every_s, timeout_s, outstanding
        self._rounds: list[_Round] = []  # undecided, oldest first
        self._last: float | None = None  # when the last round was sent
        self._sent = 0  # rounds sent (the witness rotates over them)
        self._probing = False  # the last ``tick`` had nodes to probe
        self._waiting: dict[str, int] = {}  # node -> its asks not ended yet
        self._lock = threading.Lock()
        self._streak: dict[str, tuple[int, float, str | None]] = {}  # node -> (misses, first at, witness)
        self.rounds = 0  # rounds decided
        self.answered: dict[str, int] = {}  # node -> probes it answered in time

    def _send(self, name: str, node: Any, tids: list[str]) -> _Ask:
        a = _Ask()
        with self._lock:
            if self._waiting.get(name, 0) >= self.outstanding:
                return a  # (never ends: unanswered)
            self._waiting[name] = self._waiting.get(name, 0) + 1

        def go() -> None:
            try:
                ok = bool(self.ask(node, tids, self.timeout_s))
            except Exception as exc:  # noqa: BLE001 - a failed ask is an unanswered one
                log.debug("probe of %s: %s", name, exc)
                ok = False
            if ok:
                a.when = time.monotonic()
            a.ended = True
            with self._lock:
                self._waiting[name] -= 1

        self.run(go)
        return a

    def _answered(self, r: _Round, a: _Ask) -> bool:
        return a.when is not None and a.when <= r.at + self.timeout_s

    def tick(
        self, now: float, probe: dict[str, tuple[Any, list[str]]], witnesses: list[tuple[str, Any]]
    ) -> None:
        """Decide the rounds due by ``now``, then, ``every_s`` after the last, send a round to
        the nodes of ``probe`` (name -> (what ``ask`` is given, its task ids)), its witness the
        next of ``witnesses`` (name, what ``ask`` is given; none may be one of ``probe``'s).
        A node no longer in ``probe`` is forgotten."""
        while self._rounds:
            r = self._rounds[0]
            every = list(r.asks.values()) + ([r.witness[1]] if r.witness else [])
            if now < r.at + self.timeout_s and not all(a.ended for a in every):
                break
            self._rounds.pop(0)
            self.rounds += 1
            heard = r.witness is None or self._answered(r, r.witness[1])
            for name, a in r.asks.items():
                if self._answered(r, a):
                    self._streak.pop(name, None)
                    self.answered[name] = self.answered.get(name, 0) + 1
                elif heard:
                    n, first, _ = self._streak.get(name, (0, r.at, None))
                    self._streak[name] = (n + 1, first, r.witness[0] if r.witness else None)
        for name in list(self._streak):
            if name not in probe:
                del self._streak[name]
        self._probing = bool(probe)
        if not probe or (self._last is not None and now - self._last < self.every_s):
            return
        others = [w for w in witnesses if w[0] not in probe]
        witness = None
        if others:
            name, node = others[self._sent % len(others)]
            witness = (name, self._send(name, node, []))
        asks = {name: self._send(name, node, tids) for name, (node, tids) in probe.items()}
        self._rounds.append(_Round(now, asks, witness))
        self._last = now
        self._sent += 1

    def misses(self, now: float) -> dict[str, tuple[int, float, str | None]]:
        """Each node's probes missed in a row: (how many, seconds since the first of them was
        sent, the last round's witness)."""
        return {n: (m, now - first, w) for n, (m, first, w) in self._streak.items()}

    def waiting(self, now: float) -> dict[str, tuple[float, float, str | None]]:
        """The nodes whose ask in a round not decided yet is still unanswered while that round's
        witness has answered: each with the seconds since the oldest such round was sent, the
        seconds its witness took to answer and the witness's name (no witness to ask: 0 and
        None). What a node that may have stopped shows before its round is decided a miss. A node
        that answered a later round is not waiting (alive: the older ask is only slow)."""
        out: dict[str, tuple[float, float, str | None]] = {}
        last: dict[str, int] = {}  # node -> the latest undecided round it answered
        for i, r in enumerate(self._rounds):
            for name, a in r.asks.items():
                if a.when is not None:
                    last[name] = i
        for i, r in enumerate(self._rounds):
            w = r.witness
            if w is not None and w[1].when is None:
                continue  # (the witness has not answered either: nothing to tell yet)
            took = w[1].when - r.at if w is not None and w[1].when is not None else 0.0
            for name, a in r.asks.items():
                if a.when is None and name not in out and last.get(name, -1) < i:
                    out[name] = (now - r.at, took, w[0] if w is not None else None)
        return out

    def next_due(self) -> float | None:
        """When (monotonic) ``tick`` next has something to do: a round to decide or to send."""
        due = [r.at + self.timeout_s for r in self._rounds[:1]]
        if self._last is not None and self._probing:
            due.append(self._last + self.every_s)
        return min(due) if due else None
