"""What the leader did, for operators, tests and Prometheus: the recent decisions applied, the
count of jobs per state, and the phases other systems follow (see clients/scheduler/_phases)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from microco.clients.scheduler import PhasePublisher
from microco.common.errors import MicrocoError

from . import _metrics as M
from ._record import STATES, JobRecord
from .policy import Decision

log = logging.getLogger(__name__)

KEEP_DECISIONS = 200


class DecisionLog:
    """The last ``KEEP_DECISIONS`` decisions applied (oldest first), as plain dicts."""

    def __init__(self) -> None:
        self.recent: list[dict[str, Any]] = []

    def applied(self, d: Decision, now: float) -> None:
        M.DECISIONS.labels(type(d).__name__, "done").inc()
        entry = {
            "at": now,
            "decision": type(d).__name__,
            "job": d.job_id,
            "devices": list(getattr(d, "devices", ())),
            "reason": d.reason,
        }
        # A new list each time: a reader holding the old one never sees it change.
        self.recent = [*self.recent, entry][-KEEP_DECISIONS:]

    @staticmethod
    def refused(d: Decision, exc: Exception) -> None:
        M.DECISIONS.labels(type(d).__name__, "refused").inc()
        log.warning("decision %s refused: %s", d, exc)


def count_states(records: Iterable[JobRecord]) -> None:
    """The jobs-per-state gauge."""
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.state] = counts.get(rec.state, 0) + 1
    for state in STATES:
        M.JOBS.labels(state).set(counts.get(state, 0))


def publish_phases(
    phases: PhasePublisher, records: Iterable[JobRecord], now: float, next_jobs: Iterable[str] | None = None
) -> None:
    """The jobs' phases for the cache (advice: a failure never fails a tick). ``next_jobs``:
    the jobs the policy will run next (``policy.next_to_run``), published as ``resuming``."""
    try:
        phases.publish([_phase_input(r) for r in records], now, next_jobs)
    except MicrocoError as exc:
        log.warning("cannot publish job phases: %s", exc)


def _phase_input(rec: JobRecord) -> dict[str, Any]:
    """What ``job_phases`` reads of a record (the clients layer sees no ``JobRecord``)."""
    return {
        "id": rec.id,
        "state": rec.state,
        "node": rec.node,
        "pending": None if rec.pending is None else rec.pending.to_dict(),
        "attained_service_s": rec.attained_service_s,
        "last_change_at": rec.last_change_at,
    }
