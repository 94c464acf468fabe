"""Threads for the coordinator's calls to nodes, kept for the next call once one ends.

A query's call to a node runs on a thread of its own, never queued behind other calls: a call
abandoned (its node stopped answering) holds its thread until the call's deadline, and a pool of
a fixed size would make the next queries wait for those. Starting a thread per call had a cost
every query paid: ``Thread.start`` waits until the new thread runs, which in a busy coordinator
(the GIL held by the threads of other queries, gRPC's, etcd's) took ~1 ms, often more, per call
(py-spy of a coordinator serving a one-fragment query, issue 19, session 32). ``CallThreads``
hands a call to a thread that is idle waiting for one, and starts a thread only when none is:
never a queue, never a bound, and an idle thread ends after ``idle_s``."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_S = 30.0  # an idle thread waits this long for a call before it ends


class CallThreads:
    """Run each call given (``run``) at once on a thread: one idle from an earlier call, or a new
    one. The threads are daemons, named ``name``."""

    def __init__(self, name: str = "store-call", idle_s: float = IDLE_S) -> None:
        self.name, self.idle_s = name, idle_s
        self._lock = threading.Lock()
        # invariant (under the lock): calls queued = threads waiting for one - ``_idle``
        self._idle = 0
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.started = 0  # threads started so far (what reuse saved is calls - started)

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._calls.put(fn)  # (an idle thread takes it: one is waiting for each put)
                return
            self.started += 1
        threading.Thread(target=self._serve, args=(fn,), name=self.name, daemon=True).start()

    def idle(self) -> int:
        """Threads waiting for a call now."""
        with self._lock:
            return self._idle

    def _serve(self, fn: Callable[[], None] | None) -> None:
        while fn is not None:
            try:
                fn()
            except BaseException:  # (a call's errors are its own: its future's)
                log.exception("a call on %s failed", self.name)
            fn = None
            with self._lock:
                self._idle += 1
            try:
                fn = self._calls.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # more threads wait than calls are queued: end this one
                        self._idle -= 1
                        return
                # a call was queued for the waiting threads meanwhile (``run`` counted this one
                # in): it is there to take
                fn = self._calls.get()
