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
"""

from __future__ import annotations

import signal
import threading
import time
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
        self._previous: Any = None
        self._armed = False

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
        return (time.perf_counter() - self.armed_at) * 1e3

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        raise CompileDeadline(
            f"{self.what}: compile abandoned, not done after {self.deadline_ms / 1e3:.1f} s (its deadline)"
        )
