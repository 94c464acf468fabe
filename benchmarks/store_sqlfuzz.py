"""Random SQL through the store, checked two ways (held-out correctness; docs/store.md, "Session
41 held-out round"), in the manner of SQLancer and SQLsmith:

- **Differential**: random, well-typed SELECTs drawn from a typed expression grammar (joins on
  the replicas' partition columns and off them, inner/left/right/full, GROUP BY with HAVING,
  aggregates with DISTINCT and FILTER, window functions, CASE, NULL-heavy columns, DISTINCT,
  ORDER BY/LIMIT/OFFSET, IN/EXISTS/scalar subqueries, derived tables and CTEs, UNION/INTERSECT/
  EXCEPT [ALL]) over tables of several shapes, run by the store and by DuckDB (the oracle) on
  the same data. Answers compare as multisets of rows (in order where the query's ORDER BY fixes
  it), numbers to 9 significant digits, floats within a relative 1e-6.
- **TLP** (ternary logic partitioning, SQLancer's oracle; Rigger and Su, OOPSLA 2020), on the
  store alone: a query's rows are the union of its rows under ``WHERE p``, ``WHERE NOT p`` and
  ``WHERE p IS NULL`` for any predicate ``p``. Checked for plain selections (UNION ALL of the
  three), DISTINCT (UNION), aggregates (MIN/MAX/SUM/COUNT of the three partitions' own), GROUP
  BY (the partitions' groups merged) and HAVING (partitioned on the HAVING's predicate).
- **NoREC** (SQLancer's other oracle; Rigger and Su, ESEC/FSE 2020; session 42): ``SELECT
  count(*) ... WHERE p`` against ``SELECT sum(CASE WHEN p THEN 1 ELSE 0 END) ...`` over the same
  FROM, which no pruning, pushdown or plan keyed on ``p`` touches (and DuckDB's count).

The tables are loaded through the store's public client (``StoreClient``) into a cluster of real
processes (etcd, a coordinator, four store nodes in three fault domains); ``--in-process`` runs
the same on an in-process ``StoreCore`` instead (faster; what the unit test uses). Counts: equal,
wrong answers, errors the store gives where DuckDB answers (``store_error``), crashes (a server
process gone, or the cluster no longer answering). A query DuckDB itself refuses is counted and
not run. ``--kill`` kills a node once the tables are loaded; with ``--recover`` one whose extents
another node may take, and they are rebuilt (throttled) while the queries run.

Session 42 added a fifth table (wide, a skewed and a NULL-heavy key, int32 and decimal(38, 10)
keys, nanosecond timestamps), ``*`` top-k queries over it, ``BETWEEN SYMMETRIC`` and literals of
other types on its keys, and NoREC.

    python -m microco.benchmarks.store_sqlfuzz --seeds 1,2,3 --queries 300 --json
    python -m microco.benchmarks.store_sqlfuzz --seeds 7 --norec 100 --kill --recover

Exit status 1 when any answer is wrong (or a server crashed)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import decimal
import json
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

# ---------------------------------------------------------------------------------------- data

WORDS = ["a", "b", "ab", "", "A", "x%y", "x_y", "it's", "é", "zz", "  ", "NULL"]

# column types: i (integer), f (float), m (decimal), s (string), b (boolean), d (date), z (a
# timestamp with a zone), t (a timestamp of nanoseconds without one), x (a filler column no
# expression names: a wide table's, read by ``*``)
SCHEMAS: dict[str, dict[str, str]] = {
    # a fact table: unique id, a nullable join key, small group keys, NULL-heavy columns
    "t0": {"id": "i", "k": "i", "g": "i", "s": "s", "f": "f", "m": "m", "d": "d", "b": "b", "n": "i"},
    # a second fact table joining t0 on k (many to many, dangling and NULL keys)
    "t1": {"id": "i", "k": "i", "h": "i", "t": "s", "v": "f", "e": "d", "c": "b", "z": "z"},
    # a small dimension on g, some g with no fact rows, a NULL g
    "t2": {"g": "i", "label": "s", "w": "i", "x": "f"},
    # an empty table
    "t3": {"id": "i", "k": "i", "s": "s"},
    # (session 42) a wide table of skewed and NULL-heavy keys: ``sk`` 80% one value, ``nk`` 95%
    # NULL, an int32 key with its extremes, a decimal(38, 10) near 1e20 (where two decimals share a
    # double), nanosecond timestamps, and 24 filler columns
    "t4": {
        "id": "i",
        "sk": "i",
        "nk": "s",
        "q32": "i",
        "big": "m",
        "ns": "t",
        "r": "f",
        **{f"c{j}": "x" for j in range(24)},
    },
}
ROWS = {"t0": 1200, "t1": 900, "t2": 14, "t3": 0, "t4": 1500}
UNIQUE = {"t0": "id", "t1": "id", "t4": "id"}
# columns whose Arrow type is not their grammar type's
COLUMN_ARROW = {
    ("t4", "q32"): pa.int32(),
    ("t4", "big"): pa.decimal128(38, 10),
    ("t4", "nk"): pa.dictionary(pa.int32(), pa.string()),  # (a categorical, as Parquet and pandas have them)
}
BIG = decimal.Decimal(10) ** 20

LAYOUTS: dict[str, dict[str, list[str]]] = {
    # joins t0.k = t1.k match (hash 4 on both), g matches t2's
    "matched": {
        "t0": ["k:hash:4", "g:hash:3", "id:range:300,700"],
        "t1": ["k:hash:4", "h:hash:2", "t:hash:3"],
        "t2": ["g:hash:3", "label:hash:2", "w:range:5"],
        "t3": ["k:hash:4", "id:hash:2", "s:hash:3"],
        # sk joins t0.k co-partitioned (a skewed join key), q32 (int32) hashed as t0.g (int64) is
        "t4": ["sk:hash:4", "q32:hash:3", "big:range:-1,100000000000000000000,100000000000000100000"],
    },
    # nothing matches a join key: strings, dates, decimals and floats as partition keys
    "off-keys": {
        "t0": ["s:hash:3", "d:range:2021-01-01,2022-01-01", "m:hash:5"],
        "t1": [
            "e:range:2021-06-01",
            "v:hash:3",
            "z:range:2021-09-01T00:00:00+00:00,2022-06-01T00:00:00+00:00",
        ],
        "t2": ["label:hash:3", "x:hash:2", "g:range:4"],
        "t3": ["s:hash:2", "id:range:10", "k:hash:3"],
        "t4": [
            "ns:range:2021-06-01 00:00:00.000000001,2022-01-01",
            "nk:hash:3",
            "sk:range:7,8",
        ],
    },
}

_ARROW = {
    "i": pa.int64(),
    "f": pa.float64(),
    "m": pa.decimal128(12, 2),
    "s": pa.string(),
    "b": pa.bool_(),
    "d": pa.date32(),
    "z": pa.timestamp("us", "UTC"),
    "t": pa.timestamp("ns"),
}
_FILLER = [pa.int16(), pa.string(), pa.float32()]
NS0 = 1_609_459_200_000_000_000  # 2021-01-01 in nanoseconds


def tables(seed: int) -> dict[str, pa.Table]:
    r = random.Random(seed * 7919 + 1)

    def value(t: str, col: str) -> Any:
        if col == "n":
            return None if r.random() < 0.9 else r.randint(-3, 3)  # NULL-heavy
        if col == "sk":
            x = r.random()
            return 7 if x < 0.8 else None if x < 0.9 else r.randint(-5, 40)  # skewed
        if col == "nk":
            return None if r.random() < 0.95 else r.choice(WORDS)
        if col == "q32":
            return r.choice([-(2**31), 2**31 - 1, None, *range(-2, 10)])
        if col == "big":  # around the range bound 1e20, where decimals 0.0000000001 apart share a double
            x = r.random()
            if x < 0.1:
                return None
            if x < 0.7:
                return BIG + decimal.Decimal(r.randint(-30, 30)).scaleb(-r.choice([1, 10]))
            return decimal.Decimal(r.randint(-(10**12), 10**12)).scaleb(-r.randint(0, 10))
        if col == "ns":
            if r.random() < 0.1:
                return None
            return NS0 + r.randint(0, 10**6) * 60_000_000_000 + r.choice([0, 1, 999, r.randint(0, 10**9)])
        if t == "x":
            if r.random() < 0.2:
                return None
            return r.choice([r.randint(-300, 300), r.choice(WORDS), r.uniform(-1, 1)])
        if r.random() < (0.0 if col in ("id",) else 0.15):
            return None
        if t == "i":
            return r.randint(-5, 40) if col in ("k",) else r.randint(0, 9)
        if t == "f":
            if r.random() < 0.03:
                return r.choice([math.nan, -math.nan, math.inf, -math.inf])
            return r.choice([0.0, -0.0, 1.5, float(r.randint(-100, 100)) / 4, r.uniform(-50, 50)])
        if t == "m":
            return decimal.Decimal(r.randint(-99999, 99999)).scaleb(-2)
        if t == "s":
            return r.choice(WORDS)
        if t == "b":
            return r.random() < 0.5
        if t == "z":
            return dt.datetime(2021, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=r.randint(0, 10**6))
        return dt.date(2020, 1, 1) + dt.timedelta(days=r.randint(0, 1000))

    out = {}
    for name, cols in SCHEMAS.items():
        n = ROWS[name]
        data = {}
        for c, t in cols.items():
            vals: list[Any]
            if c == "id":
                vals = list(range(n))
                r.shuffle(vals)
            elif name == "t2" and c == "g":
                vals = [*range(-1, n - 2), None]
            else:
                vals = [value(t, c) for _ in range(n)]
            if t == "t":
                data[c] = pa.array(vals, pa.int64()).cast(_ARROW[t])
                continue
            if t == "x":
                typ = _FILLER[int(c[1:]) % 3]
                kind = int if typ == pa.int16() else str if typ == pa.string() else float
                data[c] = pa.array([v if isinstance(v, kind) else None for v in vals], typ)
                continue
            data[c] = pa.array(vals, COLUMN_ARROW.get((name, c), _ARROW.get(t)))
        out[name] = pa.table(data)
    return out


# ------------------------------------------------------------------------------------- grammar


class Scope:
    """The columns a clause may name: ``(qualified text, type)``."""

    def __init__(self, cols: list[tuple[str, str]]) -> None:
        self.cols = cols

    def of(self, t: str) -> list[str]:
        return [c for c, ct in self.cols if ct == t]


class Gen:
    def __init__(self, r: random.Random) -> None:
        self.r = r
        self.depth = 0

    # -- expressions --
    def lit(self, t: str) -> str:
        r = self.r
        if r.random() < 0.04:
            return "NULL"
        if t == "i":
            return str(r.randint(-3, 12))
        if t == "f":
            return r.choice(["0.0", "1.5", "-2.25", "10.0", f"{r.uniform(-30, 30):.2f}"])
        if t == "m":
            return f"{r.uniform(-500, 500):.2f}"
        if t == "s":
            return "'" + r.choice(WORDS).replace("'", "''") + "'"
        if t == "b":
            return r.choice(["true", "false"])
        if t == "z":
            at = dt.datetime(2021, 1, 1) + dt.timedelta(minutes=r.randint(0, 10**6))
            return r.choice(
                [f"TIMESTAMPTZ '{at}+00'", f"'{at}+00'", f"TIMESTAMPTZ '{at:%Y-%m-%d} 00:00:00+00'"]
            )
        if t == "t":
            return self.ns_literal()
        return f"DATE '{dt.date(2020, 1, 1) + dt.timedelta(days=r.randint(0, 1000))}'"

    def expr(self, t: str, sc: Scope, depth: int = 0) -> str:
        r = self.r
        cols = sc.of(t)
        if depth >= 2 or r.random() < 0.45 or t in "zt":
            if cols and r.random() < 0.8:
                return r.choice(cols)
            return self.lit(t)
        e = lambda tt=t: self.expr(tt, sc, depth + 1)  # noqa: E731
        if t == "b":
            return self.pred(sc, depth + 1)
        x = r.random()
        if x < 0.15:
            return f"CASE WHEN {self.pred(sc, depth + 1)} THEN {e()} ELSE {e()} END"
        if x < 0.25:
            return f"coalesce({e()}, {e()})"
        if x < 0.3:
            return f"nullif({e()}, {e()})"
        if t == "i":
            return r.choice(
                [
                    f"({e()} + {e()})",
                    f"({e()} - {e()})",
                    f"({e()} * {r.randint(-2, 3)})",
                    f"abs({e()})",
                    f"length({e('s')})",
                    f"({e()} % {r.randint(1, 4)})",
                    f"greatest({e()}, {e()})",
                    f"CAST({e('b')} AS INTEGER)",
                    f"year({e('d')})",
                    f"({e()} // {r.randint(1, 3)})",
                    f"date_diff('day', {e('d')}, {e('d')})",
                    f"TRY_CAST({e('s')} AS INTEGER)",
                    f"strpos({e('s')}, {self.lit('s')})",
                    f"CASE {e()} WHEN {self.lit('i')} THEN {e()} WHEN {self.lit('i')} THEN {e()} END",
                ]
            )
        if t == "f":
            return r.choice(
                [
                    f"({e()} + {e()})",
                    f"({e('i')} / 2)",
                    f"round({e()}, 1)",
                    f"CAST({e('i')} AS DOUBLE)",
                    f"-{e()}",
                    f"({e()} / nullif({e('i')}, 0))",
                    f"CAST({e('m')} AS DOUBLE)",
                ]
            )
        if t == "m":
            return r.choice(
                [
                    f"({e()} + {e()})",
                    f"abs({e()})",
                    f"CAST({e('i')} AS DECIMAL(12,2))",
                    f"round({e()}, 1)",
                    f"({e()} * {e('i')})",
                ]
            )
        if t == "s":
            return r.choice(
                [
                    f"upper({e()})",
                    f"({e()} || {e()})",
                    f"substr({e()}, 1, 2)",
                    f"trim({e()})",
                    f"CAST({e('i')} AS VARCHAR)",
                    f"replace({e()}, 'a', 'b')",
                    f"lpad({e()}, 3, '*')",
                    f"CAST({e('d')} AS VARCHAR)",
                    f"lower({e()})",
                ]
            )
        return r.choice(
            [
                f"({e()} + {r.randint(0, 30)})",
                f"least({e()}, {e()})",
                f"CAST(date_trunc('month', {e()}) AS DATE)",
                f"CAST({e()} - INTERVAL {r.randint(1, 40)} DAY AS DATE)",
            ]
        )

    def pred(self, sc: Scope, depth: int = 0) -> str:
        r = self.r
        x = r.random()
        if depth < 2 and x < 0.2:
            return f"({self.pred(sc, depth + 1)} {r.choice(['AND', 'OR'])} {self.pred(sc, depth + 1)})"
        if depth < 2 and x < 0.27:
            return f"(NOT {self.pred(sc, depth + 1)})"
        types = [t for t in "ifmsbdzt" if sc.of(t)] or ["i"]
        t = r.choice(types)
        a = self.expr(t, sc, depth + 1)
        y = r.random()
        if t == "b" and y < 0.3:
            return a
        if y < 0.12:
            return f"({a} IS {r.choice(['', 'NOT '])}NULL)"
        if y < 0.2:
            return f"({a} IS {r.choice(['', 'NOT '])}DISTINCT FROM {self.expr(t, sc, depth + 1)})"
        if y < 0.3 and t != "b":
            return f"({a} {r.choice(['', 'NOT '])}BETWEEN {self.lit(t)} AND {self.lit(t)})"
        if y < 0.4:
            items = ", ".join(self.lit(t) for _ in range(r.randint(1, 4)))
            return f"({a} {r.choice(['', 'NOT '])}IN ({items}))"
        if y < 0.47 and t == "s":
            pat = r.choice(["a%", "%b", "x\\%%", "_", "%", "%y", "A%"])
            return f"({a} {r.choice(['LIKE', 'NOT LIKE', 'ILIKE'])} '{pat}')"
        op = r.choice(["=", "<>", "<", "<=", ">", ">="])
        return f"({a} {op} {self.expr(t, sc, depth + 1)})"

    def agg(self, sc: Scope) -> tuple[str, str]:
        """An aggregate and its type."""
        r = self.r
        t = r.choice([t for t in "ifm" if sc.of(t)] or ["i"])
        e = self.expr(t, sc, 1)
        x = r.random()
        if x < 0.15:
            return "count(*)", "i"
        if x < 0.25:
            return f"count({self.expr(r.choice('isd'), sc, 1)})", "i"
        if x < 0.32:
            return f"count(DISTINCT {self.expr(r.choice('is'), sc, 1)})", "i"
        if x < 0.45:
            return f"sum({e})", t if t != "i" else "i"
        if x < 0.52:
            return f"avg({e})", "f"
        if x < 0.62:
            tt = r.choice("ifmsd")
            return f"{r.choice(['min', 'max'])}({self.expr(tt, sc, 1)})", tt
        if x < 0.68:
            return f"sum({e}) FILTER (WHERE {self.pred(sc, 1)})", t
        if x < 0.72:
            return f"bool_or({self.pred(sc, 1)})", "b"
        if x < 0.76:
            return f"bool_and({self.pred(sc, 1)})", "b"
        if x < 0.8:
            return f"stddev_samp({self.expr('f', sc, 1)})", "f"
        if x < 0.84:
            return f"sum(DISTINCT {e})", t
        if x < 0.88:
            return f"median({self.expr(r.choice('if'), sc, 1)})", "f"
        if x < 0.92:
            return f"sum(CASE WHEN {self.pred(sc, 1)} THEN 1 ELSE 0 END)", "i"
        if x < 0.96:
            se = self.expr("s", sc, 1)
            return f"string_agg(DISTINCT {se}, ',' ORDER BY {se})", "s"
        return f"count(DISTINCT {e}) FILTER (WHERE {self.pred(sc, 1)})", "i"

    # -- FROM --
    def source(self) -> tuple[str, Scope, str | None]:
        """A FROM clause, its scope, and its unique row key (None where rows may repeat)."""
        r = self.r

        def cols(table: str, alias: str) -> list[tuple[str, str]]:
            return [(f"{alias}.{c}", t) for c, t in SCHEMAS[table].items()]

        x = r.random()
        if x < 0.45:
            t = r.choice(["t0", "t0", "t1", "t2", "t3", "t4"])
            return f"{t} AS q", Scope(cols(t, "q")), (f"q.{UNIQUE[t]}" if t in UNIQUE else None)
        join = r.choice(["JOIN", "JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
        if x < 0.55:  # (session 42) the skewed table: on its skewed key, an int32 on an int64
            other = r.choice(["t0", "t1"])
            on = r.choice(["p.sk = q.k", "p.sk = q.k", "p.q32 = q.id", "p.id = q.k", "p.nk = q.id::VARCHAR"])
            if other == "t0" and r.random() < 0.3:
                on = r.choice(["p.q32 = q.g", "p.nk = q.s", "p.big = q.m"])
            sc = Scope(cols("t4", "p") + cols(other, "q"))
            return f"t4 AS p {join} {other} AS q ON {on}", sc, None
        if x < 0.75:
            a, b = r.choice([("t0", "t1"), ("t1", "t0"), ("t0", "t3"), ("t1", "t3")])
            on = r.choice(
                [
                    "p.k = q.k",
                    "p.k = q.k",
                    "p.id = q.id",
                    f"p.k = q.k AND {self.pred(Scope(cols(a, 'p') + cols(b, 'q')), 1)}",
                    "p.k = q.k + 1",
                    "p.id = q.k",
                ]
            )
            if (a, b) in (("t0", "t1"), ("t1", "t0")) and r.random() < 0.25:
                s_a = "s" if a == "t0" else "t"
                s_b = "s" if b == "t0" else "t"
                on = f"p.{s_a} = q.{s_b}"
            sc = Scope(cols(a, "p") + cols(b, "q"))
            return f"{a} AS p {join} {b} AS q ON {on}", sc, None
        if x < 0.9:
            a = r.choice(["t0", "t1"])
            key = "g" if a == "t0" else "h"
            sc = Scope(cols(a, "p") + cols("t2", "q"))
            return f"{a} AS p {join} t2 AS q ON p.{key} = q.g", sc, None
        # three tables
        sc = Scope(cols("t0", "p") + cols("t1", "q") + cols("t2", "z"))
        j2 = r.choice(["JOIN", "LEFT JOIN"])
        return f"t0 AS p {join} t1 AS q ON p.k = q.k {j2} t2 AS z ON p.g = z.g", sc, None

    # -- queries --
    def select_list(self, sc: Scope, n: int) -> tuple[list[str], list[str]]:
        items, types = [], []
        for i in range(n):
            t = self.r.choice("ifmsbd")
            e = self.expr(t, sc)
            plain = re.fullmatch(r"\w+\.\w+", e) is not None
            items.append(e if plain and self.r.random() < 0.3 else f"{e} AS c{i}")
            types.append(t)
        return items, types

    def query(self) -> tuple[str, bool]:
        """A query and whether its answer's order is fixed (compared in order)."""
        r = self.r
        kind = r.choice(
            [
                "select",
                "select",
                "group",
                "group",
                "group",
                "distinct",
                "order",
                "window",
                "subquery",
                "setop",
                "cte",
                "scalar",
                "extra",
                "extra",
                "prune",
                "wide",
            ]
        )
        if kind == "wide":
            return self.wide()
        if kind == "extra":
            return self.extra()
        if kind == "prune":
            return self.prune()
        frm, sc, key = self.source()
        where = f" WHERE {self.pred(sc)}" if r.random() < 0.7 else ""
        if kind == "select":
            items, _ = self.select_list(sc, r.randint(1, 4))
            return f"SELECT {', '.join(items)} FROM {frm}{where}", False
        if kind == "group":
            keys = [self.expr(r.choice("isbdm"), sc, 1) for _ in range(r.randint(0, 2))]
            aggs = [self.agg(sc)[0] for _ in range(r.randint(1, 3))]
            items = [f"{k} AS k{i}" for i, k in enumerate(keys)] + [
                f"{a} AS a{i}" for i, a in enumerate(aggs)
            ]
            group = f" GROUP BY {', '.join(keys)}" if keys else ""
            having = ""
            if r.random() < 0.35:
                having = f" HAVING {r.choice([f'count(*) > {r.randint(0, 20)}', self.pred(sc, 1) if not keys else f'{self.agg(sc)[0]} IS NOT NULL', f'({keys[0]}) IS NOT NULL' if keys else 'count(*) > 0'])}"
            q = f"SELECT {', '.join(items)} FROM {frm}{where}{group}{having}"
            if r.random() < 0.3:  # a top-k of groups: ordered by every output column
                order = ", ".join(f"{i + 1}{r.choice(['', ' DESC'])}" for i in range(len(items)))
                return f"{q} ORDER BY {order} LIMIT {r.randint(1, 8)}", True
            return q, False
        if kind == "distinct":
            items, _ = self.select_list(sc, r.randint(1, 3))
            return f"SELECT DISTINCT {', '.join(items)} FROM {frm}{where}", False
        if kind == "order":
            items, _ = self.select_list(sc, r.randint(1, 3))
            n = len(items)
            order = ", ".join(
                f"{i + 1}{r.choice(['', ' DESC'])}{r.choice(['', ' NULLS FIRST', ' NULLS LAST'])}"
                for i in range(n)
            )
            lim = f" LIMIT {r.randint(0, 40)}" + (f" OFFSET {r.randint(1, 10)}" if r.random() < 0.3 else "")
            if r.random() < 0.15:  # (session 42) DuckDB's share of the rows
                lim = f" LIMIT {r.choice([f'{r.randint(1, 30)}%', f'{r.randint(1, 60)} PERCENT'])}"
            if r.random() < 0.3:
                return f"SELECT DISTINCT {', '.join(items)} FROM {frm}{where} ORDER BY {order}{lim}", True
            return f"SELECT {', '.join(items)} FROM {frm}{where} ORDER BY {order}{lim}", True
        if kind == "window":
            part = self.expr(r.choice("isb"), sc, 1)
            ordk = self.expr(r.choice("ifsd"), sc, 1)
            if key is not None:
                w = r.choice(
                    [
                        f"row_number() OVER (PARTITION BY {part} ORDER BY {ordk}, {key})",
                        f"sum({self.expr('i', sc, 1)}) OVER (PARTITION BY {part} ORDER BY {key} ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)",
                        f"lag({self.expr('s', sc, 1)}) OVER (PARTITION BY {part} ORDER BY {ordk}, {key})",
                        f"lead({self.expr('f', sc, 1)}, 2) OVER (ORDER BY {ordk} DESC NULLS FIRST, {key})",
                        f"first_value({self.expr('i', sc, 1)}) OVER (PARTITION BY {part} ORDER BY {key})",
                        f"ntile(3) OVER (PARTITION BY {part} ORDER BY {ordk}, {key})",
                    ]
                )
            else:
                w = r.choice(
                    [
                        f"rank() OVER (PARTITION BY {part} ORDER BY {ordk})",
                        f"dense_rank() OVER (ORDER BY {ordk} DESC)",
                        f"count(*) OVER (PARTITION BY {part})",
                        f"sum({self.expr('i', sc, 1)}) OVER (PARTITION BY {part} ORDER BY {ordk})",
                        f"max({self.expr('d', sc, 1)}) OVER (PARTITION BY {part})",
                        f"avg({self.expr('f', sc, 1)}) OVER ()",
                    ]
                )
            items, _ = self.select_list(sc, r.randint(1, 2))
            q = f"SELECT {', '.join(items)}, {w} AS w FROM {frm}{where}"
            if r.random() < 0.3:
                q = f"SELECT * FROM ({q}) AS ww WHERE w {r.choice(['<=', '>', '='])} {r.randint(1, 3)}"
            return q, False
        if kind == "subquery":
            inner_t = r.choice(["t0", "t1", "t2", "t3", "t4"])
            inner_cols = [(f"u.{c}", t) for c, t in SCHEMAS[inner_t].items()]
            isc = Scope(inner_cols)
            it = r.choice([t for t in "is" if isc.of(t) and sc.of(t)] or ["i"])
            outer = self.expr(it, sc, 1)
            inner = r.choice(isc.of(it) or ["1"])
            x = r.random()
            if x < 0.4:
                p = f"{outer} {r.choice(['', 'NOT '])}IN (SELECT {inner} FROM {inner_t} AS u WHERE {self.pred(isc, 1)})"
            elif x < 0.75:
                corr = r.choice(isc.of(it) or ["u.k"])
                p = f"{r.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM {inner_t} AS u WHERE {corr} = {outer} AND {self.pred(isc, 1)})"
            else:
                t = r.choice([t for t in "ifm" if isc.of(t)] or ["i"])
                p = f"{self.expr(t, sc, 1) if sc.of(t) else self.lit(t)} > (SELECT {r.choice(['avg', 'max', 'min'])}({r.choice(isc.of(t) or ['1'])}) FROM {inner_t} AS u WHERE {self.pred(isc, 1)})"
            items, _ = self.select_list(sc, r.randint(1, 3))
            return (
                f"SELECT {', '.join(items)} FROM {frm} WHERE {p}{' AND ' + self.pred(sc, 1) if r.random() < 0.4 else ''}",
                False,
            )
        if kind == "setop":
            op = r.choice(["UNION", "UNION ALL", "INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"])
            types = [r.choice("isd") for _ in range(r.randint(1, 2))]
            frm2, sc2, _ = self.source()
            a = ", ".join(f"{self.expr(t, sc, 1)} AS c{i}" for i, t in enumerate(types))
            b = ", ".join(f"{self.expr(t, sc2, 1)} AS c{i}" for i, t in enumerate(types))
            return f"SELECT {a} FROM {frm}{where} {op} SELECT {b} FROM {frm2} WHERE {self.pred(sc2)}", False
        if kind == "cte":
            gk = self.expr(r.choice("is"), sc, 1)
            a, at = self.agg(sc)
            if at not in "ifm":
                a, at = "count(*)", "i"
            op = r.choice(["JOIN", "LEFT JOIN"])
            return (
                f"WITH s AS (SELECT {gk} AS gk, {a} AS av FROM {frm}{where} GROUP BY {gk}) "
                f"SELECT t2.label, s.gk, s.av FROM t2 {op} s ON t2.g = s.gk"
                if gk.endswith(".g") or gk.endswith(".k") or gk.endswith(".h")
                else f"WITH s AS (SELECT {gk} AS gk, {a} AS av FROM {frm}{where} GROUP BY {gk}) "
                f"SELECT gk, av, av > (SELECT avg(av) FROM s) AS big FROM s"
            ), False
        # scalar subquery in the select list, correlated
        t = r.choice(["t1", "t3", "t0"])
        col = r.choice([c for c, tt in SCHEMAS[t].items() if tt == "i"])
        outer = r.choice(sc.of("i"))
        items, _ = self.select_list(sc, r.randint(1, 2))
        sub = f"(SELECT {r.choice(['count(*)', f'max(u.{col})', f'sum(u.{col})'])} FROM {t} AS u WHERE u.k = {outer}) AS sq"
        return f"SELECT {', '.join(items)}, {sub} FROM {frm}{where}", False

    def ns_literal(self) -> str:
        """A timestamp literal against a nanosecond column: microseconds, nanoseconds, a day."""
        r = self.r
        ns = NS0 + r.randint(0, 10**6) * 60_000_000_000 + r.choice([0, 1, 999, r.randint(0, 10**9)])
        at = dt.datetime(2021, 1, 1) + dt.timedelta(microseconds=(ns - NS0) // 1000)
        text = f"{at:%Y-%m-%d %H:%M:%S}.{ns % 10**9:09d}"
        return r.choice(
            [
                f"TIMESTAMP '{at}'",
                f"'{text}'",
                f"TIMESTAMP_NS '{text}'",
                f"DATE '{at:%Y-%m-%d}'",
                f"'{at:%Y-%m-%d}'",
                "TIMESTAMP_NS '2021-06-01 00:00:00.000000001'",
                "'2021-06-01 00:00:00'",
                "TIMESTAMP '2022-01-01 00:00:00.000001'",
            ]
        )

    def key_literal(self, t: str, col: str = "") -> str:
        """A literal to compare a column of type ``t`` with, often of another type: numbers
        past the column's precision, numerals as strings, exponents, integers past 64 bits."""
        r = self.r
        if col == "big":  # about the range bound 1e20, in the decimal's digits and past them
            d = r.randint(-30, 30)
            return r.choice(
                [
                    "100000000000000000000",
                    "99999999999999999999.95",
                    f"{BIG + decimal.Decimal(d).scaleb(-10)}",
                    f"{BIG + decimal.Decimal(d).scaleb(-1)}",
                    f"{BIG + decimal.Decimal(d).scaleb(-12)}",
                    "1e20",
                    "'100000000000000000000'",
                    str(d),
                    "NULL",
                ]
            )
        if t == "t":
            return self.ns_literal()
        n = r.randint(-5, 40)
        forms = [
            str(n),
            f"{n}.5",
            f"{n}.0",
            f"{n}.00000000000000001",
            f"{n - 1}.99999999999999999",
            f"'{n}'",
            f"'0{n}'" if n >= 0 else f"'{n}'",
            f"{n}e0",
            "9223372036854775808",
            "-1e30",
            "NULL",
            f"CAST({n} AS DOUBLE)",
            f"{n} + 0.25",
        ]
        if t == "m":
            forms += [
                f"{r.uniform(-500, 500):.3f}",
                f"{r.uniform(-500, 500):.2f}",
                f"'{r.uniform(-500, 500):.2f}'",
            ]
        if t == "s":
            day = dt.date(2020, 1, 1) + dt.timedelta(days=r.randint(0, 1000))
            forms += [f"'{w}'" for w in WORDS if "'" not in w] + ["1", "0", f"DATE '{day}'", "true"]
        if t == "d":
            day = dt.date(2020, 1, 1) + dt.timedelta(days=r.randint(0, 1000))
            forms = [
                f"DATE '{day}'",
                f"'{day}'",
                f"TIMESTAMP '{day} 00:00:00'",
                f"TIMESTAMP '{day} 12:30:00'",
                f"DATE '{day}' + INTERVAL 1 DAY",
                "NULL",
            ]
        if t == "f":
            forms += ["'nan'", "'-0.0'", "0.1", f"{n}.25"]
        return r.choice(forms)

    def prune(self) -> tuple[str, bool]:
        """Filters on the layouts' partition columns (hash and range), literals of other types."""
        r = self.r
        table = r.choice(["t0", "t0", "t1", "t2", "t4", "t4"])
        col = r.choice([c for c in SCHEMAS[table] if SCHEMAS[table][c] not in "bx"])
        t = SCHEMAS[table][col]
        lit = lambda: self.key_literal(t, col)  # noqa: E731
        x = r.random()
        if x < 0.45:
            p = f"{col} {r.choice(['=', '<', '<=', '>', '>=', '<>'])} {lit()}"
        elif x < 0.6:
            p = f"{lit()} {r.choice(['=', '<', '>='])} {col}"
        elif x < 0.8:
            p = f"{col} {r.choice(['', 'NOT '])}IN ({', '.join(lit() for _ in range(r.randint(1, 4)))})"
        else:
            p = f"{col} {r.choice(['', '', 'SYMMETRIC '])}BETWEEN {lit()} AND {lit()}"
            p = p.replace(" SYMMETRIC BETWEEN", " BETWEEN SYMMETRIC")
        if r.random() < 0.3:
            p = f"{p} {r.choice(['AND', 'OR'])} {col} {r.choice(['=', '<', '>'])} {lit()}"
        if r.random() < 0.5:
            return f"SELECT count(*) AS n, count(DISTINCT {col}) AS nd FROM {table} WHERE {p}", False
        other = r.choice(list(SCHEMAS[table]))
        return f"SELECT {col}, {other} FROM {table} WHERE {p}", False

    def extra(self) -> tuple[str, bool]:
        """Shapes of a second grammar: grouping sets, DISTINCT ON, QUALIFY, SEMI/ANTI/USING/
        NATURAL/LATERAL/cross joins, LIMIT inside a subquery, aggregates of aggregates, ordered
        and statistical aggregates, set operations inside IN and under ORDER BY ... LIMIT."""
        r = self.r
        sc0 = Scope([(f"q.{c}", t) for c, t in SCHEMAS["t0"].items()])
        w = f" WHERE {self.pred(sc0)}" if r.random() < 0.6 else ""
        k = r.randint(0, 14)
        if k == 0:
            a, b = r.sample(["q.g", "q.k", "q.b", "q.s", "q.d"], 2)
            g = r.choice([f"ROLLUP ({a}, {b})", f"CUBE ({a}, {b})", f"GROUPING SETS (({a}), ({a}, {b}), ())"])
            agg = self.agg(sc0)[0]
            return (
                f"SELECT {a} AS ga, {b} AS gb, grouping({a}, {b}) AS gg, {agg} AS a0 FROM t0 AS q{w} GROUP BY {g}",
                False,
            )
        if k == 1:
            on = r.choice(["q.k", "q.g", "q.s", "q.b"])
            order = r.choice(["q.id", "q.f DESC NULLS LAST, q.id", "q.m NULLS FIRST, q.id DESC"])
            return (
                f"SELECT DISTINCT ON ({on}) {on} AS o, q.id, q.f FROM t0 AS q{w} ORDER BY {on}, {order}",
                False,
            )
        if k == 2:
            part = r.choice(["q.g", "q.k", "q.s"])
            fn = r.choice(["row_number()", "rank()", "dense_rank()"])
            order = r.choice(["q.id", "q.f, q.id", "q.m DESC, q.id"])
            return (
                f"SELECT q.id, {part} AS p FROM t0 AS q{w} "
                f"QUALIFY {fn} OVER (PARTITION BY {part} ORDER BY {order}) <= {r.randint(1, 3)}"
            ), False
        if k == 3:
            j = r.choice(["SEMI JOIN", "ANTI JOIN"])
            on = r.choice(["q.k = u.k", "q.id = u.id", "q.k = u.k AND u.h < 5", "q.s = u.t"])
            return f"SELECT q.id, q.k FROM t0 AS q {j} t1 AS u ON {on}{w}", False
        if k == 4:
            j = r.choice(["JOIN", "LEFT JOIN", "FULL JOIN"])
            return (
                f"SELECT k, count(*) AS n, sum(q.g) AS sg FROM t0 AS q {j} t1 AS u USING (k){w} GROUP BY k",
                False,
            )
        if k == 5:
            return (
                f"SELECT * FROM t2 NATURAL JOIN (SELECT q.g, count(*) AS n FROM t0 AS q{w} GROUP BY q.g) AS z",
                False,
            )
        if k == 6:
            lim = r.randint(1, 5)
            return (
                f"SELECT q.id, l.id AS lid FROM t0 AS q, LATERAL (SELECT u.id FROM t1 AS u WHERE u.k = q.k "
                f"ORDER BY u.id LIMIT {lim}) AS l{w}"
            ), False
        if k == 7:
            return (
                f"SELECT z.label, q.id FROM t2 AS z CROSS JOIN t0 AS q WHERE q.id < {r.randint(0, 30)}",
                False,
            )
        if k == 8:
            lim = r.randint(0, 200)
            order = r.choice(["q.id", "q.f NULLS FIRST, q.id", "q.s DESC, q.id"])
            return (
                f"SELECT sub.g, count(*) AS n, sum(sub.k) AS sk FROM (SELECT q.g, q.k FROM t0 AS q{w} "
                f"ORDER BY {order} LIMIT {lim}) AS sub GROUP BY sub.g"
            ), False
        if k == 9:
            return (
                f"SELECT s.g, sum(s.n) AS tn, max(s.n) AS mx, count(*) AS groups FROM (SELECT q.g, q.k, count(*) AS n "
                f"FROM t0 AS q{w} GROUP BY q.g, q.k) AS s GROUP BY s.g HAVING sum(s.n) > {r.randint(0, 50)}"
            ), False
        if k == 10:
            a = r.choice(
                [
                    "var_pop(q.f)",
                    "corr(q.f, q.k)",
                    "quantile_cont(q.k, 0.25)",
                    "arg_max(q.f, q.id)",
                    "arg_min(q.s, q.id)",
                    "bit_or(q.g)",
                    "string_agg(q.s, '|' ORDER BY q.id)",
                    "list(q.k ORDER BY q.id DESC)",
                    "avg(DISTINCT q.k)",
                    "count(*) FILTER (WHERE q.b)",
                    "max(q.m) - min(q.m)",
                    "sum(q.m * q.m)",
                    "first(q.s ORDER BY q.id)",
                    "regr_slope(q.f, q.k)",
                ]
            )
            key = r.choice(["q.g", "q.b", "q.s", "q.k", None])
            if key is None:
                return f"SELECT {a} AS a FROM t0 AS q{w}", False
            return f"SELECT {key} AS key, {a} AS a FROM t0 AS q{w} GROUP BY {key}", False
        if k == 11:
            return (
                f"SELECT q.id FROM t0 AS q WHERE q.k IN (SELECT u.k FROM t1 AS u WHERE u.h = {r.randint(0, 9)} "
                f"UNION SELECT z.w FROM t2 AS z){' AND ' + self.pred(sc0) if w else ''}"
            ), False
        if k == 12:
            lim = r.randint(1, 30)
            return (
                f"SELECT q.k AS x FROM t0 AS q{w} UNION SELECT u.h FROM t1 AS u ORDER BY 1 NULLS FIRST LIMIT {lim}"
            ), True
        if k == 13:
            return (
                f"SELECT q.g, count(*) AS n FROM t0 AS q{w} GROUP BY q.g "
                f"HAVING count(*) > (SELECT count(*) / 20 FROM t1 AS u WHERE u.h = q.g)"
            ), False
        return (
            f"SELECT q.id, q.k FROM t0 AS q WHERE {r.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM t1 AS u WHERE u.k = q.k "
            f"AND u.id > q.id){' AND ' + self.pred(sc0) if w else ''}"
        ), False

    def wide(self) -> tuple[str, bool]:
        """(session 42) ``*`` of the wide table, filtered, ordered on a column and the unique key,
        limited: a top-k that reads every column of the rows it keeps (late materialization)."""
        r = self.r
        sc = Scope([(f"q.{c}", t) for c, t in SCHEMAS["t4"].items()])
        order = r.choice(["q.sk", "q.big DESC", "q.ns NULLS FIRST", "q.nk DESC NULLS LAST", "q.r", "q.c1"])
        where = f" WHERE {self.pred(sc)}" if r.random() < 0.8 else ""
        return f"SELECT * FROM t4 AS q{where} ORDER BY {order}, q.id LIMIT {r.randint(1, 60)}", True

    # -- NoREC --
    def norec(self) -> tuple[str, str]:
        """(session 42) NoREC (Rigger and Su, ESEC/FSE 2020): ``count(*) ... WHERE p`` against the
        number of rows ``p`` holds for, counted with no WHERE to prune, push down or plan by."""
        frm, sc, _ = self.source()
        p = self.pred(sc)
        return (
            f"SELECT count(*) AS n FROM {frm} WHERE {p}",
            f"SELECT sum(CASE WHEN {p} THEN 1 ELSE 0 END) AS n FROM {frm}",
        )

    # -- TLP --
    def tlp(self) -> tuple[str, list[str], str]:
        """``(kind, [the query, its three partitions' queries...], how to combine)`` for SQLancer's
        ternary logic partitioning."""
        r = self.r
        frm, sc, _ = self.source()
        p = self.pred(sc)
        base_where = f"{self.pred(sc)} AND " if r.random() < 0.3 else ""
        parts = [
            f"WHERE {base_where}({p})",
            f"WHERE {base_where}(NOT ({p}))",
            f"WHERE {base_where}(({p}) IS NULL)",
        ]
        whole = f"WHERE {base_where[:-5]}" if base_where else ""
        kind = r.choice(["where", "where", "distinct", "aggregate", "group", "having"])
        if kind in ("where", "distinct"):
            items, _ = self.select_list(sc, r.randint(1, 3))
            d = "DISTINCT " if kind == "distinct" else ""
            qs = [f"SELECT {d}{', '.join(items)} FROM {frm} {w}" for w in ["", *parts]]
            if whole:
                qs[0] = f"SELECT {d}{', '.join(items)} FROM {frm} {whole}"
            return kind, qs, ("union" if d else "union all")
        if kind == "aggregate":
            t = r.choice("ifm")
            fn = r.choice(["min", "max", "sum", "count"])
            e = self.expr(t, sc, 1)
            qs = [f"SELECT {fn}({e}) AS a FROM {frm} {w}" for w in [whole, *parts]]
            return kind, qs, fn
        if kind == "group":
            gk = self.expr(r.choice("isb"), sc, 1)
            qs = [f"SELECT {gk} AS gk FROM {frm} {w} GROUP BY {gk}" for w in [whole, *parts]]
            return kind, qs, "union"
        gk = self.expr(r.choice("isb"), sc, 1)
        a, _ = self.agg(sc)
        hp = r.choice(
            [
                f"count(*) > {r.randint(0, 10)}",
                f"({gk}) IS NULL",
                f"{a} > {r.randint(-5, 20)}",
                f"{a} IS NULL",
            ]
        )
        q = f"SELECT {gk} AS gk, count(*) AS n FROM {frm} {whole} GROUP BY {gk}"
        qs = [q] + [f"{q} HAVING {h}" for h in [f"({hp})", f"(NOT ({hp}))", f"(({hp}) IS NULL)"]]
        return "having", qs, "union all"


# ---------------------------------------------------------------------------------- comparison


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return ("nan",)
        if v == 0:
            return ("num", 0.0)
        return ("num", float(f"{v:.9g}"))
    if isinstance(v, decimal.Decimal) or (isinstance(v, int) and not isinstance(v, bool)):
        return ("num", float(f"{float(v):.9g}"))
    return (type(v).__name__, v)


def _close(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if a[0] == b[0] == "num":
        return math.isclose(a[1], b[1], rel_tol=1e-6, abs_tol=1e-9)
    return False


def _values(c: pa.ChunkedArray) -> list[Any]:
    if pa.types.is_timestamp(c.type) and c.type.unit == "ns":  # (datetime has no nanoseconds)
        return [None if v is None else ("ns", v) for v in c.cast(pa.int64()).to_pylist()]
    return c.to_pylist()


def rows_of(t: pa.Table) -> list[tuple]:
    cols = [_values(t.column(i)) for i in range(t.num_columns)]
    return [tuple(_norm(c[i]) for c in cols) for i in range(t.num_rows)]


def same(got: list[tuple], want: list[tuple], ordered: bool) -> bool:
    if len(got) != len(want):
        return False
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    if got == want:
        return True
    # floats summed in another order: equal within a tolerance, pairwise after sorting
    return all(len(g) == len(w) and all(_close(x, y) for x, y in zip(g, w)) for g, w in zip(got, want))


def tlp_combine(how: str, parts: list[list[tuple]]) -> list[tuple]:
    if how == "union all":
        return [row for p in parts for row in p]
    if how == "union":
        return list({repr(row): row for p in parts for row in p}.values())
    vals = [p[0][0] for p in parts if p and p[0][0] != ("NoneType", None)]
    if how == "count":
        return [(("num", float(sum(v[1] for v in vals))),)]
    if not vals:
        return [(("NoneType", None),)]
    if how == "sum":
        return [(_norm(sum(v[1] if v[0] == "num" else math.nan for v in vals)),)]
    nan = [v for v in vals if v[0] == "nan"]
    if nan and how == "max":  # DuckDB orders NaN above every number
        return [(nan[0],)]
    rest = [v for v in vals if v[0] != "nan"] or nan
    return [((min if how == "min" else max)(rest, key=lambda v: v[1:]),)]


def tlp_agrees(how: str, whole: list[tuple], parts: list[list[tuple]]) -> bool:
    """The query's rows and its three partitions' combined agree. Rows are compared normalised
    (numbers to 9 digits), so a DISTINCT's rows that differ past the ninth digit (two decimals
    near 1e20) are one row to the union of the partitions: the query's are deduplicated alike."""
    if how == "union":
        whole = list({repr(row): row for row in whole}.values())
    return same(tlp_combine(how, parts), whole, False)


# ---------------------------------------------------------------------------------------- runs


def pieces(table: pa.Table) -> list[pa.Table]:
    """A table as three appends of unequal size (several extents a partition, small batches)."""
    n = table.num_rows
    cuts = [0, n // 7, n // 2, n]
    return [table.slice(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]


RECOVERY_RATE_BYTES = 20e3  # ``--recover``: slow enough that queries run while extents are rebuilt
# what a run reports of the recovery (its seconds beside the run's say whether queries ran under it)
RECOVERY_KEYS = ("state", "rebuilt", "bytes_read", "seconds")


class InProcess:
    """An in-process store (``StoreCore`` over ``LocalTransport``, four nodes, three domains)."""

    def __init__(self, work: str) -> None:
        from microco.common.kv import MemoryKV
        from microco.services.store import LocalTransport, NodeInfo, StoreCore

        self.tr = LocalTransport(work, [NodeInfo(f"n{i}", f"r{i % 3}") for i in range(4)])
        self.core = StoreCore(MemoryKV(), self.tr, recovery_rate_bytes=0)

    def load(self, name: str, table: pa.Table, layout: list[str]) -> None:
        from microco.clients.store import parse_partitioning
        from microco.services.store import spec_from_pb

        self.core.create_table(name, table.schema, [spec_from_pb(parse_partitioning(p)) for p in layout])
        for piece in pieces(table):
            self.core.append(name, piece)

    def drop(self, name: str) -> None:
        self.core.drop_table(name)

    def sql(self, text: str) -> pa.Table:
        return self.core.sql(text)[0]

    def alive(self) -> bool:
        return True

    def kill_one(self, recover: bool = False) -> None:
        if not recover:
            self.tr.kill("n1")  # its extents are read from the other replicas from now on
            return
        # n0 shares its fault domain with n3, which may take its extents: rebuilt under the
        # queries, slowly (20 kB/s of reads), from the other replicas
        self.tr.kill("n0")
        self.rebuilt: dict[str, Any] = {}
        self.recovering = threading.Thread(
            target=lambda: self.rebuilt.update(self.core.recover(rate_bytes=RECOVERY_RATE_BYTES)),
            daemon=True,
        )
        self.recovering.start()

    def finish_recovery(self) -> dict[str, Any]:
        self.recovering.join()
        return {
            **{k: self.rebuilt.get(k) for k in RECOVERY_KEYS},
            "unavailable_extents": self.core.lost_count(),
        }


class Client:
    """A cluster of real processes, used through the public client."""

    def __init__(self, cluster: Any) -> None:
        from microco.clients.store import StoreClient

        self.cluster = cluster
        self.client = StoreClient.from_address(cluster.coordinator_address, default_timeout=120)

    def load(self, name: str, table: pa.Table, layout: list[str]) -> None:
        self.client.create_table(name, table.schema, layout)
        for piece in pieces(table):
            self.client.append(name, piece)

    def drop(self, name: str) -> None:
        self.client.drop_table(name)

    def sql(self, text: str) -> pa.Table:
        return self.client.sql(text, timeout=120)

    def kill_one(self, recover: bool = False) -> None:
        # store-1 is alone in its fault domain: no node may take its extents, which are read from
        # the other replicas from then on; store-0's are rebuilt on store-3 under the queries (the
        # coordinator's recovery wakes when the node's lease ends; reads throttled to 20 kB/s)
        self.killed = "store-0" if recover else "store-1"
        self.cluster.procs[self.killed].kill()  # SIGKILL: a node lost under the queries
        self.cluster.procs[self.killed].wait()

    def finish_recovery(self) -> dict[str, Any]:
        deadline = time.monotonic() + 300
        while True:
            got = self.client.recovery(timeout=20)
            if not got["unavailable_extents"] or time.monotonic() > deadline:
                return {k: got.get(k) for k in (*RECOVERY_KEYS, "unavailable_extents")}
            time.sleep(1)

    def alive(self) -> bool:
        if any(
            p.poll() is not None for n, p in self.cluster.procs.items() if n != getattr(self, "killed", "")
        ):
            return False
        try:
            self.client.list_tables(timeout=20)
        except Exception:  # noqa: BLE001
            return False
        return True


KEYS = (
    "queries",
    "equal",
    "wrong",
    "store_error",
    "duckdb_error",
    "crash",
    "tlp",
    "tlp_equal",
    "tlp_wrong",
    "tlp_error",
    "tlp_invalid",
    "norec",
    "norec_equal",
    "norec_wrong",
    "norec_error",
)


def run(
    store: Any,
    seed: int,
    layout: str,
    queries: int,
    tlp_queries: int,
    kill: bool = False,
    norec_queries: int = 0,
    recover: bool = False,
) -> dict[str, Any]:
    """Load the seed's tables under ``layout`` and run ``queries`` differential,
    ``tlp_queries`` TLP and ``norec_queries`` NoREC checks; counts and findings. ``kill``: a node
    is killed once the tables are loaded (every query after it reads that node's extents from
    the other replicas); ``recover``: and its extents are rebuilt on the others under the
    queries."""
    import duckdb

    data = tables(seed)
    for name, t in data.items():
        store.load(name, t, LAYOUTS[layout][name])
    if kill:
        store.kill_one(recover)
    con = duckdb.connect()
    con.execute("SET threads = 1")
    for name, t in data.items():
        con.register(name, t)
    r = random.Random(seed * 1_000_003 + sorted(LAYOUTS).index(layout))
    g = Gen(r)
    stats = dict.fromkeys(KEYS, 0)
    findings: list[dict[str, Any]] = []
    for _ in range(queries):
        sql, ordered = g.query()
        try:
            want = con.sql(sql).to_arrow_table()
        except duckdb.Error:
            stats["duckdb_error"] += 1
            continue
        stats["queries"] += 1
        try:
            got = store.sql(sql)
        except Exception as exc:  # noqa: BLE001 (what the store said is the finding)
            if not store.alive():
                stats["crash"] += 1
                findings.append({"kind": "crash", "sql": sql, "error": f"{type(exc).__name__}: {exc}"[:500]})
                break
            stats["store_error"] += 1
            findings.append({"kind": "error", "sql": sql, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        if got.schema.names != want.schema.names or not same(rows_of(got), rows_of(want), ordered):
            stats["wrong"] += 1
            findings.append(
                {
                    "kind": "wrong",
                    "sql": sql,
                    "rows": [got.num_rows, want.num_rows],
                    "names": [got.schema.names, want.schema.names],
                }
            )
        else:
            stats["equal"] += 1
    for _ in range(tlp_queries if not stats["crash"] else 0):
        kind, qs, how = g.tlp()
        try:
            for q in qs:
                con.sql(q).fetchall()  # DuckDB must take it (typing), not judge it
        except duckdb.Error:
            stats["tlp_invalid"] += 1
            continue
        stats["tlp"] += 1
        try:
            answers = [rows_of(store.sql(q)) for q in qs]
        except Exception as exc:  # noqa: BLE001
            if not store.alive():
                stats["crash"] += 1
                findings.append(
                    {"kind": "crash", "sql": qs[0], "error": f"{type(exc).__name__}: {exc}"[:500]}
                )
                break
            stats["tlp_error"] += 1
            findings.append({"kind": "tlp_error", "sql": qs, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        if tlp_agrees(how, answers[0], answers[1:]):
            stats["tlp_equal"] += 1
        else:
            stats["tlp_wrong"] += 1
            findings.append(
                {
                    "kind": "tlp_wrong",
                    "tlp": kind,
                    "sql": qs,
                    "rows": [len(answers[0]), len(tlp_combine(how, answers[1:]))],
                }
            )
    for _ in range(norec_queries if not stats["crash"] else 0):
        fast, slow = g.norec()
        try:
            want = con.sql(fast).fetchall()
            con.sql(slow).fetchall()
        except duckdb.Error:
            continue  # not well typed (DuckDB must take both, not judge them)
        stats["norec"] += 1
        try:
            n_fast, n_slow = (store.sql(q).column(0)[0].as_py() or 0 for q in (fast, slow))
        except Exception as exc:  # noqa: BLE001
            if not store.alive():
                stats["crash"] += 1
                findings.append({"kind": "crash", "sql": fast, "error": f"{type(exc).__name__}: {exc}"[:500]})
                break
            stats["norec_error"] += 1
            findings.append(
                {"kind": "norec_error", "sql": fast, "error": f"{type(exc).__name__}: {exc}"[:500]}
            )
            continue
        if n_fast == n_slow == want[0][0]:
            stats["norec_equal"] += 1
        else:
            stats["norec_wrong"] += 1
            findings.append(
                {"kind": "norec_wrong", "sql": [fast, slow], "rows": [n_fast, n_slow, want[0][0]]}
            )
    recovery = store.finish_recovery() if kill and recover else None
    for name in data:
        with contextlib.suppress(Exception):
            store.drop(name)
    return {
        "seed": seed,
        "layout": layout,
        "node_killed": kill,
        **({"recovery": recovery} if recovery is not None else {}),
        **stats,
        "findings": findings,
    }


@contextlib.contextmanager
def _store(in_process: bool, recover: bool = False) -> Iterator[Callable[[], Any]]:
    if in_process:
        with tempfile.TemporaryDirectory(prefix="microco-sqlfuzz-") as work:
            yield lambda: InProcess(tempfile.mkdtemp(dir=work))
        return
    from microco.benchmarks.store import bench_cluster

    coordinator_args = ["--recovery-rate-mb", "0", "--recovery-interval-s", "3600"]
    if recover:
        coordinator_args = [
            "--recovery-rate-mb",
            str(RECOVERY_RATE_BYTES / 1e6),
            "--recovery-interval-s",
            "2",
        ]
    with bench_cluster("microco-bench-sqlfuzz-", 4, coordinator_args) as cluster:
        c = Client(cluster)
        yield lambda: c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microco.benchmarks.store_sqlfuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"of {', '.join(LAYOUTS)}")
    ap.add_argument("--queries", type=int, default=200, help="differential queries per seed and layout")
    ap.add_argument("--tlp", type=int, default=100, help="TLP checks per seed and layout")
    ap.add_argument(
        "--in-process", action="store_true", help="an in-process store, not a cluster of processes"
    )
    ap.add_argument(
        "--kill",
        action="store_true",
        help="kill a node once the tables are loaded (in process: every run; a cluster: its last run)",
    )
    ap.add_argument(
        "--recover",
        action="store_true",
        help="with --kill: kill a node whose extents may be rebuilt, and rebuild them under the queries",
    )
    ap.add_argument("--norec", type=int, default=0, help="NoREC checks per seed and layout (default 0)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    load0 = os.getloadavg()[0]
    results = []
    t0 = time.perf_counter()
    with _store(args.in_process, args.kill and args.recover) as make:
        plan = [(layout, int(seed)) for layout in args.layouts.split(",") for seed in args.seeds.split(",")]
        for i, (layout, seed) in enumerate(plan):
            kill = args.kill and (args.in_process or i == len(plan) - 1)
            res = run(make(), seed, layout, args.queries, args.tlp, kill, args.norec, args.recover)
            results.append(res)
            print(
                f"[sqlfuzz] seed {seed} {layout}: {res['equal']}/{res['queries']} equal, {res['wrong']} wrong, "
                f"{res['store_error']} store errors, {res['crash']} crashes; TLP {res['tlp_equal']}/{res['tlp']} "
                f"({res['tlp_wrong']} wrong, {res['tlp_error']} errors); NoREC {res['norec_equal']}/{res['norec']}"
                + (f"; recovery {res['recovery']}" if "recovery" in res else ""),
                file=sys.stderr,
                flush=True,
            )
            if res["crash"]:
                break
    total = {k: sum(r[k] for r in results) for k in KEYS}
    out = {
        "start_utc": started,
        "end_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_at_start": load0,
        "seconds": round(time.perf_counter() - t0, 1),
        "backend": "in-process" if args.in_process else "cluster of processes, public client",
        "kill": args.kill,
        "recover": args.kill and args.recover,
        "total": total,
        "runs": results,
    }
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        for res in results:
            for f in res["findings"]:
                print(
                    f"{res['seed']} {res['layout']}: {f['kind']}: {f['sql']}\n   {f.get('error', f.get('rows'))}"
                )
        print(json.dumps(total))
    return 1 if total["wrong"] or total["tlp_wrong"] or total["norec_wrong"] or total["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
