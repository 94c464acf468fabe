"""What the scheduler tells the other systems about its jobs: one small etcd key per job.

The scheduler's job records (``/microco/scheduler/jobs/``) are its own working state, large and
rewritten at every tick. What another system needs is far less and changes far less often: is
the job running (and where), waiting, suspended, about to get its time slice, migrating (and
to where), or gone. The scheduler publishes that here, a key written only when it changes:

    /microco/scheduler/phases/<job id>  ->  {"job_id", "phase", "node", "target", "at"}

The cache servers watch the prefix (a scheduler-aware cache: prefetch for the job about to
resume, keep a suspended job's allocation, drop a finished job's pins at once, warm the host a
migrating job is going to). Both ends share this module, so it lives with the scheduler's
client side; it reads a job record as plain JSON and imports nothing of the service.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from microco.common.kv import KV

PHASES_PREFIX = "/microco/scheduler/phases/"

RUNNING, WAITING, SUSPENDED, RESUMING, MIGRATING, FINISHED = (
    "running",
    "waiting",
    "suspended",
    "resuming",
    "migrating",
    "finished",
)
PHASES = (RUNNING, WAITING, SUSPENDED, RESUMING, MIGRATING, FINISHED)

# Scheduler record states (services/scheduler/_jobs.py) -> phases.
_OF_STATE = {
    "queued": WAITING,
    "running": RUNNING,
    "packed": RUNNING,
    "suspended": SUSPENDED,
    "migrating": MIGRATING,
    "finished": FINISHED,
    "failed": FINISHED,
    "cancelled": FINISHED,
}


@dataclass(frozen=True)
class JobPhase:
    """One job as the other systems see it. ``node``: where it runs or last ran; ``target``:
    where a migrating job is going (empty when not known yet)."""

    job_id: str
    phase: str
    node: str = ""
    target: str = ""
    at: float = 0.0

    def same(self, other: JobPhase | None) -> bool:
        """Equal but for the time stamp (nothing to publish)."""
        return other is not None and (self.phase, self.node, self.target) == (
            other.phase,
            other.node,
            other.target,
        )


def phase_key(job_id: str) -> str:
    return PHASES_PREFIX + job_id


def job_phases(
    records: Iterable[Mapping[str, Any]], now: float, next_jobs: Iterable[str] | None = None
) -> dict[str, JobPhase]:
    """The phase of every job record. Of the jobs waiting for devices (queued or suspended)
    the one that would get the next time slice is ``resuming`` whenever some job runs: its
    data can be brought in while the others' slice ends. ``next_jobs``: the ones the policy
    says it will run next (``microco.services.scheduler.policy.next_to_run``), all of them
    ``resuming``; without it, the least attained service first (Gandiva's order; the earliest
    changed among equals)."""
    out: dict[str, JobPhase] = {}
    waiting: list[Mapping[str, Any]] = []
    running = False
    for rec in records:
        phase = _OF_STATE.get(str(rec.get("state")), WAITING)
        target = ""
        if phase == MIGRATING:
            pending = rec.get("pending") or {}
            target = str(pending.get("node") or pending.get("target") or "")
        out[rec["id"]] = JobPhase(rec["id"], phase, str(rec.get("node") or ""), target, now)
        if phase in (WAITING, SUSPENDED):
            waiting.append(rec)
        running = running or phase == RUNNING
    if next_jobs is not None:
        chosen = set(next_jobs)
        for rec in waiting:
            if running and rec["id"] in chosen:
                p = out[rec["id"]]
                out[rec["id"]] = JobPhase(p.job_id, RESUMING, p.node, p.target, now)
    elif running and waiting:
        nxt = min(
            waiting,
            key=lambda r: (
                float(r.get("attained_service_s") or 0.0),
                float(r.get("last_change_at") or 0.0),
                r["id"],
            ),
        )
        p = out[nxt["id"]]
        out[nxt["id"]] = JobPhase(p.job_id, RESUMING, p.node, p.target, now)
    return out


class PhasePublisher:
    """Writes the phases that changed since the last call (and deletes those of jobs whose
    records are gone). The scheduler calls :meth:`publish` once per tick."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self._last: dict[str, JobPhase] = {}
        self.writes = 0

    def publish(
        self, records: Iterable[Mapping[str, Any]], now: float, next_jobs: Iterable[str] | None = None
    ) -> None:
        phases = job_phases(records, now, next_jobs)
        for job_id, p in phases.items():
            last = self._last.get(job_id)
            if p.phase == MIGRATING and last is not None and last.phase == MIGRATING and not p.target:
                p = phases[job_id] = JobPhase(p.job_id, p.phase, p.node, last.target, p.at)
            if p.same(last):
                continue
            self.kv.put_json(phase_key(job_id), asdict(p))
            self._last[job_id] = p
            self.writes += 1
        self._forget_gone(phases)

    def moving(self, job_id: str, node: str, target: str, now: float) -> None:
        """Publish at once that ``job_id`` leaves ``node`` for ``target`` (before it stops, so
        the new host's cache warms while the job checkpoints and restarts)."""
        p = JobPhase(job_id, MIGRATING, node, target, now)
        self.kv.put_json(phase_key(job_id), asdict(p))
        self._last[job_id] = p
        self.writes += 1

    def _forget_gone(self, phases: Mapping[str, JobPhase]) -> None:
        for job_id in [j for j in self._last if j not in phases]:
            self.kv.delete(phase_key(job_id))
            del self._last[job_id]
            self.writes += 1


def read_phases(kv: KV) -> dict[str, JobPhase]:
    return {doc["job_id"]: JobPhase(**doc) for _, doc in kv.get_prefix_json(PHASES_PREFIX)}


def watch_phases(kv: KV, on_phase: Callable[[str, JobPhase | None], None]) -> Callable[[], None]:
    """Call ``on_phase(job_id, phase)`` for every change (``None``: the job's key was deleted);
    returns the function that stops watching. Phases already published are not replayed:
    read them first with :func:`read_phases`."""

    def on_event(ev: Any) -> None:
        job_id = ev.key[len(PHASES_PREFIX) :]
        if ev.kind == "delete" or ev.value is None:
            on_phase(job_id, None)
            return
        on_phase(job_id, JobPhase(**json.loads(ev.value)))

    return kv.watch_prefix(PHASES_PREFIX, on_event)
