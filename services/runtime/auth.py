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
from microco.common.identity import REVOKED_PREFIX, check_not_revoked, peer_name, revoked, set_revoked
from microco.common.kv import WatchEvent

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
    if name in _ended_jobs and revoked(name, pem):
        raise Unauthenticated(
            f"{name} has ended: a finished job's credentials are no longer accepted "
            "(a running job's are; submit a new job to act again)"
        )
    check_not_revoked(name, pem)
    return Caller(name, admin)


# --------------------------------------------------------------------------- ended jobs
# A job's certificate (``job:<id>``, issued by the scheduler when it starts the job, valid 30
# days) stops authenticating when the job ends: the scheduler puts its name on the deny-list
# (``REVOKED_PREFIX``) with the reason ``ENDED`` in the tick in which the job ends, and every
# service follows that list (``Revocations``). The entry goes once any certificate it refuses
# has expired.

ENDED = "job ended"
JOB_REVOCATION_KEEP_S = 31 * 86400.0  # past the 30 days a job's certificate is valid
_ended_jobs: frozenset[str] = frozenset()


def revoke_ended_jobs(kv: Any, ended: set[str] | frozenset[str], now: float | None = None) -> list[str]:
    """Put ``job:<id>`` of every job in ``ended`` on the deny-list unless it is there (the
    scheduler's garbage collection, with the ids of its terminal jobs); drop ended-job entries
    older than a job certificate's life. Returns the names added."""
    import time

    now = time.time() if now is None else now
    prefix = REVOKED_PREFIX + "job:"
    present: set[str] = set()
    for key, raw in kv.get_prefix(prefix):
        job_id = key[len(prefix) :]
        present.add(job_id)
        try:
            entry = json.loads(raw)
            stale = entry.get("reason") == ENDED and now - float(entry["at"]) > JOB_REVOCATION_KEEP_S
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if stale and job_id not in ended:  # its record is gone too: nothing can name it again
            kv.delete(key)
    added = []
    for job_id in sorted(ended - present):
        kv.put(prefix + job_id, json.dumps({"at": now, "reason": ENDED}).encode())
        added.append(f"job:{job_id}")
    if added:
        log.info("credentials of %d ended jobs revoked", len(added))
    return added


class Revocations:
    """Keeps this process's deny-list (``microco.common.identity.set_revoked``) equal to etcd's
    ``REVOKED_PREFIX``: loaded at start, followed by a watch (each change applied as it comes:
    a job ending adds one entry, so the list is not read again whole), and reloaded every
    ``interval_s`` (a watch lost while etcd was away is made good within that)."""

    def __init__(self, kv: Any, interval_s: float = 10.0) -> None:
        self.kv = kv
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._cancel: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._entries: dict[str, float] = {}
        self._ended: set[str] = set()

    @staticmethod
    def _parse(key: str, raw: bytes) -> tuple[float, bool] | None:
        try:
            entry = json.loads(raw)
            return float(entry["at"]), entry.get("reason") == ENDED
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring a malformed revocation %s", key)
            return None

    def _publish(self) -> None:
        global _ended_jobs
        set_revoked(self._entries)
        _ended_jobs = frozenset(self._ended)

    def load(self) -> dict[str, float]:
        entries: dict[str, float] = {}
        ended = set()
        for key, raw in self.kv.get_prefix(REVOKED_PREFIX):
            name = key[len(REVOKED_PREFIX) :]
            parsed = self._parse(key, raw)
            if parsed is None:
                continue
            entries[name] = parsed[0]
            if parsed[1]:
                ended.add(name)
        with self._lock:
            self._entries, self._ended = entries, ended
            self._publish()
        return entries

    def _apply(self, event: WatchEvent) -> None:
        if not event.key.startswith(REVOKED_PREFIX):
            self._reload()
            return
        name = event.key[len(REVOKED_PREFIX) :]
        parsed = (
            None if event.kind == "delete" or event.value is None else self._parse(event.key, event.value)
        )
        with self._lock:
            if parsed is None:
                self._entries.pop(name, None)
                self._ended.discard(name)
            else:
                self._entries[name] = parsed[0]
                (self._ended.add if parsed[1] else self._ended.discard)(name)
            self._publish()

    def start(self) -> Revocations:
        try:
            self.load()
            self._cancel = self.kv.watch_prefix(REVOKED_PREFIX, self._apply)
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


def may_access_job(who: Caller, kv: Any, job_id: str) -> bool:
    """Whether the caller is the job itself, its owner, or trusted (a job nobody knows is a
    trusted caller's alone)."""
    if who.trusted or (who.kind == "job" and who.subject == job_id):
        return True
    owner = job_owner(kv, job_id)
    return owner is not None and who.may_act_on_job(job_id, owner)


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
