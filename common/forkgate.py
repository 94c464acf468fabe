"""A fork waits for a process's background gRPC work: ``fork()`` beside a thread inside a gRPC
call leaves the child a half-copied gRPC core.

gRPC's own fork handler gives up when another thread is inside a call ("Other threads are
currently calling into gRPC, skipping fork() handlers"), and a child that then opens a channel
of its own can crash: a ``DataLoader(num_workers>0)`` worker forked while the cache loader's
prefetch thread was in a lookup segfaulted (CI, 2026-12-03). Python's ``os.register_at_fork``
hooks run before libc's (gRPC's), so a process can quiesce its own calls first:

* a background thread holds ``GATE`` (``with GATE.held():``) around each unit of its work that
  calls into gRPC (a unary call, a stream read to its end);
* ``os.fork()`` (and so ``multiprocessing``'s fork start method) waits until no thread holds
  it, for at most ``wait_s`` (a unit stuck longer is not waited for: the fork goes ahead, as
  before, and says so), and holds new units out until it has returned, in parent and child.

Units are short (one call with its deadline), so a fork is delayed by at most one of them.
``subprocess`` starts no Python fork hooks and is not delayed. A child that changes nothing
before its exec is started by ``vfork`` and runs no fork handler at all; one that changes its
user, group or runs a ``preexec_fn`` is started by ``fork``, and libc's handlers (gRPC's) run in
it: with calls in flight on other threads such a child crashed before its exec (session 43, the
node agent starting a job as its own user). So the agent lets ``setpriv`` change a job's user
(``services/agent/_procs.py``) and its own child changes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class ForkGate:
    """Counts the threads inside gRPC work; a fork waits for none (see the module's doc). A
    thread never waits for itself: a fork from inside a unit does not wait for that unit, and a
    unit nested in another of the same thread is not held out."""

    def __init__(self, wait_s: float = 10.0) -> None:
        self.wait_s = wait_s
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=self._before, after_in_parent=self._after, after_in_child=self._reset)

    def _reset(self) -> None:
        # (In a child: the parent's other threads do not exist here, nor does what they held.)
        self._cond = threading.Condition()
        self._inside: dict[int, int] = {}  # thread ident -> units it is inside
        self._forking = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """One unit of background gRPC work; waits while a fork is under way."""
        me = threading.get_ident()
        with self._cond:
            while self._forking and me not in self._inside:
                self._cond.wait()
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._inside.pop(me) - 1
                if left:
                    self._inside[me] = left
                self._cond.notify_all()

    @property
    def inside(self) -> int:
        """Units under way in other threads than this one."""
        me = threading.get_ident()
        with self._cond:
            return sum(n for t, n in self._inside.items() if t != me)

    def _before(self) -> None:
        with self._cond:  # (an RLock: ``inside`` takes it again)
            self._forking = True
            if not self._cond.wait_for(lambda: self.inside == 0, timeout=self.wait_s):
                log.warning(
                    "forking while %d background gRPC call(s) are still under way after %.0f s",
                    self.inside,
                    self.wait_s,
                )

    def _after(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


#: The process's gate (its hooks are registered once, at import).
GATE = ForkGate()
