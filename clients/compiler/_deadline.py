"""A deadline for a compile that runs in the training step (PyTorch; issue 18, session 11).

A whole-step compile priced wrongly could cost a run minutes: Inductor's cold compile of a
model never compiled here took 233-831 s on the corpus at load 7-27, where its price said
seconds or one minute. In line, the compile is Python in the training thread, so a timer signal
(``SIGALRM``, ``setitimer``) can interrupt it: the handler raises :class:`CompileDeadline`
inside the compile, which the wrapper's guards treat as the compiled step failing (the step is
run eagerly or repeated on the last good configuration; the trial is reported failed; training
goes on). Only in the main thread, and only where the process has no ``SIGALRM`` handler of its
own; elsewhere the compile runs without a deadline, as before. A compiler child process that was
running (Inductor's C++ build) is left to finish; its output is not used.

The timer runs only inside the compile calls (:meth:`DeadlineTimer.within`, around each of
Inductor's per-graph compiles, ``compile_fx_inner``, in ``WholeStepBackend``), never while
Dynamo traces the step nor while the user's own code runs: armed from the forward's call
(session 11) it fired in Dynamo's tracing, and a raise there aborted a CI worker ("Fatal Python
error: Aborted"). The backward graph's compile, which AOTAutograd runs lazily at the step's
first backward, runs under what is left of the same deadline.

What Dynamo's trace and AOTAutograd take before and between the compile calls cannot be
interrupted, but it is counted (issue 18, session of 2026-12-03: at a slowdown of 6 they took
52 s beside an abandoned compile's 179 s, neither bounded nor in the floor recorded for it):
from :meth:`DeadlineTimer.begin`, called where the compiled step is first called, the deadline
is the wall time since then, so each compile call gets what the trace left (1 ms where the trace
took it all), and :meth:`DeadlineTimer.spent_ms` is what the abandoned compile ran in all.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any


class CompileDeadline(Exception):
    """Raised inside a compile that ran past its deadline."""


class DeadlineTimer:
    """Arm before a compile, disarm after; ``fired`` says whether it interrupted one."""

    def __init__(self) -> None:
        self.armed_at = 0.0
        self.deadline_ms = 0.0
        self.what = ""
        self.fired = False
        self.last_ms = 0.0  # how long the latest armed window lasted
        self._previous: Any = None
        self._armed = False
        # The window :meth:`within` arms for (0: none): set by the wrapper for a trial's compile.
        self.budget_ms = 0.0
        self.budget_what = ""
        # Where the compiled call began (:meth:`begin`; 0: not begun) and where the timer fired.
        self.started_at = 0.0
        self.fired_at = 0.0

    @staticmethod
    def available() -> bool:
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return False
        return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)

    def arm(self, deadline_ms: float, what: str) -> bool:
        """Start the timer (False: not available here, the compile runs without a deadline)."""
        if self._armed or not self.available() or not deadline_ms > 0:
            return False
        self.fired, self.what, self.deadline_ms = False, what, deadline_ms
        self._previous = signal.signal(signal.SIGALRM, self._fire)
        self.armed_at = time.perf_counter()
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, deadline_ms / 1e3)
        return True

    def disarm(self) -> float:
        """Stop the timer; returns the ms since it was armed (0 when it was not)."""
        if not self._armed:
            return 0.0
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._armed = False
        self.last_ms = (time.perf_counter() - self.armed_at) * 1e3
        return self.last_ms

    def allow(self, deadline_ms: float, what: str) -> None:
        """Let the next compile calls run under a deadline of ``deadline_ms`` in all (0: none)."""
        self.budget_ms, self.budget_what = max(0.0, deadline_ms), what
        self.started_at = 0.0

    def begin(self) -> None:
        """The compiled call begins (the trace, then the compile calls): from now on the allowed
        deadline is wall time, the trace's included (once per allowed deadline)."""
        if self.budget_ms > 0 and not self.started_at:
            self.started_at = time.perf_counter()

    def spent_ms(self) -> float:
        """What the compile ran, from :meth:`begin` (else its last window) to the timer firing."""
        if self.started_at and self.fired_at >= self.started_at:
            return max(self.last_ms, (self.fired_at - self.started_at) * 1e3)
        return self.last_ms

    @contextlib.contextmanager
    def within(self) -> Iterator[None]:
        """Run the body (a backend's compile call) under what is left of the allowed deadline;
        several calls (a graph break, a recompile) share it. Without one allowed, or where the
        timer is not available, the body runs without a deadline."""
        fired = self.fired  # one window that fired is not forgotten by the next
        left = self.budget_ms
        if self.started_at and left > 0:  # begun: the trace so far took its share
            left = max(1.0, left - (time.perf_counter() - self.started_at) * 1e3)
        if not left > 0 or self._armed or not self.arm(left, self.budget_what):
            yield
            return
        try:
            yield
        finally:
            spent = self.disarm()
            if not self.started_at:
                self.budget_ms = max(1.0, self.budget_ms - spent)
            self.fired = self.fired or fired

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        self.fired, self.fired_at = True, time.perf_counter()
        raise CompileDeadline(
            f"{self.what}: compile abandoned, not done after {self.deadline_ms / 1e3:.1f} s (its deadline)"
        )
