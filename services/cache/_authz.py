"""Who may report for a job to the cache (docs/security.md). A report sets a job's dataset size
and ``finished`` (which drops its allocation and pins): only the job itself, its owner, or a
platform service / administrator may send it. A job the scheduler does not know (a loader run
outside the platform) belongs to the first identity that reports for it on this server."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from microco.common.errors import PermissionDenied
from microco.services.runtime.auth import Caller, job_owner

MAX_CLAIMS = 100_000


class JobReports:
    def __init__(self, kv: Any = None) -> None:
        self.kv = kv
        self._claims: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, who: Caller, job_id: str, user: str) -> str:
        """Refuse a report the caller may not send; the user the report counts for."""
        if who.trusted:
            return user
        # the ranks of a job report as "<job id>/rank<r>" (clients/cache QuiverLoader)
        base = job_id.split("/", 1)[0]
        if who.kind == "job":
            if who.subject != base:
                raise PermissionDenied(
                    f"{who.name} may not report for job {job_id!r}: a job reports only for itself"
                )
            owner = job_owner(self.kv, base)
            return owner if owner else user
        owner = job_owner(self.kv, base)
        if owner is not None:
            who.require_job(base, owner, "report cache progress")
            return owner
        with self._lock:
            claimed = self._claims.setdefault(job_id, who.name)
            self._claims.move_to_end(job_id)
            while len(self._claims) > MAX_CLAIMS:
                self._claims.popitem(last=False)
        if claimed != who.name:
            raise PermissionDenied(f"{who.name} may not report for job {job_id!r}: it is {claimed}'s")
        return who.subject
