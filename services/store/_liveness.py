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
