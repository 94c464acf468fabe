"""Job processes on one host: launch with a device assignment, relay control, report exits.

Every job process is started from one long-lived *spawner* thread with
``PR_SET_PDEATHSIG=SIGKILL`` (through util-linux ``setpriv --pdeathsig``, else a ``preexec_fn``): if the agent dies (even by ``kill -9``) its jobs die with it, so
the scheduler can safely restart them elsewhere from their last checkpoint without two copies
of a job ever running. (Linux sends the signal when the *thread* that forked exits, hence one
thread that lives as long as the agent.) Jobs do not depend on the scheduler at all: a
scheduler restart leaves them running.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microco.clients.scheduler import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_DIR,
    ENV_DEVICES,
    ENV_JOB_ID,
    EXIT_CHECKPOINTED,
    ControlChannel,
    classify_exit,
    read_records,
)
from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound

from ._devices import DeviceInfo
from ._runas import AGENT_ONLY, JobControl, JobUser, blocked, give, pick_job_uid, reclaim, traversable
from ._warm import ForkedProcess, Zygote, python_target

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# A job id names directories on this node: no separators, no "..".
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_LOG_NAME = re.compile(r"attempt-(\d+)\.log")
# A job command naming the interpreter by one of these bare names runs with the platform's own
# interpreter (the one the agent runs under, where microco and its frameworks are installed).
# A job that wants another names it by path (its own virtualenv's bin/python) or runs a
# container (``docker run ...``): see docs/first-job.md.
PLATFORM_PYTHON_NAMES = frozenset({"python", "python3"})
# How long a launcher ended after its ranks checkpointed has to exit before it is killed.
LAUNCHER_GRACE_S = 5.0


def job_command(command: list[str], python: str = sys.executable) -> list[str]:
    """``command`` with a bare ``python``/``python3`` replaced by the platform's interpreter."""
    if command and command[0] in PLATFORM_PYTHON_NAMES and python:
        return [python, *command[1:]]
    return list(command)


_AGENT_ONLY = AGENT_ONLY


def job_environment(
    base: dict[str, str],
    platform_env: dict[str, str],
    job_env: dict[str, str],
    python: str = sys.executable,
) -> dict[str, str]:
    """A job's environment before its device and identity variables: the agent's own,
    with the platform interpreter's directory first on PATH when it is a virtualenv (so a
    ``python`` inside the job's own scripts is the platform's too), the platform's addresses
    (MICROCO_ETCD, MICROCO_REDIS, MICROCO_NODE), then what the job's spec asks for (which wins).
    The agent's own credentials never reach a job: it gets its own, scoped to its id, from the
    scheduler (``MICROCO_CREDENTIALS_PEM`` in ``job_env``)."""
    env = {k: v for k, v in base.items() if k not in _AGENT_ONLY}
    bindir = os.path.dirname(python) if python else ""
    # (the path as run, not resolved: a virtualenv's python is a link to the base interpreter)
    in_venv = sys.prefix != sys.base_prefix
    if bindir and in_venv and os.path.abspath(bindir).startswith(os.path.abspath(sys.prefix) + os.sep):
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
        env["PATH"] = os.pathsep.join([bindir, *parts])
    env.update({k: v for k, v in platform_env.items() if v})
    env.update(job_env)
    return env


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """Runs every ``Popen`` on one thread that lives as long as the agent (see module doc)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        threading.Thread(target=self._run, name="spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def call(self, fn: Callable[[], Any]) -> Any:
        fut: Future[Any] = Future()
        self._q.put((fn, fut))
        return fut.result()


@dataclass
class ManagedProcess:
    job_id: str
    attempt: int
    command: list[str]
    device_ids: list[str]
    popen: subprocess.Popen[bytes] | ForkedProcess
    control: ControlChannel
    checkpoint_dir: Path
    log_path: Path
    started_at: float
    exit_code: int | None = None
    exited_at: float | None = None
    control_seq: int = 0
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    forked: bool = False  # started from the warm zygote rather than by exec
    stop_sent: bool = False  # the agent sent SIGTERM (``stop``): the exit is the stop's
    # A ``stop`` control (checkpoint-and-exit) was relayed: once every rank has checkpointed, a
    # launcher that would start them again (``torchrun --max-restarts``) is ended (``poll``).
    stop_controlled: bool = False
    launcher_ended_at: float | None = None
    uid: int | None = None  # the uid the job runs as, when one of its own (``_runas.JOB_UIDS``)
    # The directories made the job's own, given back to the agent once it has exited (its uid
    # goes to a later job).
    owned: list[Path] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        if self.exit_code is None:
            code = self.popen.poll()
            if code is None and self.stop_controlled:
                self._end_launcher_once_checkpointed()
            if code is not None:
                # A process killed by a signal reports -N; keep that (not 0, not 75). A job's
                # processes' own records decide what a launcher's code means (``_ranks``).
                self.exit_code, self.message = classify_exit(code, self.control.dir, _tail(self.log_path))
                if self.launcher_ended_at is not None and self.exit_code != EXIT_CHECKPOINTED:
                    # every rank had checkpointed when the agent ended the launcher: whatever
                    # the launcher's code (0 from a handler of its own), that is how it ended
                    step = max((int(r.get("step") or 0) for r in read_records(self.control.dir)), default=0)
                    self.exit_code = EXIT_CHECKPOINTED
                    self.message = (
                        f"checkpointed at step {step} (the launcher, ended by the agent, exited with {code})"
                    )
                if self.stop_sent and 0 <= self.exit_code != EXIT_CHECKPOINTED:
                    # A script's own SIGTERM handler (save, then exit 0) would make the agent's
                    # stop read as the job finished, or failed: it is the stop's, so the job is
                    # rescheduled from its checkpoint.
                    self.message = (
                        f"stopped by the node agent (SIGTERM); the job's own handler exited with {code}"
                    )
                    self.exit_code = -signal.SIGTERM
                self.exited_at = time.time()
                owned, self.owned = self.owned, []
                if owned:
                    reclaim(owned)
        return self.exit_code

    def _end_launcher_once_checkpointed(self) -> None:
        """After a stop, a job whose every rank recorded ``checkpointed`` is done on this node,
        whatever its launcher does next: ``torchrun --max-restarts N`` (torch elastic's fault
        tolerance) takes the ranks' exit 75 for a failure and starts them again; each new
        generation restored, trained, saw the stop again and checkpointed (or hung joining its
        process group) until torchrun ran out of restarts or the scheduler's operation timeout
        stopped the job (session 42: 4.7 s, once more than 5 minutes, for 2 restarts). The
        launcher's process group is ended here (SIGTERM, SIGKILL after ``LAUNCHER_GRACE_S``);
        its exit then reads as checkpointed by the ranks' records (``classify_exit``)."""
        if self.launcher_ended_at is not None:
            if time.monotonic() - self.launcher_ended_at > LAUNCHER_GRACE_S:
                _kill_group(self.pid, signal.SIGKILL)
            return
        records = read_records(self.control.dir)
        world = max((int(r.get("world") or 1) for r in records), default=1)
        done = {int(r["rank"]) for r in records if r.get("state") == "checkpointed"}
        if world > 1 and done >= set(range(world)):
            log.info(
                "job %s: every rank of attempt %d checkpointed; ending its launcher",
                self.job_id,
                self.attempt,
            )
            self.launcher_ended_at = time.monotonic()
            _kill_group(self.pid, signal.SIGTERM)

    def status(self) -> dict[str, Any]:
        self.poll()
        return {
            "job_id": self.job_id,
            "pid": self.pid,
            "attempt": self.attempt,
            "exited": self.exit_code is not None,
            "exit_code": self.exit_code if self.exit_code is not None else 0,
            "device_ids": list(self.device_ids),
            "control_seq": self.control_seq,
            "started_at": self.started_at,
            "message": self.message,
            "forked": self.forked,
            **hook_report(self.control.status() or {}),
        }


def hook_report(hook: dict[str, Any]) -> dict[str, Any]:
    """What the agent relays of a job's ``status.json`` (the hook's report), with defaults for
    what an older hook or a job that has not reported yet leaves out."""
    return {
        "job_state": hook.get("state", ""),
        "step": int(hook.get("step") or 0),
        "minibatch_ms": float(hook.get("minibatch_ms") or 0.0),
        "utilization": None if hook.get("utilization") is None else float(hook["utilization"]),
        "timed_steps": int(hook.get("timed_steps") or 0),
        "timed_ms": float(hook.get("timed_ms") or 0.0),
        "timed_sq_ms": float(hook.get("timed_sq_ms") or 0.0),
        "seq_done": int(hook.get("seq_done") or 0),
        "checkpoint_step": -1 if hook.get("checkpoint_step") is None else int(hook["checkpoint_step"]),
        "checkpoint_bytes": int(hook.get("checkpoint_bytes") or 0),
        "first_step_at": float(hook.get("first_step_at") or 0.0),
        "updated_at": float(hook.get("updated_at") or 0.0),
        "suspend_ms": float(hook.get("suspend_ms") or 0.0),
        "resume_ms": float(hook.get("resume_ms") or 0.0),
        "peak_rss_bytes": int(hook.get("peak_rss_bytes") or 0),
        "restored_from_step": -1
        if hook.get("restored_from_step") is None
        else int(hook["restored_from_step"]),
    }


def _tail(path: Path, limit: int = 800) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


# At most this much of a log's end answers a request for its last lines (a line can be
# megabytes: a progress bar's, or a script's dump of an array).
TAIL_MAX_BYTES = 4 * 1024 * 1024
_LINE_END = re.compile(rb"\r(?!\n)|\n")


def tail_offset(path: Path, lines: int, block: int = 64 * 1024, max_bytes: int = TAIL_MAX_BYTES) -> int:
    """Byte offset where the last ``lines`` lines of ``path`` begin (a last line without its
    end counts as a line), and at most ``max_bytes`` before the end; 0 when the file has fewer.

    A line ends with a newline, or with a carriage return not followed by one: a progress
    bar (tqdm's, Keras') redraws its line with carriage returns, each a line as a terminal
    shows it; ``\r\n`` is one line end."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        floor = max(0, end - max_bytes)
        pos, seen = end, 0
        # a line end ending the file ends the last line; it does not start one more
        f.seek(max(0, end - 1))
        skip_last = f.read(1) in (b"\n", b"\r")
        after = b""  # the byte after the current block (b"" at the end of the file)
        while pos > floor:
            start = max(floor, pos - block)
            f.seek(start)
            buf = f.read(pos - start)
            for m in reversed(list(_LINE_END.finditer(buf))):
                i = m.start()
                if i == len(buf) - 1 and buf[i:] == b"\r" and after == b"\n":
                    continue  # the \r of a \r\n split across blocks: its \n counted
                if skip_last and start + i == end - 1:
                    continue
                seen += 1
                if seen == lines:
                    return start + i + 1
            after = buf[:1]
            pos = start
        return floor


def _disk_usage(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _kill_group(pid: int, sig: int) -> None:
    """Signal the job's process group; the process alone if it has not made its session yet
    (a job forked from the zygote calls ``setsid`` first thing, but a stop may come sooner)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` (threads made before the call keep their own mask otherwise)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # the thread ended meanwhile


class ProcessManager:
    """The job processes of this host, by job id (the latest attempt of each)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        devices: list[DeviceInfo],
        checkpoint_root: str | os.PathLike[str] | None = None,
        pin_cpus: bool = True,
        preload: list[str] | None = None,
        platform_env: dict[str, str] | None = None,
        run_as: JobUser | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        # The user every job runs as (None: the agent's own; see _runas).
        self.run_as = run_as
        # What every job is told about the platform (MICROCO_ETCD, MICROCO_REDIS, MICROCO_NODE).
        self.platform_env = dict(platform_env or {})
        self.devices = {d.id: d for d in devices}
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root else self.data_dir / "checkpoints"
        self.pin_cpus = pin_cpus
        # Called before every start; raises to refuse it (the agent's fence: see _fence).
        self.gate: Callable[[], None] | None = None
        self._procs: dict[str, ManagedProcess] = {}
        self._lock = threading.RLock()
        self._spawner = _Spawner()
        self._last_uid = 0  # the job uid given last (``pick_job_uid`` goes round after it)
        # The warm zygote (see ``_zygote``): Python jobs fork from it instead of starting an
        # interpreter and importing their framework; None when nothing is to be preloaded.
        self.zygote: Zygote | None = None
        if preload:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.zygote = Zygote(
                preload, launch=self._spawner.call, stderr_path=self.data_dir / "zygote.log", run_as=run_as
            ).start()

    def _check_devices(self, device_ids: list[str]) -> None:
        unknown = [d for d in device_ids if d not in self.devices]
        if unknown:
            raise InvalidArgument(f"devices {unknown} are not on this node (it has {sorted(self.devices)})")

    def _cpus(self, device_ids: list[str]) -> set[int]:
        return {c for d in device_ids for c in self.devices[d].cpus}

    def _device_env(self, device_ids: list[str]) -> dict[str, str]:
        gpus = [str(self.devices[d].index) for d in device_ids if self.devices[d].kind == "gpu"]
        env = {ENV_DEVICES: ",".join(device_ids), "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        if not gpus:
            # A virtual device is a CPU share: one compute thread per device.
            n = str(max(1, len(device_ids)))
            env.update(
                OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, TF_NUM_INTRAOP_THREADS=n, TF_NUM_INTEROP_THREADS="1"
            )
        return env

    def start(
        self,
        job_id: str,
        command: list[str],
        env: dict[str, str],
        device_ids: list[str],
        workdir: str = "",
        checkpoint_dir: str = "",
        attempt: int = 0,
    ) -> ManagedProcess:
        if self.gate is not None:
            self.gate()
        if not job_id:
            raise InvalidArgument("job_id is required")
        if not _SAFE_ID.fullmatch(job_id):
            raise InvalidArgument(
                f"job_id {job_id!r} is not a safe name (letters, digits, '.', '_', '-'; no path separators)"
            )
        if not command:
            raise InvalidArgument("command is empty")
        if any("\0" in x for x in (workdir, checkpoint_dir, *command, *env, *env.values())):
            raise InvalidArgument("a command argument, env entry or directory holds a NUL byte")
        command = job_command(command)
        self._check_devices(device_ids)
        exe = command[0]
        if shutil.which(exe) is None and not (os.path.sep in exe and os.access(exe, os.X_OK)):
            raise InvalidArgument(f"command not found on node: {exe!r}")
        if workdir and not os.path.isdir(workdir):
            raise InvalidArgument(f"workdir {workdir!r} does not exist on this node")
        own = [self.data_dir.resolve(), self.checkpoint_root.resolve()]  # the agent opens these itself
        if workdir and self.run_as is not None and (stop := blocked(self.run_as, [Path(workdir)], own)):
            # The job's user must reach its working directory itself: a job started by exec is
            # put there by the agent (root) before its user changes, so a directory under one it
            # may not pass (a 0700 home) was open to it all the same (session 42)
            raise InvalidArgument(f"workdir {workdir!r}: the job's user ({self.run_as}) may not pass {stop}")
        with self._lock:
            old = self._procs.get(job_id)
            if old is not None and old.poll() is None:
                if old.attempt == attempt:
                    return old  # a retried StartProcess: idempotent
                raise FailedPrecondition(
                    f"job {job_id} attempt {old.attempt} is still running (pid {old.pid})"
                )
            job_dir = self.data_dir / "jobs" / job_id
            control_dir = job_dir / f"attempt-{attempt}"
            # Control directories of earlier attempts are dead (their process has exited): only
            # their logs are kept, for the user.
            if job_dir.is_dir():
                for entry in job_dir.iterdir():
                    if entry.is_dir() and entry.name.startswith("attempt-"):
                        shutil.rmtree(entry, ignore_errors=True)
            control_dir.mkdir(parents=True)
            ckpt = Path(checkpoint_dir) if checkpoint_dir else self.checkpoint_root / job_id
            ckpt.mkdir(parents=True, exist_ok=True)
            log_path = job_dir / f"attempt-{attempt}.log"
            user = self.run_as
            if user is not None and user.per_job:
                taken = {p.uid for p in self._procs.values() if p.uid is not None and p.poll() is None}
                user = user.with_uid(pick_job_uid(taken, self._last_uid))
                self._last_uid = user.uid
            job_home: dict[str, str] = {}
            if user is not None:
                # The job's own directories are the job user's; the way to them it may pass only.
                self.data_dir.mkdir(parents=True, exist_ok=True)
                for d in (self.data_dir, self.data_dir / "jobs", job_dir, self.checkpoint_root):
                    if d.is_dir():
                        traversable(d, user)
                give(control_dir, user)
                give(ckpt, user)
                give(job_dir / "home", user)
                job_home = {"HOME": str(job_dir / "home")}
            full_env = {
                **job_environment(dict(os.environ), self.platform_env, env),
                **self._device_env(device_ids),
                ENV_JOB_ID: job_id,
                ENV_ATTEMPT: str(attempt),
                ENV_CONTROL_DIR: str(control_dir),
                ENV_CHECKPOINT_DIR: str(ckpt),
                **job_home,
            }
            logf = open(log_path, "wb")
            me = os.getpid()

            setpriv = shutil.which("setpriv")
            as_user = user
            if setpriv:
                # util-linux's setpriv sets the parent-death signal and execs the job: no Python
                # runs between fork and exec (Python code there can crash or deadlock in a
                # multi-threaded parent such as a gRPC server). It changes the job's user too
                # (real, effective and saved ids; no supplementary groups), before the death
                # signal: the agent's own child then changes nothing, so it is started by
                # vfork. A child that changed its user itself was started by fork, which runs
                # gRPC's fork handlers in it; with calls in flight on the agent's other threads
                # it crashed before its exec (CI, session 43: a job as its own uid never ran its
                # first line; about 1 start in 10 in a reproducer beside a busy gRPC server).
                ids = []
                if user is not None:
                    ids = ["--reuid", str(user.uid), "--regid", str(user.gid), "--clear-groups"]
                argv, preexec, as_user = [setpriv, *ids, "--pdeathsig", "KILL", "--", *command], None, None
            else:
                argv, preexec = list(command), _die_with_parent(me)

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    argv,
                    env=full_env,
                    cwd=workdir or None,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=preexec,
                    # the job's user where setpriv does not set it (set before the death
                    # signal: a change of user clears it)
                    user=as_user.uid if as_user is not None else None,
                    group=as_user.gid if as_user is not None else None,
                    extra_groups=[] if as_user is not None else None,
                )

            popen: subprocess.Popen[bytes] | ForkedProcess | None = None
            target = python_target(list(command))
            cpus = self._cpus(device_ids) if self.pin_cpus else set()
            if self.zygote is not None and target is not None and self.zygote.ready.is_set():
                try:
                    popen = self.zygote.spawn(target, full_env, workdir, log_path, cpus, user=user)
                except RuntimeError as exc:  # a cold or dead zygote: start it the ordinary way
                    log.warning("zygote start of %s failed (%s); starting by exec", job_id, exc)
            if popen is None:
                try:
                    popen = self._spawner.call(spawn)
                except OSError as exc:
                    raise InvalidArgument(f"cannot start {exe!r}: {exc.strerror or exc}") from exc
                except ValueError as exc:  # a NUL byte, a name with '=': the job's own, not the node's
                    raise InvalidArgument(f"cannot start {exe!r}: {exc}") from exc
                finally:
                    logf.close()
            else:
                logf.close()
            if self.pin_cpus:
                _set_affinity(popen.pid, cpus)
            proc = ManagedProcess(
                job_id,
                attempt,
                list(command),
                list(device_ids),
                popen,
                ControlChannel(control_dir) if user is None else JobControl(control_dir, user),
                ckpt,
                log_path,
                time.time(),
                forked=isinstance(popen, ForkedProcess),
                uid=user.uid if self.run_as is not None and self.run_as.per_job and user else None,
                owned=[control_dir, ckpt, job_dir / "home"]
                if self.run_as is not None and self.run_as.per_job
                else [],
            )
            self._procs[job_id] = proc
            log.info(
                "started job",
                extra={"job": job_id, "pid": popen.pid, "attempt": attempt, "devices": device_ids},
            )
            return proc

    def get(self, job_id: str) -> ManagedProcess:
        with self._lock:
            proc = self._procs.get(job_id)
        if proc is None:
            raise NotFound(f"no process for job {job_id} on this node")
        return proc

    def control(self, job_id: str, action: str, device_ids: list[str] | None = None) -> ManagedProcess:
        proc = self.get(job_id)
        if proc.poll() is not None:
            raise FailedPrecondition(f"job {job_id} attempt {proc.attempt} has exited ({proc.exit_code})")
        if device_ids:
            self._check_devices(device_ids)
        with self._lock:
            if device_ids and action in ("resume", "resize"):
                proc.device_ids = list(device_ids)
                if self.pin_cpus:
                    _set_affinity(proc.pid, self._cpus(device_ids))
            proc.control_seq = proc.control.send(action, list(device_ids) if device_ids else None)
            if action == "stop":
                proc.stop_controlled = True
        return proc

    def stop(self, job_id: str, grace_s: float = 5.0) -> ManagedProcess:
        """SIGTERM the job's process group, SIGKILL after ``grace_s``."""
        return self.stop_all([self.get(job_id)], grace_s)[0]

    def stop_all(self, procs: list[ManagedProcess], grace_s: float) -> list[ManagedProcess]:
        """SIGTERM every one of ``procs`` at once, SIGKILL those alive ``grace_s`` later: N jobs
        stop within one grace, not N in a row (a fenced node must stop all of them before its
        lease can expire)."""
        live = [p for p in procs if p.poll() is None]
        for p in live:
            p.stop_sent = True
            _kill_group(p.pid, signal.SIGTERM)
        until = time.monotonic() + grace_s
        for p in live:
            try:
                p.popen.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        late = [p for p in live if p.poll() is None]
        for p in late:
            _kill_group(p.pid, signal.SIGKILL)
        for p in late:
            p.popen.wait(timeout=10)
        for p in live:
            p.poll()
        return procs

    def log_files(self, job_id: str) -> dict[int, Path]:
        """The logs of ``job_id`` kept on this node, by attempt."""
        if not _SAFE_ID.fullmatch(job_id or ""):
            raise InvalidArgument(f"job_id {job_id!r} is not a job id")
        job_dir = self.data_dir / "jobs" / job_id
        out: dict[int, Path] = {}
        if job_dir.is_dir():
            for entry in job_dir.iterdir():
                m = _LOG_NAME.fullmatch(entry.name)
                if m and entry.is_file():
                    out[int(m.group(1))] = entry
        return out

    def is_running(self, job_id: str, attempt: int) -> bool:
        """Whether attempt ``attempt`` of ``job_id`` has a live process here (its log may grow)."""
        with self._lock:
            proc = self._procs.get(job_id)
        return proc is not None and proc.attempt == attempt and proc.poll() is None

    def collect_garbage(
        self, keep: set[str], keep_logs: set[str] | frozenset[str] = frozenset()
    ) -> tuple[list[str], int]:
        """Delete the data of every job found here (checkpoint directory under the checkpoint
        root, control directories and logs) that is not in ``keep`` and has no live process,
        and forget its exited processes; of a job in ``keep_logs``, keep the logs (an ended
        job's output stays readable for its user). Returns (deleted job ids, bytes freed).

        ``keep`` comes from the scheduler and covers the whole cluster: with a checkpoint root
        shared by several nodes, a job known to the scheduler keeps its checkpoint wherever it
        runs, and one the scheduler no longer knows loses it on whichever node collects first.
        """
        with self._lock:
            live = {jid for jid, p in self._procs.items() if p.poll() is None}
            found = set(self._procs)
            for root in (self.checkpoint_root, self.data_dir / "jobs"):
                if root.is_dir():
                    found |= {e.name for e in os.scandir(root) if e.is_dir() and _SAFE_ID.fullmatch(e.name)}
            deleted, freed = [], 0
            for jid in sorted(found - set(keep) - live):
                job_dir = self.data_dir / "jobs" / jid
                if jid in keep_logs:
                    # everything but the logs; the job's id stays known here through them
                    gone = [self.checkpoint_root / jid]
                    if job_dir.is_dir():
                        gone += [e for e in job_dir.iterdir() if not _LOG_NAME.fullmatch(e.name)]
                else:
                    gone = [self.checkpoint_root / jid, job_dir]
                    deleted.append(jid)
                for path in gone:
                    if path.is_dir():
                        freed += _disk_usage(path)
                        shutil.rmtree(path, ignore_errors=True)
                    elif path.exists():
                        freed += path.stat().st_size
                        path.unlink()
                self._procs.pop(jid, None)
        if deleted:
            log.info("collected job data", extra={"jobs": deleted, "bytes": freed})
        return deleted, freed

    def list(self) -> list[ManagedProcess]:
        with self._lock:
            procs = list(self._procs.values())
        for p in procs:
            p.poll()
        return procs

    def shutdown(self, grace_s: float = 2.0) -> None:
        for p in self.list():
            if p.exit_code is None:
                try:
                    self.stop(p.job_id, grace_s)
                except Exception:
                    log.exception("stopping %s", p.job_id)
        if self.zygote is not None:
            self.zygote.close()
