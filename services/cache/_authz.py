"""Who may report for a job to the cache (docs/security.md). A report sets a job's dataset size
and ``finished`` (which drops its allocation and pins): only the job itself, its owner, or a
platform service / administrator may send it. A job the scheduler does not know (a loader run
outside the platform) belongs to the first identity that reports for it on this server."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
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

    def owner(self, job_id: str) -> str:
        """Whom job ``job_id`` (a rank's ``<job>/rank<r>`` too) reports for: ``user:<owner>`` of a
        job the scheduler knows, else the identity that reported for it first here ("": none)."""
        owner = job_owner(self.kv, job_id.split("/", 1)[0])
        if owner:
            return f"user:{owner}"
        with self._lock:
            return self._claims.get(job_id, "")


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


class Visibility:
    """What a caller may learn from ``GetStats`` and ``GetAllocations`` (docs/security.md): a
    platform service or an administrator (the console, an operator) everything; a user, or a
    job, only datasets its principal named first on this server (``DatasetClaims``) and jobs
    that report for it (``JobReports``), with the server's totals. Another user's dataset names,
    sizes and job ids stay theirs, as their registrations in etcd and their jobs in the
    scheduler do: a shared cache used to list them all to anyone who asked."""

    def __init__(self, datasets: DatasetClaims, reports: JobReports) -> None:
        self.datasets = datasets
        self.reports = reports

    def _mine(self, who: Caller) -> tuple[Callable[[str], bool], Callable[[str], bool]]:
        me = self.datasets.principal(who)
        user = me.removeprefix("user:") if me.startswith("user:") else ""

        def dataset(name: str) -> bool:
            owner = self.datasets.owner(name)
            if owner:
                return owner == me
            # Named by no user here yet (a platform service warmed it: the scheduler's follower
            # on a job's next node, before the job's first read there): the user whose name it
            # is qualified by (``owner/name``, as the registry names a user's datasets). CI,
            # session 40: a migrated job could not see its own dataset warm on its new node.
            return bool(user) and name.split("/", 1)[0] == user and "/" in name

        def job(job_id: str) -> bool:
            own = who.kind == "job" and job_id.split("/", 1)[0] == who.subject
            return own or self.reports.owner(job_id) == me

        return dataset, job

    def stats(self, who: Caller, stats: dict[str, Any]) -> dict[str, Any]:
        if who.trusted:
            return stats
        dataset, job = self._mine(who)
        return {
            **stats,
            "datasets": {k: v for k, v in stats["datasets"].items() if dataset(k)},
            "jobs": [j for j in stats["jobs"] if job(j)],
            "job_stats": [s for s in stats["job_stats"] if job(s["job_id"])],
        }

    def allocations(
        self, who: Caller, table: list[tuple[Any, int]], members: Callable[[str], frozenset[str]]
    ) -> list[tuple[Any, int]]:
        """Allocations of the caller's datasets; a content group shared with other users' names
        shows the caller's names and how many others, its jobs the caller's, and its reason with
        the others' names and jobs left out."""
        if who.trusted:
            return table
        dataset, job = self._mine(who)
        out = []
        for a, used in table:
            names = sorted(members(a.dataset))
            mine = [n for n in names if dataset(n)]
            if not mine:
                continue
            theirs = [n for n in names if not dataset(n)]
            hidden = [j for j in a.jobs if not job(j)]
            reason = a.reason
            for name in sorted(theirs + hidden, key=len, reverse=True):
                reason = reason.replace(name, "another user's")
            label = "+".join(mine) + (f" (+{len(theirs)} of other users)" if theirs else "")
            jobs = tuple(j for j in a.jobs if job(j))
            out.append((dataclasses.replace(a, dataset=label, jobs=jobs, reason=reason), used))
        return out
