"""The SQL plan cache: a plan is reused only for the same SQL on the same catalog and nodes.

A SQL query's fixed cost before any data moves is mostly sqlglot (parse, analyse, generate the
fragments' SQL) and the planner in Python. A repeated query (a dashboard, a report, a benchmark)
skips it: plans are kept by the **normalised SQL text** (whitespace outside quotes collapsed; a
text with block comments, dollar quotes or backslashes is kept as written) and reused only when
the **catalog version** still matches: a digest of the raw etcd records the plan was made from
(each referenced table's record: schema, replicas' partitioning, committed super-extents, sizes;
every super-extent record: placement, extent states) and of the live nodes it was made for.
Those records are read for every query anyway (the same reads as an uncached plan), so any
change (an append, a drop and re-create with another schema or partitioning, an extent marked
corrupt or rebuilt elsewhere, a node lost or moved) is seen by the next query, in this process or
any other: a stale plan is never used. Plans whose pruning read a value that changes by itself
(``current_date``) are not kept. Permissions are not part of a plan: every call checks the
caller against the tables the SQL reads before it plans (``_service``)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

V = TypeVar("V")

# a quoted string or identifier (an unterminated one runs to the end, verbatim), a line comment
# with its newline, or whitespace
_TOKEN = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|--[^\n]*(?:\n|$)|\s+")


def normalise(sql: str) -> str:
    """``sql`` with each run of whitespace outside quotes and line comments as one space, ends
    stripped: two texts with the same normal form tokenise the same, so they plan the same. A text
    whose quoting this cannot follow exactly (block comments, which nest; dollar-quoted strings;
    backslash escapes) is returned stripped only."""
    text = sql.strip()
    if "/*" in text or "$" in text or "\\" in text:
        return text
    return _TOKEN.sub(lambda m: " " if m.group(0)[0].isspace() else m.group(0), text)


def digest(*parts: bytes | str) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


def text_key(sql: str) -> bytes:
    """The cache key of a SQL text: a digest of its normal form (a long text is not kept)."""
    return digest(normalise(sql))


class LRU(Generic[V]):
    """A thread-safe least-recently-used map of at most ``size`` entries (0: keeps nothing)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[Any, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Any) -> V | None:
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return v

    def put(self, key: Any, value: V) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()

    def __len__(self) -> int:
        return len(self._d)
