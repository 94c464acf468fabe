"""Compiles off the critical path: a candidate configuration is compiled in a separate,
process while training keeps running the best configuration so far.

The worker (``python -m microco.clients.compiler._background_worker``) rebuilds the model from a
snapshot, runs it once under the candidate configuration with inputs of the captured shapes, and
exits; what it leaves behind is Inductor's on-disk caches (FX graph cache, AOTAutograd cache),
so when the trial then runs in the training process its compile is a cache hit (a warm load, not
a compile). Why a process and not a thread: compiling is Python work that would hold the GIL
against the training loop, and a fresh interpreter (not ``fork``) is safe beside gRPC channels
and intra-op thread pools. The process runs with one compile thread (see ``NICE`` for its
priority); the slowdown it causes the training steps beside it is charged to the compile.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

from ._background_worker import PARENT_ENV, SYS_PATH_ENV

log = logging.getLogger(__name__)

# The worker's CPU priority. Not the lowest: measured on the shared 2-core machine (load 4.5-7), a
# worker at nice 19 got 8 s of CPU in 8 minutes and at nice 10 spent 32 s just importing torch,
# so the deferred trial waited while the run's remaining steps (what a compile must repay) ran
# out. At the default priority it takes its fair share; what that costs the training steps
# beside it is measured and charged to the compile, and bounded by what the compile can save.
NICE = 0


def compile_threads() -> int:
    """Inductor's compile workers for a background compile: the cores idle now beside the training
    process, one left for it, at least one. On the 2-core VM that is one (a pool per core would
    take the training's core); on a GPU host of 16 cores, where ``torch.compile`` compiles with a
    worker a core, one thread had the worker compile its kernels one at a time with 14 cores idle
    (session 30, H200: tv-resnet18's whole step waited 3,510 steps for its worker and was then
    dropped; how much sooner it would have been ready is not measured)."""
    from ._session import idle_cores

    return max(1, int(idle_cores()) - 1)


def worker_env() -> dict[str, str]:
    """The worker's environment beside the parent's: the parent's pid (the worker ends when its
    parent is gone, ``_background_worker.watch_parent``) and the parent's ``sys.path``, where
    the worker looks for the modules that unpickle the model.

    Held out, issue 18, session 43: a model class in ``mymodel.py`` beside ``train.py``, the
    script run as ``python proj/train.py`` from another directory: the parent imports it from
    the script's directory (``sys.path[0]``), the worker (``python -m``, from the parent's
    working directory) did not find it ("No module named 'mymodel'") and every compile was a
    cold one in the training step."""
    return {PARENT_ENV: str(os.getpid()), SYS_PATH_ENV: json.dumps(list(sys.path))}


def values_id(values: dict[str, str]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(values.items()))


class BackgroundCompiler:
    """One background compile at a time, in FIFO order; the session asks :meth:`ready` before it
    runs a trial and :meth:`start` when the trial's compile is not done yet.

    ``needs_compile(values)`` says whether running ``values`` in the training process would
    compile anything now; ``payload(values)`` returns what the worker needs (``None``: the model
    cannot be rebuilt in another process, so compiles stay in line, as without this class).
    """

    _files: tuple[str, str, str] | None

    def __init__(
        self,
        needs_compile: Callable[[dict[str, str]], bool],
        payload: Callable[[dict[str, str]], dict[str, Any] | None],
        on_done: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.needs_compile = needs_compile
        self.payload = payload
        # Told each finished or cancelled compile's log entry (the wrapper keeps the worker's
        # wall time: how long a trial waits for its background compile).
        self.on_done = on_done
        self.enabled = True
        self._done: set[str] = set()
        self._queue: list[dict[str, str]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._running: dict[str, str] | None = None
        self._files = None
        self._started = 0.0
        self.log: list[dict[str, Any]] = []  # one entry per finished background compile
        # No worker outlives the training process, nor this compiler: a finaliser per running
        # worker (run at exit too). It holds the worker, not the compiler: ``atexit`` holding
        # ``self.cancel`` kept every wrapper ever made (and its model) alive until the process
        # ended (held out, session 39: a sweep's trials, each model a new ``AstraTorch``).
        self._reaper: weakref.finalize[Any, Any] | None = None

    # -- what the session asks
    def ready(self, values: dict[str, str]) -> bool:
        """True when the trial can run now without a compile in line (or cannot be helped)."""
        if not self.enabled or values_id(values) in self._done:
            return True
        return not self.needs_compile(values)

    def start(self, values: dict[str, str]) -> None:
        vid = values_id(values)
        if vid in self._done or any(values_id(v) == vid for v in self._queue):
            return
        if self._running is not None and values_id(self._running) == vid:
            return
        self._queue.append(dict(values))
        self._pump()

    def busy(self) -> bool:
        """Is a background compile running or queued? (Polls the running one.)"""
        self._pump()
        return self._proc is not None or bool(self._queue)

    def cancel(self) -> None:
        """Stop the running compile (the exploration no longer wants it) and forget the queue."""
        self._queue.clear()
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # the worker and its compiler children
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
        self._finish(cancelled=True)

    def close(self) -> None:
        self.cancel()

    # -- mechanism
    def _pump(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._finish()
        while self._proc is None and self._queue:
            values = self._queue.pop(0)
            if values_id(values) in self._done:
                continue
            self._launch(values)

    def _launch(self, values: dict[str, str]) -> None:
        path = ""
        try:
            payload = self.payload(values)
            if payload is not None:
                import torch

                fd, path = tempfile.mkstemp(prefix="microco-bg-", suffix=".pt")
                os.close(fd)
                # The worker rebuilds the model from this file. A model another process cannot
                # rebuild (a class defined inside a function: "Can't pickle local object") fails
                # here: found on a GPU machine (session 30), where the background path is taken,
                # the error escaped the training step and stopped the user's run.
                torch.save(payload, path)
        except Exception as exc:  # noqa: BLE001 - the compile then happens in line, as before
            log.info("background compile unavailable (%s): compiling in line", exc)
            payload = None
        if payload is None:
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self.enabled = False
            self._done.add(values_id(values))
            return
        out, errpath = path[:-3] + ".json", path[:-3] + ".err"
        env = dict(os.environ)
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(compile_threads())
        env["OMP_NUM_THREADS"] = str(payload.get("threads", 1))
        env["MICROCO_BACKGROUND_NICE"] = str(NICE)
        env.update(worker_env())
        with open(errpath, "wb") as err:  # a file, not a pipe: a chatty compile must not block
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "microco.clients.compiler._background_worker", path, out],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # its own process group: cancel() stops its children too
            )
        self._running, self._files, self._started = dict(values), (path, out, errpath), time.perf_counter()
        self._reaper = weakref.finalize(self, _stop_worker, self._proc, self._files)

    def _finish(self, cancelled: bool = False) -> None:
        proc, values, files = self._proc, self._running, self._files
        self._proc, self._running, self._files = None, None, None
        if self._reaper is not None:
            self._reaper.detach()
            self._reaper = None
        if proc is None or values is None or files is None:
            return
        wall = time.perf_counter() - self._started
        result: dict[str, Any] = {}
        try:
            with open(files[1]) as f:
                result = json.load(f)
        except (OSError, ValueError):
            pass
        err = b""
        try:
            with open(files[2], "rb") as f:
                err = f.read()[-2000:]
        except OSError:
            pass
        for p in files:
            try:
                os.unlink(p)
            except OSError:
                pass
        entry = {
            "values": values,
            "wall_s": round(wall, 3),
            "rc": proc.returncode,
            "cancelled": cancelled,
            "compile_s": result.get("compile_s"),
            "error": result.get("error", "")
            or ("" if proc.returncode == 0 else err.decode(errors="replace")),
        }
        self.log.append(entry)
        if self.on_done is not None:
            try:
                self.on_done(entry)
            except Exception as exc:  # noqa: BLE001 - a record not kept must not stop training
                log.info("background compile not recorded (%s)", exc)
        if cancelled:
            return
        if proc.returncode != 0 or entry["error"]:
            log.warning(
                "background compile failed (%s); the trial compiles in line", str(entry["error"])[-300:]
            )
        # Done either way: a failed background compile leaves the compile to the trial, in line,
        # where a failure falls back to eager and fails the trial, as without background compiles.
        self._done.add(values_id(values))


def _stop_worker(proc: subprocess.Popen[bytes], files: tuple[str, str, str]) -> None:
    """A worker whose compiler is gone (collected, or the process exits): stopped, its files
    removed."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    for p in files:
        with contextlib.suppress(OSError):
            os.unlink(p)
