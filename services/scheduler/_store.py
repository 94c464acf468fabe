"""The job table: job records in etcd, read and written with compare-and-swap.

Any instance serves the API from here (``create``, ``get``, ``select``, ``watch``, and ``change``
for the two fields the API sets on an existing job: ``cancel_requested`` and ``operator``).
The leader's tick works on ``jobs``, the table it ``load``-ed at its start: ``keep`` puts a
changed record there, ``save`` also writes it. A record is never changed in place
(``JobRecord`` is frozen): ``jobs`` always holds the latest version of each.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Iterator
from typing import Any

from microco.common.errors import Aborted, InvalidArgument, MicrocoError, NotFound
from microco.common.kv import KV

from . import _jobs as J
from ._record import JobRecord


class JobStore:
    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.jobs: dict[str, JobRecord] = {}  # the tick's table: the latest of every record
        self._raw: dict[str, bytes] = {}  # what the tick last read or wrote, per job

    # ================================================================== API (any instance)
    def create(self, rec: JobRecord) -> None:
        if not self.kv.compare_and_swap(J.job_key(rec.id), None, rec.to_json()):
            raise MicrocoError("job id collision; submit again")

    def get(self, job_id: str) -> JobRecord:
        if not job_id:
            raise InvalidArgument("job id is required")
        raw = self.kv.get(J.job_key(job_id))
        if raw is None:
            raise NotFound(f"no job {job_id!r}")
        return JobRecord.from_json(raw)

    def read_all(self) -> list[JobRecord]:
        """Every record, in key order (as the tick's table holds them)."""
        return [JobRecord.from_json(raw) for _, raw in self.kv.get_prefix(J.JOBS_PREFIX)]

    def select(self, states: list[str] | None = None, owner: str = "") -> list[JobRecord]:
        out = self.read_all()
        if states:
            out = [r for r in out if r.state in states]
        if owner:
            out = [r for r in out if r.spec.user == owner]
        return sorted(out, key=lambda r: (r.submitted_at, r.id))

    def change(self, job_id: str, fn: Callable[[JobRecord], JobRecord | None]) -> JobRecord:
        """Apply ``fn`` to the stored record until the compare-and-swap holds; ``fn`` returns
        None to leave the record as it is (that record is returned)."""
        key = J.job_key(job_id)
        while True:
            raw = self.kv.get(key)
            if raw is None:
                raise NotFound(f"no job {job_id!r}")
            rec = JobRecord.from_json(raw)
            new = fn(rec)
            if new is None:
                return rec
            if self.kv.compare_and_swap(key, raw, new.to_json()):
                return new

    def watch(
        self, job_ids: list[str], active: Callable[[], bool], poll_s: float = 0.5
    ) -> Iterator[JobRecord]:
        """Every record change of the selected jobs (all when empty), starting with their current state."""
        wanted: set[str] = set(job_ids)
        q: queue.Queue[JobRecord] = queue.Queue()

        def on_event(ev: Any) -> None:
            if ev.kind == "put" and ev.value:
                rec = JobRecord.from_json(ev.value)
                if not wanted or rec.id in wanted:
                    q.put(rec)

        cancel = self.kv.watch_prefix(J.JOBS_PREFIX, on_event)
        try:
            for rec in self.select():
                if not wanted or rec.id in wanted:
                    yield rec
            missing = wanted - {r.id for r in self.select()}
            if missing:
                raise NotFound(f"no job {min(missing)!r}")
            while active():
                try:
                    yield q.get(timeout=poll_s)
                except queue.Empty:
                    continue
        finally:
            cancel()

    # ================================================================== the leader's tick
    def load(self) -> dict[str, JobRecord]:
        """Read every record: the tick's table."""
        self._raw, self.jobs = {}, {}
        for _key, raw in self.kv.get_prefix(J.JOBS_PREFIX):
            rec = JobRecord.from_json(raw)
            self._raw[rec.id] = raw
            self.jobs[rec.id] = rec
        return self.jobs

    def keep(self, rec: JobRecord) -> JobRecord:
        """``rec`` is now the latest version of its job (written by a later ``save``)."""
        self.jobs[rec.id] = rec
        return rec

    def save(self, rec: JobRecord) -> JobRecord:
        """Write ``rec`` over the version the tick last read or wrote; returns what is stored.

        On a lost race: the API changes only ``cancel_requested`` and ``operator`` (and the
        message), so those are merged exactly; anything else means another leader wrote (this
        one lost leadership mid-tick), and the tick is abandoned (``Aborted``)."""
        key = J.job_key(rec.id)
        while True:
            new = rec.to_json()
            old = self._raw.get(rec.id)
            if self.kv.compare_and_swap(key, old, new):
                self._raw[rec.id] = new
                return self.keep(rec)
            fresh = self.kv.get(key)
            if fresh is None:
                return self.keep(rec)
            theirs = JobRecord.from_json(fresh)
            mine_before = JobRecord.from_json(old) if old else None
            if mine_before is None or _api_free(theirs) != _api_free(mine_before):
                raise Aborted(f"job {rec.id} was changed by another scheduler; abandoning this tick")
            rec = dataclasses.replace(
                rec,
                cancel_requested=rec.cancel_requested or theirs.cancel_requested,
                operator=theirs.operator
                if mine_before.operator is None and theirs.operator is not None
                else rec.operator,  # an operator's command, also from the API
            )
            self._raw[rec.id] = fresh


def _api_free(rec: JobRecord) -> JobRecord:
    """The record without what the API may change on an existing job."""
    return dataclasses.replace(rec, cancel_requested=False, message="", operator=None)
