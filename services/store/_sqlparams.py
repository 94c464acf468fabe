"""Bound parameters of a SQL statement (``?``, or numbered ``$1``): each placeholder replaced in
the parsed tree by a literal of its value, never by pasting text, so a value is data whatever it
holds (a string with quotes stays one string). Used by Flight SQL's prepared statements, where
DB-API clients (``cursor.execute(sql, params)``, pandas' ``read_sql(..., params=)``) send the
values as an Arrow record batch, one row per execution."""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from microco.common.errors import InvalidArgument

from ._sql import DIALECT, parse  # the guarded parse (size, depth, one query)


def _numbered(sql: str) -> str:
    """``sql`` with each ``?`` placeholder written ``$k`` by its place in the text (1, 2, ...;
    the tokenizer tells a placeholder from a ``?`` in a string or a comment), so that the parsed
    tree's placeholders say which value is theirs whatever the tree's order."""
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(sql)
    except sqlglot.errors.TokenError as e:
        raise InvalidArgument(f"SQL parse error: {e}") from None
    marks = [t for t in tokens if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
    if not marks:
        return sql
    if any(t.token_type == TokenType.PARAMETER for t in tokens):
        raise InvalidArgument("mixed ? and $n placeholders")
    out, at = [], 0
    for k, t in enumerate(marks, 1):
        out += [sql[at : t.start], f"${k}"]
        at = t.end + 1
    return "".join(out) + sql[at:]


def placeholders(sql: str) -> int:
    """How many values ``sql`` takes (``?`` each one; ``$n`` up to the highest ``n``)."""
    found = [p for p in parse(_numbered(sql)).find_all(exp.Placeholder) if str(p.this or "").isdigit()]
    return max((int(p.this) for p in found), default=0)


@dataclass(frozen=True)
class Nanos:
    """A bound timestamp of nanoseconds, as its exact text (Python's datetime holds none), and
    whether it carries a zone."""

    text: str
    zoned: bool = False


def _literal(value: Any) -> exp.Expr:
    if value is None:
        return exp.Null()
    if isinstance(value, Nanos):
        if not value.zoned:
            return exp.cast(
                exp.Literal.string(value.text), exp.DataType.build("TIMESTAMP_NS", dialect=DIALECT)
            )
        if re.search(r"\.\d{6}\d*[1-9]", value.text):
            raise InvalidArgument(
                f"a zoned timestamp parameter holds nanoseconds ({value.text}): the store's SQL keeps "
                "a zoned timestamp to microseconds; bind it without a zone or rounded to microseconds"
            )
        return exp.cast(exp.Literal.string(value.text), "TIMESTAMPTZ")
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, float):
        # a DOUBLE, as DuckDB binds a Python float: the text ``0.1`` is a DECIMAL literal, which
        # equals a FLOAT column's 0.1 where the double 0.1 does not (and ``? * 3`` was 0.3, not
        # 0.30000000000000004); ``inf`` is no number literal at all (held out, session 41)
        return exp.cast(exp.Literal.string(repr(value) if value == value else "NaN"), "DOUBLE")
    if isinstance(value, int | decimal.Decimal):
        return exp.Literal.number(str(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        kind = "TIMESTAMPTZ" if value.tzinfo is not None else "TIMESTAMP"
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), kind)
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if isinstance(value, dt.time):
        return exp.cast(exp.Literal.string(value.isoformat()), "TIME")
    # (held out, session 42: a DataFrame's binary and duration columns, which DuckDB binds as a
    # BLOB and an INTERVAL, were refused: "a bound parameter of type bytes is not supported")
    if isinstance(value, bytes | bytearray | memoryview):
        return exp.cast(exp.Literal.string("".join(f"\\x{b:02x}" for b in bytes(value))), "BLOB")
    if isinstance(value, dt.timedelta):
        micros = value.seconds * 10**6 + value.microseconds
        return exp.cast(exp.Literal.string(f"{value.days} days {micros} microseconds"), "INTERVAL")
    raise InvalidArgument(f"a bound parameter of type {type(value).__name__} is not supported")


def bind(sql: str, values: Sequence[Any]) -> str:
    """``sql`` with its placeholders replaced by ``values`` (Python values: None, bool, int,
    float, Decimal, str, bytes, date, datetime, time, timedelta), as SQL text of the store's
    dialect."""
    tree = parse(_numbered(sql))
    found = list(tree.find_all(exp.Placeholder))
    if any(not str(p.this or "").isdigit() for p in found):
        raise InvalidArgument("only ? and $n placeholders can be bound")
    need = max((int(p.this) for p in found), default=0)
    if need != len(values):
        raise InvalidArgument(f"the statement takes {need} parameter(s), {len(values)} bound")
    if not found:
        return sql
    literals = [_literal(v) for v in values]
    for p in found:
        p.replace(literals[int(p.this) - 1].copy())
    return tree.sql(dialect=DIALECT)
