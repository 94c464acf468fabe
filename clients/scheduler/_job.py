"""What every job-side hook shares: the job's environment, step timing, checkpoint files and
obeying control at a mini-batch boundary. Framework hooks (``_torch``, ``_keras``) only say how
to capture and restore their state.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from microco.clients.telemetry import StepRecord, StepTelemetry, install, uninstall

from ._control import (
    CHECKPOINT,
    EXIT_CHECKPOINTED,
    RESIZE,
    RESUME,
    STOP,
    SUSPEND,
    ControlChannel,
    read_json,
)
from ._ranks import error_line, is_comm_error, read_records, write_record

log = logging.getLogger(__name__)

# Environment a node agent gives every job process.
ENV_JOB_ID = "MICROCO_JOB_ID"
ENV_ATTEMPT = "MICROCO_ATTEMPT"
ENV_DEVICES = "MICROCO_DEVICES"  # comma-separated device ids
ENV_CONTROL_DIR = "MICROCO_CONTROL_DIR"
ENV_CHECKPOINT_DIR = "MICROCO_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_S = "MICROCO_CHECKPOINT_EVERY_S"
# A job spread over several nodes runs one process per node (rank); see ``init_distributed``.
ENV_RANK = "MICROCO_RANK"
ENV_WORLD_SIZE = "MICROCO_WORLD_SIZE"
# The run's declared length in steps (the spec's ``total_steps``, unless the job's own environment
# says otherwise): what the compiler's exploration may spend and a compile must repay.
ENV_TOTAL_STEPS = "MICROCO_TOTAL_STEPS"

# Actions as small integers, for agreeing on one across ranks (0: nothing to do).
_ACTION_CODES = {SUSPEND: 1, RESUME: 2, CHECKPOINT: 3, STOP: 4, RESIZE: 5}
_CODE_ACTIONS = {v: k for k, v in _ACTION_CODES.items()}
_PERIODIC_CHECKPOINT = 9  # rank 0's checkpoint timer ran out (agreed like a command)

CHECKPOINT_FILE = "checkpoint"
# Periodic checkpoints when the job does not say (``MICROCO_CHECKPOINT_EVERY_S`` unset; "0" turns
# them off): a killed job loses at most this much training, and the interval stretches so that
# writing checkpoints costs at most 1/CHECKPOINT_COST_SHARE of the time between them.
DEFAULT_CHECKPOINT_EVERY_S = 300.0
CHECKPOINT_COST_SHARE = 50
_REPORT_EVERY_S = 0.2  # status file refresh while nothing changes (state changes are immediate)
_PARK_POLL_S = 0.01
# How long a rank that checkpointed for a stop waits for every other rank's record before it
# exits all the same (a rank that died meanwhile must not keep the others from leaving).
EXIT_WAIT_S = 60.0


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children_cpu_s() -> float:
    """CPU seconds spent by this process's child processes: those waited for (``getrusage``)
    and those still running, read from ``/proc`` (the children of the process's main thread and
    of the calling one: a data loader's workers are started by the thread that iterates it).
    0 where there is no ``/proc``."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = ru.ru_utime + ru.ru_stime
    pid = os.getpid()
    kids: set[str] = set()
    for tid in {pid, threading.get_native_id()}:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(f.read().split())
        except OSError:
            pass
    for kid in kids:
        try:
            with open(f"/proc/{kid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class JobContext:
    """The scheduler's view from inside a training process.

    Outside the scheduler (no ``MICROCO_CONTROL_DIR``) it still times mini-batches and, if a
    checkpoint directory is given, checkpoints on request of the script; control is a no-op.

    ``save`` returns the bytes of a checkpoint of the job's whole state at this boundary,
    ``load`` restores from them; ``on_park`` / ``on_unpark`` free and re-take the device
    (e.g. move a model off the GPU); ``on_devices`` is told of a new device set (resize).
    """

    def __init__(
        self,
        *,
        control_dir: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        job_id: str | None = None,
        attempt: int | None = None,
        devices: list[str] | None = None,
        checkpoint_every_s: float | None = None,
        exit_fn: Callable[[int], None] | None = None,
        telemetry: StepTelemetry | None = None,
    ) -> None:
        env = os.environ
        control_dir = control_dir or env.get(ENV_CONTROL_DIR) or None
        checkpoint_dir = checkpoint_dir or env.get(ENV_CHECKPOINT_DIR) or None
        self.job_id = job_id or env.get(ENV_JOB_ID, "")
        self.attempt = attempt if attempt is not None else int(env.get(ENV_ATTEMPT, "0") or 0)
        if devices is None:
            devices = [d for d in env.get(ENV_DEVICES, "").split(",") if d]
        self.devices: list[str] = list(devices)
        self.channel = ControlChannel(control_dir) if control_dir else None
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        # Said by the caller or the job's environment: kept as said. Unsaid: the default,
        # stretched for a job whose checkpoints are slow to write (see ``_checkpoint_due``).
        self.checkpoint_interval_said = True
        if checkpoint_every_s is None:
            said = env.get(ENV_CHECKPOINT_EVERY_S, "").strip()
            self.checkpoint_interval_said = bool(said)
            checkpoint_every_s = float(said) if said else DEFAULT_CHECKPOINT_EVERY_S
        self.checkpoint_every_s = checkpoint_every_s
        # How a checkpoint-and-move ends the process. ``os._exit`` skips interpreter teardown
        # (seconds for a process holding torch or TensorFlow), which is pure migration latency:
        # the checkpoint and the status are already on disk. Tests pass one raising SystemExit.
        self.exit_fn = exit_fn or os._exit
        self.save: Callable[[int], bytes] | None = None
        self.load: Callable[[bytes], int] | None = None
        self.on_park: Callable[[], None] | None = None
        self.on_unpark: Callable[[], None] | None = None
        self.on_devices: Callable[[list[str]], None] | None = None
        # A spread job: every rank must act on the same command at the same boundary (one
        # rank parking or exiting while another waits in an all-reduce would hang both).
        # ``agree([code, seq])`` is a collective that returns rank 0's list to every rank (the
        # torch hook sets a broadcast); rank 0 alone reads the control file and writes checkpoints.
        # A job whose processes a launcher started (torchrun, mp.spawn, ...) shares one control
        # directory: its ranks come from the launcher's RANK / WORLD_SIZE (or ``use_group``),
        # rank 0 alone reports, and a suspend parks every rank in place. The ranks of a job the
        # scheduler spread (``MICROCO_WORLD_SIZE``) each have their own node agent.
        self.spread = int(env.get(ENV_WORLD_SIZE, "1") or 1) > 1
        self.rank = int(env.get(ENV_RANK) or env.get("RANK") or 0)
        self.world_size = int(env.get(ENV_WORLD_SIZE) or env.get("WORLD_SIZE") or 1)
        self.agree: Callable[[list[int]], list[int]] | None = None

        self.step = 0
        self.restored_from_step: int | None = None
        self.state = "running"
        self.seq_done = 0
        self.started_at = time.time()
        self.first_step_at: float | None = None
        self._times: deque[float] = deque(maxlen=20)
        self._last_ms: float | None = None
        # Every mini-batch this process timed, as running sums (count, ms, ms squared): the
        # scheduler takes differences between two readings, so it can judge a change (a grow,
        # a pack) from the mean of every mini-batch since it, and how sure that mean is, not
        # from the last 20 (a loop whose every 16th batch waits 250 ms for data shows 20-batch
        # means from 24 to 37 ms around a true 25).
        self.timed_steps = 0
        self.timed_ms = 0.0
        self.timed_sq_ms = 0.0
        # The process's one telemetry stream (``microco.clients.telemetry``): it times every
        # mini-batch once, at ``step_end``; the cache loader adds its wait for data and the
        # compiler wrapper its compiled regions, and both read the step back from it.
        self.telemetry = install(telemetry if telemetry is not None else StepTelemetry())
        self.last_record: StepRecord | None = None
        # CPU time the process spent in each of those mini-batches (all its threads): on a
        # virtual device (a CPU share, one compute thread per device) it is the device's busy
        # time, so CPU / wall / devices is the fraction of its devices the job keeps busy.
        self._cpu_ms: deque[float] = deque(maxlen=20)
        # ... and its child processes' (a data loader's workers run on the job's cores: a loop
        # whose workers decode every sample is busy though its own process mostly waits)
        self._children_cpu_s = children_cpu_s()
        self.on_gpu = bool(env.get("CUDA_VISIBLE_DEVICES", ""))
        self._last_report = 0.0
        self._last_checkpoint_at = time.monotonic()
        self.checkpoint_bytes = 0
        self.checkpoint_ms = 0.0
        self.checkpoint_step: int | None = None
        self.checkpoint_error = ""  # why the last periodic checkpoint was not written, if it was not
        self.last_suspend_ms: float | None = None
        self.last_resume_ms: float | None = None
        self._parked_at: float | None = None
        self.losses_reported = 0
        self._recorded = False
        if self.channel is not None:
            _install_excepthook(self)

    # ------------------------------------------------------------------ checkpoint files
    @property
    def checkpoint_path(self) -> Path | None:
        return self.checkpoint_dir / CHECKPOINT_FILE if self.checkpoint_dir else None

    def remove_partial_checkpoints(self) -> int:
        """Delete half-written checkpoint files of other processes; returns how many."""
        path = self.checkpoint_path
        if path is None or not path.parent.is_dir():
            return 0
        mine = f".{path.name}.{os.getpid()}.tmp"
        n = 0
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            if tmp.name != mine:
                try:
                    tmp.unlink()
                    n += 1
                except OSError:
                    pass
        return n

    def has_checkpoint(self) -> bool:
        path = self.checkpoint_path
        return bool(path and path.exists())

    def write_checkpoint(self) -> int:
        """Capture the state now (``save``) and replace the checkpoint file atomically.
        In a spread job only rank 0 writes (every rank holds the same state)."""
        if self.save is None or self.checkpoint_path is None:
            raise RuntimeError("this job has no checkpoint directory or no save function")
        if self.rank != 0 and self.agree is None:
            self.checkpoint_step = self.step
            return 0
        t0 = time.perf_counter()
        # With a process group every rank calls ``save`` (it may gather each rank's RNG state,
        # a collective); rank 0 alone writes.
        blob = self.save(self.step)
        if self.rank != 0:
            self.checkpoint_step = self.step
            return 0
        path = self.checkpoint_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
            # Rename is atomic: a job killed mid-write leaves the previous checkpoint intact.
            os.replace(tmp, path)
        except OSError:
            # A full disk: what was written goes (it held the room a later try needs, until the
            # next restart); the previous checkpoint stays whole.
            try:
                tmp.unlink()
            except OSError:
                pass
            raise
        self.checkpoint_ms = (time.perf_counter() - t0) * 1000.0
        self.checkpoint_bytes = len(blob)
        self.checkpoint_step = self.step
        self._last_checkpoint_at = time.monotonic()
        return len(blob)

    def restore(self) -> int:
        """Load the latest checkpoint if there is one; returns the step to continue from.

        Temporary files a killed earlier process left half-written are deleted first: the
        scheduler runs one process of a job at a time, so they can only be garbage, and only
        the latest complete checkpoint is ever needed."""
        self.remove_partial_checkpoints()
        path = self.checkpoint_path
        if self.load is None or path is None or not path.exists():
            self._report(force=True)
            return 0
        blob = path.read_bytes()
        self.step = int(self.load(blob))
        self.restored_from_step = self.step
        self.checkpoint_step = self.step
        self.checkpoint_bytes = len(blob)
        self._report(force=True)
        self._mark_boundary()
        return self.step

    # ------------------------------------------------------------------ the boundary
    def step_end(self, step: int | None = None, *, obey: bool = True) -> None:
        """Call after every mini-batch: records its time and obeys pending control.

        May not return: a ``stop`` (checkpoint-and-move) exits the process with
        ``EXIT_CHECKPOINTED`` once the checkpoint is on disk. With ``obey=False`` control
        waits for the next boundary (``boundary()``, or the next step's end).
        """
        self.step = self.step + 1 if step is None else int(step)
        rec = self.last_record = self.telemetry.end_step(self.step)
        ms = rec.step_s * 1000.0
        self._times.append(ms)
        self.timed_steps += 1
        self.timed_ms += ms
        self.timed_sq_ms += ms * ms
        kids = 0.0
        if not self.on_gpu and self.channel is not None:  # (what only the scheduler reads)
            now = children_cpu_s()
            kids, self._children_cpu_s = max(0.0, now - self._children_cpu_s), now
        self._cpu_ms.append((rec.cpu_s + kids) * 1000.0)
        self._last_ms = ms
        if self.first_step_at is None:
            self.first_step_at = time.time()
            self._report(force=True)
        if self.first_step_at is not None and not self._recorded:
            self._recorded = True
            self._record("running")
        if not obey:
            # control waits for the loop's own work (an epoch's validation, maybe minutes): the
            # status says where the job is meanwhile, not where it was up to 0.2 s before
            self._report(force=True)
            return
        self.boundary()

    def boundary(self) -> None:
        """Obey pending control (and a due periodic checkpoint) at a boundary that is not a
        mini-batch's end: after a loop's end-of-epoch work, say (``TorchHook.epoch``)."""
        together = self._together()
        before = (self.seq_done, self.checkpoint_step, self._last_checkpoint_at, self.state)
        self._obey()
        if not together and self._checkpoint_due():
            self._periodic_checkpoint()  # (ranks with a group agree on it in ``_obey_together``)
        self._report()
        # The next mini-batch's time starts after control handling (a park or a checkpoint is
        # not compute); when there was none, this step's end is the next one's start.
        if (self.seq_done, self.checkpoint_step, self._last_checkpoint_at, self.state) != before:
            self._mark_boundary()

    def finish(self) -> None:
        """Call when training is done: the final status says so."""
        self.state = "finished"
        self._record("finished")
        self._report(force=True)
        uninstall(self.telemetry)

    def use_group(self, rank: int, world_size: int, agree: Callable[[list[int]], list[int]]) -> None:
        """Act as rank ``rank`` of ``world_size`` processes that agree on control through
        ``agree`` (a collective returning rank 0's list of ints to every rank)."""
        self.rank, self.world_size, self.agree = int(rank), int(world_size), agree

    @property
    def reporter(self) -> bool:
        """Whether this process writes the job's status: rank 0 of a job whose ranks share a
        control directory, every rank of a spread job (each for its own node agent)."""
        return self.rank == 0 or self.spread

    @property
    def checkpoint_interval_s(self) -> float:
        """Seconds between periodic checkpoints (0: none)."""
        if self.checkpoint_interval_said or self.checkpoint_every_s <= 0:
            return self.checkpoint_every_s
        return max(self.checkpoint_every_s, CHECKPOINT_COST_SHARE * self.checkpoint_ms / 1000.0)

    def _periodic_checkpoint(self) -> None:
        """A checkpoint of the job's own schedule. One that cannot be written (its disk full) is
        logged and training goes on from the last one written, tried again an interval later:
        a full checkpoint disk failed every job that checkpointed on it, at its next periodic
        checkpoint, though each could go on and be resumed from its last one (session 42)."""
        try:
            self.write_checkpoint()
        except OSError as exc:
            self._last_checkpoint_at = time.monotonic()
            self.checkpoint_error = f"the checkpoint of step {self.step} was not written: {exc}"
            log.warning(
                "%s; training goes on (the last checkpoint written is of step %s)",
                self.checkpoint_error,
                self.checkpoint_step,
            )
        else:
            self.checkpoint_error = ""

    def _checkpoint_due(self) -> bool:
        interval = self.checkpoint_interval_s
        return (
            interval > 0
            and self.checkpoint_path is not None
            and self.save is not None
            and time.monotonic() - self._last_checkpoint_at >= interval
        )

    def _record(self, state: str, **extra: Any) -> None:
        """This process's record in the control directory (see ``_ranks``)."""
        if self.channel is None:
            return
        write_record(
            self.channel.dir,
            self.rank,
            {
                "state": state,
                "pid": os.getpid(),
                "world": self.world_size,
                "step": self.step,
                "at": time.time(),
                **extra,
            },
        )

    def _wait_for_every_rank(self) -> None:
        """After this rank's checkpoint for a stop: no rank exits before every rank has recorded
        its own (a launcher ends the others at the first exit). Ranks sharing a control
        directory read each other's records there. A collective did it before, a broadcast from
        rank 0, which tells rank 0 nothing of the others: rank 0 left it at once, and a rank
        still receiving could find the connection gone. The ranks of a spread job (a control
        directory each) still agree by the collective; its failure once this rank's checkpoint
        is recorded leaves the record as it is."""
        if self.spread or self.channel is None:
            try:
                if self.agree is not None:
                    self.agree([0, 0])
            except Exception as exc:  # noqa: BLE001 - this rank's checkpoint is complete and recorded
                log.warning(
                    "rank %d: the other ranks were not heard after the checkpoint (%s)", self.rank, exc
                )
            return
        deadline = time.monotonic() + EXIT_WAIT_S
        ranks: set[int] = set()
        while time.monotonic() < deadline:
            ranks = {
                int(r.get("rank", -1))
                for r in read_records(self.channel.dir)
                if r.get("state") == "checkpointed"
            }
            if len(ranks) >= self.world_size:
                return
            time.sleep(_PARK_POLL_S)
        log.warning(
            "rank %d: ranks %s did not record a checkpoint within %.0f s; leaving all the same",
            self.rank,
            sorted(set(range(self.world_size)) - ranks),
            EXIT_WAIT_S,
        )

    def _together(self) -> bool:
        """Whether the ranks agree at this boundary: several of them with a collective, and
        something to agree on (outside the scheduler without checkpoints there is nothing,
        and every rank sees the same environment, so none pays the broadcast)."""
        return (
            self.world_size > 1
            and self.agree is not None
            and (
                self.channel is not None
                or (self.checkpoint_interval_s > 0 and self.checkpoint_path is not None)
            )
        )

    def _obey(self) -> None:
        if self._together():
            self._obey_together()
            return
        if self.channel is None:
            return
        cmd = self.channel.poll()
        if not cmd or int(cmd.get("seq", 0)) <= self.seq_done:
            return
        self._carry_out(cmd)

    def _obey_together(self) -> None:
        """Several ranks: rank 0's command (and a due periodic checkpoint), agreed by every
        rank at this boundary, so no rank parks or exits while another waits in a collective.

        Ranks sharing one control directory (a launcher's) carry the command out together:
        suspend parks every rank in place, stop checkpoints once and exits every rank. A job
        the scheduler spread over nodes cannot park rank by rank (each node's agent would
        resume its rank on its own), so suspend means checkpoint-and-exit there."""
        assert self.agree is not None
        code, seq = 0, 0
        if self.rank == 0:
            cmd = self.channel.poll() if self.channel is not None else None
            if cmd and int(cmd.get("seq", 0)) > self.seq_done:
                code, seq = _ACTION_CODES.get(str(cmd.get("action")), 0), int(cmd.get("seq", 0))
            elif self._checkpoint_due():
                code = _PERIODIC_CHECKPOINT
        code, seq = self.agree([code, seq])
        if not code:
            return
        if code == _PERIODIC_CHECKPOINT:
            self._periodic_checkpoint()
            return
        action = _CODE_ACTIONS[code]
        if self.spread:
            if action == SUSPEND:
                action = STOP
            # the other ranks acknowledge their own agent's latest command
            seq = seq if self.rank == 0 else (self.channel.last_seq() if self.channel else 0)
            if action in (RESUME, RESIZE):
                self._ack(seq)
                return
            self._carry_out({"seq": seq, "action": action, "devices": None})
            return
        cmd = read_json(self.channel.command_path) if self.channel is not None else None
        devices = cmd.get("devices") if cmd and int(cmd.get("seq", 0)) == seq else None
        self._carry_out({"seq": seq, "action": action, "devices": devices})

    def _carry_out(self, cmd: dict[str, Any]) -> None:
        action, seq = cmd.get("action"), int(cmd.get("seq", 0))
        devices = cmd.get("devices")
        if action == SUSPEND:
            t0 = time.perf_counter()
            if self.save is not None and self.checkpoint_path is not None:
                self.write_checkpoint()
            if self.on_park:
                self.on_park()
            self.last_suspend_ms = (time.perf_counter() - t0) * 1000.0
            self.state = "parked"
            self._parked_at = time.perf_counter()
            self._ack(seq)
            self._park()
        elif action == CHECKPOINT:
            self.write_checkpoint()
            self._ack(seq)
        elif action == STOP:
            was_parked = self.state == "parked"
            if not was_parked or self.checkpoint_step != self.step:
                self.write_checkpoint()
            self.state = "checkpointed"
            self._ack(seq)
            # The record tells the agent "checkpointed" whatever code a launcher returns; it
            # is written once the checkpoint is complete. With a group, no rank exits before
            # every rank has (a launcher kills the others at the first exit).
            self._record("checkpointed")
            _leave_on_sigterm()
            if self.agree is not None and self.world_size > 1 and not was_parked:
                self._wait_for_every_rank()
            sys.stdout.flush()
            sys.stderr.flush()
            self.exit_fn(EXIT_CHECKPOINTED)
            raise SystemExit(EXIT_CHECKPOINTED)  # if exit_fn returned
        elif action in (RESUME, RESIZE):
            if devices is not None and list(devices) != self.devices:
                self.devices = list(devices)
                if self.on_devices:
                    self.on_devices(self.devices)
            self._ack(seq)
        else:
            log.warning("ignoring unknown control action %r", action)
            self._ack(seq)

    def _park(self) -> None:
        """Wait, holding no device, until told to resume or stop."""
        assert self.channel is not None
        while True:
            time.sleep(_PARK_POLL_S)
            cmd = self.channel.poll()
            if not cmd or int(cmd.get("seq", 0)) <= self.seq_done:
                self._report()
                continue
            action = cmd.get("action")
            if action == RESUME:
                t0 = time.perf_counter()
                devices = cmd.get("devices")
                if devices is not None and list(devices) != self.devices:
                    self.devices = list(devices)
                    if self.on_devices:
                        self.on_devices(self.devices)
                if self.on_unpark:
                    self.on_unpark()
                self.last_resume_ms = (time.perf_counter() - t0) * 1000.0
                self.state = "running"
                self._ack(int(cmd["seq"]))
                return
            if action == STOP:
                self._carry_out(cmd)  # exits
            elif action == RESIZE:
                self.devices = list(cmd.get("devices") or self.devices)
                self._ack(int(cmd["seq"]))
            else:  # SUSPEND again or CHECKPOINT: already checkpointed and parked
                self._ack(int(cmd["seq"]))

    def _ack(self, seq: int) -> None:
        self.seq_done = seq
        self._report(force=True)

    # ------------------------------------------------------------------ status
    def minibatch_ms(self) -> float | None:
        """Mean of the recent mini-batch times (the first is left out once there are others:
        it carries warm-up such as graph tracing)."""
        times = list(self._times)
        if len(times) > 1:
            times = times[1:]
        return sum(times) / len(times) if times else None

    def _mark_boundary(self) -> None:
        self.telemetry.mark()

    def utilization(self) -> float | None:
        """The fraction of its devices the job kept busy over the recent mini-batches (the first
        left out, as for ``minibatch_ms``): on virtual devices, CPU time per wall time per device,
        at most 1. None on GPUs (their busy time is not the process's CPU time; not measured) and
        before two mini-batches."""
        if self.on_gpu or len(self._times) < 2:
            return None
        wall = sum(list(self._times)[1:])
        cpu = sum(list(self._cpu_ms)[1:])
        if wall <= 0:
            return None
        return max(0.0, min(1.0, cpu / wall / max(1, len(self.devices))))

    def status(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "pid": os.getpid(),
            "state": self.state,
            "step": self.step,
            "restored_from_step": self.restored_from_step,
            "minibatch_ms": self.minibatch_ms(),
            "minibatch_ms_last": self._last_ms,
            "utilization": self.utilization(),
            "timed_steps": self.timed_steps,
            "timed_ms": self.timed_ms,
            "timed_sq_ms": self.timed_sq_ms,
            "started_at": self.started_at,
            "first_step_at": self.first_step_at,
            "updated_at": time.time(),
            "seq_done": self.seq_done,
            "devices": self.devices,
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_ms": self.checkpoint_ms,
            "checkpoint_step": self.checkpoint_step,
            "suspend_ms": self.last_suspend_ms,
            "resume_ms": self.last_resume_ms,
            "peak_rss_bytes": peak_rss_bytes(),
        }

    def _report(self, force: bool = False) -> None:
        if self.channel is None or not self.reporter:
            return
        now = time.monotonic()
        if not force and now - self._last_report < _REPORT_EVERY_S:
            return
        self._last_report = now
        try:
            self.channel.report(self.status())
        except OSError as exc:  # a full disk must not kill training; the agent sees staleness
            log.warning("cannot write job status: %s", exc)


class ContextDelegates:
    """What every framework hook reads of its job's :class:`JobContext`, so a script needs only
    the hook."""

    context: JobContext

    @property
    def devices(self) -> list[str]:
        return self.context.devices

    @property
    def step(self) -> int:
        """The global step: mini-batches trained by the job so far, across epochs and restarts."""
        return self.context.step


def _leave_on_sigterm() -> None:
    """A process whose checkpoint for a stop is recorded only exits: a SIGTERM now (the agent
    ends a launcher once every rank recorded its checkpoint) ends it as it stands. A framework's
    own handler ran instead: Lightning's broadcasts the signal to the other ranks, some of them
    gone by then; its error turned the rank's record from checkpointed to failed (CI, session
    43: a Lightning DDP job moved at load 24, and 2 of 2 runs beside the torchrun tests)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _install_excepthook(ctx: JobContext) -> None:
    """On an uncaught exception, record this rank's one-line error before the usual report."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        # (a rank whose checkpoint for a stop is complete and recorded only exits: what fails
        # then, a collective with ranks already gone, is of the exit, not of the checkpoint)
        if not isinstance(exc, KeyboardInterrupt | SystemExit) and ctx.state != "checkpointed":
            ctx._record("failed", error=error_line(exc), comm=is_comm_error(exc))
        previous(kind, exc, tb)

    sys.excepthook = hook
