"""The one way microco starts a service as a process of its own on this machine.

The local stack (``microco up``), the scheduler's and the store's local clusters (tests,
benchmarks, the demo) all launch ``python -m <module> <args>`` with its output appended to a log
file, wait for it to register in etcd while watching that it has not died, and stop it with
SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class LaunchError(RuntimeError):
    """A launched process exited, or what it should do did not happen in time."""


def start_service(
    module: str,
    args: Sequence[str] = (),
    *,
    log_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    umask: int = -1,
) -> subprocess.Popen[bytes]:
    """``python -m module args`` with this interpreter; stdout and stderr appended to
    ``log_path`` (discarded without one); ``env`` is added to this process's environment.
    ``new_session`` puts the child in a session of its own, so a Ctrl-C at the terminal reaches
    only the supervisor, which then stops its children in order. ``umask``: the child's (``-1``:
    this process's; the stack gives its services ``0o077``, so what they write is their own)."""
    cmd = [sys.executable, "-m", module, *args]
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if log_path is None:
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env, start_new_session=new_session, umask=umask,
        )  # fmt: skip
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    # the log is as private as what the child writes under ``umask``
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666 & ~umask if umask >= 0 else 0o666)
    with os.fdopen(fd, "ab") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env, start_new_session=new_session, umask=umask,
        )  # fmt: skip


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    poll_s: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something true and return that; raise
    :class:`LaunchError` if ``proc`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise LaunchError(f"{what}: the process exited with code {proc.returncode}")
        if time.monotonic() >= deadline:
            raise LaunchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL if it is still there after ``grace`` seconds; its exit code."""
    if proc.poll() is None:
        proc.terminate()
    return kill_after(proc, grace)


def kill_after(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    """Wait up to ``grace`` seconds for a process already asked to stop, then SIGKILL it."""
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            return proc.wait(5)
        except subprocess.TimeoutExpired:
            return None
