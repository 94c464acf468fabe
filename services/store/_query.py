"""The query model: a small relational query (filter, project, equi-join, group-by with aggregates,
order, limit) as a frozen dataclass with a JSON form, validated against the tables' schemas.

It is what the SDK's dataframe-like builder produces and what the coordinator plans; JSON keeps
it language-neutral on the wire (a string field of the gRPC request)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from microco.common.errors import InvalidArgument

from ._limits import MAX_IN_VALUES, MAX_LIMIT, check_count, check_keys, check_name, load_json, short

OPS = ("=", "!=", "<", "<=", ">", ">=", "in")
QUERY_FIELDS = frozenset(
    {"table", "where", "select", "join", "group_by", "aggs", "order_by", "limit", "replica"}
)
JOIN_FIELDS = frozenset({"table", "left_on", "right_on", "where", "select", "replica"})
AGG_FUNCS = ("sum", "count", "min", "max", "mean")


@dataclass(frozen=True)
class Agg:
    fn: str
    column: str  # "*" for count(*)
    name: str

    def __post_init__(self) -> None:
        if self.fn not in AGG_FUNCS:
            raise InvalidArgument(f"aggregate {short(self.fn)} is not one of {', '.join(AGG_FUNCS)}")
        if self.column == "*" and self.fn != "count":
            raise InvalidArgument(f"{self.fn}(*) is not defined; only count(*)")


@dataclass(frozen=True)
class Join:
    table: str
    left_on: str
    right_on: str
    where: tuple[tuple[str, str, Any], ...] = ()
    select: tuple[str, ...] | None = None
    replica: int | None = None  # force the right table's replica (benchmarks, EXPLAIN)


@dataclass(frozen=True)
class Query:
    table: str
    where: tuple[tuple[str, str, Any], ...] = ()
    select: tuple[str, ...] | None = None
    join: Join | None = None
    group_by: tuple[str, ...] = ()
    aggs: tuple[Agg, ...] = ()
    order_by: tuple[tuple[str, bool], ...] = ()  # (column, descending)
    limit: int | None = None
    replica: int | None = None  # force the main table's replica

    # ---------------------------------------------------------------- JSON
    def to_json(self) -> str:
        d: dict[str, Any] = {"table": self.table}
        if self.where:
            d["where"] = [list(w) for w in self.where]
        if self.select is not None:
            d["select"] = list(self.select)
        if self.join is not None:
            j = self.join
            d["join"] = {"table": j.table, "left_on": j.left_on, "right_on": j.right_on}
            if j.where:
                d["join"]["where"] = [list(w) for w in j.where]
            if j.select is not None:
                d["join"]["select"] = list(j.select)
            if j.replica is not None:
                d["join"]["replica"] = j.replica
        if self.group_by:
            d["group_by"] = list(self.group_by)
        if self.aggs:
            d["aggs"] = [[a.fn, a.column, a.name] for a in self.aggs]
        if self.order_by:
            d["order_by"] = [[c, "desc" if desc else "asc"] for c, desc in self.order_by]
        if self.limit is not None:
            d["limit"] = self.limit
        if self.replica is not None:
            d["replica"] = self.replica
        return json.dumps(d, default=str)

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> Query:
        """The query of a request's JSON: unknown fields, oversized or deeply nested input and
        values of the wrong shape are ``InvalidArgument`` (naming the field, never echoing it whole)."""
        d = load_json(text, "query") if isinstance(text, (str, bytes)) else text
        if not isinstance(d, dict) or "table" not in d:
            raise InvalidArgument("a query needs a 'table'")
        check_keys(d, QUERY_FIELDS, "query")
        try:
            join = None
            if d.get("join"):
                j = d["join"]
                if not isinstance(j, dict):
                    raise InvalidArgument("'join' must be an object")
                check_keys(j, JOIN_FIELDS, "query join")
                join = Join(
                    table=check_name(j["table"], "join table"),
                    left_on=check_name(j["left_on"], "join left_on"),
                    right_on=check_name(j["right_on"], "join right_on"),
                    where=_where(j.get("where", [])),
                    select=_names(j["select"], "join select") if j.get("select") is not None else None,
                    replica=_replica(j.get("replica")),
                )
            aggs = _list(d.get("aggs", []), "aggs")
            order = _list(d.get("order_by", []), "order_by")
            limit = d.get("limit")
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT
            ):
                raise InvalidArgument(f"limit must be a non-negative integer, got {short(limit)}")
            return cls(
                table=check_name(d["table"], "table"),
                where=_where(d.get("where", [])),
                select=_names(d["select"], "select") if d.get("select") is not None else None,
                join=join,
                group_by=_names(d.get("group_by", []), "group_by"),
                aggs=tuple(Agg(*_names(a, "an aggregate", exact=3)) for a in aggs),
                order_by=tuple(
                    (c, str(o).lower() == "desc")
                    for c, o in (_names(x, "an order key", exact=2) for x in order)
                ),
                limit=limit,
                replica=_replica(d.get("replica")),
            )
        except KeyError as exc:
            raise InvalidArgument(f"malformed query: missing field {short(exc.args[0])}") from None
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"malformed query: {short(str(exc), 120)}") from None

    # ---------------------------------------------------------------- validation
    def validate(self, schemas: dict[str, pa.Schema]) -> None:
        """Raise ``InvalidArgument`` naming the first unknown column, bad operator or
        inconsistent clause; ``schemas`` maps table name to schema (unknown tables are the
        caller's NotFound)."""
        main = schemas[self.table]
        _cols(main, [w[0] for w in self.where], self.table)
        for w in self.where:
            _check_op(w)
        if self.select is not None:
            _cols(main, self.select, self.table)
        avail = set(main.names) if self.select is None else set(self.select)
        if self.join is not None:
            right = schemas[self.join.table]
            _cols(main, [self.join.left_on], self.table)
            _cols(right, [self.join.right_on], self.join.table)
            lt, rt = main.field(self.join.left_on).type, right.field(self.join.right_on).type
            if lt != rt:
                # held out (session 39): the nodes' hash join refused keys of two types (even
                # int64 and int32), each refusal taken for a node's failure and retried on every
                # node, and the query failed "after retries"
                raise InvalidArgument(
                    f"join keys {self.table}.{self.join.left_on} ({lt}) and {self.join.table}."
                    f"{self.join.right_on} ({rt}) differ in type: this query model joins keys of one "
                    "type; SQL (microco store sql) compares them as SQL does"
                )
            _cols(right, [w[0] for w in self.join.where], self.join.table)
            for w in self.join.where:
                _check_op(w)
            if self.join.select is not None:
                _cols(right, self.join.select, self.join.table)
            ravail = set(right.names) if self.join.select is None else set(self.join.select)
            clash = (avail & ravail) - {self.join.left_on}
            if clash:
                raise InvalidArgument(
                    f"columns {sorted(clash)} exist in both joined tables; select one side's"
                )
            avail |= ravail
        for c in self.group_by:
            if c not in avail:
                raise InvalidArgument(f"group-by column {c!r} is not in the query's columns")
        names = set()
        for a in self.aggs:
            if a.column != "*" and a.column not in avail:
                raise InvalidArgument(f"aggregate column {a.column!r} is not in the query's columns")
            if a.column != "*":
                owner = main if a.column in main.names else schemas[self.join.table]  # type: ignore[union-attr]
                _check_agg(a.fn, a.column, owner.field(a.column).type)
            if a.name in names or a.name in self.group_by:
                raise InvalidArgument(f"output name {a.name!r} is used twice")
            names.add(a.name)
        if self.group_by and not self.aggs:
            raise InvalidArgument("a group-by needs at least one aggregate")
        out = set(self.group_by) | names if (self.aggs or self.group_by) else avail
        for c, _ in self.order_by:
            if c not in out:
                raise InvalidArgument(f"order-by column {c!r} is not in the query's output")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 0):
            raise InvalidArgument("limit must be a non-negative integer")
        for r in (self.replica, self.join.replica if self.join else None):
            if r is not None and r not in (0, 1, 2):
                raise InvalidArgument(f"replica must be 0, 1 or 2, got {r!r}")


_AGG_OK: dict[tuple[str, str], str] = {}  # (fn, type) -> "" or why not, as found once


def _check_agg(fn: str, column: str, t: pa.DataType) -> None:
    """Refuse an aggregate the nodes' engine (Acero) cannot compute, or would compute wrong,
    naming it: held out (session 39), ``max`` of a duration failed on the nodes as a "malformed
    fragment task", and ``sum`` of a uint64 column wrapped around silently (two values above
    2**63 overflow; SQL sums into a wider type)."""
    if pa.types.is_dictionary(t):
        t = t.value_type  # (judged by its values)
    key = (fn, str(t))
    why = _AGG_OK.get(key)
    if why is None:
        why = ""
        if fn in ("sum", "mean") and pa.types.is_uint64(t):
            why = "a uint64 sum overflows 64 bits here"
        elif fn != "count":
            acero_fn = {"mean": "sum"}.get(fn, fn)
            try:
                for keys in (["g"], []):  # (the hash kernel and the scalar one)
                    pa.table({"c": pa.nulls(1, t), "g": [0]}).group_by(keys).aggregate([("c", acero_fn)])
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
                why = f"the nodes' engine has no {fn} of {t}"
        _AGG_OK[key] = why
    if why:
        raise InvalidArgument(
            f"{fn}({column}) is not computed by this query model: {why}; SQL (microco store sql) computes it"
        )


def _list(items: Any, what: str) -> list[Any]:
    if not isinstance(items, (list, tuple)):
        raise InvalidArgument(f"{what} must be a list, got {type(items).__name__}")
    check_count(items, what)
    return list(items)


def _names(items: Any, what: str, exact: int | None = None) -> tuple[str, ...]:
    items = _list(items, what)
    if exact is not None and len(items) != exact:
        raise InvalidArgument(f"{what} has {exact} parts, got {len(items)}")
    return tuple(check_name(c, what) for c in items)


def _replica(r: Any) -> int | None:
    if r is not None and (isinstance(r, bool) or r not in (0, 1, 2)):
        raise InvalidArgument(f"replica must be 0, 1 or 2, got {short(r)}")
    return r


def _scalar(v: Any, what: str) -> Any:
    if v is not None and not isinstance(v, (str, int, float, bool)):
        raise InvalidArgument(
            f"{what}: a filter value must be a number, string, boolean or null, got {type(v).__name__}"
        )
    if isinstance(v, str):
        if len(v) > 1 << 16:
            raise InvalidArgument(f"{what}: a filter value is {len(v)} characters; the limit is {1 << 16}")
    return v


def _where(items: Any) -> tuple[tuple[str, str, Any], ...]:
    out = []
    for w in _list(items, "where"):
        if not isinstance(w, (list, tuple)) or len(w) != 3:
            raise InvalidArgument(f"a filter is [column, op, value], got {short(w)}")
        c, op, v = w
        c = check_name(c, "filter column")
        if not isinstance(op, str) or op not in OPS:
            raise InvalidArgument(f"filter operator {short(op)} is not one of {', '.join(OPS)}")
        if isinstance(v, (list, tuple)):
            check_count(v, f"'in' values of {short(c)}", MAX_IN_VALUES)
            v = tuple(_scalar(x, f"filter on {short(c)}") for x in v)
        else:
            v = _scalar(v, f"filter on {short(c)}")
        out.append((c, op, v))
    return tuple(out)


def _check_op(w: tuple[str, str, Any]) -> None:
    if w[1] not in OPS:
        raise InvalidArgument(f"filter operator {short(w[1])} is not one of {', '.join(OPS)}")
    if w[1] == "in" and not isinstance(w[2], (tuple, list)):
        raise InvalidArgument(f"'in' needs a list of values for {w[0]!r}")


def _cols(schema: pa.Schema, cols: Sequence[str], table: str) -> None:
    for c in cols:
        if c not in schema.names:
            raise InvalidArgument(
                f"table {short(table)} has no column {short(c)} (columns: {', '.join(schema.names)})"
            )
