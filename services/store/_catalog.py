"""The catalog: tables, their three partitionings, super-extents and extent locations, in etcd.

Layout (under ``/microco/store/``):

- ``tables/<name>``: schema, the three partition specs, committed super-extent ids, row and byte
  totals, next super-extent id. Compare-and-swap on this record is the commit point of an append:
  extents written to nodes but not referenced here do not exist (a crash leaves only orphan files).
- ``superextents/<table>/<sid>``: every extent of one super-extent (replica, partition, node,
  rows, bytes, checksum, sub-buckets). Recovery and re-placement rewrite it with CAS.
- ``appends/<table>/<token>``: the result of an append committed with a client's idempotency
  token (rows, bytes, super-extent ids, wall time), written in the commit's transaction: an append
  sent again with that token (its answer was lost with a coordinator) is acknowledged from it and
  not appended twice, by whichever coordinator serves. Kept ``APPEND_TOKEN_TTL_S``.
- ``recovery``: progress of the current recovery (for ``microco store recovery``).

A restarted coordinator rebuilds everything from these keys.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from microco.common.errors import Aborted, AlreadyExists, InvalidArgument, NotFound
from microco.common.kv import KV, dumps

from ._layout import CODECS, DEFAULT_COMPRESSION, ExtentMeta
from ._limits import check_name, short
from ._partition import PartitionSpec, hash_codes, range_bounds

ROOT = "/microco/store/"
TABLES = ROOT + "tables/"
SUPER = ROOT + "superextents/"
RECOVERY = ROOT + "recovery"
APPENDS = ROOT + "appends/"
# How long a committed append's token is honoured: a client resends within its call's deadline
# (minutes); a day leaves room for a load re-run by hand with the same token.
APPEND_TOKEN_TTL_S = 24 * 3600.0
# A token written anew, in the same transaction, by every change of a table or super-extent
# record (a drop: once its deletes are done): equal tokens, equal catalog (the SQL plan cache)
VERSION = ROOT + "catalog-version"
TXN_DELETES = 100  # deletes per etcd transaction (etcd takes 128 operations in one by default)


def _new_version() -> bytes:
    return uuid.uuid4().hex.encode()


def append_key(table: str, token: str) -> str:
    """The etcd key of an append's idempotency token (checked: at most 128 letters, digits, '-'
    or '_'; a table's tokens are left to expire after a drop, being random, not swept)."""
    if not 0 < len(token) <= 128 or not all(c.isalnum() or c in "-_" for c in token):
        raise InvalidArgument(f"idempotency token {short(token)} must be 1-128 letters, digits, '-' or '_'")
    return f"{APPENDS}{table}/{token}"


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass
class SuperExtent:
    table: str
    id: int
    rows: int
    extents: list[ExtentMeta] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "id": self.id,
            "rows": self.rows,
            "extents": [e.to_json() for e in self.extents],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SuperExtent:
        return cls(d["table"], d["id"], d["rows"], [ExtentMeta.from_json(e) for e in d["extents"]])

    def replica(self, r: int) -> list[ExtentMeta]:
        return [e for e in self.extents if e.replica == r]

    def find(self, extent_id: str) -> ExtentMeta | None:
        return next((e for e in self.extents if e.id == extent_id), None)


@dataclass
class TableInfo:
    name: str
    schema: pa.Schema
    specs: list[PartitionSpec]
    super_extents: list[SuperExtent] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    # each replica's extent codec (a layout choice, like its partitioning); "": the writing
    # node's default (``--extent-compression``, zstd), as for tables created without codecs
    codecs: list[str] = field(default_factory=lambda: [""] * 3)

    def codec(self, replica: int) -> str:
        """Replica ``replica``'s codec as the planner estimates it (the default when unset)."""
        return self.codecs[replica] or DEFAULT_COMPRESSION

    def extents(self) -> list[ExtentMeta]:
        return [e for s in self.super_extents for e in s.extents]

    @property
    def stored_bytes(self) -> int:
        """Bytes of its extent files on the nodes (all three replicas, compressed); ``bytes`` is
        the Arrow data's size, which the planner's estimates use."""
        return sum(e.stored_bytes for e in self.extents())


def validate_codecs(codecs: list[str] | None) -> list[str]:
    """Three replica codecs ("" each when None), each one of ``CODECS`` or "" (the default)."""
    if codecs is None or not any(codecs):
        return [""] * 3
    if len(codecs) != 3:
        raise InvalidArgument(
            f"a table has three replicas: give a codec for each (or none), got {len(codecs)}"
        )
    for c in codecs:
        if c and c not in CODECS:
            raise InvalidArgument(f"unknown extent codec {short(c)}: one of {', '.join(CODECS)}")
    return list(codecs)


def validate_table(name: str, schema: pa.Schema, specs: list[PartitionSpec]) -> None:
    check_name(name, "table name")
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise InvalidArgument(f"table name {short(name)} must be letters, digits, '_' or '-'")
    if len(specs) != 3:
        raise InvalidArgument(
            f"a table has exactly three replicas, each with its partitioning; got {len(specs)}"
        )
    if len(schema) == 0:
        raise InvalidArgument("a table needs at least one column")
    # SQL names a column without regard to case (DuckDB too), so two columns whose names differ
    # only in case could not be told apart by a query: ``sum("A")`` silently read column ``a``
    # (held out, session 32: a pandas frame's ``a`` and ``A``). Refused, with both names.
    folded: dict[str, str] = {}
    for n in schema.names:
        other = folded.setdefault(n.lower(), n)
        if other != n or schema.names.count(n) > 1:
            raise InvalidArgument(
                f"columns {other!r} and {n!r} differ only in case (or repeat): SQL cannot tell them "
                "apart; rename one"
            )
    for s in specs:
        if s.column not in schema.names:
            raise InvalidArgument(
                f"partitioning column {s.column!r} is not in the schema ({', '.join(schema.names)})"
            )
        if s.kind == "range":
            range_bounds(s, schema.field(s.column).type)
        else:
            # a column no hash takes is refused here, not at the first append (held out, session
            # 39: a column of Arrow's null type, as an all-null Parquet column reads, was created
            # and every load failed)
            hash_codes(pa.nulls(1, schema.field(s.column).type))


class Catalog:
    """Catalog operations over a ``KV``; every multi-key change is one etcd transaction."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    # ------------------------------------------------------------------ tables
    def create_table(
        self, name: str, schema: pa.Schema, specs: list[PartitionSpec], codecs: list[str] | None = None
    ) -> dict[str, Any]:
        validate_table(name, schema, specs)
        codecs = validate_codecs(codecs)
        # SQL names a table without regard to case and reads the first match in key order: a
        # table "Orders" made beside "orders" took the name in everyone's SQL, so another user
        # could answer the owner's queries of their own table with rows of theirs (session 42)
        folded = name.lower()
        for other in self.table_names():
            if other.lower() == folded and other != name:
                raise AlreadyExists(
                    f"table {short(other)} exists: SQL names tables without regard to case, so "
                    f"{short(name)} would be the same table to a query"
                )
        rec: dict[str, Any] = {
            "name": name,
            "schema": schema_to_b64(schema),
            "specs": [s.to_json() for s in specs],
            "super_extents": [],
            "next_super_extent": 0,
            "rows": 0,
            "bytes": 0,
        }
        if any(codecs):  # a record without it reads as the node default for every replica
            rec["replica_codecs"] = codecs
        if not self.kv.commit(
            checks=[(TABLES + name, None)], puts={TABLES + name: dumps(rec), VERSION: _new_version()}
        ):
            raise AlreadyExists(f"table {short(name)} already exists")
        return rec

    def table_record(self, name: str) -> tuple[dict[str, Any], bytes]:
        check_name(name, "table name")
        raw = self.kv.get(TABLES + name)
        if raw is None:
            raise NotFound(f"no table {short(name)}")
        return json.loads(raw), raw

    def version(self) -> bytes | None:
        """The catalog's version token (None before the first change that wrote one)."""
        return self.kv.get(VERSION)

    def table_names(self) -> list[str]:
        return [k[len(TABLES) :] for k, _ in self.kv.get_prefix(TABLES)]

    def table_records(self) -> dict[str, dict[str, Any]]:
        """Every table's record, by name, in one read (what ``table_names`` reads anyway)."""
        return {k[len(TABLES) :]: json.loads(raw) for k, raw in self.kv.get_prefix(TABLES)}

    def raw_table_records(self) -> list[tuple[str, bytes]]:
        """Every table's name and raw record, in key order, in one read."""
        return [(k[len(TABLES) :], raw) for k, raw in self.kv.get_prefix(TABLES)]

    def table(self, name: str, record: dict[str, Any] | None = None) -> TableInfo:
        """The table with its committed super-extents; ``record``: its record when just read
        (``table_records``), which saves reading it again."""
        rec = record if record is not None else self.table_record(name)[0]
        return self.assemble(name, rec, [raw for _, raw in self.super_records(name)])

    def super_records(self, name: str) -> list[tuple[str, bytes]]:
        """The raw super-extent records of a table (committed or not), in key order."""
        return self.kv.get_prefix(f"{SUPER}{name}/")

    @staticmethod
    def assemble(name: str, rec: dict[str, Any], super_raws: list[bytes]) -> TableInfo:
        """The table of a record and its raw super-extent records (as ``table`` reads them)."""
        supers = {}
        for raw in super_raws:
            s = SuperExtent.from_json(json.loads(raw))
            supers[s.id] = s
        committed = [supers[i] for i in rec["super_extents"] if i in supers]
        return TableInfo(
            name=name,
            schema=schema_from_b64(rec["schema"]),
            specs=[PartitionSpec.from_json(s) for s in rec["specs"]],
            super_extents=committed,
            rows=rec["rows"],
            bytes=rec["bytes"],
            codecs=list(rec.get("replica_codecs") or [""] * 3),
        )

    def set_replica_codec(self, name: str, replica: int, codec: str) -> list[str]:
        """Record ``codec`` as replica ``replica``'s (what appends and rebuilds write from now
        on; a recode rewrites its extents); returns the table's codecs."""
        if replica not in (0, 1, 2):
            raise InvalidArgument(f"replica must be 0, 1 or 2, got {short(replica)}")
        validate_codecs([codec, "", ""])
        for _ in range(50):
            rec, raw = self.table_record(name)
            codecs = list(rec.get("replica_codecs") or [""] * 3)
            codecs[replica] = codec
            rec["replica_codecs"] = codecs
            if self.kv.commit(
                checks=[(TABLES + name, raw)], puts={TABLES + name: dumps(rec), VERSION: _new_version()}
            ):
                return codecs
        raise Aborted(f"table {short(name)} is being changed concurrently; retry")

    def drop_table(self, name: str) -> TableInfo:
        """Delete a table's records. Its record goes in the same transaction as the new catalog
        version (with as many of its super-extent records as one transaction takes), so a reader
        sees the table and the old version, or neither: a plan cached on the old version is never
        reused once the table is gone (it was, between the deletes and the version's write). The
        super-extent records left over (a table of many) are unreachable without the table's
        record and deleted after, batch by batch while the name stays free (a table re-created
        under it keeps its own)."""
        for _ in range(50):
            rec, raw = self.table_record(name)
            supers = self.super_records(name)
            info = self.assemble(name, rec, [r for _, r in supers])
            keys = [k for k, _ in supers]
            if self.kv.commit(
                checks=[(TABLES + name, raw)],
                puts={VERSION: _new_version()},
                deletes=[TABLES + name, *keys[: TXN_DELETES - 1]],
            ):
                break
        else:
            raise Aborted(f"table {short(name)} is being changed concurrently; retry")
        for i in range(TXN_DELETES - 1, len(keys), TXN_DELETES):
            if not self.kv.commit(checks=[(TABLES + name, None)], deletes=keys[i : i + TXN_DELETES]):
                break
        return info

    def reserve_super_extents(self, name: str, count: int) -> int:
        """Reserve ``count`` super-extent ids; returns the first."""
        for _ in range(50):
            rec, raw = self.table_record(name)
            first = rec["next_super_extent"]
            rec["next_super_extent"] = first + count
            if self.kv.commit(
                checks=[(TABLES + name, raw)], puts={TABLES + name: dumps(rec), VERSION: _new_version()}
            ):
                return first
        raise Aborted(f"table {short(name)} is being changed concurrently; retry")

    def commit_super_extents(
        self, name: str, supers: list[SuperExtent], token: str = "", result: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Make written super-extents part of the table, atomically (the commit point). With an
        idempotency ``token``, ``result`` is recorded under it in the same transaction, which
        also checks that the token is not recorded yet: returns None when this call committed,
        or the recorded result when an earlier send of the same append did (then nothing is
        committed, and the super-extents written for this one are orphans)."""
        key = append_key(name, token) if token else ""
        for _ in range(50):
            rec, raw = self.table_record(name)
            rec["super_extents"] = rec["super_extents"] + [s.id for s in supers]
            rec["rows"] += sum(s.rows for s in supers)
            rec["bytes"] += sum(e.bytes for s in supers for e in s.extents)
            puts = {f"{SUPER}{name}/{s.id:08d}": dumps(s.to_json()) for s in supers}
            puts[TABLES + name] = dumps(rec)
            puts[VERSION] = _new_version()
            checks: list[tuple[str, bytes | None]] = [(TABLES + name, raw)]
            if key:
                puts[key] = dumps({**(result or {}), "at": time.time()})
                checks.append((key, None))
            if self.kv.commit(checks=checks, puts=puts):
                return None
            if key and (done := self.committed_append(name, token)) is not None:
                return done
        raise Aborted(f"table {short(name)} is being changed concurrently; retry")

    def committed_append(self, name: str, token: str) -> dict[str, Any] | None:
        """The result recorded for an append committed with ``token``, or None."""
        got: dict[str, Any] | None = self.kv.get_json(append_key(name, token))
        return got

    def expire_append_tokens(self, ttl_s: float = APPEND_TOKEN_TTL_S, now: float | None = None) -> int:
        """Delete the append tokens recorded more than ``ttl_s`` ago; returns how many."""
        now = time.time() if now is None else now
        old = [k for k, v in self.kv.get_prefix_json(APPENDS) if now - float(v.get("at", 0)) > ttl_s]
        for i in range(0, len(old), TXN_DELETES):
            self.kv.commit(deletes=old[i : i + TXN_DELETES])
        return len(old)

    def replace_extent(self, table: str, sid: int, old_id: str, new: ExtentMeta) -> bool:
        """Swap one extent's record (after a rebuild); False if the super-extent changed meanwhile."""
        key = f"{SUPER}{table}/{sid:08d}"
        raw = self.kv.get(key)
        if raw is None:
            return False
        s = SuperExtent.from_json(json.loads(raw))
        for k, e in enumerate(s.extents):
            if e.id == old_id:
                s.extents[k] = new
                return self._swap(key, raw, dumps(s.to_json()))
        return False

    def mark_extent(self, table: str, sid: int, extent_id: str, state: str) -> bool:
        key = f"{SUPER}{table}/{sid:08d}"
        for _ in range(20):
            raw = self.kv.get(key)
            if raw is None:
                return False
            s = SuperExtent.from_json(json.loads(raw))
            e = s.find(extent_id)
            if e is None:
                return False
            if e.state == state:
                return True
            e.state = state
            if self._swap(key, raw, dumps(s.to_json())):
                return True
        return False

    def _swap(self, key: str, raw: bytes, new: bytes) -> bool:
        """Compare-and-swap of a super-extent record, with a new catalog version."""
        return self.kv.commit(checks=[(key, raw)], puts={key: new, VERSION: _new_version()})

    # ------------------------------------------------------------------ recovery progress
    def put_recovery(self, progress: dict[str, Any]) -> None:
        self.kv.put(RECOVERY, dumps(progress))

    def recovery(self) -> dict[str, Any]:
        return self.kv.get_json(RECOVERY) or {"state": "idle"}
