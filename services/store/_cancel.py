"""Cancelling a query task on a store node (the node's side: ``NodeStore.cancel``).

The coordinator names each task it sends with a task id (``tid``); when the attempt the task is
part of loses (another plan's answer was taken, the query failed or its caller went away) it
sends the node a ``cancel`` action with the ids (``StoreCore._cancel_losers``). The node stops
the task where it stands: a DuckDB query is interrupted (``connection.interrupt()``), reading
extents, fetching from peers, shuffle puts and takes and the batches of a result stream (Flight
``DoGet``, Acero sources) check the task's token between pieces and raise ``TaskCancelled``; the
task's inputs are then dropped with its frames and its memory handed back
(``_exec.release_unused``).

A cancel may arrive before its task starts (the node was paused with both queued, or the call
is still on its way): the id is remembered (``EARLY_KEPT`` of them) and the task, when it
arrives, ends at once. A cancel of a task that finished or was never seen does nothing else.
The node's own record (``TaskRegistry.log``, ``stats``) says what became of each.

The coordinator also asks a node, while a fragment runs long, about its tasks (``probe``: which
are running, for how long, what they have read): a node that answers is there, one that does not
answer within the probe's short deadline may have stopped (``_liveness.Probes``)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from microco.common.errors import MicrocoError

# cancels of tasks not (yet) running that are remembered, oldest forgotten first (a task id is
# 24 hex characters: well under a megabyte)
EARLY_KEPT = 4096
# the record of what became of cancelled tasks, newest kept
LOG_KEPT = 1024
MAX_CANCEL_IDS = 4096  # ids in one cancel action
# a cancelled task's DuckDB connections are interrupted again this often while attached, for at
# most this long (``CancelToken.cancel``)
INTERRUPT_EVERY_S = 0.05
INTERRUPT_FOR_S = 10.0


class TaskCancelled(MicrocoError):
    """The task was cancelled by the coordinator (its attempt lost)."""


class CancelToken:
    """A running task's: ``cancel`` sets it and interrupts the DuckDB connections attached."""

    def __init__(self, tid: str) -> None:
        self.tid = tid
        self.event = threading.Event()
        self.started = time.monotonic()
        self.bytes_read = 0  # what the task has read so far (``probe``)
        self._lock = threading.Lock()
        self._conns: set[Any] = set()

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def check(self) -> None:
        if self.event.is_set():
            raise TaskCancelled(f"task {self.tid} was cancelled")

    def attach(self, con: Any) -> None:
        """A DuckDB connection the task runs on: interrupted by ``cancel`` (at once if it was)."""
        with self._lock:
            self._conns.add(con)
        if self.event.is_set():
            con.interrupt()

    def detach(self, con: Any) -> None:
        with self._lock:
            self._conns.discard(con)

    def cancel(self) -> None:
        """Set the token and interrupt the task's DuckDB connections, again every
        ``INTERRUPT_EVERY_S`` while any is attached (at most ``INTERRUPT_FOR_S``): DuckDB clears a
        connection's interrupt when a query starts, so one sent between the task's last check
        and the start of its query would be lost (found by the Flight test: the query ran on)."""
        self.event.set()
        if self._interrupt():
            threading.Thread(target=self._keep_interrupting, name="store-interrupt", daemon=True).start()

    def _interrupt(self) -> bool:
        with self._lock:
            conns = list(self._conns)
        for con in conns:
            try:
                con.interrupt()
            except Exception:  # noqa: BLE001, S110 - a connection closing as its query ends
                pass
        return bool(conns)

    def _keep_interrupting(self) -> None:
        end = time.monotonic() + INTERRUPT_FOR_S
        while time.monotonic() < end:
            time.sleep(INTERRUPT_EVERY_S)
            if not self._interrupt():
                return


class TaskRegistry:
    """A node's running tasks by id, and what became of the cancelled ones (``log``)."""

    def __init__(self) -> None:
        # reentrant: a result stream dropped unread ends its task (``end``) from its generator's
        # ``finally``, which the garbage collector may run on a thread inside this very lock
        # (its ``cancel`` or ``start``); a plain lock would wait there forever (the same hazard
        # as the memory release's, ``_exec.release_unused``: issue 19, session 31)
        self._lock = threading.RLock()
        self.running: dict[str, CancelToken] = {}
        self._early: OrderedDict[str, None] = OrderedDict()
        self.log: OrderedDict[str, str] = OrderedDict()  # tid -> what the cancel found / the end
        self.counts = {
            "cancelled_running": 0,
            "cancelled_before_start": 0,
            "cancel_not_running": 0,
            "probes": 0,  # probes answered (``probe``)
        }

    def _note(self, tid: str, what: str) -> None:
        self.log[tid] = what
        self.log.move_to_end(tid)
        while len(self.log) > LOG_KEPT:
            self.log.popitem(last=False)

    def start(self, tid: str) -> CancelToken:
        """Register task ``tid`` as running (cancelled at once if its cancel came first)."""
        token = CancelToken(tid)
        with self._lock:
            early = self._early.pop(tid, "absent") != "absent"
            self.running[tid] = token
            if early:
                self.counts["cancelled_before_start"] += 1
                self._note(tid, "cancelled before it started")
        if early:
            token.cancel()
        return token

    def end(self, token: CancelToken, error: BaseException | None = None) -> None:
        with self._lock:
            if self.running.get(token.tid) is token:
                del self.running[token.tid]
            if token.cancelled and isinstance(error, TaskCancelled):
                if self.log.get(token.tid) == "cancelled while running":
                    self._note(token.tid, "cancelled while running: stopped")

    def cancel(self, tids: list[str]) -> dict[str, list[str]]:
        """Cancel the tasks ``tids``: those running stop; the others are remembered in case they
        are still to come. Returns which were running and which were not."""
        hit, missed = [], []
        with self._lock:
            for tid in tids:
                token = self.running.get(tid)
                if token is not None and not token.cancelled:
                    hit.append(token)
                    self.counts["cancelled_running"] += 1
                    self._note(tid, "cancelled while running")
                elif token is None:
                    missed.append(tid)
                    self.counts["cancel_not_running"] += 1
                    self._early[tid] = None
                    while len(self._early) > EARLY_KEPT:
                        self._early.popitem(last=False)
                    if tid not in self.log:
                        self._note(tid, "not running (finished, or not started)")
        for token in hit:
            token.cancel()
        return {"cancelled": [t.tid for t in hit], "not_running": missed}

    def probe(self, tids: list[str]) -> dict[str, Any]:
        """What the coordinator asks while tasks run long: which of ``tids`` are running here,
        each with its seconds and bytes read so far, and which are not (finished, cancelled, or
        not arrived yet). An answer at all says the node is there."""
        now = time.monotonic()
        running: dict[str, dict[str, Any]] = {}
        with self._lock:
            self.counts["probes"] += 1
            for tid in tids:
                token = self.running.get(tid)
                if token is not None:
                    running[tid] = {
                        "s": round(now - token.started, 3),
                        "bytes_read": token.bytes_read,
                        "cancelled": token.cancelled,
                    }
        return {"running": running, "not_running": [t for t in tids if t not in running]}

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self.counts, "tasks_running": len(self.running)}
