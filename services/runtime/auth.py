"""Who is calling: the authenticated peer of a gRPC call, and the checks servicers make on it.

Every server requires a client certificate from the platform's CA (mutual TLS), so a call that
reaches a servicer has a verified peer; :func:`caller` reads it into a :class:`Caller`. The
rules (docs/security.md):

- ``service:<name>``: a platform service; acts on behalf of any user (the console submits for
  the person signed in to it, the scheduler starts their processes). A few calls are one
  service's alone: process control on an agent is the scheduler's.
- ``user:<name>``: acts on their own jobs, datasets and tables; an administrator on all.
- ``job:<id>``: one job's processes; act only as that job.

In insecure development mode (no TLS) every call is allowed, as the flag says.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from microco.common.errors import PermissionDenied, Unauthenticated
from microco.common.identity import REVOKED_PREFIX, check_not_revoked, peer_name, set_revoked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    name: str  # "user:alice", "service:scheduler", "job:j-1"; "" without TLS (insecure mode)
    admin: bool = False

    @property
    def kind(self) -> str:
        return self.name.partition(":")[0] if self.name else "insecure"

    @property
    def subject(self) -> str:
        return self.name.partition(":")[2]

    @property
    def insecure(self) -> bool:
        return not self.name

    @property
    def trusted(self) -> bool:
        """May act on every user's resources: a platform service, an administrator, or anyone
        in insecure mode."""
        return self.insecure or self.admin or self.kind == "service"

    def is_service(self, *names: str) -> bool:
        return self.kind == "service" and (not names or self.subject in names)

    def owns(self, owner: str) -> bool:
        """Whether the caller may act on a resource of user ``owner``."""
        return self.trusted or (self.kind == "user" and self.subject == owner)

    def may_act_on_job(self, job_id: str, owner: str) -> bool:
        """A job's owner, the job itself, or a trusted caller."""
        return self.owns(owner) or (self.kind == "job" and self.subject == job_id)

    # -- checks that raise PERMISSION_DENIED with a one-line message
    def require_service(self, *names: str, what: str) -> None:
        if self.insecure or self.is_service(*names):
            return
        allowed = " or ".join(f"service:{n}" for n in names) if names else "a platform service"
        raise PermissionDenied(f"{self.name} may not {what}: only {allowed} may")

    def require_owner(self, owner: str, what: str) -> None:
        if not self.owns(owner):
            raise PermissionDenied(f"{self.name} may not {what}: it belongs to user {owner!r}")

    def require_job(self, job_id: str, owner: str, what: str) -> None:
        if not self.may_act_on_job(job_id, owner):
            raise PermissionDenied(f"{self.name} may not {what} of job {job_id!r} (owner {owner!r})")

    def require_user_or_trusted(self, what: str) -> None:
        if self.kind == "job":
            raise PermissionDenied(f"{self.name} may not {what}: a job acts only on itself")


INSECURE = Caller("")


def caller(context: Any) -> Caller:
    """The authenticated peer of a call. A secure server only accepts connections with a
    client certificate from its CA; a plaintext one (insecure mode) yields :data:`INSECURE`."""
    try:
        auth = context.auth_context()
    except (AttributeError, NotImplementedError):
        return INSECURE  # an in-process call with no transport (tests of a servicer alone)
    if not isinstance(auth, dict):
        return INSECURE  # likewise (a stand-in context)
    certs = auth.get("x509_pem_cert") or []
    if not certs:
        if auth.get("transport_security_type") == [b"ssl"]:
            raise Unauthenticated(
                "no client certificate: every call needs credentials from the platform's CA"
            )
        return INSECURE
    pem = certs[0] if isinstance(certs[0], bytes) else str(certs[0]).encode()
    name, admin = peer_name(pem)
    check_not_revoked(name, pem)
    return Caller(name, admin)


class Revocations:
    """Keeps this process's deny-list (``microco.common.identity.set_revoked``) equal to etcd's
    ``REVOKED_PREFIX``: loaded at start, followed by a watch, and reloaded every
    ``interval_s`` (a watch lost while etcd was away is made good within that)."""

    def __init__(self, kv: Any, interval_s: float = 10.0) -> None:
        self.kv = kv
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._cancel: Any = None
        self._thread: threading.Thread | None = None

    def load(self) -> dict[str, float]:
        entries: dict[str, float] = {}
        for key, raw in self.kv.get_prefix(REVOKED_PREFIX):
            try:
                entries[key[len(REVOKED_PREFIX) :]] = float(json.loads(raw)["at"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed revocation %s", key)
        set_revoked(entries)
        return entries

    def start(self) -> Revocations:
        try:
            self.load()
            self._cancel = self.kv.watch_prefix(REVOKED_PREFIX, lambda _ev: self._reload())
        except Exception as exc:  # noqa: BLE001 - etcd away: the loop below retries
            log.warning("revocation list not loaded yet: %s", exc)
        self._thread = threading.Thread(target=self._loop, name="revocations", daemon=True)
        self._thread.start()
        return self

    def _reload(self) -> None:
        try:
            self.load()
        except Exception as exc:  # noqa: BLE001 - kept until the next reload
            log.warning("revocation list not reloaded: %s", exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._reload()

    def stop(self) -> None:
        self._stop.set()
        if self._cancel is not None:
            try:
                self._cancel()
            except Exception:  # noqa: BLE001, S110 - a watch on a closed client
                pass


# The scheduler's job records (``services/scheduler/_jobs.JOBS_PREFIX``): the owner of a job,
# for the services that hold only its id (an agent's logs, the cache's reports).
JOB_RECORDS_PREFIX = "/microco/scheduler/jobs/"


def job_owner(kv: Any, job_id: str) -> str | None:
    """The owner of job ``job_id``, ``None`` when there is no such job."""
    if not job_id or kv is None:
        return None
    rec = kv.get_json(JOB_RECORDS_PREFIX + job_id)
    if not isinstance(rec, dict):
        return None
    return str((rec.get("spec") or {}).get("user") or "")


def require_job_access(who: Caller, kv: Any, job_id: str, what: str) -> None:
    """The caller is the job itself, its owner, or trusted; a job nobody knows is a trusted
    caller's alone (its owner cannot be established)."""
    if who.trusted or (who.kind == "job" and who.subject == job_id):
        return
    owner = job_owner(kv, job_id)
    if owner is None:
        raise PermissionDenied(
            f"{who.name} may not {what} of job {job_id!r}: no such job is known to be theirs"
        )
    who.require_job(job_id, owner, what)
