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


class DatasetClaims:
    """Who may insert chunks under a dataset name (docs/security.md). Chunks are content
    addressed (the server stores bytes only under their own digest), so nobody can plant
    other bytes under a digest; what a name is worth is its allocation: bytes inserted under
    a dataset count against its quota and may evict its chunks. A dataset name therefore
    belongs, on this server, to the first user (a job counts as its owner's; a job the
    scheduler does not know as itself) that names it in a ``Lookup``, ``PutChunks`` or
    ``ReportProgress``. Anyone else may insert under it only a chunk already known to belong
    to it (named by its owner's calls): those are the dataset's own bytes, verified against
    their digest, so sharing cached data between users stays safe and useful; and their
    calls do not teach the server which digests the name holds. Platform services and
    administrators may insert under any name."""

    def __init__(self, kv: Any = None) -> None:
        self.kv = kv
        self._claims: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def principal(self, who: Caller) -> str:
        """The user a caller acts for (``user:<name>``), or the job itself when no job record
        names its owner."""
        if who.kind == "job":
            owner = job_owner(self.kv, who.subject)
            return f"user:{owner}" if owner else who.name
        return who.name

    def owns(self, who: Caller, dataset: str) -> bool:
        """Whether ``who`` may name ``dataset`` as its own (claiming it if nobody has)."""
        if who.trusted or not dataset:
            return True
        me = self.principal(who)
        with self._lock:
            claimed = self._claims.setdefault(dataset, me)
            self._claims.move_to_end(dataset)
            while len(self._claims) > MAX_CLAIMS:
                self._claims.popitem(last=False)
        return claimed == me

    def owner(self, dataset: str) -> str:
        with self._lock:
            return self._claims.get(dataset, "")

    def check_insert(self, who: Caller, dataset: str, known: bool, digest: str) -> None:
        """Refuse a chunk ``who`` may not insert under ``dataset``; ``known``: whether the
        digest is already known to belong to that dataset."""
        if known or self.owns(who, dataset):
            return
        raise PermissionDenied(
            f"{who.name} may not insert chunk {digest[:12]}... under dataset {dataset!r}: the name is "
            f"{self.owner(dataset)}'s on this cache and the chunk is not one of its known chunks "
            "(use a dataset name of your own: identical bytes are still cached once)"
        )
