"""Pure state transitions of a job record: each takes a ``JobRecord`` and returns the new one
(no I/O; the reconciler and the decision applier call them and save the result)."""

from __future__ import annotations

import logging

from . import _metrics as M
from ._record import CANCELLED, FAILED, FINISHED, PACKED, QUEUED, RUNNING, SUSPENDED, JobRecord

log = logging.getLogger(__name__)


def lost(rec: JobRecord, why: str, now: float, max_restarts: int) -> JobRecord:
    """The job's process is gone (node lost, killed): back to the queue, from its checkpoint if
    it has one, or failed once it was restarted more than ``max_restarts`` times."""
    M.LOST.inc()
    rec = rec.released(restarts=rec.restarts + 1)
    if rec.restarts > max_restarts:
        return rec.with_state(FAILED, f"{why}; gave up after {max_restarts} restarts", now, finished_at=now)
    log.warning("job lost", extra={"job": rec.id, "why": why})
    if rec.checkpoint_step >= 0:
        return rec.with_state(
            SUSPENDED, f"{why}; will resume from checkpoint step {rec.checkpoint_step}", now
        )
    return rec.with_state(QUEUED, f"{why}; no checkpoint yet, will restart from the beginning", now)


def cancelled(rec: JobRecord, now: float) -> JobRecord:
    return rec.released().with_state(CANCELLED, "cancelled by the user", now, finished_at=now)


def finished(rec: JobRecord, message: str, now: float) -> JobRecord:
    return rec.released().with_state(FINISHED, message, now, finished_at=now)


def failed(rec: JobRecord, message: str, now: float) -> JobRecord:
    return rec.released().with_state(FAILED, message, now, finished_at=now)


def parked(rec: JobRecord, now: float) -> JobRecord:
    """Suspended with its process parked on its node (the decision's reason, which rode on the
    pending operation, goes into the history)."""
    reason = rec.pending.reason if rec.pending is not None else ""
    msg = f"suspended at step {rec.step} (parked on {rec.node})"
    return rec.with_state(
        SUSPENDED,
        f"{msg}: {reason}" if reason else msg,
        now,
        devices=(),
        packed_with=(),
        pending=None,
        parked=True,
    )


def packing(rec: JobRecord, partners: list[str], now: float) -> JobRecord:
    """A running job's partners on its devices: PACKED with some, RUNNING alone."""
    state = PACKED if partners else RUNNING
    if state == rec.state:
        return rec.with_state(state, rec.message, now, packed_with=tuple(partners))
    message = (
        f"packed with {', '.join(partners)}" if partners else f"running alone on {', '.join(rec.devices)}"
    )
    return rec.with_state(state, message, now, packed_with=tuple(partners), step_at_change=rec.step)
