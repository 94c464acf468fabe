"""The agent's side of the zygote (see ``_zygote``): start it, ask it to fork jobs, track them.

``Zygote.spawn`` returns a ``ForkedProcess``, which offers the part of ``subprocess.Popen``
the process manager uses (``pid``, ``poll``, ``wait``, ``returncode``): the job is the
zygote's child, so its exit status arrives over the zygote's pipe rather than from
``waitpid``. If the zygote dies its children die with it (parent-death signal) and are
reported killed (-9); the next start of a Python job starts a new zygote and, until it is
warm, jobs are started the ordinary way.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ._runas import AGENT_ONLY

log = logging.getLogger(__name__)

AUTO = "auto"


def default_preload() -> list[str]:
    """NumPy and PyTorch when installed (found without importing them). With torch comes
    ``torch._dynamo``: the optimizers import it at their first step (2+ s), so a job forked
    from a zygote without it would only move that cost to its first mini-batch."""
    import importlib.util

    out = [m for m in ("numpy", "torch") if importlib.util.find_spec(m) is not None]
    if "torch" in out:
        out.append("torch._dynamo")
    return out


def parse_preload(value: str) -> list[str]:
    """``auto`` -> ``default_preload()``; ``none`` or empty -> no zygote; else a module list."""
    value = (value or "").strip()
    if value == AUTO:
        return default_preload()
    if value in ("", "none", "off"):
        return []
    return [m.strip() for m in value.split(",") if m.strip()]


def python_target(command: list[str], python: str = sys.executable) -> tuple[str, str, list[str]] | None:
    """``("module", name, args)`` for ``<python> -m name args``, ``("path", script, args)`` for
    ``<python> script.py args``, or None when the command is something else (another
    interpreter, interpreter options, not Python at all): those are started by exec."""
    if len(command) < 2:
        return None
    exe = shutil.which(command[0]) if os.path.sep not in command[0] else command[0]
    if not exe or os.path.realpath(exe) != os.path.realpath(python):
        return None
    if command[1] == "-m" and len(command) >= 3:
        return ("module", command[2], list(command[3:]))
    if not command[1].startswith("-") and command[1].endswith(".py"):
        return ("path", command[1], list(command[2:]))
    return None


class ForkedProcess:
    """A job process forked by the zygote (a ``Popen``-like handle)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """One warm zygote process. ``start`` returns at once; ``ready`` tells when it can fork."""

    def __init__(
        self,
        preload: list[str],
        *,
        launch: Callable[[Callable[[], subprocess.Popen[bytes]]], subprocess.Popen[bytes]] | None = None,
        stderr_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        run_as: Any = None,
    ) -> None:
        self.preload = list(preload)
        self.run_as = run_as  # a JobUser each job becomes after the fork (None: the zygote's own)
        self.python = python
        self._launch = launch or (lambda fn: fn())
        self._stderr_path = stderr_path
        self._lock = threading.Lock()  # one request written at a time
        self._state = threading.Lock()
        self._popen: subprocess.Popen[bytes] | None = None
        self._children: dict[int, ForkedProcess] = {}
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.starts = 0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Zygote:
        """Start the zygote process (its imports run in the background)."""
        with self._state:
            if self._closed or (self._popen is not None and self._popen.poll() is None):
                return self
            self.ready.clear()
            argv = [self.python, "-m", "microco.services.agent._zygote", "--preload", ",".join(self.preload)]
            setpriv = shutil.which("setpriv")
            if setpriv:
                argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
            env = {
                # never the agent's credentials: a job forked from here shares this memory
                **{k: v for k, v in os.environ.items() if k not in AGENT_ONLY},
                # One thread for everything the zygote imports: NumPy's OpenBLAS then starts no
                # thread pool, so the zygote is single-threaded when it forks.
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
            err = open(self._stderr_path, "ab") if self._stderr_path else subprocess.DEVNULL

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                )

            try:
                self._popen = self._launch(spawn)
            finally:
                if not isinstance(err, int):
                    err.close()
            self.starts += 1
            threading.Thread(
                target=self._read, args=(self._popen,), name="zygote-reader", daemon=True
            ).start()
        return self

    def close(self) -> None:
        """Stop the zygote (its remaining children die with it)."""
        with self._state:
            self._closed = True
            popen = self._popen
        if popen is not None and popen.poll() is None:
            try:
                assert popen.stdin is not None
                popen.stdin.close()
                # An idle zygote exits at once on end of input; one still importing its preload
                # (seconds of torch on a busy machine) reads no input until done: it holds no
                # state worth waiting for, so it is terminated instead of waited on.
                popen.wait(timeout=0.5)
            except (OSError, subprocess.TimeoutExpired):
                popen.terminate()
                try:
                    popen.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    popen.kill()
                    popen.wait()

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    # ------------------------------------------------------------------ forking
    def spawn(
        self,
        target: tuple[str, str, list[str]],
        env: dict[str, str],
        cwd: str,
        log_path: str | os.PathLike[str],
        cpus: set[int] | None = None,
        timeout: float = 10.0,
        user: Any = None,
    ) -> ForkedProcess:
        """Fork a job from the warm zygote; raises ``RuntimeError`` if it is not available."""
        if not self.ready.is_set():
            raise RuntimeError("zygote is not ready")
        kind, name, args = target
        req_id = next(self._ids)
        fut: Future[Any] = Future()
        req = {
            "id": req_id,
            "kind": kind,
            "target": name,
            "args": args,
            "env": env,
            "cwd": cwd,
            "log": str(log_path),
            "cpus": sorted(cpus or ()),
        }
        user = user if user is not None else self.run_as  # this job's user (``_runas``)
        if user is not None:
            req.update(uid=user.uid, gid=user.gid)
        with self._lock:
            popen = self._popen
            if popen is None or popen.stdin is None:
                raise RuntimeError("zygote is not running")
            self._pending[req_id] = fut
            try:
                popen.stdin.write((json.dumps(req) + "\n").encode())
                popen.stdin.flush()
            except OSError as exc:
                self._pending.pop(req_id, None)
                raise RuntimeError(f"zygote pipe: {exc}") from exc
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise RuntimeError("zygote did not answer") from None

    # ------------------------------------------------------------------ reader thread
    def _read(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        for raw in popen.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("ready"):
                self.info = msg
                self.ready.set()
                log.info("zygote ready", extra={"preloaded": msg.get("preloaded"), "s": msg.get("import_s")})
            elif "exit" in msg:
                child = self._children.pop(int(msg["exit"]), None)
                if child is not None:
                    child._exited(int(msg["code"]))
            elif "id" in msg:
                fut = self._pending.pop(int(msg["id"]), None)
                if "pid" in msg:
                    child = ForkedProcess(int(msg["pid"]))
                    self._children[child.pid] = child  # before the exit message can arrive
                    if fut is not None:
                        fut.set_result(child)
                elif fut is not None:
                    fut.set_exception(RuntimeError(msg.get("error", "zygote refused")))
        # EOF: the zygote is gone; its children died with it (parent-death signal).
        popen.wait()
        self.ready.clear()
        for child in list(self._children.values()):
            child._exited(-9)
        self._children.clear()
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(RuntimeError("zygote exited"))
        self._pending.clear()
        if not self._closed:
            log.warning("zygote exited with %s; restarting it", popen.returncode)
            time.sleep(1.0)  # no tight loop if it cannot start at all
            if not self._closed:
                try:
                    self.start()
                except OSError as exc:
                    log.error("cannot restart the zygote: %s", exc)
