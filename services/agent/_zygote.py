"""A warm *zygote*: a process that imported the heavy frameworks once and forks job processes.

Starting a PyTorch job costs seconds of ``import torch`` (3.5 s idle here, 20 s under load)
before its first mini-batch, and a scheduler starts processes often: every job start, every
restart after a lost node, every migration. The agent therefore keeps one zygote per host that
has already imported the preload modules (default: NumPy and PyTorch when installed) and, for a
job whose command is ``<this python> -m module ...`` or ``<this python> script.py ...``, forks a
child of it that becomes the job: a new session, the job's environment, working directory, CPU
set and log file, then ``runpy`` runs the job's module as ``__main__``. A start costs a fork
(milliseconds) instead of an interpreter start and a framework import.

What keeps that safe and equal to a fresh process:

* The zygote stays **single-threaded** (it is started with one BLAS/OpenMP thread, so NumPy's
  OpenBLAS starts no pool, and it never runs a framework op), so ``fork`` copies no lock held
  by another thread. Frameworks that start threads at import (TensorFlow) are not preloaded;
  their jobs take the ordinary path (exec).
* Nothing device-related is initialised before the fork: ``import torch`` does not touch CUDA,
  so ``CUDA_VISIBLE_DEVICES`` set in the child still decides which GPUs it sees. The child
  applies its thread count (``OMP_NUM_THREADS``) to torch, which read it at import.
* Lifetime: the zygote is started with ``PR_SET_PDEATHSIG=SIGKILL`` towards the agent and each
  child with the same towards the zygote, so a dying agent (even ``kill -9``) still takes its
  jobs with it. The zygote reaps its children and reports each exit status (negative signal
  numbers for killed ones, as ``Popen`` does) to the agent over its pipe.
* Python's and NumPy's global RNGs are reseeded from the OS in every child (a fresh process
  would be); a job that wants determinism seeds them itself, as the examples do.

Protocol (JSON lines): agent -> zygote ``{"id", "kind": "module"|"path", "target", "args",
"env", "cwd", "log", "cpus"}``; zygote -> agent ``{"ready": true, "preloaded": [...],
"import_s"}`` once, ``{"id", "pid"}`` or ``{"id", "error"}`` per request, ``{"exit": pid,
"code"}`` per child exit.

    python -m microco.services.agent._zygote --preload numpy,torch
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _child(req: dict, keep_close: list[int], zygote_pid: int, libc) -> None:
    """Runs in the forked child: become the job, never return."""
    code = 1
    try:
        os.setsid()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote_pid:  # the zygote died before prctl took effect
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in keep_close:
            try:
                os.close(fd)
            except OSError:
                pass
        log_fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        if req.get("uid") is not None:  # the job's own user (services/agent/_runas.py)
            os.setgroups([])
            os.setgid(req["gid"])
            os.setuid(req["uid"])
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a change of user cleared it
            if os.getppid() != zygote_pid:
                os._exit(1)
        if req.get("cpus"):
            try:
                os.sched_setaffinity(0, set(req["cpus"]))
            except OSError:
                pass
        if req.get("cwd"):
            os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req.get("env") or {})
        _fresh_process_state()
        import runpy

        if req["kind"] == "module":
            sys.path[0] = os.getcwd()  # as ``python -m`` does
            sys.argv = [req["target"], *req["args"]]

            def runner():
                return runpy.run_module(req["target"], run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(req["target"])
            sys.path[0] = os.path.dirname(path)  # as ``python script.py`` does
            sys.argv = [path, *req["args"]]

            def runner():
                return runpy.run_path(path, run_name="__main__")

        try:
            runner()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:  # noqa: BLE001 - reported as a normal interpreter would
            import traceback

            traceback.print_exc()
            code = 1
        code = _shutdown(code)
    except BaseException:  # noqa: BLE001 - set-up failed: say why in the job's log
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _fresh_process_state() -> None:
    """What differs between a fork of the zygote and a fresh interpreter, made equal."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and threads and threads.isdigit() and int(threads) > 0:
        # torch read OMP_NUM_THREADS at import, in the zygote (where it is 1).
        torch.set_num_threads(int(threads))


def _shutdown(code: int) -> int:
    """Interpreter exit as Python does it (non-daemon threads joined, atexit run), minus the
    module teardown that would only cost time."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            code = code or 120
    return code


def serve(preload: list[str]) -> int:
    import ctypes
    import select

    # The pipes to the agent move off fds 0/1, which become /dev/null and stderr (the agent's
    # log): anything a preloaded module prints cannot corrupt the protocol.
    rfd, wfd = os.dup(0), os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    os.dup2(2, 1)
    t0 = time.perf_counter()
    loaded = []
    for name in preload:
        try:
            __import__(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a missing framework only means no preload
            print(f"zygote: cannot preload {name}: {exc}", file=sys.stderr)
    import microco.clients.scheduler  # noqa: F401 - every hooked job imports it

    libc = ctypes.CDLL(None, use_errno=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    me = os.getpid()
    _send(wfd, {"ready": True, "preloaded": loaded, "import_s": time.perf_counter() - t0, "pid": me})

    buf = b""
    while True:
        try:
            ready, _, _ = select.select([rfd, wake_r], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while True:  # reap every child that exited
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(wfd, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if rfd not in ready:
            continue
        chunk = os.read(rfd, 65536)
        if not chunk:
            return 0  # the agent closed the pipe: it is gone or shutting down
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                _send(wfd, {"id": req["id"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                _child(req, [rfd, wfd, wake_r, wake_w], me, libc)
            _send(wfd, {"id": req["id"], "pid": pid})


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="microco node agent zygote (started by the agent)")
    p.add_argument("--preload", default="", help="comma-separated modules to import before forking")
    args = p.parse_args(argv)
    return serve([m for m in args.preload.split(",") if m])


if __name__ == "__main__":
    raise SystemExit(main())
