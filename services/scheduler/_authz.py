"""Who may do what to a job (docs/security.md): the owner comes from the caller's identity; a
user acts on their own jobs (an administrator or a platform service on all), a job's process on
itself only; environment values that look like secrets go to the job's owner and the job itself
alone, and list calls never return them."""

from __future__ import annotations

import re
from typing import Any

from microco.api.scheduler.v1 import scheduler_pb2
from microco.common.errors import PermissionDenied
from microco.services.runtime.auth import Caller

from ._record import JobRecord

REDACTED = "<redacted>"
_SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT)", re.I)


def looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def owned_spec(who: Caller, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its owner set from the caller: a user submits as themselves (naming another
    owner is refused); a platform service or an administrator may submit for a named user."""
    named = spec.get("user") or ""
    if who.kind == "job":
        raise PermissionDenied(f"{who.name} may not submit jobs: a job acts only on itself")
    if who.trusted:
        return {**spec, "user": named or who.subject or named}
    if named and named != who.subject:
        raise PermissionDenied(f"{who.name} may not submit a job owned by {named!r}")
    return {**spec, "user": who.subject}


def check_job(who: Caller, rec: JobRecord, what: str) -> None:
    who.require_job(rec.id, rec.spec.user, what)


def visible(who: Caller, rec: JobRecord) -> bool:
    return who.may_act_on_job(rec.id, rec.spec.user)


def sees_secrets(who: Caller, rec: JobRecord) -> bool:
    """Whether ``who`` reads the values of ``rec``'s secret-looking environment variables: its
    owner and the job itself (and anyone in insecure mode, where every call is allowed). An
    administrator or a platform service acts on the job without them: the console reads jobs as
    ``service:console``, and its job page showed every job's ``API_KEY`` to whoever held any of
    its tokens, the read-only one too (session 42)."""
    if who.insecure:
        return True
    if who.kind == "user":
        return who.subject == rec.spec.user
    return who.kind == "job" and who.subject == rec.id


def redact(job: scheduler_pb2.Job) -> scheduler_pb2.Job:
    """The job as a list call returns it: secret-looking environment values replaced."""
    for k in list(job.spec.env):
        if looks_secret(k):
            job.spec.env[k] = REDACTED
    return job
