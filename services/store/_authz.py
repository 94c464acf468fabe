"""Who may change a table through the coordinator (docs/security.md): a user drops and appends
to the tables they created (an administrator or a platform service to all); a job acts for its
owner. The owner is kept beside the catalog (``/microco/store/owners/<table>``), written when a
user or a job creates the table; a table without one (created by a service) is changed by
trusted callers only.

Reads (``Query``, ``Explain``, ``PlanRead``, ``GetTable``; ``ListTables`` lists only these):
a table with an owner is read by that owner, the owner's jobs and trusted callers; a table
without one (a platform table: the demo's, a service's) by every authenticated caller. The
Flight tickets ``PlanRead`` hands out carry a grant the coordinator signs for the caller
(:mod:`._grants`), so a store node serves extents only to whom the coordinator allowed.

Sharing: the owner (or an administrator) lets another user read a table
(``GrantTableRead``); the grant is kept beside the owner
(``/microco/store/grants/<table>/<user>``), covers that user's jobs too, and goes with
``RevokeTableRead`` or when the table is dropped. Every read check above consults it, the
coordinator's and the nodes' alike."""

from __future__ import annotations

import json
import time
from typing import Any

from microco.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from microco.common.identity import split_name
from microco.services.runtime.auth import Caller, job_owner

OWNERS = "/microco/store/owners/"
GRANTS = "/microco/store/grants/"


def grantee(name: str) -> str:
    """The user a read grant names: ``alice`` or ``user:alice`` -> ``alice`` (a clear error
    for a job, a service or a malformed name: grants are to users, and cover their jobs)."""
    full = name if ":" in name else f"user:{name}"
    kind, subject = split_name(full)
    if kind != "user":
        raise InvalidArgument(f"a table is shared with a user (user:<name>), not {full[:80]!r}")
    return subject


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
            self.kv.delete_prefix(GRANTS + table + "/")

    def granted(self, table: str, user: str) -> bool:
        return bool(user) and self.kv is not None and self.kv.get(GRANTS + f"{table}/{user}") is not None

    def grants(self, table: str) -> list[str]:
        """The users ``table`` is shared with, sorted."""
        if self.kv is None:
            return []
        prefix = GRANTS + table + "/"
        return sorted(key[len(prefix) :] for key, _ in self.kv.get_prefix(prefix))

    def grant(self, who: Caller, table: str, user: str) -> None:
        """Let ``user`` (and their jobs) read ``table``: its owner's or a trusted caller's call."""
        self._check_sharing(who, table, "share")
        name = grantee(user)
        if name == self.owner(table):
            raise InvalidArgument(f"user {name!r} owns table {table!r} already")
        if self.kv is not None:
            self.kv.put(GRANTS + f"{table}/{name}", json.dumps({"by": who.name, "at": time.time()}).encode())

    def revoke(self, who: Caller, table: str, user: str) -> None:
        """Withdraw ``user``'s grant (nothing when there is none)."""
        self._check_sharing(who, table, "withdraw a grant of")
        if self.kv is not None:
            self.kv.delete(GRANTS + f"{table}/{grantee(user)}")

    def _check_sharing(self, who: Caller, table: str, what: str) -> None:
        if self.kv is not None and not self.owner(table):
            raise FailedPrecondition(
                f"table {table!r} is a platform table: every authenticated caller reads it already"
            )
        self.check(who, table, what)

    def owner(self, table: str) -> str:
        raw = self.kv.get(OWNERS + table) if self.kv is not None else None
        return raw.decode() if raw else ""

    def may_read(self, who: Caller, table: str) -> bool:
        if who.trusted or self.kv is None:
            return True
        owner = self.owner(table)
        if not owner:
            return True
        user = self._user(who)
        return owner == user or self.granted(table, user)

    def check_read(self, who: Caller, tables: list[str]) -> None:
        for table in tables:
            if not self.may_read(who, table):
                raise PermissionDenied(
                    f"{who.name} may not read table {table!r}: it is user {self.owner(table)!r}'s "
                    "(its owner may share it: microco store grant)"
                )

    def check(self, who: Caller, table: str, what: str) -> None:
        if who.trusted or self.kv is None:
            return
        raw = self.kv.get(OWNERS + table)
        owner = raw.decode() if raw else ""
        user = self._user(who)
        if not owner or owner != user:
            whose = f"user {owner!r}'s" if owner else "a platform table"
            raise PermissionDenied(f"{who.name} may not {what} table {table!r}: it is {whose}")


def sql_tables(catalog_names: list[str], sql: str) -> list[str]:
    """The catalog's names of the tables a SQL query reads (names match case-insensitively,
    as the planner resolves them); unknown names are left to the planner's error. The names come
    from ``_sql.referenced``, which keeps them by the text's normal form (a repeated query is not
    parsed again); the caller is checked against them on every call, cached plan or not."""
    from ._sql import referenced

    by_lower: dict[str, str] = {}
    for n in catalog_names:
        by_lower.setdefault(n.lower(), n)  # the first match, as the planner takes it
    out: list[str] = []
    for ref in referenced(sql):
        name = by_lower.get(ref)
        if name is not None and name not in out:
            out.append(name)
    return out
