"""The supervisor loop on a process that always crashes: restarted with back-off, said so, then
given up on with a clear message; and nothing is restarted once a stop has begun."""

from __future__ import annotations

import time
from pathlib import Path

from microco.services.stack import ProcessSpec, Stack, StackOptions
from microco.services.stack._restart import RestartPolicy, RestartTracker
from microco.services.stack._supervisor import Child

# `python -m microco.services.stack --etcd ...` exits at once (argparse: bad arguments).
CRASHER = ProcessSpec("crasher", "crasher", "microco.services.stack")


def _stack(tmp_path: Path, said: list[str], max_failures: int) -> Stack:
    policy = RestartPolicy(base_s=0.05, cap_s=0.2, window_s=60.0, max_failures=max_failures)
    stack = Stack(
        StackOptions(home=tmp_path, etcd="127.0.0.1:1", redis="redis://127.0.0.1:1/0", restart=policy),
        progress=said.append,
    )
    (tmp_path / "logs").mkdir()
    child = Child(CRASHER, instance_id="crasher-1", tracker=RestartTracker(policy))
    stack.children.append(child)
    stack._launch(child)
    return stack


def test_a_crashing_service_is_restarted_with_back_off_then_given_up(tmp_path: Path) -> None:
    said: list[str] = []
    stack = _stack(tmp_path, said, max_failures=3)
    child = stack.children[0]
    deadline = time.monotonic() + 60
    while child.status != "failed" and time.monotonic() < deadline:
        stack.supervise()
        time.sleep(0.02)
    assert child.status == "failed", said
    assert child.tracker.restarts == 2
    assert sum("restarting in" in m for m in said) == 2
    assert sum("crasher: restarted" in m for m in said) == 2
    assert any("giving up after 3 failures within 60s" in m and "crasher.log" in m for m in said), said
    stack.stop()


def test_no_restart_once_stopping(tmp_path: Path) -> None:
    said: list[str] = []
    stack = _stack(tmp_path, said, max_failures=5)
    child = stack.children[0]
    stack.stop()
    first_pid = child.proc.pid
    for _ in range(20):
        stack.supervise()
        time.sleep(0.02)
    assert child.proc.pid == first_pid
    assert not any("restart" in m for m in said), said
