"""Per-process records in a job's control directory: how each process of a job ended.

A job may be one process or several (``torchrun``, ``mp.spawn``, Lightning or Accelerate
launchers start one per rank under a launcher process). The node agent sees only the exit code
of the process it started, and a launcher turns any rank's exit into its own code (``torchrun``
exits 1 whether a rank checkpointed on request, raised, or was killed). So every process that
runs the hook writes ``rank-<r>.json`` next to the control files:

- ``running`` at its first mini-batch boundary (with its pid, so a test or an operator can find
  the ranks);
- ``checkpointed`` with the step, written after the checkpoint is complete and before exiting
  on a stop: the agent reports the job as checkpointed whatever code the launcher returns;
- ``failed`` with one line (``ValueError: ...``) on an uncaught exception; ``comm`` marks an
  error of the collective library (a peer rank went away), which is a consequence, not a cause;
- ``finished`` when training is done.

A rank that died without a word (``kill -9``, the OOM killer, a launcher's SIGTERM) leaves
``running``. ``classify_exit`` turns the records and the exit code into the agent's verdict.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from ._control import EXIT_CHECKPOINTED, read_json, write_json_atomic

RANK_FILE = "rank-{rank}.json"
_ERROR_LINE_MAX = 300

# A lost rank (one that vanished without an error of its own): reported as killed, so the
# scheduler reschedules the job from its last checkpoint, as for a single killed process.
EXIT_LOST = -int(signal.SIGKILL)


def write_record(control_dir: Path, rank: int, record: dict[str, Any]) -> None:
    try:
        write_json_atomic(control_dir / RANK_FILE.format(rank=rank), {"rank": rank, **record})
    except OSError:
        pass  # best effort: a full disk must not change how the job ends


def read_records(control_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    out = []
    try:
        paths = sorted(Path(control_dir).glob(RANK_FILE.format(rank="*")))
    except OSError:
        return []
    for path in paths:
        rec = read_json(path)
        if isinstance(rec, dict):
            out.append(rec)
    return out


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most a few hundred characters."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0].strip()}" if text else type(exc).__name__
    return line[:_ERROR_LINE_MAX]


_COMM_WORDS = ("connection closed by peer", "connection reset", "broken pipe", "gloo", "nccl", "socket")


def is_comm_error(exc: BaseException) -> bool:
    """An error of the collective library, as a rank sees it when a peer has gone away.
    (torch is consulted only if the job imported it: an excepthook must not import it.)"""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        kinds = tuple(
            k for k in (getattr(dist, "DistError", None), getattr(dist, "DistNetworkError", None)) if k
        )
        if kinds and isinstance(exc, kinds):
            return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError | ConnectionError | OSError) and any(w in text for w in _COMM_WORDS)


def last_error_line(log_tail: str) -> str:
    """The line of a log tail that says what went wrong: the last ``SomethingError: ...`` line,
    else the last non-empty line."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if ":" in ln and " " not in head and (head.endswith(("Error", "Exception", "Exit", "Interrupt"))):
            return ln[:_ERROR_LINE_MAX]
    return lines[-1][:_ERROR_LINE_MAX] if lines else ""


def classify_exit(code: int, control_dir: str | os.PathLike[str], log_tail: str = "") -> tuple[int, str]:
    """The agent's verdict on a job process that exited with ``code``: ``(code, message)``
    where code is 0 (finished), ``EXIT_CHECKPOINTED``, negative (lost: reschedule from the
    last checkpoint) or anything else (failed), and the message is one line."""
    records = read_records(control_dir)
    done = [r for r in records if r.get("state") == "checkpointed"]
    if code == EXIT_CHECKPOINTED or (done and code != 0):
        if code == EXIT_CHECKPOINTED:
            return code, ""
        step = max(int(r.get("step") or 0) for r in done)
        return EXIT_CHECKPOINTED, f"checkpointed at step {step} (the launcher exited with {code})"
    if code == 0:
        return 0, ""
    failed = sorted((r for r in records if r.get("state") == "failed"), key=lambda r: r.get("at", 0.0))
    causes = [r for r in failed if not r.get("comm")]
    multi = any(int(r.get("world") or 1) > 1 for r in records)
    if causes:
        r = causes[0]
        who = f"rank {r['rank']}: " if multi else ""
        return code, f"{who}{r.get('error', '')} (exited with {code})"
    if code < 0:
        sig = _signal_name(-code)
        return code, f"killed by {sig}"
    if multi:
        silent = [r["rank"] for r in records if r.get("state") == "running"]
        who = f"rank {', '.join(map(str, silent))}" if silent else "a rank"
        return EXIT_LOST, (
            f"{who} of the job ended without an error of its own (killed?); the launcher exited with {code}"
        )
    line = last_error_line(log_tail)
    return code, f"exited with {code}: {line}" if line else f"exited with {code}"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
