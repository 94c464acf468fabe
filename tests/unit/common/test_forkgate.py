"""A fork waits for the process's background gRPC work (common/forkgate.py): a DataLoader worker
forked while the cache loader's prefetch thread was inside a lookup segfaulted (CI)."""

from __future__ import annotations

import logging
import os
import threading
import time

from microco.common.calls import call_with_retry
from microco.common.forkgate import GATE


def _fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_a_fork_waits_until_no_other_thread_is_inside_a_call():
    order: list[str] = []
    inside = threading.Event()

    def call() -> None:
        with GATE.held():
            inside.set()
            time.sleep(0.3)  # (the order is asserted, not the time)
            order.append("call done")

    t = threading.Thread(target=call)
    t.start()
    inside.wait()
    _fork_and_reap()
    order.append("forked")
    t.join()
    assert order == ["call done", "forked"]


def test_a_fork_from_inside_a_unit_does_not_wait_for_itself(caplog):
    caplog.set_level(logging.WARNING, logger="microco.common.forkgate")
    with GATE.held():
        with GATE.held():  # nested in the same thread
            _fork_and_reap()
    assert "forking while" not in caplog.text and GATE.inside == 0


def test_a_client_call_is_inside_the_gate():
    seen: list[bool] = []

    def fn(request, timeout):
        seen.append(threading.get_ident() in GATE._inside)
        return request

    assert call_with_retry(fn, "r", timeout=5, idempotent=True) == "r"
    assert seen == [True] and threading.get_ident() not in GATE._inside
