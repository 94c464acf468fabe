"""The control channel between a node agent and the job process it runs.

Two small JSON files in a per-job *control directory* that only the agent and the job touch:

- ``command.json`` (agent -> job): ``{"seq": n, "action": ..., "devices": [...]}``. The agent
  bumps ``seq`` for each new command; the job acts on a command once, at its next mini-batch
  boundary.
- ``status.json`` (job -> agent): step, mini-batch times, state (running / parked / exited),
  the last command ``seq`` the job carried out, checkpoint size.

Why files: a mini-batch boundary costs one ``stat`` (a few microseconds) when nothing changed,
the channel needs no server in the job, survives an agent restart (the agent re-reads it), and
works the same for PyTorch, TensorFlow or anything else that can write JSON. Both files are
replaced atomically (write to a temporary name, ``os.replace``), so a reader never sees half
a file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COMMAND_FILE = "command.json"
STATUS_FILE = "status.json"

# Actions a job obeys at a mini-batch boundary.
SUSPEND = "suspend"  # checkpoint, free the device, park until resume / stop
RESUME = "resume"  # continue (optionally on new devices of the same node)
CHECKPOINT = "checkpoint"  # checkpoint and keep running
STOP = "stop"  # checkpoint and exit with EXIT_CHECKPOINTED (checkpoint-and-move)
RESIZE = "resize"  # elastic job: continue on a new device set
ACTIONS = (SUSPEND, RESUME, CHECKPOINT, STOP, RESIZE)

# Exit status of a job that checkpointed and exited on request (EX_TEMPFAIL): "not done,
# resume me from my checkpoint", as opposed to 0 (finished) or anything else (failed).
EXIT_CHECKPOINTED = 75


def write_json_atomic(path: Path, value: Any, owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` with ``value`` as JSON in one step (readers see old or new, never half).
    ``owner``: (uid, gid) the file is given to before it is renamed into place (so a reader of
    that user never sees one it cannot read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class ControlChannel:
    """Both ends of one job's control directory (the agent sends, the job polls)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.command_path = self.dir / COMMAND_FILE
        self.status_path = self.dir / STATUS_FILE
        self._seen_mtime: int | None = None
        self._last_command: dict[str, Any] | None = None
        #: (uid, gid) the command files are given to (the job's user, when it is not the agent's)
        self.file_owner: tuple[int, int] | None = None

    # ---- agent side
    def send(self, action: str, devices: list[str] | None = None) -> int:
        """Post a command; returns its sequence number (acknowledged in status ``seq_done``)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown control action {action!r}; expected one of {ACTIONS}")
        current = read_json(self.command_path) or {}
        seq = int(current.get("seq", 0)) + 1
        write_json_atomic(
            self.command_path,
            {"seq": seq, "action": action, "devices": devices, "sent_at": time.time()},
            self.file_owner,
        )
        return seq

    def status(self) -> dict[str, Any] | None:
        status = read_json(self.status_path)
        return status if isinstance(status, dict) else None

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, poll: float = 0.01
    ) -> dict[str, Any]:
        """Poll the job's status until ``predicate`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status is not None and predicate(status):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job status in {self.dir} did not reach the condition: {status}")
            time.sleep(poll)

    def wait_ack(self, seq: int, timeout: float) -> dict[str, Any]:
        return self.wait_status(lambda s: int(s.get("seq_done", 0)) >= seq, timeout)

    # ---- job side
    def poll(self) -> dict[str, Any] | None:
        """The current command if the file changed since the last poll (one ``stat`` otherwise)."""
        try:
            mtime = os.stat(self.command_path).st_mtime_ns
        except FileNotFoundError:
            return None
        if mtime == self._seen_mtime:
            return None
        self._seen_mtime = mtime
        self._last_command = read_json(self.command_path)
        return self._last_command

    def last_seq(self) -> int:
        cmd = read_json(self.command_path)
        return int(cmd.get("seq", 0)) if cmd else 0

    def report(self, status: dict[str, Any]) -> None:
        write_json_atomic(self.status_path, status)
