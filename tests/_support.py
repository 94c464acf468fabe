"""Helpers shared by the test modules (pytest puts ``tests/`` on ``sys.path`` for
``tests/conftest.py``, so test modules import this as ``from _support import ...``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float = 10.0, interval: float = 0.05) -> T | None:
    """Poll ``cond`` until it returns something truthy (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def wait_until(
    cond: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.1
) -> T:
    """Like :func:`wait_for`, but fail the test with ``what`` in the message on timeout."""
    value = wait_for(cond, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
    return value
