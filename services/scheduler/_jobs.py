"""Job records: validation of a spec, a new record, and proto and policy-view conversion.

The record itself (frozen, typed, its JSON) is ``_record.JobRecord``.

Pure functions, no I/O: the servicer, the core and the unit tests share them.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from microco.api.scheduler.v1 import scheduler_pb2
from microco.clients.scheduler import spec_from_pb as spec_from_pb  # the one wire mapping
from microco.clients.scheduler import spec_to_pb as spec_to_pb
from microco.common.errors import InvalidArgument

from ._record import (  # the states, re-exported: J.RUNNING etc.
    CANCELLED,
    FAILED,
    FINISHED,
    HOLDING,
    MIGRATING,
    PACKED,
    QUEUED,
    RUNNING,
    STATES,
    SUSPENDED,
    TERMINAL,
    JobRecord,
    JobSpec,
    StateChange,
)

__all__ = [
    "CANCELLED",
    "FAILED",
    "FINISHED",
    "HOLDING",
    "MIGRATING",
    "PACKED",
    "QUEUED",
    "RUNNING",
    "STATES",
    "SUSPENDED",
    "TERMINAL",
    "JobRecord",
    "JobSpec",
]

JOBS_PREFIX = "/microco/scheduler/jobs/"

_STATE_TO_PB: dict[str, scheduler_pb2.JobState] = {
    QUEUED: scheduler_pb2.JOB_STATE_QUEUED,
    RUNNING: scheduler_pb2.JOB_STATE_RUNNING,
    SUSPENDED: scheduler_pb2.JOB_STATE_SUSPENDED,
    PACKED: scheduler_pb2.JOB_STATE_PACKED,
    MIGRATING: scheduler_pb2.JOB_STATE_MIGRATING,
    FINISHED: scheduler_pb2.JOB_STATE_FINISHED,
    FAILED: scheduler_pb2.JOB_STATE_FAILED,
    CANCELLED: scheduler_pb2.JOB_STATE_CANCELLED,
}
_PB_TO_STATE: dict[int, str] = {int(v): k for k, v in _STATE_TO_PB.items()}


def state_to_pb(state: str) -> scheduler_pb2.JobState:
    return _STATE_TO_PB[state]


def state_from_pb(value: int) -> str:
    try:
        return _PB_TO_STATE[value]
    except KeyError:
        raise InvalidArgument(f"unknown job state {value}") from None


def job_key(job_id: str) -> str:
    return JOBS_PREFIX + job_id


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]


def validate_spec(
    spec: Mapping[str, Any], cluster_devices: int | None, check_command: bool = True
) -> JobSpec:
    """A clean ``JobSpec``, or ``InvalidArgument`` saying exactly what is wrong.

    ``cluster_devices`` is how many devices the registered nodes offer (None: do not check).
    """
    problems = []
    command = [str(c) for c in spec.get("command") or []]
    devices = int(spec.get("devices", 0))
    if not command:
        problems.append("command is empty: give the argv of the training process")
    elif check_command and shutil.which(command[0]) is None:
        problems.append(f"command not found: {command[0]!r} is not an executable on the scheduler's PATH")
    if devices <= 0:
        problems.append(f"devices must be at least 1 (got {devices})")
    elif cluster_devices is not None and devices > cluster_devices:
        problems.append(f"job wants {devices} devices but the cluster has {cluster_devices}")
    total_steps = int(spec.get("total_steps") or 0)
    if total_steps < 0:
        problems.append("total_steps must not be negative")
    max_devices = int(spec.get("max_devices") or 0)
    if max_devices and max_devices < devices:
        problems.append("max_devices must be at least devices")
    try:
        gpu_share = float(spec.get("gpu_share") or 1.0)
    except (TypeError, ValueError):
        gpu_share = float("nan")
    if not 0.0 < gpu_share <= 1.0:  # also refuses NaN
        problems.append(f"gpu_share must be in (0, 1] (got {spec.get('gpu_share')!r})")
    elif gpu_share < 1.0 and devices != 1:
        problems.append("gpu_share below 1 is for one-device jobs only")
    problems += _size_problems(spec, command)
    problems += _exec_problems(spec, command)
    if problems:
        raise InvalidArgument("invalid job spec: " + "; ".join(problems))
    return JobSpec(
        name=str(spec.get("name") or ""),
        command=tuple(command),
        devices=devices,
        elastic=bool(spec.get("elastic", False)),
        priority=int(spec.get("priority") or 0),
        user=str(spec.get("user") or ""),
        tenant=str(spec.get("tenant") or ""),
        env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
        workdir=str(spec.get("workdir") or ""),
        total_steps=total_steps,
        model=str(spec.get("model") or ""),
        max_devices=max_devices,
        gpu_share=gpu_share,
    )


# A job's record lives in one etcd value (1.5 MiB at most by default, and a compare-and-swap
# carries it twice): the parts a user writes are bounded well below that.
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 64 * 1024
MAX_COMMAND_ARGS = 4096
MAX_COMMAND_BYTES = 64 * 1024
MAX_NAME_CHARS = 200
MAX_PATH_CHARS = 4096


def _size_problems(spec: Mapping[str, Any], command: list[str]) -> list[str]:
    out = []
    env = spec.get("env") or {}
    env_bytes = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in env.items())
    if len(env) > MAX_ENV_VARS or env_bytes > MAX_ENV_BYTES:
        out.append(
            f"env has {len(env)} variables, {env_bytes} bytes: at most {MAX_ENV_VARS} and "
            f"{MAX_ENV_BYTES} bytes (pass large settings in a file the job reads)"
        )
    command_bytes = sum(len(c.encode()) for c in command)
    if len(command) > MAX_COMMAND_ARGS or command_bytes > MAX_COMMAND_BYTES:
        out.append(
            f"command has {len(command)} arguments, {command_bytes} bytes: at most "
            f"{MAX_COMMAND_ARGS} and {MAX_COMMAND_BYTES} bytes"
        )
    for field, limit in (
        ("name", MAX_NAME_CHARS),
        ("user", MAX_NAME_CHARS),
        ("tenant", MAX_NAME_CHARS),
        ("model", MAX_NAME_CHARS),
        ("workdir", MAX_PATH_CHARS),
    ):
        n = len(str(spec.get(field) or ""))
        if n > limit:
            out.append(f"{field} is {n} characters long: at most {limit}")
    return out


def _exec_problems(spec: Mapping[str, Any], command: list[str]) -> list[str]:
    """What no process can be started with: a NUL byte in an argument, in the environment or in
    the working directory, an environment name that is empty or holds '='. Such a job was taken,
    then failed to start on every node it was placed on, tick after tick (the agent's exec
    raised, and the scheduler took that for the node's fault and queued it again): session 42."""
    out = []
    if any("\0" in c for c in command):
        out.append("an argument of command holds a NUL byte")
    env = spec.get("env") or {}
    names = [str(k) for k in env if not str(k) or "=" in str(k) or "\0" in str(k)]
    if names:
        out.append(f"env names must be non-empty, without '=' or NUL bytes (got {names[0][:40]!r})")
    if any("\0" in str(v) for v in env.values()):
        out.append("an env value holds a NUL byte")
    if "\0" in str(spec.get("workdir") or ""):
        out.append("workdir holds a NUL byte")
    return out


def new_record(spec: JobSpec, now: float | None = None) -> JobRecord:
    now = time.time() if now is None else now
    job_id = f"{_slug(spec.name) or 'job'}-{uuid.uuid4().hex[:8]}"
    return JobRecord(
        id=job_id,
        spec=spec,
        state=QUEUED,
        submitted_at=now,
        last_change_at=now,
        message="queued",
        history=(StateChange(now, QUEUED, "submitted"),),
    )


def as_record(rec: JobRecord | Mapping[str, Any]) -> JobRecord:
    """``rec`` as a ``JobRecord`` (a stored JSON dict is read with ``JobRecord.from_dict``)."""
    return rec if isinstance(rec, JobRecord) else JobRecord.from_dict(rec)


def log_job_ids(records: Iterable[JobRecord], now: float, log_retention_s: float) -> set[str]:
    """Ended jobs whose logs the nodes keep for their users (their other data may go): those
    that ended less than ``log_retention_s`` ago."""
    return {
        r.id for r in records if r.terminal and now - (r.finished_at or r.last_change_at) < log_retention_s
    }


def retained_job_ids(records: Iterable[JobRecord], now: float, failed_retention_s: float) -> set[str]:
    """Jobs whose data (checkpoints, logs) the nodes must keep: every job not yet terminal
    (a resume needs its checkpoint), and failed jobs for ``failed_retention_s`` after they
    failed, so a user can inspect them. Finished and cancelled jobs need nothing."""
    keep = set()
    for r in records:
        ended_at = r.finished_at or r.last_change_at
        failed_recently = r.state == FAILED and now - ended_at < failed_retention_s
        if not r.terminal or failed_recently:
            keep.add(r.id)
    return keep


def record_to_pb(rec: JobRecord | Mapping[str, Any]) -> scheduler_pb2.Job:
    rec = as_record(rec)
    return scheduler_pb2.Job(
        id=rec.id,
        spec=spec_to_pb(rec.spec.to_dict()),
        state=state_to_pb(rec.state),
        device_ids=rec.devices,
        node=rec.node,
        step=rec.step,
        submitted_at=rec.submitted_at,
        first_step_at=rec.first_step_at,
        finished_at=rec.finished_at,
        minibatch_ms=rec.minibatch_ms,
        message=rec.message,
        attempt=rec.attempt,
        checkpoint_step=rec.checkpoint_step,
        restarts=rec.restarts,
        packed_with=rec.packed_with,
        attained_service_s=rec.attained_service_s,
        minibatch_ms_alone=rec.minibatch_ms_alone,
        utilization=rec.utilization,
        last_change_at=rec.last_change_at,
        history=[
            scheduler_pb2.StateChange(at=h.at, state=state_to_pb(h.state), message=h.message)
            for h in rec.history
        ],
    )


def record_to_view(rec: JobRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The dict a policy's ``JobView`` is built from (see policy.job_view_from_dict)."""
    rec = as_record(rec)
    spec = rec.spec
    return {
        "id": rec.id,
        "devices_wanted": spec.devices,
        "elastic": spec.elastic,
        "priority": spec.priority,
        "owner": spec.user,
        "submitted_at": rec.submitted_at,
        "state": rec.state,
        "devices": list(rec.devices) if rec.holding else [],
        "attained_service_s": rec.attained_service_s,
        "minibatch_ms": rec.minibatch_ms or None,
        "minibatch_ms_alone": rec.minibatch_ms_alone or None,
        "utilization": rec.utilization,
        "steps_done": rec.step,
        "total_steps": spec.total_steps or None,
        "packed_with": list(rec.packed_with),
        "last_change_at": rec.last_change_at,
        "model": spec.model,
        "max_devices": spec.max_devices or None,
        "gpu_share": spec.gpu_share or 1.0,
    }
