"""SQL over the store: parsed with sqlglot, planned onto the replica-aware planner, run with DuckDB.

A query takes one of five shapes (the first that fits; EXPLAIN says which and why):

- ``partition_local``: one table, or two inner-joined on keys whose replicas are co-partitioned by
  the same function (small tables broadcast beside them), with no subquery save those keyed to
  the split's partition column (``_subqueries``: correlated [NOT] EXISTS, [NOT] IN and scalar
  subqueries, ``IN (SELECT k ... GROUP BY k ...)``, which then run per partition too), and either
  no aggregate (a scan: filter, project, top-k) or a GROUP BY that contains the partition column. Every output row (every group) then comes
  from one partition, so the whole query (less the final ORDER BY/LIMIT, which each fragment
  applies as a top-k) runs per partition on a store node and the coordinator concatenates and
  orders. COUNT(DISTINCT), HAVING, CASE... all run next to the data.
- ``partial_agg``: the same tables, aggregates that decompose (sum, count, avg, min, max) and a
  GROUP BY of plain columns: fragments compute partial aggregates next to the data, the
  coordinator merges them with DuckDB and evaluates the SELECT, HAVING, ORDER BY, LIMIT.
- ``staged``: a query that does not split whole, cut into the parts that do (``_staged``: CTE
  bodies, set-operation branches, derived tables, uncorrelated subqueries; a grouped query with
  windows over its groups, ROLLUP/CUBE or aggregates of aggregates over a pre-aggregation by its
  finest grouping, ``_preaggregate``), each part a distributed sub-plan of one of the shapes
  above, run side by side; the rest runs at the coordinator over their results (and gathers the
  tables it still reads, as below).
- ``exchange``: a query whose groups or join keys no replica keeps whole in its partitions (an
  aggregate that does not decompose grouped off the partition key; an outer, semi or anti join,
  or two big tables joined, on keys no replica pair co-partitions): the nodes hash-split their
  rows by the query's key over the JSON plans' shuffle transport, each reducer runs the query
  (or its partial aggregation) on its bucket; chosen over ``gather`` by cost
  (``_exchange_wins``), the gather kept for small tables.
- ``gather``: anything else (other subqueries, outer joins, a table too big to broadcast, count
  distinct off the partition key...): each table's needed columns are read from one replica (pruned by partition
  filters, filtered next to the data by the conjuncts that only touch that table), and the whole
  SQL runs in DuckDB at the coordinator. Correct first; the same pushdowns keep it lean.

Node fragments are DuckDB over the Arrow extents (``op: "sql"`` tasks): DuckDB was measured against
pyarrow/Acero for the fragments (docs/store.md). Coordinator-side DuckDB has external access off,
so SQL cannot read or write files of the coordinator's host."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import itertools
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.generator import Generator as _BaseGenerator
from sqlglot.tokens import TokenType

from microco.common.errors import InvalidArgument, MicrocoError, NotFound, ResourceExhausted, Unavailable

from . import _exec, _plancache
from ._catalog import Catalog, TableInfo
from ._limits import MAX_SQL_BYTES, MAX_SQL_DEPTH, MAX_SQL_LIST, short
from ._partition import _literal_array
from ._placement import REPLICAS
from ._planner import (
    COST_TIE,
    MOVE_WEIGHT,
    ReadEstimate,
    Unit,
    _nodes_by_bytes,
    _score,
    cheapest_replica,
    pruned_partitions,
    read_estimate,
    replica_units,
)
from ._residency import Residency

if TYPE_CHECKING:
    from ._core import StoreCore

log = logging.getLogger(__name__)


class _Generator(DuckDB.Generator):  # type: ignore[misc,valid-type]
    """sqlglot's DuckDB generator, made to write back what was read where its own rendering
    changes a query's meaning. The store runs sqlglot's rendering of the tree (fragments, the
    coordinator's merge), so a rewrite meant for SQL of another engine read as DuckDB's is a
    wrong answer given silently. Held out, DuckDB's own window tests (session 40): ``last(x
    IGNORE NULLS) OVER w`` was written ``LAST(x) OVER w`` and ``first(x IGNORE NULLS) OVER w``
    ``ANY_VALUE(x) OVER w`` (sqlglot keeps IGNORE/RESPECT NULLS only on ``first_value``, ``lag``,
    ``lead``, ``last_value``, ``nth_value``). Written as read here, the modifier inside the call,
    whatever the function: DuckDB answers it or refuses it as it would the text as written (it
    refuses the modifier on an aggregate that is not a window). Save ``any_value``, which sqlglot's
    reader itself wraps in IGNORE NULLS (DuckDB's ``any_value`` skips NULLs): written as DuckDB's
    generator writes it, ``ANY_VALUE(x)`` (DuckDB refuses the modifier on it)."""

    def ignorenulls_sql(self, expression: exp.IgnoreNulls) -> str:
        if isinstance(expression.this, exp.AnyValue):
            return str(super().ignorenulls_sql(expression))
        return str(_BaseGenerator.ignorenulls_sql(self, expression))

    def respectnulls_sql(self, expression: exp.RespectNulls) -> str:
        return str(_BaseGenerator.respectnulls_sql(self, expression))


class StoreDuckDB(DuckDB):
    """DuckDB's dialect as the store reads and writes it (``_Generator``)."""

    Generator = _Generator


DIALECT: type[Dialect] = StoreDuckDB
_DECOMPOSABLE = (exp.Sum, exp.Count, exp.Avg, exp.Min, exp.Max)
_CMP = {exp.EQ: "=", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_FROM = "from_" if "from_" in exp.Select.arg_types else "from"  # renamed in sqlglot 28
_WITH = "with_" if "with_" in exp.Select.arg_types else "with"  # likewise
_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass
class SqlPlan:
    kind: str
    tasks: list[tuple[str, dict[str, Any]]]
    final_sql: str  # over the registered inputs at the coordinator
    inputs: list[str]  # for gather: one name per task (the table it feeds); else "__parts"
    explain: list[str] = field(default_factory=list)
    replicas: dict[str, int] = field(default_factory=dict)
    moved_bytes: int = 0
    # seconds per phase of the run (plan, fragments, merge), once it ran: EXPLAIN's last line
    timings: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)  # the live nodes it was planned on, by name
    cached: bool = False  # reused from the plan cache (``_plancache``)
    # the estimated bytes the fragments bring to the coordinator (gather: the tables' columns
    # read; 0: small, e.g. partial aggregates); above ``STREAM_MERGE_BYTES`` the merge streams
    gathered_bytes: float = 0.0
    # gather only: big tables filtered by the join keys of smaller filtered tables read first
    # (``_semi_joins``; run by ``keyed_tasks``)
    semi: list[dict[str, Any]] = field(default_factory=list)
    # staged only: sub-plans (name, plan) run first, each distributed on its own; their results
    # are inputs of this plan's ``final_sql`` under their names (``_staged``)
    stages: list[tuple[str, SqlPlan]] = field(default_factory=list)
    # the hedges of stragglers its run started (``StoreCore._with_retries``, ``_hedge``)
    hedges: list[dict[str, Any]] = field(default_factory=list)
    # exchange only: the map tasks run first (each node's rows of a table, filtered and projected
    # next to the data, hash-split by the query's key into one bucket per reducer); ``tasks``
    # are then the reducers, each pulling its bucket from every map's node (``_exchange_tasks``).
    # Their ``qid`` is ``EXCHANGE_QID``, replaced by a fresh one each run.
    exchange: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # the answer's column names as DuckDB binds the text as written, where sqlglot's rendering
    # may name them otherwise (``_may_rename``); None: the plan's own names are DuckDB's
    names: list[str] | None = None

    @property
    def streams_merge(self) -> bool:
        return self.gathered_bytes > STREAM_MERGE_BYTES

    def explain_text(self) -> str:
        lines = list(self.explain)
        if self.cached:
            lines.append("plan cache: reused (same SQL text, catalog version and live nodes)")
        if self.timings:
            lines.append("timings: " + ", ".join(f"{k} {v:.4f} s" for k, v in self.timings.items()))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------- parsing
def parse(sql: str) -> exp.Query:
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidArgument("empty SQL")
    if len(sql) > MAX_SQL_BYTES:
        raise InvalidArgument(f"SQL is {len(sql)} characters; the limit is {MAX_SQL_BYTES}")
    if _paren_depth(sql) > MAX_SQL_DEPTH:
        raise InvalidArgument(f"SQL is nested more than {MAX_SQL_DEPTH} levels deep")
    try:
        _refuse_unreadable(sql)
        trees = sqlglot.parse(sql, read=DIALECT)
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidArgument(
            f"SQL syntax error: {short(str(exc).splitlines()[0] if str(exc) else exc, 300)}"
        ) from None
    except RecursionError:
        raise InvalidArgument("SQL is nested too deeply") from None
    # (a comment after the last ``;`` parses as a statement of its own, with nothing in it)
    found = [t for t in trees if t is not None and not isinstance(t, exp.Semicolon)]
    if len(found) != 1:
        raise InvalidArgument(f"give exactly one SQL statement, got {len(found)}")
    tree = found[0]
    if not isinstance(tree, exp.Query):
        raise InvalidArgument(f"only queries (SELECT) are accepted, not {tree.key.upper()}")
    for node in tree.walk():
        if node.depth > MAX_SQL_DEPTH:
            raise InvalidArgument(f"SQL is nested more than {MAX_SQL_DEPTH} levels deep")
        if isinstance(node, (exp.In, exp.Select, exp.Tuple)) and len(node.expressions) > MAX_SQL_LIST:
            raise InvalidArgument(
                f"a list in the SQL has {len(node.expressions)} items; the limit is {MAX_SQL_LIST}"
            )
    for sel in tree.find_all(exp.Select):
        _name_group_columns(sel)
        _fetch_as_limit(sel)
    aggregates = _engine_aggregates()
    for f in list(tree.find_all(exp.Anonymous)):
        if isinstance(f.this, str) and f.this.lower() in aggregates:
            f.replace(exp.AnonymousAggFunc(this=f.this, expressions=f.expressions))
    return tree


# DuckDB's functions whose first argument is a date part, which sqlglot's reader takes for a
# constant part even where it is a column: ``date_trunc(s, d)`` is read as ``date_trunc('second',
# d)`` (``s``, an abbreviation of second), ``date_diff(unit, a, b)`` as ``date_diff('UNIT', ...)``
_PART_FIRST = frozenset({"date_trunc", "datetrunc", "date_diff", "datediff"})


def _refuse_unreadable(sql: str) -> None:
    """Refuse, naming it, what sqlglot reads as another query than DuckDB does, where the store
    would run sqlglot's reading and answer otherwise, silently (held out, DuckDB's own tests,
    session 40): a date part given as a column (``date_trunc(s, d)`` over a column ``s`` of part
    names answered every row truncated to the second, ``test_date_trunc.test``), and DuckDB's
    ``EXPORT_STATE`` modifier of an aggregate (read as a column alias: the final value came back
    for the aggregate's state, ``aggregate_state_export/*.test``)."""
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(sql)
    except sqlglot.errors.TokenError:
        return  # (the parse reports it)
    for i, t in enumerate(tokens):
        word = t.text.lower()
        if (
            word in _PART_FIRST
            and i + 3 < len(tokens)
            and tokens[i + 1].token_type == TokenType.L_PAREN
            and tokens[i + 2].token_type in (TokenType.VAR, TokenType.IDENTIFIER)
            and tokens[i + 3].token_type == TokenType.COMMA  # (``t.s`` is read as the column)
        ):
            raise InvalidArgument(
                f"{t.text}({tokens[i + 2].text}, ...): a date part given as a column is not supported "
                "(the SQL front end reads it as a constant part); give the part as a string, e.g. 'month'"
            )
        if (
            word == "export_state"
            and t.token_type == TokenType.VAR
            and i
            and tokens[i - 1].token_type == TokenType.R_PAREN
        ):
            raise InvalidArgument("EXPORT_STATE is not supported (an aggregate's state cannot be exported)")


def _percent(limit: exp.Limit) -> bool:
    """A ``LIMIT n%`` / ``LIMIT n PERCENT`` (DuckDB's), not a count of rows."""
    options = limit.args.get("limit_options")
    return options is not None and bool(options.args.get("percent"))


def _fetch_as_limit(sel: exp.Select) -> None:
    """Standard SQL's ``OFFSET n ROWS FETCH FIRST m ROWS ONLY`` as the ``LIMIT m`` the planner
    splits (sqlglot keeps it a ``Fetch``, which has no ``expression``: the plan failed with an
    AttributeError; held out, session 33). ``WITH TIES`` and ``PERCENT`` are refused by name."""
    fetch = sel.args.get("limit")
    if not isinstance(fetch, exp.Fetch):
        return
    options = fetch.args.get("limit_options")
    if options is not None and (options.args.get("with_ties") or options.args.get("percent")):
        raise InvalidArgument("FETCH ... WITH TIES and FETCH ... PERCENT are not supported: use LIMIT")
    count = fetch.args.get("count")
    sel.set("limit", exp.Limit(expression=count.copy() if count is not None else exp.Literal.number(1)))


@functools.lru_cache(maxsize=1)
def _engine_aggregates() -> frozenset[str]:
    """The names of the aggregate functions of the engine the fragments run on (DuckDB's
    catalog, aliases included). sqlglot knows many aggregates by name, not all: ``mean``,
    ``product``, ``histogram``, ``fsum``, ``entropy``, ``mad``, ``arbitrary`` ... parse as
    anonymous functions, and a query over one with no GROUP BY was planned as if its rows were
    independent, each fragment answering its own aggregate (issue 19, session 29: ``select
    histogram(l_linenumber) from lineitem`` answered one histogram per fragment). ``parse``
    makes each such call an aggregate node (``exp.AnonymousAggFunc``: not decomposable, so it is
    split only where its groups are whole in a partition)."""
    con = duck()
    try:
        rows = con.sql(
            "select distinct lower(function_name) from duckdb_functions() where function_type = 'aggregate'"
        ).fetchall()
    finally:
        con.close()
    return frozenset(r[0] for r in rows)


def _name_group_columns(sel: exp.Select) -> None:
    """``GROUP BY 1, 2`` and ``GROUP BY ALL`` written out as the columns they stand for, where
    those are plain columns (the same query: a plain column GROUP BY splits over the replicas,
    an ordinal did not and was gathered whole); anything else is left as written."""
    group = sel.args.get("group")
    if group is None or group.args.get("grouping_sets") or group.args.get("rollup") or group.args.get("cube"):
        return
    items = [i.this if isinstance(i, exp.Alias) else i for i in sel.expressions]
    if group.args.get("all"):
        keys = [i for i in items if not i.find(exp.AggFunc, exp.Window)]
        having = sel.args.get("having")
        named = {k.name.lower() for k in keys if isinstance(k, exp.Column)}
        if having is not None and any(
            c.name.lower() not in named
            for c in having.find_all(exp.Column)
            if not c.find_ancestor(exp.AggFunc, exp.Window, exp.Subquery)
        ):
            # DuckDB groups by the HAVING's columns outside aggregates too (``SELECT a ... GROUP
            # BY ALL HAVING b > 0`` groups by a and b): left as written (held out, DuckDB's tests:
            # written as ``GROUP BY a`` it was refused, "b must appear in the GROUP BY clause")
            return
        if keys and all(isinstance(k, exp.Column) for k in keys):
            group.set("all", None)
            group.set("expressions", [k.copy() for k in keys])
        return
    for g in group.expressions:
        if isinstance(g, exp.Literal) and g.is_int and 1 <= int(g.this) <= len(items):
            item = items[int(g.this) - 1]
            if isinstance(item, exp.Column):
                g.replace(item.copy())


def _paren_depth(sql: str) -> int:
    """Deepest parenthesis nesting outside quotes, before the (recursive) parser sees the text."""
    depth = deepest = 0
    quote = ""
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def _cte_names(tree: exp.Expr) -> set[str]:
    return {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}


def table_refs(tree: exp.Expr) -> list[exp.Table]:
    """Every base-table reference (CTE references excluded); table functions are refused."""
    ctes = _cte_names(tree)
    out = []
    for t in tree.find_all(exp.Table):
        if not isinstance(t.this, exp.Identifier):
            raise InvalidArgument(f"only store tables can be queried, not {short(t.this.sql(DIALECT), 80)}")
        if t.args.get("db") or t.args.get("catalog"):
            raise InvalidArgument(
                f"table {short(t.sql(DIALECT))}: no schema or catalog qualifiers in store SQL"
            )
        if t.name.lower() in ctes:
            continue
        out.append(t)
    return out


# ---------------------------------------------------------------------------------- analysis
def _used_names(tree: exp.Expr) -> set[str] | None:
    """Lower-case column names the query uses anywhere, or None when it selects ``*`` (every
    column) of some table: ``_used_columns`` without the tables a star reads whole."""
    used = _used_columns(tree)
    return None if used is None or used[1] else used[0]


def _used_columns(tree: exp.Expr) -> tuple[set[str], set[str]] | None:
    """Lower-case column names the query uses anywhere, and the lower-case names of the tables
    whose every column a star selects (``SELECT *`` or ``t.*`` over them); None when a star's
    sources are not known (every column of every table). ``count(*)`` and ``EXISTS (SELECT *
    ...)`` read no column through their star; a star over CTEs and derived tables reads what
    those select (``_star_over_derived``)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    whole: set[str] = set()
    for s in tree.find_all(exp.Star):
        if isinstance(s.parent, exp.Count):
            continue
        if isinstance(s.parent, exp.Select) and isinstance(s.parent.parent, exp.Exists):
            continue
        if _reads_a_stage(s.parent):
            continue  # a staged part's result (``_staged``: SELECT * FROM __microco_stageK)
        tables = _star_tables(s, ctes)
        if tables is None:
            return None
        whole |= tables
    if tree.find(exp.Columns):
        return None  # DuckDB's ``COLUMNS('regex')``: the columns whose names match (held out, session 33)
    if tree.find(exp.Pivot):
        # PIVOT groups by every column it does not name, UNPIVOT keeps them: the columns a
        # pivot reads are not the names written (held out, DuckDB's tests: ``FROM (PIVOT t ON
        # month USING sum(amount))`` read month and amount only, and answered one row of sums
        # over the whole table for DuckDB's row per (empid, status), silently)
        return None
    for t in tree.find_all(exp.Table):
        if _renamed_columns(t) and t.name.lower() not in ctes:
            # ``FROM t AS a(x, y)`` names t's first columns by position, so every column is
            # read, in the table's order (held out, DuckDB's tests: ``SELECT x, y FROM a
            # i1(x, y)`` read neither, and DuckDB refused the fragment's two names for 1 column)
            whole.add(t.name.lower())
    names: set[str] = set()
    for c in tree.find_all(exp.Column):
        names.add(c.name.lower())
        # ``meta.b`` is a column's struct field as often as a table's column: its qualifier
        # may name a column (reading one more column where it names a table's alias instead)
        names.update(part.lower() for part in (c.table, c.db, c.catalog) if part)
    for j in tree.find_all(exp.Join):
        if str(j.args.get("method") or "").upper() == "NATURAL":
            return None  # (joins on every column the two sides share)
        # ``JOIN ... USING (k)`` names its key as an identifier, not a column
        names.update(u.name.lower() for u in j.args.get("using") or [])
    return names, whole


def _joined(source: exp.Expr) -> list[exp.Expr]:
    """A FROM or join source as the sources a star over it covers: a parenthesized join, ``(a
    CROSS JOIN b)`` (sqlglot: a subquery around a table that carries joins), is each of its tables
    (nested ones too), not a derived table; anything else is itself. Held out (SQLite's
    sqllogictest, ``SELECT * FROM ( tab0 cor0 CROSS JOIN tab1 cor1 )``): the star was taken for a
    derived table's, so no column of either table was counted as needed, and the store answered
    with one column of each, silently."""
    inner = source.this if isinstance(source, exp.Subquery) else None
    if isinstance(inner, (exp.Table, exp.Subquery)) and inner.args.get("joins"):
        out = _joined(_without_joins(inner))
        for j in inner.args["joins"]:
            out.extend(_joined(j.this))
        return out
    if isinstance(inner, exp.Subquery):
        return _joined(inner)
    return [source]


def _without_joins(node: exp.Expr) -> exp.Expr:
    copy = node.copy()
    copy.set("joins", None)
    return copy


def _star_sources(star: exp.Star) -> list[exp.Expr] | None:
    """What ``star`` (``*`` or ``t.*`` in a select list) selects from: the FROM's and joins'
    sources it covers; None when it is not a select list's star."""
    q = star.parent.parent if isinstance(star.parent, exp.Column) else star.parent
    if not isinstance(q, exp.Select):
        return None
    sources: list[exp.Expr] = []
    src = q.args.get(_FROM)
    if src is not None:
        sources.extend(_joined(src.this))
    for j in q.args.get("joins") or []:
        sources.extend(_joined(j.this))
    if isinstance(star.parent, exp.Column) and star.parent.table:
        named = star.parent.table.lower()
        sources = [x for x in sources if x.alias_or_name.lower() == named]
    return sources or None


def _star_over_derived(star: exp.Star, ctes: set[str]) -> bool:
    """Whether ``star`` (``*`` or ``t.*``) selects only from CTEs and derived tables, whose
    columns are their own select lists' (counted where they are written; a star there is judged
    there), so no table's every column. Held out (TPC-DS Q33, Q56, Q60: ``SELECT * FROM ss UNION
    ALL SELECT * FROM cs ...`` over three CTEs) every column of six tables was read and gathered,
    1.7 GB at scale factor 1 for a query that uses 15 columns."""
    return _star_tables(star, ctes) == set()


def _star_tables(star: exp.Star, ctes: set[str]) -> set[str] | None:
    """The store tables (lower-case names) whose every column ``star`` selects: those among its
    sources (CTEs and derived tables add none: their columns are their select lists', judged
    where they are written); None when its sources are not known (not a select list's star, or a
    source that is neither a table nor a derived table). Held out (TPC-DS Q62, Q99: ``(SELECT
    SUBSTRING(w_warehouse_name, 1, 20) w_substr, * FROM warehouse) sq1`` joined to
    ``catalog_sales``) a star over a five-row table read and gathered all 34 columns of
    ``catalog_sales`` too, 570 MB at scale factor 1 for the five columns the query uses."""
    sources = _star_sources(star)
    if sources is None:
        return None
    out: set[str] = set()
    for x in sources:
        if isinstance(x, exp.Subquery):
            continue
        if not isinstance(x, exp.Table) or x.db or not isinstance(x.this, exp.Identifier):
            return None
        if x.name.lower() not in ctes:
            out.add(x.name.lower())
    return out


def _reads_a_stage(q: exp.Expr | None) -> bool:
    """Whether ``q`` is a SELECT from a staged part's result alone (no store table's columns)."""
    if not isinstance(q, exp.Select) or q.args.get("joins"):
        return False
    src = q.args.get(_FROM)
    return src is not None and isinstance(src.this, exp.Table) and src.this.name.startswith(STAGE)


def _needed_columns(
    tree: exp.Expr,
    schema: pa.Schema,
    names: set[str] | None = ...,  # type: ignore[assignment]
    whole: bool = False,
) -> list[str]:
    """The columns of ``schema`` the query uses (``names``: ``_used_names``, read from ``tree``
    when not given); all of them when ``whole`` (a star selects the table's every column)."""
    if names is ...:
        names = _used_names(tree)
    if names is None or whole:
        return list(schema.names)
    cols = [c for c in schema.names if c.lower() in names]
    return cols or [schema.names[0]]  # count(*) still needs the rows


def _conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    if e is None:
        return []
    return list(e.flatten()) if isinstance(e, exp.And) else [e]


def _only_inner(sel: exp.Select) -> bool:
    for j in sel.args.get("joins") or []:
        if j.side or (j.kind and j.kind.upper() not in ("INNER", "CROSS")):
            return False
    return True


def _owned(col: exp.Column, alias: str, cols: set[str], others: set[str]) -> bool:
    """``col`` surely names a column of the table aliased ``alias`` (cols: its columns, others:
    every other table's columns in the query: an unqualified name found there is ambiguous, or
    an outer reference of a correlated subquery)."""
    name = col.name.lower()
    if col.table:
        return col.table.lower() == alias.lower() and name in cols
    return name in cols and name not in others


def pushable(tree: exp.Expr, ref: exp.Table, cols: set[str], others: set[str]) -> list[exp.Expr]:
    """Conjuncts of the WHERE around ``ref`` that touch only its table, when filtering the table
    first is exactly equivalent: it is referenced once, directly in the FROM of a SELECT with only
    inner joins, and the conjunct has no subquery, aggregate or window."""
    sel = ref.parent.parent if isinstance(ref.parent, (exp.From, exp.Join)) else None
    if not isinstance(sel, exp.Select) or not _only_inner(sel):
        return []
    if sel.find(exp.TableSample):
        return []  # DuckDB samples the FROM's rows before the WHERE filters them
    where = sel.args.get("where")
    out = []
    for c in _conjuncts(where.this if where else None):
        if c.find(exp.Select, exp.AggFunc, exp.Window, exp.Exists, exp.Placeholder, exp.Parameter):
            continue
        used = list(c.find_all(exp.Column))
        if used and all(_owned(u, ref.alias_or_name, cols, others) for u in used):
            out.append(c)
    return out


def _unqualify(e: exp.Expr) -> exp.Expr:
    return e.copy().transform(
        lambda n: exp.Column(this=n.this.copy()) if isinstance(n, exp.Column) and n.table else n
    )


_DB: duckdb.DuckDBPyConnection | None = None
_DB_LOCK = threading.Lock()
_DB_CONFIG: dict[str, str] = {}  # set by ``configure`` before the database is opened
# A gather whose inputs are estimated above this streams them into DuckDB (bounded memory, one
# more copy); below it they are fetched in parallel and scanned in place as Arrow (faster: at
# scale factor 1 streaming cost the gather plans ~30% of their time). A quarter of the bound.
STREAM_MERGE_BYTES = 512 << 20


def configure(memory_mb: float | None = None, temp_dir: str | Path | None = None) -> None:
    """Bound this process's DuckDB: at most ``memory_mb`` MiB of its own memory (tables it holds,
    hash tables, sorts), spilling beyond to files under ``temp_dir`` (``None``: DuckDB's defaults,
    80% of the machine's memory). Queries from now on run in a database opened with these
    settings; those in flight finish in the one they started in."""
    global _DB, STREAM_MERGE_BYTES
    if memory_mb and memory_mb < 16:
        raise InvalidArgument(f"a DuckDB memory limit below 16 MiB cannot run queries (got {memory_mb:g})")
    with _DB_LOCK:
        _DB = None  # the next ``duck()`` opens the database anew (open cursors keep the old one)
        _DB_CONFIG.clear()
        STREAM_MERGE_BYTES = int((memory_mb or 2048) * (1 << 20)) // 4
        if memory_mb:
            _DB_CONFIG["memory_limit"] = f"{int(memory_mb)}MiB"
        if temp_dir is not None:
            Path(temp_dir).mkdir(parents=True, exist_ok=True)
            _DB_CONFIG["temp_directory"] = str(temp_dir)


def duck() -> duckdb.DuckDBPyConnection:
    """A fresh connection (cursor) to this process's one in-memory DuckDB database: a cursor costs
    ~1/10 of a new database (measured: 18 ms vs 190 ms here), and what a query registers is its
    cursor's own (temporary views are per connection). External access is off and locked."""
    global _DB
    with _DB_LOCK:
        if _DB is None:
            db = duckdb.connect(config=dict(_DB_CONFIG))
            db.execute("SET enable_external_access = false")
            db.execute("SET lock_configuration = true")
            _DB = db
        return _DB.cursor()


def _constant(e: exp.Expr) -> Any:
    """The value of a column-free expression (``date '1994-01-01' + interval '1' year``), by DuckDB."""
    if isinstance(e, exp.Literal):  # the common case, without a DuckDB round trip
        if e.is_string:
            return e.this
        if e.this.lstrip("-").isdigit():
            return int(e.this)
        if "e" in e.this.lower():
            return float(e.this)  # DuckDB's DOUBLE
        # DuckDB's DECIMAL, exactly: ``id < 300.00000000000000001`` holds for id 300, which
        # the float 300.0 would have pruned away (held out, session 41)
        return decimal.Decimal(e.this)
    if e.find(exp.Column, exp.Select, exp.AggFunc):
        raise ValueError("not constant")
    if e.find(exp.Collate):
        # ``s = 'A' COLLATE NOCASE`` compares under the collation, not the key's bytes (held out,
        # session 42: it pruned to the partition of 'A' and lost 'a', silently)
        raise ValueError("a collated value prunes nothing")
    text = e.sql(DIALECT)
    if any(not isinstance(f, (exp.Cast, exp.Interval)) for f in e.find_all(exp.Func)):
        _volatile.seen = True  # a plan pruned by it is not kept in the plan cache
        return _folded.__wrapped__(text)  # current_date, random(): not memoised
    return _folded(text)


_volatile = threading.local()  # .seen: this thread's planning folded a value that changes by itself


class _Temporal(str):
    """A date or timestamp's value, as the ISO text a partitioning casts to the key's type; not a
    string literal: SQL compares a string column with it as a date (``' 2021-01-05' = DATE
    '2021-01-05'`` holds in DuckDB), so it prunes no string key."""


@functools.lru_cache(maxsize=1024)
def _folded(text: str) -> Any:
    """DuckDB's value of a constant expression's text (a pure function of it: memoised, since a
    planner asks for the same constants once per replica it scores)."""
    con = duck()
    try:
        cur = con.execute(f"SELECT {text}")
        row = cur.fetchone()
        v = row[0] if row is not None else None
        kind = str(cur.description[0][1]) if cur.description else ""
    finally:
        con.close()
    if isinstance(v, dt.datetime | dt.time) and kind.endswith("_NS"):
        # Python's datetime drops the nanoseconds (held out, session 42: ``ts < TIMESTAMP_NS
        # '2021-06-01 00:00:00.0000005'`` was taken for midnight and pruned away the partition
        # starting there, which holds midnight, below the literal)
        raise ValueError("a timestamp or time of nanoseconds prunes nothing")
    if isinstance(v, dt.datetime):
        if v.time() != dt.time(0) or v.tzinfo is not None:
            raise ValueError("a timestamp prunes date partitions only at midnight")
        return _Temporal(v.date().isoformat())
    if isinstance(v, dt.date):
        return _Temporal(v.isoformat())
    return v


def _pruning_value(value: Any, type_: pa.DataType) -> Any:
    """``value`` as the partitioning must see it for pruning by ``column <op> value`` to keep
    every row SQL's comparison would (a tuple: each of an IN list's); ``ValueError`` where no
    value does. DuckDB casts a string column to the number it is compared with (``'01' = 1``
    holds); compares an integer or decimal column with a literal it does not hold exactly
    (``k = 3.5``, ``id < 299.5``, ``m < 1.005e0``, an integer past 64 bits) in a wider type; and
    a float column with a DECIMAL literal as the double nearest it (Python's ``float`` of it;
    Arrow's decimal-to-double cast is off by an ulp for about one literal in five). Before (held
    out, session 41) the first pruned to the partition of ``'1'``, the integers' failed the
    query ("literal ... does not fit a column of type int64"), and ``id < 300.00000000000000001``
    (read as the float 300.0) or ``m < 1.005e0`` (cast to 1.00) pruned away the partition
    starting there."""
    if isinstance(value, tuple):
        return tuple(_pruning_value(v, type_) for v in value)
    if value is None:
        return value
    if pa.types.is_dictionary(type_):
        # compared as its values are (held out, session 42: ``s = 1`` on a dictionary-encoded
        # string key pruned to the partition of '1', the string rule not seeing the strings)
        type_ = type_.value_type
    if pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_):
        if not isinstance(value, str) or isinstance(value, _Temporal):
            # (a date or timestamp too, held out, session 42: ``s = DATE '2021-01-05'`` pruned to
            # the partition of the text '2021-01-05' and lost ' 2021-01-05' and '2021-1-5')
            raise ValueError("a string column compared with a number or a date")
        return value
    if (pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_binary_view(type_)) and (
        isinstance(value, str) and "\\" in value
    ):
        # DuckDB reads ``\xHH`` in a string cast to BLOB as the byte HH; Arrow's cast keeps the
        # text (held out, session 42: ``b = '\xff'`` pruned to the partition of the four bytes
        # and lost the row of the byte 0xff, silently)
        raise ValueError("a string with escapes compared with a binary column")
    if (
        pa.types.is_floating(type_)
        and type_.bit_width < 64
        and isinstance(value, float)
        and value == value
        and not _holds_exactly(type_, value)
    ):
        # DuckDB compares a FLOAT column with a DOUBLE it does not hold as doubles; cast to the
        # column's type the literal rounds to a float32 a bound may equal (held out, session 42:
        # ``v < 1.000000016e-1`` pruned away the partition starting at 0.1f, which holds 0.1f)
        raise ValueError("a double a narrower float column does not hold")
    if pa.types.is_floating(type_) and isinstance(value, decimal.Decimal):
        value = float(value)
    if isinstance(value, float) and (
        pa.types.is_decimal(type_) or (pa.types.is_integer(type_) and not abs(value) < 2.0**53)
    ):
        raise ValueError("a double compared as a double with a column it is not")
    try:
        _literal_array([value], type_)
    except InvalidArgument:
        raise ValueError("a literal the column's type does not hold") from None
    return value


def _holds_exactly(type_: pa.DataType, value: float) -> bool:
    """Whether a float column of ``type_`` holds the double ``value`` exactly."""
    try:
        return float(pa.scalar(value, pa.float64()).cast(type_, safe=False).as_py()) == value
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def triples(conjuncts: list[exp.Expr], t: TableInfo) -> list[tuple[str, str, Any]]:
    """``(column, op, value)`` filters on ``t``'s partition columns, for pruning (the SQL filter
    itself runs on the nodes, so a conjunct left out here costs pruning, never correctness)."""
    partition_cols = {s.column for s in t.specs}
    out: list[tuple[str, str, Any]] = []
    for c in conjuncts:
        before = len(out)
        try:
            if isinstance(c, exp.Binary) and type(c) in _CMP:
                left, right, op = c.this, c.expression, _CMP[type(c)]
                if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
                    left, right, op = right, left, _FLIP[op]
                if isinstance(left, exp.Column) and left.name in partition_cols:
                    out.append((left.name, op, _constant(right)))
            elif (
                isinstance(c, exp.Between)
                and isinstance(c.this, exp.Column)
                and c.this.name in partition_cols
                # BETWEEN SYMMETRIC (PostgreSQL's, which sqlglot reads): either order of the
                # bounds (held out, session 42: ``id BETWEEN SYMMETRIC 700 AND 300`` pruned to
                # ``id >= 700 AND id <= 300``, no partition: 0 rows for 401)
                and not c.args.get("symmetric")
            ):
                out.append((c.this.name, ">=", _constant(c.args["low"])))
                out.append((c.this.name, "<=", _constant(c.args["high"])))
            elif (
                isinstance(c, exp.In)
                and isinstance(c.this, exp.Column)
                and c.this.name in partition_cols
                and c.expressions
                and not c.args.get("query")
                and (len(c.expressions) <= 64 or all(isinstance(v, exp.Literal) for v in c.expressions))
            ):
                out.append((c.this.name, "in", tuple(_constant(v) for v in c.expressions)))
        except (ValueError, duckdb.Error):
            del out[before:]
            continue
        try:
            out[before:] = [
                (col, op, _pruning_value(v, t.schema.field(col).type)) for col, op, v in out[before:]
            ]
        except ValueError:
            del out[before:]
    return out


# ---------------------------------------------------------------------------------- planning
def _side(t: TableInfo, cols: list[str], sources: list[dict[str, Any]]) -> dict[str, Any]:
    schema = pa.schema([t.schema.field(c) for c in cols])
    return {
        "sources": sources,
        "read": cols,
        "keep": cols,
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _scan_sql(name: str, cols: list[str], conds: list[exp.Expr] | list[str]) -> str:
    """``SELECT cols FROM name WHERE conds``, written directly (building a sqlglot SELECT and
    generating it cost ~10 ms a table under load; only the conditions need the generator)."""
    text = f"SELECT {', '.join(_ident(c) for c in cols)} FROM {_ident(name)}"
    if conds:
        text += " WHERE " + " AND ".join(
            f"({c if isinstance(c, str) else _unqualify(c).sql(DIALECT)})" for c in conds
        )
    return text


@dataclass
class _Ctx:
    core: StoreCore
    tree: exp.Query
    tables: dict[str, TableInfo]
    live: set[str]
    addresses: dict[str, str]
    # tables every fragment reads whole (small dimension tables joined to the split table(s))
    broadcast: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # ids of table references whose filters must not prune the split (``_subqueries``)
    noprune: set[int] = field(default_factory=set)
    text: str = ""  # the SQL as written (what DuckDB names unnamed outputs from)
    # what of the tables' extents is in memory on their nodes (``_residency``; None: not known)
    resident: Residency | None = None
    # an exchange being planned: table name -> the key columns its rows are hash-split by
    # (``_fragment_tasks`` then builds maps and reducers; ``exchange_maps`` gets the maps)
    exchange: dict[str, list[str]] | None = None
    exchange_maps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    exchange_cost: dict[str, float] = field(default_factory=dict)
    _names: Any = ...
    _bound: Any = ...  # the outputs' names as DuckDB binds ``text`` (``_bound_names``)

    def needed(self, t: TableInfo) -> list[str]:
        """The columns of table ``t`` that the query uses (names resolved once): all of them where
        a star selects from it."""
        if self._names is ...:
            self._names = _used_columns(self.tree)
        if self._names is None:
            return list(t.schema.names)
        names, whole = self._names
        return _needed_columns(self.tree, t.schema, names, t.name.lower() in whole)


def plan_sql(ctx: _Ctx) -> SqlPlan:
    tree = ctx.tree
    refs = table_refs(tree)
    if tree.find(exp.Pivot):
        # a PIVOT groups rows by columns it does not name (nor does the query): no split plan
        # knows them, so the tables are gathered (every column) and DuckDB runs it whole
        return _gather(ctx, refs)
    if any(_percent(limit) for limit in tree.find_all(exp.Limit)):
        # ``LIMIT 10%`` keeps a share of all the rows, which no fragment knows: the split plans
        # kept 10 rows a fragment and 10 in all (held out, session 42: 10 rows for DuckDB's 20
        # of 200, silently); DuckDB runs it whole
        return _gather(ctx, refs)
    plan = _distributed(ctx, refs)
    if plan is not None and plan.kind != "exchange":
        return plan
    exchanged = plan
    if exchanged is None:
        plan = _nested_local(ctx, refs)
        if plan is not None:
            return plan
        exchanged = _exchange_join(ctx, refs)
    gathered = _gather(ctx, refs)
    if exchanged is not None and _exchange_wins(ctx, exchanged, gathered):
        return exchanged
    staged = _staged(ctx) if getattr(ctx.core, "sql_staging", True) else None
    if staged is not None and staged.gathered_bytes < gathered.gathered_bytes:
        return staged
    if staged is not None:
        # the stages would leave the gather as big as it is (the rest reads the same columns of
        # the same tables: TPC-DS Q70's IN list over store_sales, whose outer query gathers
        # store_sales anyway): they would only add a round of fragments
        gathered.explain.insert(
            1,
            f"staging not chosen: the rest would still gather ~{staged.gathered_bytes / 1e6:.2f} MB "
            f"(the whole query: ~{gathered.gathered_bytes / 1e6:.2f} MB); its {len(staged.stages)} "
            "parts would only add a round of fragments",
        )
    return gathered


STAGE = "__microco_stage"  # the name a sub-plan's result has in the coordinator's SQL


def _unwrap(q: exp.Expr) -> exp.Expr:
    while isinstance(q, exp.Subquery) and not q.args.get("alias"):
        q = q.this
    return q


def _uncorrelated(q: exp.Select, tables: dict[str, TableInfo]) -> bool:
    """Whether ``q`` refers to nothing outside itself: every qualified column's qualifier is a
    table or alias of a FROM inside it, and every unqualified column is a column of a table read
    inside it (SQL resolves a name to the innermost scope that has it). Conservative: a table
    that is not a store table (a CTE) inside, or a star, counts as correlated."""
    names: set[str] = set()
    cols: set[str] = set()
    for t in q.find_all(exp.Table):
        info = tables.get(t.name.lower())
        if info is None:
            return False
        names |= {t.name.lower(), t.alias_or_name.lower()}
        cols |= {c.lower() for c in info.schema.names}
    aliases = {e.alias.lower() for e in q.find_all(exp.Alias)} | {
        s.alias.lower() for s in q.find_all(exp.Subquery) if s.alias
    }
    for c in q.find_all(exp.Column):
        if c.table:
            if c.table.lower() not in names | aliases:
                return False
        elif c.name.lower() not in cols | aliases:
            return False
    return True


def _group_map(cols: list[exp.Column], prefix: str) -> tuple[dict[str, str], list[exp.Expr]]:
    """Names ``prefix0``, ``prefix1``... for group columns: the map from each column (its SQL,
    and its bare name) to its name, and the SELECT items that compute them."""
    gmap: dict[str, str] = {}
    for i, g in enumerate(cols):
        gmap[g.sql(DIALECT)] = f"{prefix}{i}"
        gmap.setdefault(g.name, f"{prefix}{i}")
    return gmap, [exp.alias_(g.copy(), f"{prefix}{i}") for i, g in enumerate(cols)]


def _partial_items(a: exp.AggFunc, name: str) -> list[exp.Expr]:
    """The partial aggregates of ``a`` that a part computes: an average as its sum and count
    (``name``s, ``name``n), any other as itself (``name``)."""
    if isinstance(a, exp.Avg):
        return [
            exp.alias_(exp.Sum(this=a.this.copy()), f"{name}s"),
            exp.alias_(exp.Count(this=a.this.copy()), f"{name}n"),
        ]
    return [exp.alias_(a.copy(), name)]


def _group_columns(group: exp.Group) -> list[exp.Column] | None:
    """The plain columns of a GROUP BY, ROLLUP and CUBE included, or None (an expression, an
    ordinal, GROUPING SETS, GROUP BY ALL)."""
    if group.args.get("all") or group.args.get("grouping_sets"):
        return None
    out: list[exp.Column] = []
    for g in group.expressions:
        items = g.expressions if isinstance(g, (exp.Rollup, exp.Cube)) else [g]
        for c in items:
            if not isinstance(c, exp.Column):
                return None
            if all(c != o for o in out):
                out.append(c)
    for key in ("rollup", "cube"):
        for r in group.args.get(key) or []:
            for c in getattr(r, "expressions", []):
                if not isinstance(c, exp.Column):
                    return None
                if all(c != o for o in out):
                    out.append(c)
    return out


def _preaggregate(q: exp.Select) -> exp.Select | None:
    """A grouped SELECT that does not split as written (a window over its groups, a ROLLUP or
    CUBE, an aggregate of aggregates), rewritten in place to run over a pre-aggregation: the
    returned inner SELECT groups the same rows by the same columns (finest grouping) with
    partial aggregates (sum, count, min, max; avg as sum and count), and ``q`` becomes the same
    query over it (``FROM (inner) __pre``), its aggregates merged from the partials (a sum of
    sums, of counts; min of mins...), so its windows, ROLLUP/CUBE, HAVING and ORDER BY run over
    the few pre-aggregated rows. The inner SELECT is an ordinary grouped query, which splits.
    None when an aggregate does not decompose or an output is unnamed (``q`` may then be
    half rewritten: give a copy)."""
    group = q.args.get("group")
    if group is None or q.args.get("qualify") or q.args.get("windows") or q.find(exp.Filter, exp.WithinGroup):
        return None  # (a named WINDOW clause is not rewritten)
    cols = _group_columns(group)
    if not cols:
        return None
    named = {e.alias.lower(): e.this for e in q.expressions if isinstance(e, exp.Alias)}
    for c in cols:
        this = named.get(c.name.lower()) if not c.table else None
        if this is not None and not (isinstance(this, exp.Column) and this.name.lower() == c.name.lower()):
            # ``SELECT i AS j ... GROUP BY j``: the key is the select list's alias, which the
            # inner SELECT over the table would not have (held out, DuckDB's tests:
            # ``test_having_alias.test``, refused, "Referenced column "j" not found")
            return None
    for n in q.walk():
        if n is not q and isinstance(n, (exp.Select, exp.Subquery)):
            return None
    if not _only_inner(q):
        return None
    windowed = {id(w.this) for w in q.find_all(exp.Window)}
    aggs = [a for a in q.find_all(exp.AggFunc) if id(a) not in windowed and not isinstance(a, exp.Grouping)]
    for a in aggs:
        if not isinstance(a, _DECOMPOSABLE) or a.find(exp.Distinct):
            return None
        if any(isinstance(x, exp.AggFunc) for x in a.this.walk()) if a.this is not None else False:
            return None
    out_items = []
    for e in q.expressions:
        if isinstance(e, exp.Column):
            e = exp.alias_(e.copy(), e.name, quoted=True)
        elif not isinstance(e, exp.Alias):
            return None  # an unnamed expression: its output name would change
        out_items.append(e)
    gmap, inner_items = _group_map(cols, "__p_g")
    merged: dict[str, exp.Expr] = {}
    for a in aggs:
        key = a.sql(DIALECT)
        if key in merged:
            continue
        k = len(merged)
        inner_items += _partial_items(a, f"__p_a{k}")
        if isinstance(a, exp.Avg):
            merged[key] = sqlglot.parse_one(
                f"CAST(SUM(__p_a{k}s) AS DOUBLE) / NULLIF(SUM(__p_a{k}n), 0)", read=DIALECT
            )
        elif isinstance(a, exp.Count):
            merged[key] = sqlglot.parse_one(f"CAST(COALESCE(SUM(__p_a{k}), 0) AS BIGINT)", read=DIALECT)
        else:
            merge = exp.Sum if isinstance(a, exp.Sum) else type(a)
            merged[key] = merge(this=exp.column(f"__p_a{k}"))
    aliases = {e.alias.lower() for e in out_items}
    bad: list[exp.Expr] = []
    agg_ids = {id(a) for a in aggs}

    def fn(n: exp.Expr) -> exp.Expr:
        if id(n) in agg_ids:
            return merged[n.sql(DIALECT)].copy()
        if isinstance(n, exp.Column):
            g = gmap.get(n.sql(DIALECT)) or (gmap.get(n.name) if not n.table else None)
            if g:
                return exp.column(g)
            if n.table or n.name.lower() not in aliases:
                bad.append(n)
        return n

    def rewrite(e: exp.Expr) -> exp.Expr:
        # transform() rebuilds parents, so map by identity on the original before copying
        return e.transform(fn, copy=False)

    inner = exp.select(*inner_items)
    inner.set(_FROM, q.args[_FROM].copy())
    if q.args.get("joins"):
        inner.set("joins", [j.copy() for j in q.args["joins"]])
    if q.args.get("where"):
        inner.set("where", q.args["where"].copy())
    inner = inner.group_by(*[c.copy() for c in cols])
    # q itself is rewritten (the identities of its aggregates are what ``fn`` knows): the
    # caller gives a copy, kept only when the inner part splits
    new_items = [rewrite(e) for e in out_items]
    new_group = rewrite(q.args["group"])
    new_having = rewrite(q.args["having"]) if q.args.get("having") else None
    new_order = rewrite(q.args["order"]) if q.args.get("order") else None
    if bad:
        return None
    q.set("expressions", new_items)
    q.set("group", new_group)
    q.set("having", new_having)
    q.set("order", new_order)
    q.set("where", None)
    q.set("joins", None)
    q.set(
        _FROM, exp.From(this=exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("__pre"))))
    )
    return inner


def _staged(ctx: _Ctx) -> SqlPlan | None:
    """A query that does not split whole, cut into parts that do: each CTE body, branch of a
    set operation (UNION [ALL], INTERSECT, EXCEPT) and derived table in a FROM that splits on
    its own (``_distributed``: partition-local or partial aggregation) runs as its own
    distributed sub-plan, looked at top-down (a part that does not split is searched for parts
    of its own); then each subquery in an expression (scalar, IN, EXISTS) that is not correlated
    (``_uncorrelated``). Only parts that reduce what reaches the coordinator (an aggregate, a
    GROUP BY, a LIMIT) are staged: a scan's rows would come whole, as gathered. The sub-plans
    run side by side, before the rest. None of the first positions can be correlated with an enclosing query
    (no LATERAL is followed), so a part's result is the same wherever it is computed. Each part is replaced
    in the query by a scan of its result (``__microco_stageK``), and the rest is a gather: the
    tables it still reads are gathered as ``_gather`` does, and DuckDB runs the rest at the
    coordinator over them and the parts' results. None when no part splits."""
    tree = ctx.tree.copy()
    first: exp.Expr = _unwrap(tree)
    while isinstance(first, exp.SetOperation):
        first = _unwrap(first.left)
    # an unnamed output is named by DuckDB after its text (`(SELECT avg(x) FROM t)`), which the
    # parts' replacements would change: each gets DuckDB's name for it first
    named = (exp.Alias, exp.Column, exp.Star)  # a star's names are its sources', a stage's too
    if (
        isinstance(first, exp.Select)
        and not all(isinstance(e, named) for e in first.expressions)
        and not _name_outputs(_Ctx(ctx.core, tree, ctx.tables, ctx.live, ctx.addresses, text=ctx.text), first)
    ):
        return None
    outer_ctes = _cte_names(tree)
    stages: list[tuple[str, SqlPlan]] = []

    def split(q: exp.Expr, pre: bool = True) -> bool:
        if not isinstance(q, exp.Select) or q.args.get(_WITH):
            return False
        if any(t.name.lower() in outer_ctes for t in q.find_all(exp.Table)):
            return False  # reads a CTE: not a store table's fragments
        if any(isinstance(x, exp.Lateral) for x in q.walk()):
            return False
        refs = table_refs(q)
        if not refs or any(r.name.lower() not in ctx.tables for r in refs):
            return False
        if not (q.args.get("group") or q.args.get("limit") or q.find(exp.AggFunc)):
            return False  # a scan brings every row it reads to the coordinator: no gain on a gather
        sub = _Ctx(ctx.core, q.copy(), ctx.tables, ctx.live, ctx.addresses, text=q.sql(DIALECT))
        plan = _distributed(sub, table_refs(sub.tree))
        if plan is None:
            plan = _exchange_join(sub, table_refs(sub.tree))
        if plan is not None and plan.kind == "exchange":
            if not _exchange_wins(sub, plan, _gather(sub, table_refs(sub.tree))):
                plan = None
        if plan is None:
            if not pre:
                return False
            trial = q.copy()  # over a pre-aggregation that splits, else q as it was
            inner = _preaggregate(trial)
            if inner is None or not split(inner, pre=False):
                return False
            for k in list(set(q.args) | set(trial.args)):
                q.set(k, trial.args.get(k))
            return True
        q.replace(exp.select("*").from_(stage(plan)))
        return True

    def stage(plan: SqlPlan) -> str:
        name = f"{STAGE}{len(stages)}"
        stages.append((name, plan))
        return name

    def visit(q: exp.Expr) -> None:
        q = _unwrap(q)
        if split(q):
            return
        w = q.args.get(_WITH)
        for cte in w.expressions if w else []:
            visit(cte.this)
        if isinstance(q, exp.SetOperation):
            visit(q.left)
            visit(q.right)
        elif isinstance(q, exp.Select):
            sources = [q.args[_FROM].this] if q.args.get(_FROM) else []
            sources += [j.this for j in q.args.get("joins") or []]
            for src in sources:
                if isinstance(src, exp.Subquery):
                    visit(src.this)

    visit(tree)
    # uncorrelated scalar aggregates over one table, several to a table: one sub-plan (one scan) each
    for combined, uses in _batched_scalars(tree, ctx.tables):
        batch = _Ctx(ctx.core, combined, ctx.tables, ctx.live, ctx.addresses, text=combined.sql(DIALECT))
        batched = _distributed(batch, table_refs(batch.tree))
        if batched is None:
            continue
        name = stage(batched)
        for q, column in uses:
            q.replace(exp.select(exp.column(column)).from_(name))
    # then subqueries in expressions (scalar, IN, EXISTS) that are not correlated, outermost first
    for q in list(tree.find_all(exp.Select)):
        if q is not tree and q.root() is tree and _uncorrelated(q, ctx.tables):
            split(q)
    if not stages:
        return None
    rest = _Ctx(ctx.core, tree, ctx.tables, ctx.live, ctx.addresses, text="")
    plan = _gather(rest, [r for r in table_refs(tree) if not r.name.startswith(STAGE)])
    explain = [
        f"plan: staged: {len(stages)} parts of the query (CTEs, set-operation branches, derived tables) "
        "split over partitions, each its own distributed sub-plan; DuckDB runs the rest at the "
        "coordinator over their results"
        + (f" and {len(set(plan.inputs))} gathered tables" if plan.inputs else "")
    ]
    for name, sub in stages:
        explain.append(f"  {name}: {sub.kind}")
        explain += [f"    {line}" for line in sub.explain]
    explain += plan.explain[1:]
    replicas = dict(plan.replicas)
    for _, sub in stages:
        replicas.update(sub.replicas)
    return replace(
        plan,
        kind="staged",
        explain=explain,
        replicas=replicas,
        moved_bytes=plan.moved_bytes + sum(sub.moved_bytes for _, sub in stages),
        stages=stages,
    )


BATCHED = "__microco_b"  # a batched scalar subquery's column in its stage's one row
_BATCHABLE_AGGS = (exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Count)


def _scalar_aggregate(q: exp.Select, tree: exp.Expr, tables: dict[str, TableInfo]) -> tuple[str, str] | None:
    """The (table, alias) of ``q`` when it is an uncorrelated scalar subquery in an expression
    that aggregates one store table to one value: ``(select <expr of sum/avg/min/max/count> from
    t [where cond])``, no DISTINCT, FILTER, GROUP BY, HAVING, ORDER BY, LIMIT, window or nested
    subquery, every column inside an aggregate. Else None."""
    sub = q.parent
    if not isinstance(sub, exp.Subquery) or sub.args.get("alias") or q.root() is not tree:
        return None
    if isinstance(sub.parent, (exp.In, exp.Exists, exp.Any, exp.All, exp.From, exp.Join, exp.SetOperation)):
        return None  # a row source, not a value
    if {k for k, v in q.args.items() if v} - {"expressions", _FROM, "where"}:
        return None
    src = q.args.get(_FROM)
    if src is None or not isinstance(src.this, exp.Table) or src.this.name.lower() not in tables:
        return None
    if len(q.expressions) != 1 or not _uncorrelated(q, tables):
        return None
    item = q.expressions[0]
    value = item.this if isinstance(item, exp.Alias) else item
    aggs = list(value.find_all(exp.AggFunc))
    if not aggs or any(type(a) not in _BATCHABLE_AGGS or a.find(exp.Distinct) for a in aggs):
        return None
    if any(x is not q for x in q.find_all(exp.Select)) or q.find(exp.Window, exp.Filter):
        return None
    where = q.args.get("where")
    if where is not None and where.find(exp.AggFunc):
        return None
    for c in value.find_all(exp.Column):
        if c.find_ancestor(exp.AggFunc) is None:
            return None
    return src.this.name.lower(), src.this.alias_or_name.lower()


def _batched_scalars(
    tree: exp.Expr, tables: dict[str, TableInfo]
) -> list[tuple[exp.Select, list[tuple[exp.Select, str]]]]:
    """Uncorrelated scalar aggregates over the same table (TPC-DS Q9: fifteen of them over
    ``store_sales``, each its own sub-plan and scan before), batched: one SELECT per table whose
    columns are the subqueries' values, each aggregate restricted to its own subquery's rows
    (``agg(x) where c`` as ``agg(case when c then x end)``; ``count(*)`` as ``count(case when c
    then 1 end)``: aggregates skip NULLs, so each value is exactly its subquery's, NULL or 0 over
    no rows alike), and the rows read cut to the union of the conditions. Returns each combined
    SELECT with the subqueries it answers and the column of each (identical subqueries share
    one). Only tables with two subqueries or more."""
    groups: dict[tuple[str, str], list[exp.Select]] = defaultdict(list)
    for q in tree.find_all(exp.Select):
        key = _scalar_aggregate(q, tree, tables)
        if key is not None:
            groups[key].append(q)
    out = []
    for subs in groups.values():
        if len(subs) < 2:
            continue
        items: list[exp.Expr] = []
        conds: list[exp.Expr] = []
        seen: dict[str, str] = {}
        uses = []
        for q in subs:
            text = q.sql(DIALECT)
            if text not in seen:
                seen[text] = f"{BATCHED}{len(seen)}"
                where = q.args.get("where")
                cond = where.this.copy() if where is not None else None
                item = q.expressions[0]
                value = (item.this if isinstance(item, exp.Alias) else item).copy()
                if cond is not None:
                    conds.append(exp.paren(cond.copy(), copy=False))
                    value = _restricted(value, cond)
                items.append(exp.alias_(value, seen[text]))
            uses.append((q, seen[text]))
        combined = exp.select(*items).from_(subs[0].args[_FROM].this.copy())
        if len(conds) == len(seen):  # every subquery filters: read only rows one of them keeps
            combined = combined.where(exp.or_(*conds, copy=False), copy=False)
        out.append((combined, uses))
    return out


def _restricted(value: exp.Expr, cond: exp.Expr) -> exp.Expr:
    """``value`` with every aggregate's input limited to the rows where ``cond`` holds."""

    def fn(n: exp.Expr) -> exp.Expr:
        if not isinstance(n, _BATCHABLE_AGGS):
            return n
        arg = n.this
        inner = exp.Literal.number(1) if arg is None or isinstance(arg, exp.Star) else arg.copy()
        case = exp.Case(ifs=[exp.If(this=cond.copy(), true=inner)])
        return n.__class__(this=case, **{k: v for k, v in n.args.items() if k != "this"})

    return value.transform(fn, copy=False)


def _columns_of(tables: dict[str, TableInfo]) -> dict[str, set[str]]:
    return {n: {c.lower() for c in t.schema.names} for n, t in tables.items()}


def _gather(ctx: _Ctx, refs: list[exp.Table]) -> SqlPlan:
    by_name: dict[str, list[exp.Table]] = defaultdict(list)
    for r in refs:
        by_name[r.name.lower()].append(r)
    colsets = _columns_of(ctx.tables)
    tasks: list[tuple[str, dict[str, Any]]] = []
    inputs: list[str] = []
    explain = [
        (
            "plan: gather: the query does not split over partitions (subquery, outer join, several "
            "tables or a non-decomposable aggregate); each table's needed columns are read from one replica, "
            "filtered next to the data, and DuckDB runs the whole SQL at the coordinator"
        )
    ]
    replicas: dict[str, int] = {}
    gathered = 0.0
    facts: dict[str, _Gathered] = {}
    for name, occ in sorted(by_name.items()):
        t = ctx.tables[name]
        others = set().union(*(v for k, v in colsets.items() if k != name and k in by_name))
        # (not below a PIVOT/UNPIVOT: a WHERE over it may name a column it makes, which a
        # table's column of the same name is not)
        pushed = len(occ) == 1 and not ctx.tree.find(exp.Pivot)
        conds = pushable(ctx.tree, occ[0], colsets[name], others) if pushed else []
        cols = ctx.needed(t)
        where = triples(conds, t)
        # every replica moves what it reads to the coordinator: the cheapest read wins
        rep, cost, units, allowed = cheapest_replica(t, where, cols, ctx.live, ctx.addresses, ctx.resident)
        if len(occ) == 1:
            facts[name] = _Gathered(occ[0], t, cols, conds, others, float(cost.bytes_read))
        why = pruned_partitions(t, rep, where)[1]
        groups = _by_node(units)
        if not groups:
            groups = {min(ctx.live) if ctx.live else "": []}
        sql = _scan_sql(t.name, cols, conds)
        for node, srcs in groups.items():
            tasks.append((node, {"op": "sql", "inputs": {t.name: _side(t, cols, srcs)}, "sql": sql}))
            inputs.append(t.name)
        replicas[t.name] = rep
        gathered += cost.bytes_read
        explain.append(
            f"  {t.name}: replica {rep} ({t.specs[rep].describe()}), {len(cols)} of {len(t.schema)} columns, "
            f"{len(units)} extent units, {sum(u.bytes for u in units) / 1e6:.2f} MB on {len(groups)} nodes"
            + (
                f"; pruned to partitions {sorted(allowed)} by {' and '.join(why)}"
                if allowed is not None
                else ""
            )
            + (f"; {len(conds)} filters pushed to the nodes" if conds else "")
            + f"; cost: ~{cost.rows} rows, {cost.bytes_read / 1e6:.2f} MB of its columns read (the least of its replicas)"
            + (
                ""
                if cost.in_memory is None
                else f", reading it ~{cost.read_s:.3g} s ({cost.in_memory:.0%} in memory, "
                f"{cost.disk_bytes / 1e6:.1f} MB from disk), the cheapest of its replicas to read and move"
            )
        )
    semi = _semi_joins(facts, colsets, semi_join_bytes(ctx.core))
    for sj in semi:
        explain.append(
            f"  semi-join: {sj['table']} read after {sj['keys_from']}, filtered next to the data by "
            f"{sj['column']} IN the {sj['key_column']} values {sj['keys_from']} brings "
            f"(inner-joined on them; ~{facts[sj['table']].bytes / 1e6:.2f} MB before the filter; no "
            f"filter if over {SEMI_JOIN_MAX_KEYS:,} keys)"
        )
    explain.append(
        f"  merge: ~{gathered / 1e6:.2f} MB to the coordinator, "
        + (
            "streamed into DuckDB (above the merge's Arrow threshold)"
            if gathered > STREAM_MERGE_BYTES
            else "held as Arrow (below the merge's streaming threshold)"
        )
    )
    return SqlPlan(
        "gather", tasks, ctx.tree.sql(DIALECT), inputs, explain, replicas, gathered_bytes=gathered, semi=semi
    )


# A gathered table estimated at least this big (its needed columns) is read after the smaller
# tables it is inner-joined to that have filters of their own, and filtered next to the data by
# their join keys (a semi-join reduction): one more round trip, for a fraction of its bytes.
SEMI_JOIN_MIN_BYTES = 32e6
SEMI_JOIN_SHARE = 0.25  # ... when the key table is at most this share of it
SEMI_JOIN_MAX_KEYS = 250_000  # distinct keys beyond this: no filter (every node gets the keys)
SEMI_JOIN_MAX_KEY_BYTES = 4e6  # ... or keys taking more bytes (they travel in the task's ticket)


@dataclass
class _Gathered:
    """A table referenced once in a gather: its reference, needed columns, pushed conditions,
    every other table's column names, and the estimated bytes of its read."""

    ref: exp.Table
    t: TableInfo
    cols: list[str]
    conds: list[exp.Expr]
    others: set[str]
    bytes: float


def _scope(ref: exp.Table) -> exp.Select | None:
    sel = ref.parent.parent if isinstance(ref.parent, (exp.From, exp.Join)) else None
    return sel if isinstance(sel, exp.Select) and _only_inner(sel) else None


def semi_join_bytes(core: Any) -> float:
    """The core's semi-join threshold (``StoreCore.sql_semi_join_bytes``; 0 or less: none)."""
    v = getattr(core, "sql_semi_join_bytes", None)
    v = SEMI_JOIN_MIN_BYTES if v is None else v
    return v if v > 0 else float("inf")


def _semi_joins(
    facts: dict[str, _Gathered], colsets: dict[str, set[str]], min_bytes: float
) -> list[dict[str, Any]]:
    """Semi-join reductions for a gather: ``T.a = S.b`` a conjunct (WHERE, or an inner join's ON)
    of the SELECT whose FROM has both ``T`` and ``S`` directly, both referenced once in the query
    (so the gathered ``T`` feeds only that SELECT), ``S`` with filters of its own and at most
    ``SEMI_JOIN_SHARE`` of ``T``'s bytes, ``T`` at least ``min_bytes``. Then a row of ``T`` whose
    ``a`` is not among the ``b`` of ``S``'s filtered rows joins no row of ``S``, so the inner join
    drops it anyway (NULL keys too): exact. ``S`` is read first and is itself not reduced (one
    level). Once some ``S`` is read first (its round trip paid), every other table joined to it
    that way takes its keys too, whatever their sizes."""
    cands = _semi_pairs(facts, colsets, min_bytes, SEMI_JOIN_SHARE, None)
    first = {sj["keys_from"] for sj in cands}
    kept = [sj for sj in cands if sj["table"] not in first]
    if kept:
        first = {sj["keys_from"] for sj in kept}
        more = _semi_pairs(facts, colsets, 0.0, float("inf"), first)
        kept += [sj for sj in more if sj["table"] not in first]
    out: list[dict[str, Any]] = []
    seen = set()
    for sj in kept:
        k = (sj["table"], sj["column"], sj["keys_from"], sj["key_column"])
        if k not in seen:
            seen.add(k)
            out.append(sj)
    return out


def _semi_pairs(
    facts: dict[str, _Gathered],
    colsets: dict[str, set[str]],
    min_bytes: float,
    share: float,
    sources: set[str] | None,
) -> list[dict[str, Any]]:
    """Every ``T.a = S.b`` pair of ``_semi_joins``: ``T`` at least ``min_bytes``, ``S`` filtered,
    at most ``share`` of ``T``'s bytes and (when ``sources`` is given) among those tables. The
    equality may be a chain of the SELECT's column equalities (``ps_partkey = l_partkey and
    l_partkey = p_partkey``: every joined row has ``ps_partkey = p_partkey``) when every column of
    the chain belongs to a table referenced once and all have one type (so no cast in between)."""
    cands: list[dict[str, Any]] = []
    for tname, ft in facts.items():
        sel = _scope(ft.ref)
        if sel is None or ft.bytes < min_bytes:
            continue
        for a, sname, b in _equal_columns(facts, colsets, sel).get(tname, []):
            fs = facts[sname]
            if (
                sname == tname
                or not fs.conds
                or (sources is not None and fs.t.name not in sources)
                or fs.bytes > share * ft.bytes
            ):
                continue
            cands.append(
                {
                    "table": ft.t.name,
                    "column": a,
                    "keys_from": fs.t.name,
                    "key_column": b,
                    "cols": ft.cols,
                    "conds": [_unqualify(x).sql(DIALECT) for x in ft.conds],
                }
            )
    return cands


def _equal_columns(
    facts: dict[str, _Gathered], colsets: dict[str, set[str]], sel: exp.Select
) -> dict[str, list[tuple[str, str, str]]]:
    """For each table referenced once directly in ``sel``'s FROM: ``(its column a, other table,
    its column b)`` with ``a = b`` implied by ``sel``'s column equalities (WHERE and inner joins'
    ON), directly or through a chain of columns of such tables, all of one type."""
    where = sel.args.get("where")
    conj = _conjuncts(where.this if where else None)
    for j in sel.args.get("joins") or []:
        conj += _conjuncts(j.args.get("on"))
    here = {n: f for n, f in facts.items() if _scope(f.ref) is sel}

    def owner(col: exp.Column) -> tuple[str, str] | None:
        for n, f in here.items():
            if _owned(col, f.ref.alias_or_name, colsets[n], f.others):
                return n, next(c for c in f.t.schema.names if c.lower() == col.name.lower())
        return None

    parent: dict[Any, Any] = {}

    def find(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    direct: set[frozenset[Any]] = set()
    for c in conj:
        if not (
            isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
        ):
            continue
        x, y = owner(c.this), owner(c.expression)
        kx = x if x is not None else ("?", c.this.sql(DIALECT))
        ky = y if y is not None else ("?", c.expression.sql(DIALECT))
        parent[find(kx)] = find(ky)
        if x is not None and y is not None:
            direct.add(frozenset((x, y)))
    classes: dict[Any, list[Any]] = defaultdict(list)
    for k in list(parent):
        classes[find(k)].append(k)
    out: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for members in classes.values():
        typed = {here[m[0]].t.schema.field(m[1]).type for m in members if m[0] != "?"}
        chain_ok = all(m[0] != "?" for m in members) and len(typed) == 1
        for x in members:
            for y in members:
                if x == y or x[0] == "?" or y[0] == "?" or x[0] == y[0]:
                    continue
                if chain_ok or frozenset((x, y)) in direct:
                    out[x[0]].append((x[1], y[0], y[1]))
    return out


def semi_first(plan: SqlPlan) -> list[int]:
    """The tasks a gather with semi-joins runs first: those of the tables that give keys."""
    first = {sj["keys_from"] for sj in plan.semi}
    return [i for i, name in enumerate(plan.inputs) if name in first]


def keyed_tasks(
    plan: SqlPlan, first: dict[int, pa.Table]
) -> tuple[list[tuple[int, tuple[str, dict[str, Any]]]], list[str]]:
    """The rest of a semi-joined gather's tasks (index, task), each reduced table's scan
    filtered by the distinct key values of the first tasks' outputs (``first``: index ->
    output); and a line per filter for EXPLAIN."""
    by: dict[str, list[pa.Table]] = defaultdict(list)
    for i, out in first.items():
        by[plan.inputs[i]].append(out)
    extra: dict[str, list[str]] = defaultdict(list)
    keys: dict[str, dict[str, str]] = defaultdict(dict)
    notes = []
    for sj in plan.semi:
        col = _exec.concat(by[sj["keys_from"]]).column(sj["key_column"])
        values = pc.unique(col.drop_null() if col.null_count else col)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if len(values) > SEMI_JOIN_MAX_KEYS or values.nbytes > SEMI_JOIN_MAX_KEY_BYTES:
            notes.append(
                f"semi-join run: {sj['table']}.{sj['column']} not filtered ({len(values):,} keys, "
                f"{values.nbytes / 1e6:.1f} MB: over {SEMI_JOIN_MAX_KEYS:,} keys or "
                f"{SEMI_JOIN_MAX_KEY_BYTES / 1e6:.0f} MB)"
            )
            continue
        t = sj["table"]
        name = f"__microco_keys_{len(keys[t])}"
        while name.lower() == t.lower():
            name += "_"
        sink = pa.BufferOutputStream()
        kt = pa.table({"k": values})
        with pa.ipc.new_stream(sink, kt.schema) as w:
            w.write_table(kt)
        keys[t][name] = base64.b64encode(sink.getvalue().to_pybytes()).decode()
        extra[t].append(f"{_ident(sj['column'])} IN (SELECT k FROM {_ident(name)})")
        notes.append(f"semi-join run: {t}.{sj['column']} IN {len(values):,} keys of {sj['keys_from']}")
    base = {sj["table"]: sj for sj in plan.semi}
    rest = []
    for i, (node, task) in enumerate(plan.tasks):
        if i in first:
            continue
        t = plan.inputs[i]
        if extra.get(t):
            sj = base[t]
            task = {**task, "sql": _scan_sql(t, sj["cols"], sj["conds"] + extra[t]), "keys": keys[t]}
        rest.append((i, (node, task)))
    return rest, notes


def task_keys(task: dict[str, Any]) -> dict[str, pa.Table]:
    """A fragment's key tables (``keyed_tasks``), decoded."""
    return {
        name: pa.ipc.open_stream(pa.py_buffer(base64.b64decode(b))).read_all()
        for name, b in (task.get("keys") or {}).items()
    }


def _by_node(units: list[Unit]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for u in units:
        for s in u.sources:
            out[s["node"]].append(s)
    return dict(sorted(out.items()))


def _simple_select(tree: exp.Expr, allowed: tuple[exp.Expr, ...] = ()) -> exp.Select | None:
    """``tree`` as one SELECT without CTEs, set operations, subqueries or windows, else None
    (the subqueries in ``allowed`` excepted: their insides are not looked at)."""
    if not isinstance(tree, exp.Select) or tree.args.get(_WITH):
        return None
    inside = {id(x) for a in allowed for x in a.walk()}
    for n in tree.walk():
        if (
            n is not tree
            and id(n) not in inside
            and isinstance(n, (exp.Select, exp.Subquery, exp.Exists, exp.Window, exp.SetOperation))
        ):
            return None
    if not _only_inner(tree):
        return None
    if tree.args.get("distinct") or tree.args.get("qualify"):
        return None
    if tree.find(exp.TableSample):
        return None  # a sample of the whole table, not of each fragment's rows
    group = tree.args.get("group")
    if group is not None and (
        group.args.get("all") or not all(isinstance(g, exp.Column) for g in group.expressions)
    ):
        return None  # GROUP BY ALL / ordinals / expressions / ROLLUP, CUBE, GROUPING SETS
    if tree.find(exp.Filter, exp.WithinGroup):
        return None  # an aggregate's FILTER or WITHIN GROUP changes what its partial would be
    return tree


def _same_domain(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal values of columns of these types fall in equal partitions of one function: one type,
    both integers (hashed as 64-bit integers), or both strings. (A string and an integer column
    can compare equal in SQL, ``'5' = 5``, yet hash apart.)"""
    if a == b:
        return True
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    return any(f(a) for f in strings) and any(f(b) for f in strings)


def _field_type(t: TableInfo, column: str) -> pa.DataType:
    return t.schema.field(column).type


def _replica_pairs(ta: TableInfo, ca: str, tb: TableInfo, cb: str) -> list[tuple[int, int]]:
    """Every ``(replica of ta, replica of tb)`` partitioned on ``ca`` and on ``cb`` by one function,
    the two columns' types hashing alike: equal values of the two columns are in equal partitions."""
    return [
        (ra, rb)
        for ra in range(REPLICAS)
        for rb in range(REPLICAS)
        if ta.specs[ra].column.lower() == ca.lower()
        and tb.specs[rb].column.lower() == cb.lower()
        and ta.specs[ra].same_function(tb.specs[rb])
        and _same_domain(_field_type(ta, ta.specs[ra].column), _field_type(tb, tb.specs[rb].column))
    ]


def _copart_options(ctx: _Ctx, sel: exp.Select, a: exp.Table, b: exp.Table) -> list[tuple[int, int, str]]:
    """Every ``(replica of a, replica of b, description)`` that co-partitions ``a`` and ``b``:
    ``sel``'s WHERE or an inner join's ON holds an equality of their two replicas' partition
    columns, and the replicas partition by one function."""
    ta, tb = ctx.tables[a.name.lower()], ctx.tables[b.name.lower()]
    cols_a, cols_b = _columns_of({"a": ta})["a"], _columns_of({"b": tb})["b"]
    conds = _conjuncts(sel.args["where"].this if sel.args.get("where") else None)
    for j in sel.args.get("joins") or []:
        conds += _conjuncts(j.args.get("on"))
        for u in j.args.get("using") or []:  # ``USING (k)`` of the two: a.k = b.k
            if u.name.lower() in cols_a and u.name.lower() in cols_b:
                conds.append(
                    exp.EQ(
                        this=exp.column(u.name, table=a.alias_or_name),
                        expression=exp.column(u.name, table=b.alias_or_name),
                    )
                )
    out: list[tuple[int, int, str]] = []
    for c in conds:
        if (
            not isinstance(c, exp.EQ)
            or not isinstance(c.this, exp.Column)
            or not isinstance(c.expression, exp.Column)
        ):
            continue
        x, y = c.this, c.expression
        for p, q in ((x, y), (y, x)):
            if _owned(p, a.alias_or_name, cols_a, cols_b) and _owned(q, b.alias_or_name, cols_b, cols_a):
                for ra, rb in _replica_pairs(ta, p.name, tb, q.name):
                    out.append((ra, rb, f"{ta.name}.{ta.specs[ra].column} = {tb.name}.{tb.specs[rb].column}"))
    return out


def _copartition(ctx: _Ctx, sel: exp.Select, refs: list[exp.Table]) -> tuple[dict[str, int], str] | None:
    """For two tables joined by an equality of partition columns co-partitioned by one function:
    ``({table: replica}, description)``; None otherwise."""
    a, b = refs
    opts = _copart_options(ctx, sel, a, b)
    if not opts:
        return None
    ra, rb, how = opts[0]
    return {ctx.tables[a.name.lower()].name: ra, ctx.tables[b.name.lower()].name: rb}, how


BROADCAST_BYTES = 64e6  # a joined table at most this big (one replica) may be read whole by every fragment
BROADCAST_SHARE = 0.25  # ... or at most this share of the split table(s)


def _replica_bytes(t: TableInfo) -> float:
    return t.bytes / REPLICAS


@dataclass
class _SubLink:
    """A subquery conjunct of the outer WHERE that can run per partition: ``node`` (the
    ``Exists`` or ``Subquery`` the SELECT check lets through), its table reference ``iref``, and
    every way it is keyed to an outer table: ``(outer reference, its replica, iref's replica,
    description)``. ``prunes``: its own filters may prune partitions (EXISTS, IN: an outer row
    of a pruned partition finds no match and is dropped anyway; not so for NOT EXISTS, NOT IN
    or a scalar subquery, whose empty answer can still keep the row)."""

    kind: str
    node: exp.Expr
    iref: exp.Table
    options: list[tuple[exp.Table, int, int, str]]
    prunes: bool


@dataclass
class _Subs:
    """The subqueries of a query that runs per partition with them (``_subqueries``)."""

    nodes: tuple[exp.Expr, ...]
    split: list[exp.Table]  # the outer split tables, then each subquery's table
    chosen: dict[str, int]
    explain: list[str]
    noprune: set[int]  # ids of table references whose filters must not prune partitions


def _subquery_conjunct(c: exp.Expr) -> tuple[str, exp.Expr, exp.Select, exp.Column | None] | None:
    """``(kind, node, its SELECT, the outer column of an IN)`` of a WHERE conjunct holding a
    subquery in one of the shapes that can run per partition, else None."""
    neg = isinstance(c, exp.Not)
    e = c.this if neg else c
    if isinstance(e, exp.Exists) and isinstance(e.this, exp.Select):
        return ("NOT EXISTS" if neg else "EXISTS"), e, e.this, None
    if (
        isinstance(e, exp.In)
        and isinstance(e.args.get("query"), exp.Subquery)
        and isinstance(e.args["query"].this, exp.Select)
        and isinstance(e.this, exp.Column)
    ):
        return ("NOT IN" if neg else "IN"), e.args["query"], e.args["query"].this, e.this
    if not neg and type(e) in _CMP:
        sides = [s for s in (e.this, e.expression) if isinstance(s, exp.Subquery)]
        other = e.expression if sides and sides[0] is e.this else e.this
        if (
            len(sides) == 1
            and isinstance(sides[0].this, exp.Select)
            and not other.find(exp.Select, exp.Subquery, exp.Exists)
        ):
            return "scalar", sides[0], sides[0].this, None
    return None


def _subqueries(ctx: _Ctx, refs: list[exp.Table]) -> _Subs | None:
    """The subqueries of the outer WHERE when the whole query can run per partition with them:
    every conjunct holding a subquery is ``[NOT] EXISTS``, ``x [NOT] IN (SELECT ...)`` or a
    comparison with a scalar subquery, over one table (no join or nested subquery), and

    - *correlated* by an equality of ``k``, the partition column of a replica of its table, and
      ``k'``, the partition column of an outer table's replica partitioned by the same function
      (further conditions, equalities or not, may follow); then an outer row of partition p
      sees only subquery rows with ``k = k'``, all in partition p, so whatever the subquery
      computes over them (EXISTS, an aggregate, a GROUP BY, an IN list) is the same in the
      fragment of partition p as over the whole table (DuckDB decorrelates it there: a grouped
      aggregate joined back);
    - or ``x IN (SELECT k ... [GROUP BY ..., k, ...])`` with ``x`` an outer partition column and
      ``k`` the subquery's, partitioned by the same function: a value ``v`` it returns comes
      from rows (a group) with ``k = v``, all in partition f(v), which is where the outer rows
      with ``x = v`` are (NULLs make a positive IN no truer; so NOT IN takes only the first way).

    The outer tables so keyed are split with the subqueries' tables (at most two outer ones,
    co-partitioned by a join equality; one may bring its co-partitioned join partner), every
    reference of a table with one replica; the other outer tables must be broadcast. None when
    there is no such subquery, or one that does not fit (the query then gathers)."""
    tree = ctx.tree
    if not isinstance(tree, exp.Select) or not getattr(ctx.core, "sql_subquery_pushdown", True):
        return None
    where = tree.args.get("where")
    colsets = _columns_of(ctx.tables)
    outer = [r for r in refs if _scope(r) is tree]
    links: list[_SubLink] = []
    for c in _conjuncts(where.this if where else None):
        if not c.find(exp.Select, exp.Subquery, exp.Exists):
            continue
        shape = _subquery_conjunct(c)
        if shape is None:
            return None
        kind, node, sub, x = shape
        inner = [r for r in refs if _within(r, node)]
        if (
            len(inner) != 1
            or _scope(inner[0]) is not sub
            or sub.args.get("joins")
            or any(sub.args.get(k) for k in (_WITH, "qualify"))
            or any(
                n is not sub
                and isinstance(n, (exp.Select, exp.Subquery, exp.Exists, exp.Window, exp.SetOperation))
                for n in sub.walk()
            )
        ):
            return None
        iref = inner[0]
        ti = ctx.tables[iref.name.lower()]
        icols = colsets[ti.name.lower()]
        options: list[tuple[exp.Table, int, int, str]] = []

        swhere = sub.args.get("where")
        for q in _conjuncts(swhere.this if swhere else None):
            if not (
                isinstance(q, exp.EQ)
                and isinstance(q.this, exp.Column)
                and isinstance(q.expression, exp.Column)
            ):
                continue
            for a, b in ((q.this, q.expression), (q.expression, q.this)):
                if (
                    _owned(a, iref.alias_or_name, icols, set())
                    and not (not b.table and b.name.lower() in icols)
                    and not (b.table and b.table.lower() == iref.alias_or_name.lower())
                ):
                    options += _keyings(
                        ctx, outer, iref, a, b, f"correlated {kind}"
                    )  # a surely the subquery table's, b surely not: a correlation
        if kind == "IN" and x is not None and not sub.args.get("limit") and not sub.args.get("offset"):
            (k,) = sub.expressions if len(sub.expressions) == 1 else (None,)
            group = sub.args.get("group")
            gnames = {
                g.name.lower() for g in (group.expressions if group else []) if isinstance(g, exp.Column)
            }
            if (
                isinstance(k, exp.Column)
                and _owned(k, iref.alias_or_name, icols, set())
                and (not sub.find(exp.AggFunc) or k.name.lower() in gnames)
                and not (group is not None and group.args.get("all"))
            ):
                options += _keyings(ctx, outer, iref, k, x, f"IN (SELECT {k.name} ...)")
        if not options:
            return None
        links.append(_SubLink(kind, node, iref, options, kind in ("EXISTS", "IN")))
    if not links:
        return None
    best: tuple[float, _Subs] | None = None
    for combo in itertools.product(*(lk.options for lk in links)):
        found = _sub_split(ctx, tree, outer, links, combo)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best[1] if best is not None else None


def _keyings(
    ctx: _Ctx, outer: list[exp.Table], iref: exp.Table, a: exp.Column, b: exp.Column, label: str
) -> list[tuple[exp.Table, int, int, str]]:
    """``(outer reference, its replica, ti's replica, description)`` for each outer table ``b``
    surely belongs to, and each pair of replicas partitioned on ``b`` and on ``a`` (``ti``'s
    column) by one function."""
    ti = ctx.tables[iref.name.lower()]
    colsets = _columns_of(ctx.tables)
    out = []
    for oref in outer:
        to = ctx.tables[oref.name.lower()]
        rest = set().union(*(colsets[r.name.lower()] for r in outer if r is not oref))
        if not _owned(b, oref.alias_or_name, colsets[to.name.lower()], rest):
            continue
        for ro, ri in _replica_pairs(to, b.name, ti, a.name):
            so, si = to.specs[ro], ti.specs[ri]
            out.append(
                (oref, ro, ri, f"{label} on {_named(iref, ti, si.column)} = {_named(oref, to, so.column)}")
            )
    return out


def _named(ref: exp.Table, t: TableInfo, column: str) -> str:
    alias = ref.alias_or_name
    return f"{t.name}.{column}" + (f" (as {alias})" if alias.lower() != t.name.lower() else "")


def _within(ref: exp.Table, node: exp.Expr) -> bool:
    p = ref.parent
    while p is not None:
        if p is node:
            return True
        p = p.parent
    return False


def _sub_split(
    ctx: _Ctx,
    tree: exp.Select,
    outer: list[exp.Table],
    links: list[_SubLink],
    combo: tuple[tuple[exp.Table, int, int, str], ...],
) -> tuple[float, _Subs] | None:
    """One choice of each subquery's keying (``combo``) as a split, with its size, or None when
    the choices disagree (a table on two replicas, partition functions that differ, more than
    two outer tables or two not co-partitioned)."""
    chosen: dict[str, int] = {}
    orefs: list[exp.Table] = []
    for lk, (oref, ro, ri, _how) in zip(links, combo, strict=True):
        for ref, r in ((oref, ro), (lk.iref, ri)):
            if chosen.setdefault(ctx.tables[ref.name.lower()].name, r) != r:
                return None
        if all(oref is not o for o in orefs):
            orefs.append(oref)
    specs = [ctx.tables[n.lower()].specs[r] for n, r in chosen.items()]
    if not all(specs[0].same_function(s) for s in specs[1:]):
        return None
    explain = [
        f"subquery: {how}: co-partitioned replicas, so it runs per partition next to the data (an outer "
        "row of partition p matches only rows of partition p)"
        for (_o, _ro, _ri, how) in combo
    ]
    tname = {id(r): ctx.tables[r.name.lower()].name for r in outer}
    if len(orefs) > 2:
        return None
    if len(orefs) == 2:
        a, b = orefs
        opts = [
            how
            for ra, rb, how in _copart_options(ctx, tree, a, b)
            if (ra, rb) == (chosen[tname[id(a)]], chosen[tname[id(b)]])
        ]
        if not opts:
            return None
        explain.append(
            f"join {opts[0]}: co-partitioned replicas, so partition p joins only partition p (no shuffle)"
        )
    else:
        (a,) = orefs
        partner = None
        for c in outer:
            if c is a:
                continue
            for ra, rc, how in _copart_options(ctx, tree, a, c):
                if ra != chosen[tname[id(a)]] or chosen.get(tname[id(c)], rc) != rc:
                    continue
                size = _replica_bytes(ctx.tables[c.name.lower()])
                if partner is None or size > partner[0]:
                    partner = (size, c, rc, how)
        if partner is not None:
            _s, c, rc, how = partner
            orefs.append(c)
            chosen[tname[id(c)]] = rc
            explain.append(
                f"join {how}: co-partitioned replicas, so partition p joins only partition p (no shuffle)"
            )
    # a table is one input of a fragment: split whole or broadcast whole, not both
    if any(tname[id(r)] in chosen for r in outer if all(r is not o for o in orefs)):
        return None
    noprune = {id(lk.iref) for lk in links if not lk.prunes}
    size = sum(_replica_bytes(ctx.tables[n.lower()]) for n in chosen)
    split = orefs + [lk.iref for lk in links]
    return size, _Subs(tuple(lk.node for lk in links), split, chosen, explain, noprune)


def _is_star(e: exp.Expr) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))


def _expand_stars(ctx: _Ctx, sel: exp.Select) -> bool:
    """``SELECT *`` and ``SELECT t.*`` over store tables written out as the columns they stand
    for, in DuckDB's order (the FROM's tables in turn, each in its schema's order; a ``USING``
    key once, from the left), so that a split plan selects its outputs by name (issue 19,
    session 29: ``SELECT t.*, u.x FROM t JOIN u USING (k)``, as the h2o db-benchmark's joins
    write it, failed in every split plan: ``Referenced column "*" not found``; and ``SELECT *
    ... ORDER BY .. LIMIT k`` gathered the whole filtered table instead of a top-k per
    fragment). False (the caller gathers) where a star cannot be written out exactly: a
    ``NATURAL`` join, DuckDB's ``* EXCLUDE``/``REPLACE``/``COLUMNS``, or a source that is not a
    store table."""
    items = sel.expressions
    if not any(_is_star(e) for e in items):
        return True
    sources: list[tuple[str, pa.Schema, set[str]]] = []  # (alias, schema, USING keys to skip in *)
    from_ = sel.args.get(_FROM)
    joins = sel.args.get("joins") or []
    for i, node in enumerate([from_.this if from_ else None] + [j.this for j in joins]):
        if not isinstance(node, exp.Table) or node.name.lower() not in ctx.tables:
            return False
        if node.args.get("pivots"):
            return False  # ``FROM t PIVOT (...)``: the star selects the pivot's columns
        if _renamed_columns(node):
            return False  # ``FROM t AS a(x, y)``: its columns go by the alias's names
        skip: set[str] = set()
        if i:
            j = joins[i - 1]
            if str(j.args.get("method") or "").upper() == "NATURAL":
                return False
            if str(j.args.get("kind") or "").upper() in ("SEMI", "ANTI"):
                # a SEMI or ANTI join's right side is a filter: a star selects none of its
                # columns, and naming them is an error (held out, DuckDB's tests: ``SELECT *
                # FROM l SEMI JOIN r ON ...`` failed with ``Referenced table "r" not found``)
                continue
            skip = {u.name.lower() for u in j.args.get("using") or []}
        sources.append((node.alias_or_name, ctx.tables[node.name.lower()].schema, skip))
    out: list[exp.Expr] = []
    for e in items:
        if not _is_star(e):
            out.append(e)
            continue
        star = e if isinstance(e, exp.Star) else e.this
        if any(star.args.get(k) for k in star.args):
            return False  # * EXCLUDE (..) / REPLACE (..) / RENAME: DuckDB's own star forms
        qual = e.table.lower() if isinstance(e, exp.Column) and e.table else None
        chosen = [s for s in sources if qual is None or s[0].lower() == qual]
        if not chosen:
            return False
        for alias, schema, skip in chosen:
            out.extend(
                exp.column(c, table=alias, quoted=True)
                for c in schema.names
                if qual is not None or c.lower() not in skip
            )
    sel.set("expressions", out)
    return True


def _renamed_columns(table: exp.Expr) -> bool:
    """Whether a table reference renames its columns by position (``FROM t AS a(x, y)``)."""
    alias = table.args.get("alias")
    return isinstance(alias, exp.TableAlias) and bool(alias.args.get("columns"))


def _bound_names(ctx: _Ctx) -> list[str] | None:
    """The query's output names as DuckDB binds the SQL as written (``ctx.text``) over empty
    tables of the same schemas (nothing runs); None when they cannot be had. Bound once per
    planning (a plan may ask from several places: the split's outputs, the answer's names)."""
    if ctx._bound is ...:
        ctx._bound = _bind_names(ctx.text, ctx.tables) if ctx.text else None
    return None if ctx._bound is None else list(ctx._bound)


def _bind_names(text: str, tables: dict[str, TableInfo]) -> list[str] | None:
    con = duck()
    try:
        for t in tables.values():
            con.register(t.name, t.schema.empty_table())
        return list(con.sql(text).columns)
    except duckdb.Error:
        return None
    finally:
        con.close()


def _name_outputs(ctx: _Ctx, sel: exp.Select) -> bool:
    """Give each unnamed output of ``sel`` (``sum(lo_revenue)``, ``a + 1``) DuckDB's own name for
    it as an alias, so that a plan which computes it in fragments and selects it by name at the
    coordinator answers with the columns DuckDB would: the names come from DuckDB binding the query
    as written over empty tables of the same schemas (nothing runs). False when they cannot be had."""
    if not _expand_stars(ctx, sel):
        return False
    items = sel.expressions
    if all(isinstance(e, (exp.Alias, exp.Column)) for e in items) and not _may_rename(ctx.text):
        return True
    if any(isinstance(e, exp.Star) for e in items) or not ctx.text:
        return False
    names = _bound_names(ctx)
    if names is None or len(names) != len(items):
        return False
    sel.set("expressions", [_as_bound(e, n) for e, n in zip(items, names)])
    return True


def _may_rename(text: str | None) -> bool:
    """Whether a select list's plain column may carry a name of DuckDB's other than its own: a
    unary plus (``SELECT + col1``), which sqlglot drops, while DuckDB names the output
    ``(+(col1))`` (held out, SQLite's sqllogictest: ``SELECT DISTINCT + col1, - col1 FROM tab2``
    was refused, its fragments answering ``col1`` where the coordinator asked for ``(+(col1))``).
    Only such texts pay for DuckDB's binding of the names."""
    return bool(text) and "+" in str(text)


def _unnamed_outputs(tree: exp.Expr) -> bool:
    """Whether the query's answer has an output that is neither aliased nor a plain column (nor a
    star): DuckDB names such an output by its own text of the expression, and the SQL the plan runs
    is sqlglot's rendering of the tree, which may write it otherwise, so the answer's names are
    taken from DuckDB binding the text as written (``SqlPlan.names``). Held out, DuckDB's own
    tests (session 40): ``list(x)`` came back named ``array_agg(x)``, ``var_samp(a)`` as
    ``variance(a)``, ``percentile_disc(.5) WITHIN GROUP (ORDER BY c)`` as ``quantile_disc(c, 0.5
    ORDER BY c)``, ``x::double`` as ``CAST(x AS DOUBLE)``; and a prepared statement's schema
    (bound from the text as written) named the columns otherwise than its result."""
    q = _unwrap(tree)
    while isinstance(q, exp.SetOperation):
        q = _unwrap(q.this)
    if not isinstance(q, exp.Select):
        return True
    return any(not isinstance(e, (exp.Alias, exp.Column, exp.Star)) for e in q.expressions)


def _as_bound(e: exp.Expr, name: str) -> exp.Expr:
    """``e`` named ``name`` (DuckDB's name for it, from binding the text as written) where its
    own name would differ: an unnamed expression, or a plain column whose text said more (a
    unary plus: DuckDB's name of an expression is parenthesised, a column's never is)."""
    if isinstance(e, exp.Alias) or not name:
        return e
    if isinstance(e, exp.Column) and (name == e.alias_or_name or not name.startswith("(")):
        return e
    return exp.alias_(e, name, quoted=True)


def _split_replica(ctx: _Ctx, t: TableInfo, where: list[Any], gcols: list[str]) -> tuple[int, list[str]]:
    """The replica of the one table a query splits over: the best match (``_score``: a group-by
    on its partition column, pruning); among equal matches the one whose read costs least
    (``read_estimate``: its codec's decoding rate over the bytes it reads and, with the nodes'
    residency known, its file bytes not in memory at the disk's rate; the plans' shapes, and so
    the bytes they move, are the same), the lower number unless another saves more than
    ``COST_TIE``. Returns it with the reason for EXPLAIN (none when the tied replicas read alike:
    one codec, nothing known of memory)."""
    scores = {x: _score(t, x, where, gcols)[0] for x in range(REPLICAS)}
    top = max(scores.values())
    tied = [x for x in range(REPLICAS) if scores[x] == top]
    if len(tied) == 1:
        return tied[0], []
    est: dict[int, ReadEstimate] = {}
    for x in tied:
        try:
            units = replica_units(t, x, ctx.live, ctx.addresses, pruned_partitions(t, x, where)[0])
        except Unavailable:
            continue
        est[x] = read_estimate(t, units, ctx.needed(t), ctx.resident)
    if not est:
        return tied[0], []
    known = any(e.in_memory is not None for e in est.values())
    if not known and len({e.codecs for e in est.values()}) < 2:
        return tied[0], []  # one codec for all: their reads decode alike (ties: the lower number)
    # decoding first, as before residency: the replica that decodes least (the lower number
    # unless another saves over ``COST_TIE``); then what is in memory, among those that decode
    # alike (one codec: ``resident_pick``, which does not trade decoding for disk)
    floor = min(e.decode_s for e in est.values())
    r = min(x for x, e in est.items() if e.decode_s <= floor * (1 + COST_TIE))
    if known:
        alike = [x for x, e in sorted(est.items()) if e.decode_s <= est[r].decode_s * (1 + COST_TIE)]
        low = min(alike, key=lambda x: (est[x].seconds, x))
        if est[r].seconds > est[low].seconds * (1 + COST_TIE):
            r = low
    if not known:
        others = ", ".join(
            f"replica {x} ~{e.decode_s:.3g} s ({e.codecs})" for x, e in sorted(est.items()) if x != r
        )
        e = est[r]
        return r, [
            f"decoding its read ~{e.decode_s:.3g} CPU s ({e.codecs}) against {others}: "
            "no replica matches the query better"
        ]

    def text(e: ReadEstimate) -> str:
        mem = "?" if e.in_memory is None else f"{e.in_memory:.0%}"
        return (
            f"~{e.seconds:.3g} s: decoding ~{e.seconds - e.disk_s:.3g} CPU s ({e.codecs}; "
            f"the rest held decoded), "
            f"{e.disk_bytes / 1e6:.1f} MB from disk ~{e.disk_s:.3g} s, {mem} in memory"
        )

    others = "; ".join(f"replica {x} {text(e)}" for x, e in sorted(est.items()) if x != r)
    return r, [
        f"reading it {text(est[r])} against {others}: no replica matches the query better; the one "
        "that decodes least, then of those decoding alike the one cheapest to read with what is in memory"
    ]


def _distributed(ctx: _Ctx, refs: list[exp.Table]) -> SqlPlan | None:
    subs = _subqueries(ctx, refs)
    sel = _simple_select(ctx.tree, subs.nodes if subs else ())
    if sel is None or not refs or not _name_outputs(ctx, sel):
        return None
    inside = {id(x) for a in (subs.nodes if subs else ()) for x in a.walk()}
    names = [r.name.lower() for r in refs]
    outer_names = [r.name.lower() for r in refs if id(r) not in inside]
    # a table twice in the FROM: one input per table name (its replica, its filters), so it is
    # never split; without subqueries it may be broadcast (read whole, unpruned, by every
    # fragment: each occurrence joins the whole table), as TPC-DS's date_dim d1, d2, d3 are
    twice = {n for n in names if names.count(n) > 1}
    if subs is not None and len(set(outer_names)) != len(outer_names):
        return None
    ctx.noprune = subs.noprune if subs else set()
    colsets = _columns_of(ctx.tables)
    aggs = [a for a in sel.find_all(exp.AggFunc) if id(a) not in inside]  # the outer SELECT's own
    group = [g for g in (sel.args["group"].expressions if sel.args.get("group") else [])]
    is_agg = bool(aggs) or bool(group)
    explain: list[str] = []
    # ---- which tables are split over partitions: a co-partitioned pair (the biggest), else the
    # biggest table; every other table must be small enough to be read whole by each fragment
    split: list[exp.Table] | None = None
    best = -1.0
    if subs is not None:  # the subqueries' tables are split with the outer tables they are keyed to
        split, chosen = subs.split, dict(subs.chosen)
        explain += subs.explain
    else:
        for i in range(len(refs)):
            for j in range(i + 1, len(refs)):
                if names[i] in twice or names[j] in twice:
                    continue
                co = _copartition(ctx, sel, [refs[i], refs[j]])
                size = _replica_bytes(ctx.tables[names[i]]) + _replica_bytes(ctx.tables[names[j]])
                if co is not None and size > best:
                    split, chosen, how, best = [refs[i], refs[j]], co[0], co[1], size
        if split is not None:
            explain.append(
                f"join {how}: co-partitioned replicas, so partition p joins only partition p (no shuffle)"
            )
    if split is None:
        big = max(range(len(refs)), key=lambda k: _replica_bytes(ctx.tables[names[k]]))
        if names[big] in twice:
            return None
        split = [refs[big]]
        t = ctx.tables[names[big]]
        others = set().union(*(colsets[m] for m in names if m != names[big]))
        conds = pushable(ctx.tree, refs[big], colsets[names[big]], others)
        where = triples(conds, t)
        gcols = [g.name for g in _owned_group(group, refs[big], colsets, names)]
        r, decoding = _split_replica(ctx, t, where, gcols)
        chosen = {t.name: r}
        reasons = _score(t, r, where, gcols)[1] + decoding
        explain.append(
            f"table {t.name}: replica {r} ({t.specs[r].describe()})"
            + (": " + "; ".join(reasons) if reasons else "")
        )
    split_bytes = sum(_replica_bytes(ctx.tables[n]) for n in {r.name.lower() for r in split})
    ctx.broadcast = {}
    ctx.exchange = None
    too_big = [
        ref
        for ref in refs
        if not any(ref is x for x in split)
        and _replica_bytes(ctx.tables[ref.name.lower()]) > max(BROADCAST_BYTES, BROADCAST_SHARE * split_bytes)
    ]
    if any(r.name.lower() in twice for r in too_big):
        return None
    if too_big:
        # two big tables not co-partitioned: both exchanged by the join key (the rest broadcast)
        keys = _exchange_join_keys(ctx, sel, split, too_big) if subs is None else None
        if keys is None:
            return None
        ctx.exchange = keys
        split = split + too_big
        explain.append(
            "join "
            + " = ".join(f"{n}.{k[0]}" for n, k in keys.items())
            + ": no co-partitioned replica pair and neither table small enough to broadcast"
        )
    for ref in refs:
        if any(ref is x for x in split):
            continue
        n = ref.name.lower()
        t = ctx.tables[n]
        if t.name in ctx.broadcast:
            continue  # (a table twice: read once, unpruned)
        others = set().union(*(colsets[m] for m in names if m != n))
        where = [] if n in twice else triples(pushable(ctx.tree, ref, colsets[n], others), t)
        r, _cost, units, _allowed = cheapest_replica(
            t, where, ctx.needed(t), ctx.live, ctx.addresses, ctx.resident
        )
        ctx.broadcast[t.name] = [s for u in units for s in u.sources]
        chosen = {**chosen, t.name: r}
    if ctx.broadcast:
        explain.append(
            f"broadcast: every fragment reads {', '.join(sorted(ctx.broadcast))} whole "
            f"({sum(s['bytes'] for v in ctx.broadcast.values() for s in v) / 1e6:.2f} MB; inner joins only, "
            "so each joined row still comes from one fragment)"
        )
    split_names = {ctx.tables[r.name.lower()].name for r in split}
    refs = split
    # partition columns of the split tables' replicas: a GROUP BY containing one keeps groups in one partition
    part_cols = {ctx.tables[n.lower()].specs[r].column.lower() for n, r in chosen.items() if n in split_names}
    if ctx.exchange is not None:  # the exchange's key splits the rows, not a replica's partitioning
        part_cols = {k.lower() for ks in ctx.exchange.values() for k in ks}
    # a group column of a split table (by name, a column of another table of the same name was
    # taken for it: GROUP BY xj.id1 beside big partitioned on big.id1 ran per partition, wrong)
    group_cols = {g.name.lower() for r in split for g in _owned_group(group, r, colsets, names)}
    local = (not is_agg) or bool(group_cols & part_cols)
    if local:
        for e in sel.expressions:
            if not isinstance(e, (exp.Column, exp.Alias)) or isinstance(e, exp.Star):
                return None  # the coordinator's ORDER BY needs named outputs
        plan = _partition_local(ctx, sel, refs, chosen, explain)
        if plan is not None:
            return _partial_exchange(ctx, plan)
        return None
    if not all(isinstance(g, exp.Column) for g in group):
        return None
    for a in aggs:
        if (
            not isinstance(a, _DECOMPOSABLE)
            or a.find(exp.Distinct)
            or any(isinstance(x, exp.AggFunc) for x in a.find_all(exp.AggFunc) if x is not a)
        ):
            break
    else:
        return _partial_exchange(ctx, _partial_agg(ctx, sel, refs, chosen, group, aggs, explain))
    # an aggregate that does not decompose (median, count(distinct), quantiles, corr...), grouped
    # off the partition key: exchange the split table's rows by its group columns, so each
    # group is whole on one reducer, which runs the whole query on its bucket
    if ctx.exchange is not None or len(refs) != 1 or subs is not None or not group:
        return None
    t = ctx.tables[refs[0].name.lower()]
    others = set().union(*(colsets[m] for m in names if m != t.name.lower()))
    gkeys = [
        _schema_name(t, g.name)
        for g in group
        if isinstance(g, exp.Column) and _owned(g, refs[0].alias_or_name, colsets[t.name.lower()], others)
    ]
    if not gkeys:
        return None
    for e in sel.expressions:
        if not isinstance(e, (exp.Column, exp.Alias)) or isinstance(e, exp.Star):
            return None
    ctx.exchange = {t.name: list(dict.fromkeys(gkeys))}
    explain.append(
        f"group-by {[g.sql(DIALECT) for g in group]} is off the partition key and an aggregate does not "
        "decompose into partials"
    )
    return _partial_exchange(ctx, _partition_local(ctx, sel, refs, chosen, explain, per_partition=True))


# --------------------------------------------------------- a whole query keyed to one partition
def _owned_group(
    group: list[exp.Expr], ref: exp.Table, colsets: dict[str, set[str]], names: list[str]
) -> list[exp.Column]:
    """The GROUP BY columns that surely are columns of ``ref``'s table (``_owned``)."""
    n = ref.name.lower()
    others = set().union(*(colsets[m] for m in names if m != n))
    return [
        g for g in group if isinstance(g, exp.Column) and _owned(g, ref.alias_or_name, colsets[n], others)
    ]


def _scope_of(node: exp.Expr) -> exp.Select | None:
    """The SELECT whose clause ``node`` is in (its nearest enclosing SELECT)."""
    q = node.parent
    while q is not None and not isinstance(q, exp.Select):
        q = q.parent
    return q


def _traces_to(sel: exp.Select, col: exp.Column, table: exp.Table, column: str) -> bool:
    """Whether ``col``, in ``sel``'s scope, is the store column ``column`` of ``table`` itself:
    directly (``sel`` reads the table) or through a derived table's output of the same name
    (``SELECT k ... FROM (SELECT k, ... FROM t)``, a star passing names through)."""
    src = sel.args.get(_FROM)
    node = src.this if src is not None else None
    if isinstance(col.this, exp.Star):
        return False
    if isinstance(node, exp.Table):
        return (
            node is table
            and col.name.lower() == column
            and (not col.table or col.table.lower() == node.alias_or_name.lower())
        )
    if not isinstance(node, exp.Subquery) or not isinstance(node.this, exp.Select):
        return False
    if col.table and col.table.lower() != node.alias_or_name.lower():
        return False
    inner = node.this
    for e in inner.expressions:
        if isinstance(e, exp.Star) and _traces_to(inner, exp.column(col.name), table, column):
            return True
        target = e.this if isinstance(e, exp.Alias) else e
        if e.alias_or_name.lower() == col.name.lower() and isinstance(target, exp.Column):
            return _traces_to(inner, target, table, column)
    return False


def _keyed_to(tree: exp.Select, table: exp.Table, column: str) -> bool:
    """Whether every step of ``tree`` that combines rows combines only rows with one value of
    ``table``'s ``column``: then each partition of a replica partitioned on it answers for its
    own rows, and the query over the table is the union of the query over each partition. Every
    GROUP BY and every window's PARTITION BY holds the column (traced through derived tables),
    a DISTINCT outputs it; no aggregate without a GROUP BY, no LIMIT below the outermost SELECT,
    no join, set operation or subquery outside FROM, no CTE."""
    for node in tree.walk():
        if isinstance(
            node, (exp.SetOperation, exp.Exists, exp.Join, exp.Lateral, exp.Unnest, exp.TableSample)
        ):
            return False
        if isinstance(node, exp.Subquery) and not isinstance(node.parent, exp.From):
            return False  # a scalar or IN subquery: it would see one partition's rows
        if isinstance(node, exp.Select) and node.args.get(_WITH):
            return False
    for sel in [tree, *(q for q in tree.find_all(exp.Select) if q is not tree)]:

        def keyed(cols: list[exp.Expr], sel: exp.Select = sel) -> bool:
            return any(isinstance(c, exp.Column) and _traces_to(sel, c, table, column) for c in cols)

        if sel is not tree and (sel.args.get("limit") or sel.args.get("offset")):
            return False
        group = sel.args.get("group")
        own_aggs = [
            a for a in sel.find_all(exp.AggFunc) if _scope_of(a) is sel and not a.find_ancestor(exp.Window)
        ]
        if group is not None:
            if any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets", "all")):
                return False
            if not keyed(group.expressions):
                return False
        elif own_aggs:
            return False  # one answer over all rows
        distinct = sel.args.get("distinct")
        if distinct is not None and (distinct.args.get("on") or not keyed(list(sel.expressions))):
            return False
        for w in sel.find_all(exp.Window):
            if _scope_of(w) is sel and not keyed(list(w.args.get("partition_by") or [])):
                return False
    return True


def _nested_local(ctx: _Ctx, refs: list[exp.Table]) -> SqlPlan | None:
    """One table, read once, under derived tables, windows and groups (the top-n-per-group
    shape: ``SELECT .. FROM (SELECT .., row_number() OVER (PARTITION BY k ORDER BY v) rn FROM t)
    WHERE rn <= 2``): where a replica's partition column keys every step that combines rows
    (``_keyed_to``), the whole query runs per partition and the coordinator concatenates, as
    ``_partition_local`` does for a flat SELECT (issue 19, session 29: the h2o db-benchmark's
    "largest two v3 by id6" was gathered whole to the coordinator beside a replica on ``id6``)."""
    tree = ctx.tree
    if len(refs) != 1 or not isinstance(tree, exp.Select):
        return None
    ref = refs[0]
    t = ctx.tables[ref.name.lower()]
    options = [x for x in range(REPLICAS) if _keyed_to(tree, ref, t.specs[x].column.lower())]
    if not options:
        return None
    names: list[str] | None = None
    if _may_rename(ctx.text) or not all(
        isinstance(e, (exp.Alias, exp.Column)) and not _is_star(e) for e in tree.expressions
    ):
        # a star over a derived table, an unnamed output: the fragments answer with the names
        # DuckDB gives the query's outputs, and the coordinator selects those
        names = _bound_names(ctx)
        if names is None:
            return None
    r = options[0]
    explain = [
        f"table {t.name}: replica {r} ({t.specs[r].describe()}): every group, window partition and "
        f"DISTINCT of the query is keyed by its partition column {t.specs[r].column}"
    ]
    return _partition_local(ctx, tree, [ref], {t.name: r}, explain, out_names=names, per_partition=True)


def _units_by_partition(
    ctx: _Ctx, refs: list[exp.Table], chosen: dict[str, int], sel: exp.Select
) -> tuple[dict[int, dict[str, list[dict]]], list[str], set[int] | None]:
    colsets = _columns_of(ctx.tables)
    names = [r.name.lower() for r in refs]
    allowed: set[int] | None = None
    why: list[str] = []
    per: dict[str, list[Unit]] = {}
    for ref in refs:
        n = ref.name.lower()
        t = ctx.tables[n]
        others = set().union(*(v for m, v in colsets.items() if m != n))
        if id(ref) in ctx.noprune:
            continue  # NOT EXISTS, NOT IN, scalar: an outer row of a partition its filters prune is kept
        conds = pushable(ctx.tree, ref, colsets[n], others)
        a, w = pruned_partitions(t, chosen[t.name], triples(conds, t))
        if a is not None:
            allowed = a if allowed is None else allowed & a
            why += w
    for ref in refs:
        t = ctx.tables[ref.name.lower()]
        per[t.name] = replica_units(t, chosen[t.name], ctx.live, ctx.addresses, allowed)
    parts: dict[int, dict[str, list[dict]]] = defaultdict(lambda: {ctx.tables[n].name: [] for n in names})
    for tname, units in per.items():
        for u in units:
            parts[u.partition][tname].extend(u.sources)
    return dict(sorted(parts.items())), why, allowed


def _fragment_tasks(
    ctx: _Ctx,
    refs: list[exp.Table],
    chosen: dict[str, int],
    sel: exp.Select,
    node_sql: str,
    per_partition: bool,
    explain: list[str],
) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    if ctx.exchange is not None:
        return _exchange_tasks(ctx, refs, chosen, node_sql, explain), 0
    parts, why, _allowed = _units_by_partition(ctx, refs, chosen, sel)
    cols = {ctx.tables[r.name.lower()].name: ctx.needed(ctx.tables[r.name.lower()]) for r in refs}
    tinfo = {t.name: t for t in ctx.tables.values()}
    bcols = {n: ctx.needed(tinfo[n]) for n in ctx.broadcast}
    if why:
        explain.append(f"pruning: {len(parts)} partitions survive ({' and '.join(why)})")
    tasks: list[tuple[str, dict[str, Any]]] = []
    moved = 0
    if per_partition:
        # Each partition runs on the node holding most of its bytes, and all the partitions a
        # node runs form one fragment: a partition stays whole inside one fragment (so groups on
        # the partition key stay whole), and rows of different partitions never join (they
        # differ in the co-partitioned key), so the union is exact and costs one fragment (one
        # read of the broadcast tables) per node instead of one per partition.
        merged: dict[str, dict[str, list[dict]]] = {}
        for srcs in parts.values():
            allsrc = [s for v in srcs.values() for s in v]
            node = _nodes_by_bytes(allsrc)[0] if allsrc else min(ctx.live)
            moved += sum(s["bytes"] for s in allsrc if s["node"] != node)
            into = merged.setdefault(node, {n: [] for n in srcs})
            for n, v in srcs.items():
                into[n].extend(v)
        groups = sorted(merged.items())
    else:  # one table, any split is fine: one fragment per node over its own sources
        (tname,) = cols
        by: dict[str, list[dict]] = defaultdict(list)
        for srcs in parts.values():
            for s in srcs[tname]:
                by[s["node"]].append(s)
        groups = [(node, {tname: s}) for node, s in sorted(by.items())]
    if not groups:
        groups = [(min(ctx.live) if ctx.live else "", {n: [] for n in cols})]
    for node, srcs in groups:
        inputs = {n: _side(tinfo[n], cols[n], srcs[n]) for n in cols}
        for n, bsrcs in ctx.broadcast.items():
            inputs[n] = _side(tinfo[n], bcols[n], bsrcs)
            moved += sum(s["bytes"] for s in bsrcs if s["node"] != node)
        tasks.append((node, {"op": "sql", "inputs": inputs, "sql": node_sql}))
    return tasks, moved


def _partition_local(
    ctx: _Ctx,
    sel: exp.Select,
    refs: list[exp.Table],
    chosen: dict[str, int],
    explain: list[str],
    out_names: list[str] | None = None,
    per_partition: bool | None = None,
) -> SqlPlan | None:
    """The whole query in fragments next to the data, their results concatenated (and ordered,
    limited) at the coordinator. ``out_names``: the query's output names where its select list
    does not say them (a star over a derived table: as DuckDB binds them); ``per_partition``:
    each partition whole within one fragment (default: several tables, or a GROUP BY)."""
    out_names = out_names or [e.alias_or_name for e in sel.expressions]
    if len({n.lower() for n in out_names}) != len(out_names):
        return None
    final = exp.select(*[exp.column(n, quoted=True) for n in out_names]).from_("__parts")
    order = sel.args.get("order")
    if order:
        keys = []
        for o in order.expressions:
            k = o.this
            match = None
            if isinstance(k, exp.Column) and not k.table and k.name.lower() in {n.lower() for n in out_names}:
                match = k.name
            else:
                for e in sel.expressions:
                    inner = e.this if isinstance(e, exp.Alias) else e
                    if inner == k:
                        match = e.alias_or_name
            if match is None:
                return None
            keys.append(
                exp.Ordered(
                    this=exp.column(match, quoted=True),
                    desc=o.args.get("desc"),
                    nulls_first=o.args.get("nulls_first"),
                )
            )
        final = final.order_by(*keys)
    if sel.args.get("limit"):
        final = final.limit(sel.args["limit"].expression.copy())
    if sel.args.get("offset"):
        final = final.offset(sel.args["offset"].expression.copy())
    node_sel = sel.copy()
    items = node_sel.expressions
    if len(items) == len(out_names) and not any(_is_star(e) for e in items):
        # the fragments answer with the names the coordinator selects (DuckDB's, where bound)
        node_sel.set("expressions", [_as_bound(e, n) for e, n in zip(items, out_names)])
    if node_sel.args.get("offset"):
        # each fragment keeps its first offset+limit rows; the coordinator skips the offset
        off = node_sel.args["offset"].expression
        lim = node_sel.args.get("limit")
        node_sel.set("offset", None)
        if lim is not None:
            node_sel = node_sel.limit(exp.Add(this=lim.expression.copy(), expression=off.copy()), copy=False)
    if per_partition is None:
        per_partition = len(refs) >= 2 or bool(sel.args.get("group"))
    tasks, moved = _fragment_tasks(ctx, refs, chosen, sel, node_sel.sql(DIALECT), per_partition, explain)
    late = _late(ctx, node_sel, refs, tasks)
    if late is not None:
        for _, task in tasks:
            task["late"] = late
        t = ctx.tables[refs[0].name.lower()]
        explain.append(
            f"late materialization: each fragment finds its top rows on {len(late['read'])} of the "
            f"{len(ctx.needed(t))} columns it uses ({', '.join(late['read'])}), then reads the "
            "others from the extents holding those rows only"
        )
    what = "groups are whole within a partition" if sel.args.get("group") else "rows are independent"
    explain.append(
        f"plan: partition-local: {what}, so the whole query runs next to the data in {len(tasks)} fragments "
        f"(DuckDB over the extents{', top-k per fragment' if order and sel.args.get('limit') else ''}); "
        "the coordinator concatenates" + (" and orders" if order else "")
    )
    return SqlPlan(
        "partition_local", tasks, final.sql(DIALECT), ["__parts"] * len(tasks), explain, chosen, moved
    )


# A top-k fragment over one table is materialized late (``_exec.late_rows``) when it reads at
# least this many columns besides those its filter and order read, and keeps at most this many
# rows (its limit and offset).
LATE_MIN_OTHER_COLUMNS = 4
LATE_MAX_ROWS = 10_000


def _late(
    ctx: _Ctx, node_sel: exp.Select, refs: list[exp.Table], tasks: list[tuple[str, dict[str, Any]]]
) -> dict[str, Any] | None:
    """The ``late`` marking of a partition-local top-k's tasks, or None where it does not apply:
    one table (no broadcast, no exchange), no grouping, aggregate, window, DISTINCT or subquery;
    the order by plain columns that no select alias shadows; a literal limit (and offset) of at
    most ``LATE_MAX_ROWS``; at least ``LATE_MIN_OTHER_COLUMNS`` columns read besides the filter's
    and the order's. Held out (ClickBench's ``SELECT * FROM hits WHERE URL LIKE '%google%'
    ORDER BY EventTime LIMIT 10`` on a 105-column table): each fragment read and scanned every
    column of every row to keep ten."""
    order, limit = node_sel.args.get("order"), node_sel.args.get("limit")
    if len(refs) != 1 or ctx.broadcast or ctx.exchange is not None or not order or limit is None or not tasks:
        return None
    if any(node_sel.args.get(k) for k in ("group", "having", "qualify", "distinct", _WITH, "joins")):
        return None
    if any(node_sel.find_all(exp.AggFunc, exp.Window, exp.Subquery)) or any(
        x is not node_sel for x in node_sel.find_all(exp.Select)
    ):
        return None
    try:
        rows = int(_constant(limit.expression))
    except (ValueError, TypeError, duckdb.Error):
        return None
    if rows > LATE_MAX_ROWS:
        return None
    aliases = {e.alias.lower(): e.this for e in node_sel.expressions if isinstance(e, exp.Alias) and e.alias}
    for o in order.expressions:
        k = o.this
        if not isinstance(k, exp.Column):
            return None
        shadow = aliases.get(k.name.lower())
        if shadow is not None and not (
            isinstance(shadow, exp.Column) and shadow.name.lower() == k.name.lower()
        ):
            return None
    t = ctx.tables[refs[0].name.lower()]
    names = {f.name.lower(): f.name for f in t.schema}
    used: list[str] = []
    for part in (node_sel.args.get("where"), order):
        if part is not None:
            used.extend(c.name.lower() for c in part.find_all(exp.Column))
    if any(u not in names for u in used):
        return None
    narrow = list(dict.fromkeys(names[u] for u in used))
    wide = ctx.needed(t)
    if any(n not in wide for n in narrow) or len(wide) - len(narrow) < LATE_MIN_OTHER_COLUMNS:
        return None
    if any(set(task["inputs"]) != {t.name} for _, task in tasks):
        return None
    find = node_sel.copy()
    find.set("expressions", [exp.column(_exec.LATE_LOCATOR, quoted=True)])
    return {"input": t.name, "read": narrow, "sql": find.sql(DIALECT)}


def _partial_agg(
    ctx: _Ctx,
    sel: exp.Select,
    refs: list[exp.Table],
    chosen: dict[str, int],
    group: list[exp.Column],
    aggs: list[exp.AggFunc],
    explain: list[str],
) -> SqlPlan | None:
    gmap, node_items = _group_map(group, "__g")  # group column (sql) -> __gi
    amap: dict[str, exp.Expr] = {}  # aggregate (sql) -> merged expression
    merge_items: list[exp.Expr] = [exp.column(f"__g{i}") for i in range(len(group))]
    for a in aggs:
        key = a.sql(DIALECT)
        if key in amap:
            continue
        k = len(amap)
        node_items += _partial_items(a, f"__a{k}")
        if isinstance(a, exp.Avg):
            merge_items += [
                exp.alias_(exp.Sum(this=exp.column(f"__a{k}s")), f"__a{k}s"),
                exp.alias_(exp.Sum(this=exp.column(f"__a{k}n")), f"__a{k}n"),
            ]
            amap[key] = sqlglot.parse_one(f"CAST(__a{k}s AS DOUBLE) / NULLIF(__a{k}n, 0)", read=DIALECT)
            continue
        fn = exp.Sum if isinstance(a, (exp.Sum, exp.Count)) else type(a)
        merge_items.append(exp.alias_(fn(this=exp.column(f"__a{k}")), f"__a{k}"))
        amap[key] = (
            sqlglot.parse_one(f"CAST(COALESCE(__a{k}, 0) AS BIGINT)", read=DIALECT)
            if isinstance(a, exp.Count)
            else exp.column(f"__a{k}")
        )
    aliases = {e.alias.lower() for e in sel.expressions if isinstance(e, exp.Alias)}

    def rewrite(e: exp.Expr, allow_alias: bool) -> exp.Expr | None:
        bad = []

        def fn(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.AggFunc):
                return amap[n.sql(DIALECT)].copy()
            if isinstance(n, exp.Column):
                g = gmap.get(n.sql(DIALECT)) or (gmap.get(n.name) if not n.table else None)
                if g:
                    return exp.column(g)
                if not (allow_alias and not n.table and n.name.lower() in aliases):
                    bad.append(n)
            return n

        out = e.copy().transform(fn)
        return None if bad else out

    outer_items = []
    for e in sel.expressions:
        inner = e.this if isinstance(e, exp.Alias) else e
        name = e.alias_or_name
        if not isinstance(e, (exp.Alias, exp.Column)):
            return None  # an unnamed expression: its output name would differ from DuckDB's
        r = rewrite(inner, False)
        if r is None:
            return None
        outer_items.append(exp.alias_(r, name, quoted=True))
    final = exp.select(*outer_items).from_(
        exp.select(*merge_items)
        .from_("__parts")
        .group_by(*[exp.column(f"__g{i}") for i in range(len(group))])
        .subquery("__m")
        if group
        else exp.select(*merge_items).from_("__parts").subquery("__m")
    )
    if sel.args.get("having"):
        h = rewrite(sel.args["having"].this, False)
        if h is None:
            return None
        final = final.where(h)
    if sel.args.get("order"):
        keys = []
        for o in sel.args["order"].expressions:
            r = rewrite(o.this, True)
            if r is None:
                return None
            keys.append(exp.Ordered(this=r, desc=o.args.get("desc"), nulls_first=o.args.get("nulls_first")))
        final = final.order_by(*keys)
    if sel.args.get("limit"):
        final = final.limit(sel.args["limit"].expression.copy())
    if sel.args.get("offset"):
        final = final.offset(sel.args["offset"].expression.copy())
    node_sel = exp.select(*node_items)
    node_sel.set(_FROM, sel.args[_FROM].copy())
    if sel.args.get("joins"):
        node_sel.set("joins", [j.copy() for j in sel.args["joins"]])
    if sel.args.get("where"):
        node_sel.set("where", sel.args["where"].copy())
    if group:
        node_sel = node_sel.group_by(*[exp.column(f"__g{i}") for i in range(len(group))])
    tasks, moved = _fragment_tasks(ctx, refs, chosen, sel, node_sel.sql(DIALECT), len(refs) >= 2, explain)
    explain.append(
        f"plan: partial aggregation: {len(tasks)} fragments aggregate next to the data (DuckDB over the extents); "
        f"the coordinator merges {len(amap)} partial aggregates"
        + (f" by {len(group)} group keys" if group else "")
        + " and evaluates SELECT/HAVING/ORDER BY/LIMIT"
    )
    return SqlPlan("partial_agg", tasks, final.sql(DIALECT), ["__parts"] * len(tasks), explain, chosen, moved)


# ------------------------------------------------------------------ the repartition exchange
# A query whose groups or join keys are not whole in any replica's partitions (an aggregate that
# does not decompose grouped off the partition key; an outer, semi or anti join, or two big
# tables joined, on keys no replica pair co-partitions) runs as an exchange rather than a gather:
# each node reads its extents of each table (filters and projection pushed next to the data, as
# a gather's), hash-splits the rows by the query's key (the group columns, or the join key) into
# one bucket per reducer (``op: map`` with ``sql``), and every reducer pulls its bucket from
# every node over the shuffle transport of the JSON plans (``op: reduce`` with ``sql``: the
# same buckets, ``shuffle_take``) and runs the query's SQL on it in DuckDB. Rows with equal keys
# hash alike (NULLs too: to one bucket), so every group and every key's join partners are on one
# reducer and the query there is exact; the coordinator concatenates, orders and limits (as for
# ``partition_local``), or merges partial aggregates (``partial_agg``'s merge, after a join).

EXCHANGE_QID = "__exchange__"  # the placeholder a plan holds; each run uses a fresh query id
# Below this many gathered bytes the gather is kept: the exchange's second round of tasks (maps,
# then reducers) costs more than spreading the work saves (core attribute ``sql_exchange_bytes``).
EXCHANGE_MIN_BYTES = 16e6


# The exchange's own pass, in the planner's cost units (a byte read from a default-codec extent)
# per byte its maps read: hashing each row's key, sorting the rows into buckets, writing and
# reading the buckets, the reducers' second DuckDB ingestion, all of which the gather does not
# do. Measured on this host: the exchange's median time over the gather's, less what the model
# already counts for it, per byte read, over the six queries of ``benchmarks/store_exchange.py``
# at 10^7 rows, six nodes (2026-12-04 13:38-13:39 UTC, load average 2-5: 1.5-3.7 units a byte,
# median 2.9; docs/benchmarks/store.md, "Repartition exchange"). With it, no exchange pays on
# this host (two cores under six nodes); re-measure on a cluster whose nodes have their own.
EXCHANGE_PASS_UNITS = 2.9


def exchange_bytes(core: Any) -> float:
    """The core's exchange threshold (``StoreCore.sql_exchange_bytes``; a negative value: never)."""
    v = getattr(core, "sql_exchange_bytes", None)
    v = EXCHANGE_MIN_BYTES if v is None else v
    return v if v >= 0 else float("inf")


def _schema_name(t: TableInfo, name: str) -> str:
    return next(c for c in t.schema.names if c.lower() == name.lower())


def _exchange_join_keys(
    ctx: _Ctx, sel: exp.Select, split: list[exp.Table], big: list[exp.Table]
) -> dict[str, list[str]] | None:
    """``{table: [key column]}`` for the two big tables of an inner join (the split table and
    one too big to broadcast) joined by an equality of one column of each whose types hash
    alike; None when there is no such pair."""
    if len(split) != 1 or len(big) != 1:
        return None
    a, b = split[0], big[0]
    ta, tb = ctx.tables[a.name.lower()], ctx.tables[b.name.lower()]
    if ta.name == tb.name:
        return None
    key = _join_equality(sel, a, ta, b, tb, inner_only=True)
    return None if key is None else {ta.name: [key[0]], tb.name: [key[1]]}


def _join_equality(
    where_of: exp.Select,
    a: exp.Table,
    ta: TableInfo,
    b: exp.Table,
    tb: TableInfo,
    inner_only: bool,
    on: exp.Expr | None = None,
) -> tuple[str, str] | None:
    """The first ``a.x = b.y`` among the conjuncts (``on``'s, else ``where_of``'s WHERE and its
    inner joins' ON) with types that hash alike: ``(x, y)`` as the schemas spell them."""
    cols_a, cols_b = _columns_of({"a": ta})["a"], _columns_of({"b": tb})["b"]
    if on is not None:
        conds = _conjuncts(on.unnest())  # ``ON (a = b AND c = d)``: TPC-DS writes them in parentheses
    else:
        conds = _conjuncts(where_of.args["where"].this if where_of.args.get("where") else None)
        for j in where_of.args.get("joins") or []:
            if inner_only:
                conds += _conjuncts(j.args.get("on"))
    for c in conds:
        if not (
            isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
        ):
            continue
        for p, q in ((c.this, c.expression), (c.expression, c.this)):
            if _owned(p, a.alias_or_name, cols_a, cols_b) and _owned(q, b.alias_or_name, cols_b, cols_a):
                x, y = _schema_name(ta, p.name), _schema_name(tb, q.name)
                if _same_domain(_field_type(ta, x), _field_type(tb, y)):
                    return x, y
    return None


def _exchange_tasks(
    ctx: _Ctx, refs: list[exp.Table], chosen: dict[str, int], node_sql: str, explain: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """The reducers of an exchange (``ctx.exchange``: each exchanged table's key columns), its
    maps put in ``ctx.exchange_maps`` and its estimates in ``ctx.exchange_cost``. Each table is
    read from its cheapest replica (every replica moves what it reads), filtered and projected
    by its map; a node that holds extents of some table is a reducer (bucket ``i`` is the
    ``i``-th's); broadcast tables are read whole by every reducer."""
    assert ctx.exchange is not None
    colsets = _columns_of(ctx.tables)
    tinfo = {t.name: t for t in ctx.tables.values()}
    sides = []
    rows = read = 0.0
    ncols = 0
    for k, ref in enumerate(refs):
        n = ref.name.lower()
        t = ctx.tables[n]
        others = set().union(*(v for m, v in colsets.items() if m != n))
        conds = pushable(ctx.tree, ref, colsets[n], others)
        cols = ctx.needed(t)
        ncols += len(cols)
        where = triples(conds, t)
        rep, cost, units, allowed = cheapest_replica(t, where, cols, ctx.live, ctx.addresses, ctx.resident)
        chosen[t.name] = rep
        rows += cost.rows
        read += cost.bytes_read
        groups = _by_node(units)
        sides.append((f"T{k}", t, cols, conds, groups))
        explain.append(
            f"  {t.name}: replica {rep} ({t.specs[rep].describe()}), {len(cols)} of {len(t.schema)} columns, "
            f"{len(units)} extent units on {len(groups)} nodes"
            + (f", pruned to partitions {sorted(allowed)}" if allowed is not None else "")
            + (f"; {len(conds)} filters pushed to the nodes" if conds else "")
            + f"; hash-split by {ctx.exchange[t.name]}; ~{cost.rows} rows, {cost.bytes_read / 1e6:.2f} MB read"
        )
    reducers = sorted(set().union(*(g for *_, g in sides))) or [min(ctx.live) if ctx.live else ""]
    nred = len(reducers)
    maps: list[tuple[str, dict[str, Any]]] = []
    peers: dict[str, list[str]] = {}
    tables: dict[str, str] = {}
    for tag, t, cols, conds, groups in sides:
        groups = groups or {reducers[0]: []}  # an empty side still gives its buckets' schema
        peers[tag] = sorted(groups)
        tables[tag] = t.name
        sql = _scan_sql(t.name, cols, conds)
        for node, srcs in groups.items():
            task = {
                "op": "map",
                "qid": EXCHANGE_QID,
                "tag": tag,
                "table": t.name,
                "side": _side(t, cols, srcs),
                "sql": sql,
                "key": ctx.exchange[t.name],
                "n": nred,
            }
            maps.append((node, task))
    bcast = {n: _side(tinfo[n], ctx.needed(tinfo[n]), srcs) for n, srcs in ctx.broadcast.items()}
    bbytes = sum(s["bytes"] for v in ctx.broadcast.values() for s in v)
    everyone = sorted({p for v in peers.values() for p in v})
    reduces = [
        (
            node,
            {
                "op": "reduce",
                "qid": EXCHANGE_QID,
                "bucket": i,
                "peers": peers,
                "addresses": {p: ctx.addresses.get(p, "") for p in everyone},
                "tables": tables,
                "inputs": bcast,
                "sql": node_sql,
            },
        )
        for i, node in enumerate(reducers)
    ]
    ctx.exchange_maps = maps
    ctx.exchange_cost = {
        "rows": rows,
        "read": read,
        "moved": read * (nred - 1) / nred + bbytes * nred,
        "reducers": nred,
        "cols": ncols,
    }
    return reduces


def _partial_exchange(ctx: _Ctx, plan: SqlPlan | None) -> SqlPlan | None:
    """``plan`` (partition-local or partial aggregation) as the exchange it was built as, when
    ``ctx.exchange`` is set: kind ``exchange``, its maps, its estimated result bytes."""
    if plan is None or ctx.exchange is None:
        return plan
    tree = ctx.tree
    c = ctx.exchange_cost
    grouped = bool(tree.args.get("group")) or bool(tree.find(exp.AggFunc))
    if tree.args.get("limit") is not None:
        out = 0.0  # k rows a reducer
    elif grouped:
        # at most a group a row: the keys' share of what is read (an upper bound)
        out = c["read"] * sum(len(v) for v in ctx.exchange.values()) / max(c["cols"], 1)
    else:
        out = c["read"]  # the rows as read (a join's result may be more or fewer)
    c["out"] = out
    for k, line in enumerate(plan.explain):
        if line.startswith("plan: "):
            what = "partial aggregation" if plan.kind == "partial_agg" else "the whole query"
            plan.explain[k] = (
                f"plan: exchange: every node hash-splits its rows of "
                f"{', '.join(f'{n} by {v}' for n, v in ctx.exchange.items())} into {c['reducers']} buckets; "
                f"each reducer pulls its bucket from every node (the shuffle's Flight transport) and runs "
                f"{what} over it in DuckDB (every group / join key whole on one reducer); the coordinator "
                + (
                    "merges the partial aggregates"
                    if plan.kind == "partial_agg"
                    else "concatenates and orders"
                )
            )
    plan.kind = "exchange"
    plan.exchange = ctx.exchange_maps
    plan.moved_bytes = 0  # measured when it runs (the buckets that cross between nodes)
    plan.gathered_bytes = out
    return plan


def _exchange_wins(ctx: _Ctx, exch: SqlPlan, gathered: SqlPlan) -> bool:
    """Whether the exchange is cheaper than the gather by the planner's cost (``Cost.total``,
    ``_planner``: bytes read plus ``MOVE_WEIGHT`` x bytes moved, summed over the nodes): the
    gather moves every byte it reads to the coordinator (G read, G moved); the exchange reads
    the same B, passes it through its split (``EXCHANGE_PASS_UNITS`` a byte, measured), moves
    the (n-1)/n of it that crosses to another reducer (and the broadcast tables to each reducer)
    and then its results to the coordinator, estimated at most (the
    query's rows as read for a scan, the keys' share of B for an aggregate: a group a row;
    none under a LIMIT). EXPLAIN also shows the rows each plan processes in one process (all of
    them at the coordinator, ~1/n per reducer); they are not in the cost: on this host the
    nodes share its cores, and measured there the spread did not pay for the exchange's extra
    pass (docs/benchmarks/store.md, "Repartition exchange"). Below ``exchange_bytes`` gathered,
    the gather is kept (a second round of tasks). Both estimates go to the chosen plan's EXPLAIN."""
    c = dict(ctx.exchange_cost)
    n = max(int(c["reducers"]), 1)
    g = gathered.gathered_bytes
    out = c.get("out", 0.0)
    cost_g = g + MOVE_WEIGHT * g
    cost_e = (1 + EXCHANGE_PASS_UNITS) * c["read"] + MOVE_WEIGHT * (c["moved"] + out)
    small = g < exchange_bytes(ctx.core)
    mode = getattr(ctx.core, "sql_exchange", None)  # True: always, False: never, None: by cost
    wins = bool(mode) if mode is not None else (not small and cost_e < cost_g)
    e_line = (
        f"exchange: ~{c['rows']:.0f} rows read and split ({c['read'] / 1e6:.2f} MB) on {n} nodes, "
        f"~{c['moved'] / 1e6:.2f} MB moved between nodes, ~{c['rows'] / n:.0f} rows per reducer, "
        f"~{out / 1e6:.2f} MB of results to the coordinator (at most): cost {cost_e / 1e6:.2f} M"
    )
    g_line = (
        f"gather: ~{g / 1e6:.2f} MB read and moved to the coordinator, which processes every row "
        f"(~{c['rows']:.0f} of the exchanged tables): cost {cost_g / 1e6:.2f} M"
    )
    if wins:
        exch.explain += [f"cost: {e_line}", f"  rather than {g_line}"]
    else:
        gathered.explain[1:1] = [
            "exchange not chosen: "
            + (
                "turned off (StoreCore.sql_exchange = False)"
                if mode is False
                else f"the gather reads under {exchange_bytes(ctx.core) / 1e6:.0f} MB (a second round of "
                "tasks costs more than it saves)"
                if small
                else "it would cost more"
            ),
            f"  cost: {g_line}",
            f"  rather than {e_line}",
        ]
    return wins


def _exchange_join(ctx: _Ctx, refs: list[exp.Table]) -> SqlPlan | None:
    """An exchange for a join no other plan splits: one SELECT over two tables joined on an
    equality of a column of each, as an outer join (LEFT, RIGHT, FULL), a SEMI or ANTI join,
    ``EXISTS`` / ``NOT EXISTS`` (a subquery over the other table correlated by the equality),
    or ``x IN (SELECT y ...)`` (not ``NOT IN``: one NULL among the ``y`` empties the answer,
    and that NULL is in one bucket only). Both tables are hash-split by their key, so a key's
    rows of both meet on one reducer, where the join (matched or not) is exact. With
    aggregates, the GROUP BY holds the key of the side every output row keeps (the left of a
    LEFT, SEMI or ANTI join; a FULL join none): a NULL-extended row's key is NULL in another
    bucket than the rows whose keys are NULL, which would split that group."""
    tree = ctx.tree
    if not isinstance(tree, exp.Select) or tree.args.get(_WITH) or len(refs) < 2:
        return None
    if len({r.name.lower() for r in refs}) != len(refs):
        return None
    if tree.args.get("distinct") or tree.args.get("qualify") or tree.find(exp.TableSample):
        return None
    if tree.find(exp.Window, exp.SetOperation, exp.Filter, exp.WithinGroup):
        return None
    frm = tree.args.get(_FROM)
    a = frm.this if frm is not None else None
    if not isinstance(a, exp.Table) or not any(a is r for r in refs):
        return None
    joins = tree.args.get("joins") or []
    subqueries = [n for n in tree.walk() if n is not tree and isinstance(n, exp.Select)]
    # the one outer/semi/anti join (to b); any other join an inner join of a small table, read
    # whole by every reducer (never NULL-extended: each output row still comes from one bucket)
    outer = [j for j in joins if j.side or (j.kind and j.kind.upper() not in ("INNER", "CROSS"))]
    dims = [j.this for j in joins if not any(j is o for o in outer)]
    if subqueries and joins:
        return None
    if joins:
        if len(outer) != 1 or not isinstance(outer[0].this, exp.Table):
            return None
        b = outer[0].this
        if not all(isinstance(d, exp.Table) and any(d is r for r in refs) for d in dims):
            return None
    else:
        if len(refs) != 2:
            return None
        b = next(r for r in refs if r is not a)
    ta, tb = ctx.tables[a.name.lower()], ctx.tables[b.name.lower()]
    if len(refs) != 2 + len(dims) and joins:
        return None
    split_bytes = _replica_bytes(ta) + _replica_bytes(tb)
    for d in dims:
        if _replica_bytes(ctx.tables[d.name.lower()]) > max(BROADCAST_BYTES, BROADCAST_SHARE * split_bytes):
            return None
    keep = None  # the side whose key a GROUP BY may hold
    key: tuple[str, str] | None = None
    if joins and not subqueries:
        j = outer[0]
        using = j.args.get("using") or []
        side, kind = (j.side or "").upper(), (j.kind or "").upper()
        if side == "LEFT" and kind in ("", "OUTER", "SEMI", "ANTI"):
            keep = "a"
        elif side == "" and kind in ("SEMI", "ANTI"):
            keep = "a"
        elif side == "RIGHT" and kind in ("", "OUTER"):
            keep = "b"
        elif side == "FULL" and kind in ("", "OUTER"):
            keep = None
        else:
            return None  # inner joins are the split plans' (``_distributed``)
        if using:
            # ``USING (k)``: a.k = b.k (one column; the output's k is the left's, coalesced in a
            # FULL join, whose NULL-extended rows are whole either way)
            names_a, names_b = _columns_of({"a": ta})["a"], _columns_of({"b": tb})["b"]
            if len(using) != 1 or using[0].name.lower() not in names_a & names_b or j.args.get("on"):
                return None
            xs, ys = _schema_name(ta, using[0].name), _schema_name(tb, using[0].name)
            key = (xs, ys) if _same_domain(_field_type(ta, xs), _field_type(tb, ys)) else None
        else:
            key = _join_equality(tree, a, ta, b, tb, inner_only=False, on=j.args.get("on"))
    elif not joins and len(subqueries) == 1:
        sub = subqueries[0]
        if (
            sub.args.get("joins")
            or sub.args.get("group")
            or sub.args.get("limit")
            or sub.args.get("having")
            or sub.find(exp.AggFunc)
            or b.parent is not sub.args.get(_FROM)
        ):
            return None
        where = tree.args.get("where")
        link = None
        for c in _conjuncts(where.this if where else None):
            if any(x is sub for x in c.walk()):
                link = c
        if link is None:
            return None
        node = link.this if isinstance(link, exp.Not) else link
        if isinstance(node, exp.Exists) and node.this is sub:
            key = _join_equality(sub, a, ta, b, tb, inner_only=True)
        elif (
            isinstance(link, exp.In)
            and isinstance(link.this, exp.Column)
            and isinstance(link.args.get("query"), exp.Subquery)
            and link.args["query"].this is sub
            and len(sub.expressions) == 1
            and isinstance(sub.expressions[0], exp.Column)
        ):
            cols_a, cols_b = _columns_of({"a": ta})["a"], _columns_of({"b": tb})["b"]
            x, y = link.this, sub.expressions[0]
            if not (
                _owned(x, a.alias_or_name, cols_a, cols_b) and _owned(y, b.alias_or_name, cols_b, cols_a)
            ):
                return None
            xs, ys = _schema_name(ta, x.name), _schema_name(tb, y.name)
            key = (xs, ys) if _same_domain(_field_type(ta, xs), _field_type(tb, ys)) else None
        else:
            return None
        keep = "a"
    else:
        return None
    if key is None:
        return None
    group = tree.args.get("group")
    partial = False  # grouped off the kept key: partial aggregates per reducer, merged
    if group is not None or tree.find(exp.AggFunc):
        if group is None or group.args.get("all"):
            return None
        colsets = _columns_of(ctx.tables)
        names = [r.name.lower() for r in refs]
        keyed = False
        if keep is not None:
            ref, col = (a, key[0]) if keep == "a" else (b, key[1])
            keyed = any(
                g.name.lower() == col.lower() for g in _owned_group(group.expressions, ref, colsets, names)
            )
        if not keyed:
            aggs = list(tree.find_all(exp.AggFunc))
            if not all(isinstance(g, exp.Column) for g in group.expressions) or not all(
                isinstance(x, _DECOMPOSABLE)
                and not x.find(exp.Distinct)
                and not any(isinstance(y, exp.AggFunc) for y in x.find_all(exp.AggFunc) if y is not x)
                for x in aggs
            ):
                return None
            partial = True
    if not _name_outputs(ctx, tree):
        return None
    for e in tree.expressions:
        if not isinstance(e, (exp.Column, exp.Alias)) or isinstance(e, exp.Star):
            return None
    ctx.broadcast = {}
    chosen: dict[str, int] = {}
    colsets = _columns_of(ctx.tables)
    for d in dims:
        t = ctx.tables[d.name.lower()]
        r, _cost, units, _allowed = cheapest_replica(
            t, [], ctx.needed(t), ctx.live, ctx.addresses, ctx.resident
        )
        ctx.broadcast[t.name] = [x for u in units for x in u.sources]
        chosen[t.name] = r
    ctx.noprune = set()
    ctx.exchange = {ta.name: [key[0]], tb.name: [key[1]]}
    explain = [
        f"join {ta.name}.{key[0]} = {tb.name}.{key[1]} (outer, semi or anti): no plan splits it over partitions"
        + (f"; {', '.join(sorted(ctx.broadcast))} read whole by every reducer (inner-joined)" if dims else "")
    ]
    if partial:
        aggs = list(tree.find_all(exp.AggFunc))
        gcols = [g for g in group.expressions if isinstance(g, exp.Column)]  # type: ignore[union-attr]
        return _partial_exchange(ctx, _partial_agg(ctx, tree, [a, b], chosen, gcols, aggs, explain))
    return _partial_exchange(ctx, _partition_local(ctx, tree, [a, b], chosen, explain, per_partition=True))


# ---------------------------------------------------------------------------------- running
def finish_sql(plan: SqlPlan, outs: list[pa.Table], staged: dict[str, pa.Table] | None = None) -> pa.Table:
    """The coordinator's part over the fragments' outputs fetched whole: registered as Arrow
    (scanned in place) and ``plan.final_sql`` run over them (small inputs; else
    ``finish_sql_streams``); ``staged``: the results of its sub-plans, by name."""
    by: dict[str, list[pa.Table]] = defaultdict(list)
    for name, t in zip(plan.inputs, outs, strict=True):
        by[name].append(t)
    con = duck()
    try:
        for name, parts in by.items():
            con.register(name, _exec.concat(parts))
        for name, t in (staged or {}).items():
            con.register(name, t)
        return _final(con, plan)
    finally:
        con.close()


def finish_sql_streams(
    plan: SqlPlan,
    streams: list[tuple[pa.Schema, Iterator[pa.RecordBatch]]],
    staged: dict[str, pa.Table] | None = None,
) -> pa.Table:
    """The coordinator's part: the fragments' outputs, streamed batch by batch into DuckDB tables
    of this query's own connection (one per input name), then ``plan.final_sql`` over them.

    Nothing holds a fragment's output whole in Arrow: each batch is copied into DuckDB as it
    arrives and dropped, so the merge's memory is DuckDB's, within its limit (``configure``),
    beyond which its tables, hash tables and sorts spill to disk. DuckDB also knows the tables'
    sizes, so it orders the joins (an Arrow stream it could scan only once, and blindly)."""
    by: dict[str, list[tuple[pa.Schema, Iterator[pa.RecordBatch]]]] = defaultdict(list)
    for name, st in zip(plan.inputs, streams, strict=True):
        by[name].append(st)
    con = duck()
    try:
        try:
            for name, parts in by.items():
                _ingest(con, name, parts)
        except duckdb.Error as exc:
            raise _sql_error(exc) from None
        for name, t in (staged or {}).items():
            con.register(name, t)
        return _final(con, plan)
    finally:
        con.close()  # drops the query's tables


def _final(con: duckdb.DuckDBPyConnection, plan: SqlPlan) -> pa.Table:
    try:
        return con.sql(plan.final_sql).to_arrow_table()
    except duckdb.Error as exc:
        raise _sql_error(exc) from None


def _sql_error(exc: duckdb.Error) -> Exception:
    if isinstance(exc, duckdb.OutOfMemoryException):
        return ResourceExhausted(
            f"the query needs more memory than the coordinator's SQL limit (--sql-memory-mb) and "
            f"what it could spill: {short(str(exc), 300)}"
        )
    return InvalidArgument(f"SQL error: {short(str(exc), 400)}")


def _ingest(
    con: duckdb.DuckDBPyConnection, name: str, parts: list[tuple[pa.Schema, Iterator[pa.RecordBatch]]]
) -> None:
    schema = parts[0][0].remove_metadata()  # a fragment reads at least one column (_needed_columns)
    table = _ident(name)
    con.register("__microco_in", schema.empty_table())
    con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM __microco_in")
    for part_schema, batches in parts:
        # one INSERT per stream, DuckDB pulling its batches (a statement per batch cost ~1 ms each:
        # several CPU-seconds for a gather of small batches); an error of the stream (a node lost
        # half-way) comes back out of DuckDB as itself, for the query's retry
        failed: list[BaseException] = []

        def guarded(
            batches: Iterator[pa.RecordBatch] = batches, failed: list[BaseException] = failed
        ) -> Iterator[pa.RecordBatch]:
            try:
                yield from batches
            except BaseException as exc:
                failed.append(exc)
                raise

        con.register("__microco_in", pa.RecordBatchReader.from_batches(part_schema, guarded()))
        try:
            con.execute(f"INSERT INTO {table} SELECT * FROM __microco_in")
        except duckdb.Error:
            if failed:
                raise failed[0] from None
            raise
    con.unregister("__microco_in")


def _fragment_error(exc: BaseException, cancel: Any) -> MicrocoError:
    """A DuckDB error in a fragment: the SQL's (``InvalidArgument``), unless the task was
    cancelled (``_cancel``: its connection interrupted), which is ``TaskCancelled``."""
    if cancel is not None and cancel.cancelled:
        from ._cancel import TaskCancelled

        return TaskCancelled(f"task {cancel.tid} was cancelled (DuckDB interrupted)")
    return InvalidArgument(f"SQL error in a fragment: {short(str(exc), 400)}")


# DuckDB's vector: an Arrow input whose chunks are shorter on average is copied into one chunk
# before DuckDB scans it (``rechunked``)
DUCKDB_VECTOR_ROWS = 2048


def rechunked(t: pa.Table) -> pa.Table:
    """``t`` as DuckDB scans it fastest: its chunks as they are, unless they average under
    DuckDB's vector (``DUCKDB_VECTOR_ROWS``), then one chunk (a copy). A fragment's input is its
    extents' record batches, one per sub-bucket, so a table appended in small pieces (many small
    super-extents) reaches DuckDB as hundreds of chunks of ~200 rows, and DuckDB's Arrow scan
    pays per chunk and column: held out (ClickBench's 105-column ``hits``, 200,000 rows appended
    60,000 at a time, 2026-12-04) a top-10 fragment over 100,000 rows in 512 chunks ran in
    0.15-0.23 s, in 0.035-0.065 s once combined (the copy 0.045-0.064 s)."""
    chunks = t.column(0).num_chunks if t.num_columns else 0
    if chunks > 1 and t.num_rows < chunks * DUCKDB_VECTOR_ROWS:
        return t.combine_chunks()
    return t


def run_fragment(inputs: dict[str, pa.Table], sql: str, cancel: Any = None) -> pa.Table:
    """A node fragment: DuckDB over the tables read from the extents. ``cancel``: the task's
    ``_cancel.CancelToken``, which interrupts the query when the task is cancelled."""
    con = duck()
    if cancel is not None:
        cancel.attach(con)
    try:
        for name, t in inputs.items():
            try:
                con.register(name, rechunked(t))
            except duckdb.Error as exc:  # a type DuckDB cannot read: the query's error, not the node's
                raise _fragment_error(exc, cancel) from None
        if cancel is not None:
            cancel.check()
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as exc:
            raise _fragment_error(exc, cancel) from None
    finally:
        if cancel is not None:
            cancel.detach(con)
        con.close()


FRAGMENT_BATCH_ROWS = 65_536  # rows per record batch of a streamed fragment result


def run_fragment_stream(inputs: dict[str, pa.Table], sql: str, cancel: Any = None) -> pa.RecordBatchReader:
    """``run_fragment`` as a stream: DuckDB hands its result over a batch of
    ``FRAGMENT_BATCH_ROWS`` rows at a time, so a node serving it holds a few batches, not the
    whole result (measured: a 141 MB result, +14 MB peak against +143 MB as one table). The
    cursor closes when the stream is read to its end or dropped."""
    con = duck()
    if cancel is not None:
        cancel.attach(con)
    try:
        for name, t in inputs.items():
            try:
                con.register(name, rechunked(t))
            except duckdb.Error as exc:  # a type DuckDB cannot read: the query's error, not the node's
                raise _fragment_error(exc, cancel) from None
        if cancel is not None:
            cancel.check()
        try:
            reader = con.sql(sql).to_arrow_reader(FRAGMENT_BATCH_ROWS)
        except duckdb.Error as exc:
            raise _fragment_error(exc, cancel) from None
    except BaseException:
        if cancel is not None:
            cancel.detach(con)
        con.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                try:
                    b = reader.read_next_batch()
                except StopIteration:
                    return
                except (duckdb.Error, pa.ArrowException, OSError) as exc:  # DuckDB's error, via Arrow
                    raise _fragment_error(exc, cancel) from None
                yield b
        finally:
            reader.close()
            if cancel is not None:
                cancel.detach(con)
            con.close()

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def referenced(sql: str) -> tuple[str, ...]:
    """The lower-case names of the tables a SQL text reads (CTEs aside), in order: a pure function
    of the text, kept by its normal form (``_plancache``) so a repeated query is not parsed again
    (the permission check and a plan-cache hit need only these)."""
    key = _plancache.text_key(sql)
    names = _REFS.get(key)
    if names is None:
        names = _ref_names(parsed(sql, key))
        _REFS.put(key, names)
    return names


def parsed(sql: str, key: bytes | None = None) -> exp.Query:
    """``parse(sql)``, from the last parses kept by the text's normal form when there: the
    permission check parses a new query first, and planning takes the same tree (each caller gets
    its own copy, so nothing planning does to it is seen by the next: a copy of a TPC-H query's
    tree took 1.1-3.1 ms here, its parse 5.9-9.2 ms)."""
    key = key if key is not None else _plancache.text_key(sql)
    tree = _TREES.get(key)
    if tree is None:
        tree = parse(sql)
        _TREES.put(key, tree)
    return tree.copy()


_TREES: _plancache.LRU[exp.Query] = _plancache.LRU(64)


def _ref_names(tree: exp.Expr) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.name.lower() for r in table_refs(tree)))


_REFS: _plancache.LRU[tuple[str, ...]] = _plancache.LRU(4096)


@dataclass
class _Cached:
    refs: tuple[str, ...]
    version: bytes
    plan: SqlPlan


def _snapshot(
    core: StoreCore, refs: tuple[str, ...]
) -> tuple[list[bytes | str], dict[str, tuple[str, bytes, list[bytes]]], str | None]:
    """What a plan of ``refs`` is made from, read now: each table's raw record and super-extent
    records (by lower-case name), and the first name that matches no table (None when all do);
    with the parts of its digest."""
    records = core.catalog.raw_table_records()
    parts: list[bytes | str] = []
    found: dict[str, tuple[str, bytes, list[bytes]]] = {}
    missing = None
    for n in refs:
        match = [(name, raw) for name, raw in records if name.lower() == n]
        if not match:
            missing = n
            parts.append("\0missing " + n)
            break
        name, raw = match[0]
        supers = [r for _, r in core.catalog.super_records(name)]
        parts += [str(len(supers)), name, raw, *supers]
        found[n] = (name, raw, supers)
    return parts, found, missing


def build(core: StoreCore, sql: str, exclude: set[str] = frozenset()) -> SqlPlan:  # type: ignore[assignment]
    """The plan of ``sql``: from the core's plan cache when the same text was planned on the same
    catalog version and live nodes (``_plancache``), else planned now (and kept).

    The catalog version is its token (``_catalog.VERSION``, written anew by every change), read
    before anything the plan is made from, so a plan is never tagged newer than what it was made
    of: a cache hit costs that one read and the node registry's (one request for the two:
    ``StoreCore.version_and_live_nodes``). A catalog without a token
    (written before there was one) is versioned by the digest of the raw records instead."""
    cache: _plancache.LRU[_Cached] | None = getattr(core, "sql_plans", None)
    key = _plancache.text_key(sql)
    hit = cache.get(key) if cache is not None else None
    both = getattr(core, "version_and_live_nodes", None)  # (one read of etcd for the two)
    if both is not None:
        token, live = both()
    else:
        token, live = core.catalog.version(), core.live_nodes()
    live = [n for n in live if n.name not in exclude]
    env: list[bytes | str] = [
        f"{n.name}\0{n.address}\0{n.domain}" for n in sorted(live, key=lambda x: x.name)
    ]
    env.append(f"broadcast {BROADCAST_BYTES!r} {BROADCAST_SHARE!r}")  # the planner's settings
    env.append(f"semi {semi_join_bytes(core)!r} {SEMI_JOIN_SHARE!r}")
    env.append(f"exchange {exchange_bytes(core)!r} {getattr(core, 'sql_exchange', None)!r}")
    tree = None
    if hit is not None:
        refs = hit.refs
    else:
        tree = parsed(sql, key)
        refs = _ref_names(tree)
    # what of the tables is in memory on their nodes (a cached plan holds while each replica's
    # share stays in the same step: ``Residency.signature``)
    resident = core.residency(refs, live) if hasattr(core, "residency") else None
    if resident is not None:
        env.append("resident " + resident.signature())
    snap = None
    if token is not None:
        version = _plancache.digest(token, *refs, "\0", *env)
    else:
        snap = _snapshot(core, refs)
        version = _plancache.digest(*snap[0], "\0", *env)
    if hit is not None and hit.version == version:
        lines = [x for x in hit.plan.explain if not x.startswith("residency: ")]
        if resident is not None:
            lines.append(resident.describe())
        return replace(hit.plan, explain=lines, timings={}, nodes={n.name: n for n in live}, cached=True)
    if tree is None:
        tree = parsed(sql, key)
    _parts, found, missing = snap if snap is not None else _snapshot(core, refs)
    if missing is not None:
        raise NotFound(
            f"no table {short(next(r.name for r in table_refs(tree) if r.name.lower() == missing))}"
        )
    tables = {n: Catalog.assemble(name, json.loads(raw), supers) for n, (name, raw, supers) in found.items()}
    if not live:
        raise Unavailable("no live store nodes")
    ctx = _Ctx(
        core,
        tree,
        tables,
        {n.name for n in live},
        {n.name: n.address for n in live},
        text=sql,
        resident=resident,
    )
    _volatile.seen = False
    plan = plan_sql(ctx)
    if _may_rename(sql) or _unnamed_outputs(tree):
        plan.names = _bound_names(ctx)
    if resident is not None:
        plan.explain.append(resident.describe())
    plan.nodes = {n.name: n for n in live}  # what the run calls: no second registry read
    if cache is not None and not _volatile.seen:
        cache.put(key, _Cached(refs, version, replace(plan, explain=list(plan.explain), timings={})))
    return plan
