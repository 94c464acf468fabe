"""Who may change a table through the coordinator (docs/security.md): a user drops and appends
to the tables they created (an administrator or a platform service to all); a job acts for its
owner. The owner is kept beside the catalog (``/microco/store/owners/<table>``), written when a
user or a job creates the table; a table without one (created by a service) is changed by
trusted callers only. Reads are not restricted here."""

from __future__ import annotations

from typing import Any

from microco.common.errors import PermissionDenied
from microco.services.runtime.auth import Caller, job_owner

OWNERS = "/microco/store/owners/"


class TableOwners:
    def __init__(self, kv: Any) -> None:
        self.kv = kv

    def _user(self, who: Caller) -> str:
        """The user a caller acts for: themselves, or a job's owner."""
        if who.kind == "user":
            return who.subject
        if who.kind == "job":
            return job_owner(self.kv, who.subject) or ""
        return ""

    def created(self, who: Caller, table: str) -> None:
        user = self._user(who)
        if user and self.kv is not None:
            self.kv.put(OWNERS + table, user.encode())

    def dropped(self, table: str) -> None:
        if self.kv is not None:
            self.kv.delete(OWNERS + table)

    def check(self, who: Caller, table: str, what: str) -> None:
        if who.trusted or self.kv is None:
            return
        raw = self.kv.get(OWNERS + table)
        owner = raw.decode() if raw else ""
        user = self._user(who)
        if not owner or owner != user:
            whose = f"user {owner!r}'s" if owner else "a platform table"
            raise PermissionDenied(f"{who.name} may not {what} table {table!r}: it is {whose}")
