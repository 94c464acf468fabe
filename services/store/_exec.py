"""Query fragments on Arrow tables with pyarrow compute: the operators a store node runs next to
its data and the coordinator runs to merge. Pure functions; ``run_task`` interprets one task of a
plan given an environment that can read sources and move shuffle buckets (a store node over
Arrow Flight, or an in-process cluster in the unit tests)."""

from __future__ import annotations

import ctypes
import itertools
import json
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import acero

from ._partition import _literal_array, _mix, hash_codes
from ._query import Agg

try:
    _LIBC: Any = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc
    _LIBC = None
_READERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="store-read")
TIMINGS_META = b"microco.timings"  # a fragment's own seconds, in its result's schema metadata


# ------------------------------------------------------------------------------- operators
def to_plain_strings(table: pa.Table) -> pa.Table:
    """string_view / large_string columns as plain string: pyarrow's joins refuse string_view as a
    non-key column, and every replica must share one schema. Also the exact widenings to types
    DuckDB (the nodes' SQL engine) reads: a decimal256 of precision up to 38 as decimal128, a
    float16 as float32 (held out, session 39: such a column loaded, and every SQL query of its
    table then failed on every node, reported as its extents unavailable)."""
    fields = []
    changed = False
    for f in table.schema:
        if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
            fields.append(pa.field(f.name, pa.string(), f.nullable))
            changed = True
        elif pa.types.is_binary_view(f.type):
            fields.append(pa.field(f.name, pa.binary(), f.nullable))
            changed = True
        elif pa.types.is_decimal256(f.type) and f.type.precision <= 38:
            fields.append(pa.field(f.name, pa.decimal128(f.type.precision, f.type.scale), f.nullable))
            changed = True
        elif pa.types.is_float16(f.type):
            fields.append(pa.field(f.name, pa.float32(), f.nullable))
            changed = True
        else:
            fields.append(f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata)) if changed else table


def sql_type_refusal(t: pa.DataType, nested: bool = False) -> str:
    """Why DuckDB, the nodes' SQL engine, cannot read a column of type ``t`` ("" when it can,
    ``to_plain_strings``' widenings counted): a table with such a column is refused at creation
    rather than loaded and never readable by SQL."""
    if pa.types.is_decimal256(t) and t.precision > 38:
        return (
            f"{t}: decimals hold at most 38 digits in SQL here (cast to decimal128(38, s), float64 or string)"
        )
    if nested and (pa.types.is_decimal256(t) or pa.types.is_float16(t)):
        return f"{t} inside a nested type (widen it: decimal128, float32)"
    if pa.types.is_union(t):
        return f"{t}: union types are not supported (a struct, or a column per variant)"
    if pa.types.is_nested(t):
        for i in range(t.num_fields):
            why = sql_type_refusal(t.field(i).type, nested=True)
            if why:
                return why
    return ""


def where_expr(schema: pa.Schema, where: Sequence[Sequence[Any]]) -> pc.Expression | None:
    expr = None
    for col, op, value in where:
        typ = schema.field(col).type
        field = pc.field(col)
        if op == "in":
            e = field.isin(_literal_array(list(value), typ))
        else:
            lit = pc.scalar(_literal_array([value], typ)[0])
            e = {
                "=": field == lit,
                "!=": field != lit,
                "<": field < lit,
                "<=": field <= lit,
                ">": field > lit,
                ">=": field >= lit,
            }[op]
        expr = e if expr is None else expr & e
    return expr


_COMPARE: dict[str, Callable[..., Any]] = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def where_mask(table: pa.Table, where: Sequence[Sequence[Any]]) -> pa.ChunkedArray | None:
    """The rows of ``table`` that ``where`` keeps, as a boolean mask computed by compute kernels
    column chunk by column chunk: what ``where_expr`` says (the same literals, the same Kleene
    ``and``: a null comparison keeps no row), without an Acero plan."""
    mask = None
    for col, op, value in where:
        typ = table.schema.field(col).type
        column = table.column(col)
        if op == "in":
            m = pc.is_in(column, value_set=_literal_array(list(value), typ))
        else:
            m = _COMPARE[op](column, _literal_array([value], typ)[0])
        mask = m if mask is None else pc.and_kleene(mask, m)
    return mask


def apply_where(table: pa.Table, where: Sequence[Sequence[Any]]) -> pa.Table:
    """``table``'s rows that ``where`` keeps. A mask of compute kernels, not ``Table.filter`` of
    an expression: that runs an Acero plan per call, whose fixed cost per batch (an extent is one
    batch per sub-bucket, 64 of them) was most of a small filtered scan's time on its node (a
    point filter on 74k rows: 1.05 ms against 0.07 ms; 3.5 ms of a 10 ms query in a loaded
    cluster; issue 19, session 32)."""
    mask = where_mask(table, where)
    return table if mask is None else table.filter(mask)


# a result (or an aggregation's input) whose batches hold fewer rows than this on average is
# made into batches of ``COMPACT_BATCH_ROWS`` (one copy; what each batch costs downstream, an
# IPC message on the wire, a pass of Acero's scheduler, is paid per batch)
COMPACT_BELOW_ROWS = 16_384
COMPACT_BATCH_ROWS = 65_536
COMPACT_MAX_BYTES = 64 << 20  # a larger table is not copied whole (its empty batches are dropped)


def compact(table: pa.Table) -> pa.Table:
    """``table`` without empty batches, and with its small batches made into larger ones (when
    its batches average under ``COMPACT_BELOW_ROWS`` rows and it is at most ``COMPACT_MAX_BYTES``). A filtered extent keeps its 64
    sub-bucket batches, most of them empty after a selective filter: served as they were, each
    was a Flight message of its own (issue 19, session 32)."""
    batches = table.to_batches()
    if len(batches) <= 1:
        return table
    kept = [b for b in batches if b.num_rows]
    if not kept:
        return table.schema.empty_table()
    if table.num_rows < COMPACT_BELOW_ROWS * len(kept) and table.nbytes <= COMPACT_MAX_BYTES:
        out = pa.Table.from_batches(kept, schema=table.schema).combine_chunks()
        return pa.Table.from_batches(out.to_batches(max_chunksize=COMPACT_BATCH_ROWS), schema=table.schema)
    if len(kept) < len(batches):
        return pa.Table.from_batches(kept, schema=table.schema)
    return table


def _agg_inputs(aggs: Sequence[Agg]) -> list[tuple[str, str, str]]:
    """(input column, pyarrow function, partial column) triples for the partial aggregation."""
    out = []
    for a in aggs:
        if a.fn == "count" and a.column == "*":
            out.append(("*", "count_all", a.name))
        elif a.fn == "mean":
            out.append((a.column, "sum", a.name + "__s"))
            out.append((a.column, "count", a.name + "__n"))
        else:
            out.append((a.column, a.fn, a.name))
    return out


# An integer sum wider than 64 bits, as DuckDB's HUGEINT reaches Arrow (held out, session 39:
# Acero's ``sum`` of int64 returns int64 and wraps around silently near 2**63). Each aggregation
# bounds its integer sums from its input (rows times the largest |value|, per table: Arrow's
# ``min_max``, one vectorised pass); while the bound stays under 2**63 the 64-bit sums are exact
# and nothing else changes, past it the sums are taken from a decimal128(38, 0) copy of the
# column (exact). ``finalize_agg`` gives such a sum back as int64 when its value fits.
WIDE_SUM = pa.decimal128(38, 0)
_SUM_LIMIT = 1 << 63
_WIDE = "\x1fwide"  # suffix of a sum input's decimal copy


def int_sum_inputs(schema: pa.Schema, triples: Sequence[tuple[str, str, str]]) -> list[str]:
    """The input columns of ``triples``' sums that are integers (their sums can wrap)."""
    names = {col for col, fn, _ in triples if fn == "sum" and col != "*"}
    return [f.name for f in schema if f.name in names and pa.types.is_integer(f.type)]


def sum_bounds(table: pa.Table | pa.RecordBatch, cols: Sequence[str]) -> dict[str, int]:
    """Per column of ``cols``, a bound on the |sum| of any of ``table``'s rows: its non-null
    rows times its largest |value| (the type's range when that is small enough; a column that
    is no longer an integer: past any bound)."""
    out = {}
    for c in cols:
        col = table.column(c)
        typ = col.type
        n = len(col) - col.null_count
        if not pa.types.is_integer(typ):
            out[c] = _SUM_LIMIT
        elif n == 0:
            out[c] = 0
        elif n << typ.bit_width < _SUM_LIMIT:
            out[c] = n << typ.bit_width
        else:
            mm = pc.min_max(col)
            out[c] = n * max(abs(mm["min"].as_py()), abs(mm["max"].as_py()))
    return out


def _wide_copies(t: pa.Table | pa.RecordBatch, cols: Sequence[str]) -> Any:
    """``t`` with a decimal128(38, 0) copy of each column of ``cols`` appended."""
    for c in cols:
        t = t.append_column(c + _WIDE, t.column(c).cast(WIDE_SUM))
    return t


def _wide_triples(triples: Sequence[tuple[str, str, str]], cols: Sequence[str]) -> list[tuple[str, str, str]]:
    return [(col + _WIDE if fn == "sum" and col in cols else col, fn, out) for col, fn, out in triples]


def _group(table: pa.Table, keys: Sequence[str], triples: Sequence[tuple[str, str, str]]) -> pa.Table:
    ints = int_sum_inputs(table.schema, triples)
    if ints:
        wide = [c for c, b in sum_bounds(table, ints).items() if b >= _SUM_LIMIT]
        if wide:
            table, triples = _wide_copies(table, wide), _wide_triples(triples, wide)
    specs: list[tuple[Any, str]] = []
    names: list[str] = []
    for col, fn, _ in triples:
        spec = ([], fn) if col == "*" else (col, fn)
        if spec not in specs:
            specs.append(spec)
            names.append("count_all" if col == "*" else f"{col}_{fn}")
    if fk := float_keys(table.schema, keys):
        table = canonical_floats(table, fk)
    res = table.group_by(list(keys), use_threads=True).aggregate(specs)
    cols = [res.column(k) for k in keys]
    out_names = list(keys)
    for col, fn, out in triples:
        spec = ([], fn) if col == "*" else (col, fn)
        arr = res.column(names[specs.index(spec)])
        if fn in ("count", "count_all"):
            arr = arr.cast(pa.int64())
        cols.append(arr)
        out_names.append(out)
    return pa.table(cols, names=out_names)


def partial_agg(table: pa.Table, keys: Sequence[str], aggs: Sequence[Agg]) -> pa.Table:
    """Per-group partial aggregates (sums, counts, min, max; a mean as sum and count)."""
    return _group(table, keys, _agg_inputs(aggs))


def _merge_triples(aggs: Sequence[Agg]) -> list[tuple[str, str, str]]:
    out = []
    for a in aggs:
        if a.fn == "mean":
            out += [(a.name + "__s", "sum", a.name + "__s"), (a.name + "__n", "sum", a.name + "__n")]
        elif a.fn in ("count", "sum"):
            out.append((a.name, "sum", a.name))
        else:
            out.append((a.name, a.fn, a.name))
    return out


def combine_partials(partials: pa.Table, keys: Sequence[str], aggs: Sequence[Agg]) -> pa.Table:
    """Merge partial aggregates of the same groups (from different extents or nodes)."""
    return _group(partials, keys, _merge_triples(aggs))


def finalize_agg(
    partials: pa.Table, keys: Sequence[str], aggs: Sequence[Agg], int_sums: dict[str, str] | None = None
) -> pa.Table:
    """Partial columns to the query's output: keys, then one column per aggregate. ``int_sums``:
    the aggregates that sum an integer column, with the type their 64-bit sum has ("int64",
    "uint64"); one summed wide (``WIDE_SUM``) has that type again when every value fits, else
    stays decimal128(38, 0) (DuckDB's type for it)."""
    int_sums = int_sums or {}
    cols = [partials.column(k) for k in keys]
    for a in aggs:
        if a.fn == "mean":
            s = partials.column(a.name + "__s").cast(pa.float64(), safe=False)  # (rounded, as SQL's avg)
            n = partials.column(a.name + "__n").cast(pa.float64())
            cols.append(pc.if_else(pc.equal(n, 0.0), pa.scalar(None, pa.float64()), pc.divide(s, n)))
        else:
            col = partials.column(a.name)
            if a.name in int_sums and pa.types.is_decimal(col.type):
                try:
                    col = col.cast(pa.uint64() if int_sums[a.name] == "uint64" else pa.int64())
                except pa.ArrowInvalid:
                    pass  # (past 64 bits: the exact value, as decimal128(38, 0))
            cols.append(col)
    return pa.table(cols, names=list(keys) + [a.name for a in aggs])


def key_hash(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for k in keys:
        with np.errstate(over="ignore"):
            h = _mix(h ^ hash_codes(table.column(k)))
    return h


def hash_split(table: pa.Table, keys: Sequence[str], n: int) -> list[pa.Table]:
    """Split rows into ``n`` buckets by a hash of ``keys`` (the exchange of a shuffle)."""
    if n == 1:
        return [table]
    b = (key_hash(table, keys) % np.uint64(n)).astype(np.int64)
    order = np.argsort(b, kind="stable")
    counts = np.bincount(b, minlength=n)
    ordered = table.take(pa.array(order))
    out, off = [], 0
    for c in counts.tolist():
        out.append(ordered.slice(off, c))
        off += c
    return out


def order_limit(table: pa.Table, order_by: Sequence[Sequence[Any]], limit: int | None) -> pa.Table:
    """Sort and cut. With a limit k smaller than the rows, a select-k (a heap: O(n log k), no
    full sort) picks the k rows first and only those are sorted; nulls last either way."""
    keys = [(c, "descending" if desc else "ascending") for c, desc in order_by]
    if keys and limit is not None and limit < table.num_rows:
        if limit == 0:
            return table.slice(0, 0)
        table = table.take(pc.select_k_unstable(table, k=limit, sort_keys=keys))
    if keys:
        table = table.sort_by(keys)
    if limit is not None:
        table = table.slice(0, limit)
    return table


def concat(tables: Sequence[pa.Table], schema: pa.Schema | None = None) -> pa.Table:
    tables = [t for t in tables if t is not None]
    if not tables:
        return schema.empty_table() if schema is not None else pa.table({})
    if len(tables) == 1:
        return tables[0]
    if all(t.num_columns == 0 for t in tables):
        # rows without columns (e.g. count(*) needs none): concat_tables would drop the row count
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).select([])
    return pa.concat_tables(tables, promote_options="permissive")


# ------------------------------------------------------------------------------- tasks
class Env(Protocol):
    """What a task needs from where it runs."""

    def read_source(self, source: dict[str, Any], columns: Sequence[str] | None) -> pa.Table: ...

    def shuffle_put(self, qid: str, tag: str, bucket: int, table: pa.Table) -> None: ...

    def shuffle_get(self, peer: str, qid: str, tag: str, bucket: int) -> pa.Table: ...


def _side_one(env: Env, side: dict[str, Any]) -> Callable[[dict[str, Any]], pa.Table]:
    read_cols = side.get("read")
    keep = side.get("keep")

    def one(src: dict[str, Any]) -> pa.Table:
        t = apply_where(env.read_source(src, read_cols), side.get("where", []))
        return t.select(keep) if keep is not None else t

    return one


def _side_schema(side: dict[str, Any]) -> pa.Schema | None:
    if not side.get("schema"):
        return None
    import base64

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(side["schema"])))


def read_each(
    sources: list[dict[str, Any]], read: Callable[[int, dict[str, Any]], pa.Table]
) -> list[pa.Table]:
    """``read(i, source)`` of each source, in order: all at once when they are on several nodes
    (sources on peers are fetched over the network), else one after another."""
    if len({s.get("node") for s in sources}) > 1:
        return list(_READERS.map(read, range(len(sources)), sources))
    return [read(i, src) for i, src in enumerate(sources)]


def scan_side(env: Env, side: dict[str, Any]) -> pa.Table:
    """Read a side's sources (read columns only), filter, and keep the columns downstream needs."""
    one = _side_one(env, side)
    parts = read_each(side["sources"], lambda _, src: one(src))
    schema = _side_schema(side)
    if not parts and schema is not None:
        return schema.empty_table()
    return concat(parts)


# a late-materialized fragment's row locator: source index << 32 | row within that source's read
LATE_LOCATOR = "__microco_loc"


def sql_inputs(env: Env, task: dict[str, Any]) -> dict[str, pa.Table]:
    """A ``sql`` task's inputs by name: each side read (``scan_side``), or, for a task the
    planner marked ``late`` (a top-k whose other columns are many), its table's rows that can be
    in the answer only (``late_rows``); its key tables besides."""
    from ._sql import task_keys

    keys = task_keys(task)
    late = task.get("late")
    inputs = {
        name: late_rows(env, side, late, keys)
        if late is not None and name == late["input"]
        else scan_side(env, side)
        for name, side in task["inputs"].items()
    }
    inputs.update(keys)
    return inputs


def scan_only(task: dict[str, Any], inputs: dict[str, pa.Table]) -> pa.Table | None:
    """The answer of a ``sql`` task whose SQL selects its one input's columns as read, in their
    order, and does nothing else (a gathered table read with no filter to push): that input,
    without DuckDB, which copied every value into its vectors and back out to Arrow (held out,
    TPC-DS at scale factor 1: 4 columns of 1.4M rows of ``store_sales``, ~0.1 s of a node's
    time for no change). None for any other task (DuckDB runs it). The input has the table's
    own types (the side's schema), as DuckDB's scan of it would have answered."""
    sides = task.get("inputs") or {}
    if len(sides) != 1 or len(inputs) != 1 or task.get("late") is not None or task.get("keys"):
        return None
    ((name, side),) = sides.items()
    t = inputs.get(name)
    schema = _side_schema(side)
    if t is None or schema is None or t.num_columns == 0 or not t.schema.equals(schema):
        return None
    from ._sql import _scan_sql

    return t if task.get("sql") == _scan_sql(name, t.schema.names, []) else None


def late_rows(env: Env, side: dict[str, Any], late: dict[str, Any], keys: dict[str, pa.Table]) -> pa.Table:
    """Late materialization of a top-k fragment: the columns its filter and order read
    (``late["read"]``), with a locator, run through ``late["sql"]`` (the fragment with its select
    list replaced by the locator: the rows of its top k); then every column the fragment needs,
    read only from the sources those rows are in and taken from them. The fragment's own SQL over
    these rows answers as over all of them: its top k are among them. A source's rows come in
    the same order whatever columns are read (the same batches of the same extent)."""
    from ._sql import run_fragment

    sources = side["sources"]
    narrow = list(late["read"])
    cancel = getattr(env, "cancel", None)

    def located(i: int, src: dict[str, Any]) -> pa.Table:
        t = env.read_source(src, narrow)
        loc = np.arange(t.num_rows, dtype=np.int64) + (np.int64(i) << np.int64(32))
        return t.append_column(LATE_LOCATOR, pa.array(loc))

    parts = read_each(sources, located)
    schema = _side_schema(side)
    if not parts:
        return schema.empty_table() if schema is not None else pa.table({})
    found = run_fragment({late["input"]: concat(parts), **keys}, late["sql"], cancel)
    del parts
    locs = np.asarray(found.column(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    rows: dict[int, list[int]] = {}
    for v in sorted(set(locs.tolist())):
        rows.setdefault(v >> 32, []).append(v & 0xFFFFFFFF)
    wide = [env.read_source({**sources[i], "rows": r}, side.get("read")) for i, r in sorted(rows.items())]
    keep = side.get("keep")
    wide = [t.select(keep) if keep is not None else t for t in wide]
    if not wide:
        return schema.empty_table() if schema is not None else found.schema.empty_table()
    return concat(wide, schema)


# sources of a streamed side read ahead of the one being consumed (peers' reads overlap; at most
# this many read tables wait besides the one in use)
PREFETCH = 2


def side_tables(env: Env, side: dict[str, Any]) -> Iterator[pa.Table]:
    """A side's sources as tables, one source (an extent, or a bucket of one) at a time: what a
    streamed fragment holds of its input is the one being consumed and ``PREFETCH`` read ahead
    (from peers: read in parallel), never the side whole."""
    one = _side_one(env, side)
    sources = side["sources"]
    if len({s.get("node") for s in sources}) <= 1:
        for src in sources:
            yield one(src)
        return
    it = iter(sources)
    window: deque[Future[pa.Table]] = deque(
        _READERS.submit(one, src) for _, src in zip(range(PREFETCH + 1), it)
    )
    while window:
        got = window.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            window.append(_READERS.submit(one, nxt))
        yield got


Stream = tuple[pa.Schema, Iterator[pa.Table]]


def peeked(tables: Iterable[pa.Table], schema: pa.Schema | None = None) -> Stream:
    """``(schema, tables)``: the schema given, or the first table's (read to learn it, and put
    back in front)."""
    it = iter(tables)
    if schema is None:
        first = next(it, None)
        if first is None:
            return pa.schema([]), iter(())
        schema = first.schema

        def again() -> Iterator[pa.Table]:
            yield first
            yield from it

        return schema.remove_metadata(), again()
    return schema.remove_metadata(), it


def side_stream(env: Env, side: dict[str, Any]) -> Stream:
    return peeked(side_tables(env, side), _side_schema(side))


def float_keys(schema: pa.Schema, keys: Sequence[str]) -> list[str]:
    """The group keys of floating type (``canonical_floats``)."""
    return [k for k in keys if k in schema.names and pa.types.is_floating(schema.field(k).type)]


def canonical_floats(t: pa.Table | pa.RecordBatch, cols: Sequence[str]) -> Any:
    """``t`` with ``cols`` (float group keys) as SQL groups them: -0.0 as 0.0 and every NaN as
    one NaN, as the partitions' hash already takes them (``hash_codes``). Acero's hash grouping
    compares bits: held out (session 39), the query model's group-by on a float column answered
    a 0.0 group and a -0.0 group where SQL (DuckDB) has one."""
    for c in cols:
        i = t.schema.get_field_index(c)
        col = t.column(i)
        nan = pa.scalar(float("nan"), col.type)
        fixed = pc.if_else(pc.is_nan(col), nan, pc.add(col, pa.scalar(0.0, col.type)))
        t = t.set_column(i, t.schema.field(i), fixed)
    return t


def _acero_source(stream: Stream, canon: Sequence[str] = ()) -> acero.Declaration:
    """A stream of tables as an Acero source: Acero pulls the next batch when it wants one, so a
    plan over it holds a few batches, not the stream. ``canon``: float group keys made canonical
    (``canonical_floats``)."""
    schema, tables = stream
    canon = float_keys(schema, canon)

    def batches() -> Iterator[pa.RecordBatch]:
        for t in tables:
            if t.schema.types != schema.types:
                t = t.cast(schema)  # (a peer's partials summed wide, after others' in 64 bits)
            for b in compact(t).to_batches():
                b = pa.RecordBatch.from_arrays(b.columns, schema=schema)
                yield canonical_floats(b, canon) if canon else b

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    return acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(reader))


def _aggregated(
    decl: acero.Declaration, keys: Sequence[str], triples: Sequence[tuple[str, str, str]]
) -> pa.Table:
    """Run ``decl`` into Acero's aggregation (one plan: its input streams through the hash
    aggregation, never materialised), shaped as ``_group`` shapes a table's aggregates."""
    specs: list[tuple[str, str]] = []
    for col, fn, _ in triples:
        if (col, fn) not in specs:
            specs.append((col, fn))
    names = [f"__agg{i}" for i in range(len(specs))]
    prefix = "hash_" if keys else ""
    aggs = [
        ([] if col == "*" else col, prefix + fn, None, n) for (col, fn), n in zip(specs, names, strict=True)
    ]
    agg = acero.Declaration("aggregate", acero.AggregateNodeOptions(aggs, keys=list(keys)), inputs=[decl])
    res = agg.to_table(use_threads=True)
    cols = [res.column(k) for k in keys]
    for col, fn, _ in triples:
        arr = res.column(names[specs.index((col, fn))])
        cols.append(arr.cast(pa.int64()) if fn in ("count", "count_all") else arr)
    return pa.table(cols, names=list(keys) + [out for _, _, out in triples])


def _aggregated_stream(
    stream: Stream, keys: Sequence[str], triples: Sequence[tuple[str, str, str]]
) -> pa.Table:
    """``_aggregated`` of a stream's tables, its integer sums exact: the tables stream through
    Acero's 64-bit sums while their bounds (``sum_bounds``) add up to under 2**63; a table
    that would pass it ends that plan (its sums are exact) and starts a second one over the rest,
    summed from decimal copies; the two plans' partials are then merged (as decimals)."""
    schema, tables = stream
    ints = int_sum_inputs(schema, triples)
    if not ints:
        return _aggregated(_acero_source(stream, keys), keys, triples)
    it = iter(tables)
    total = dict.fromkeys(ints, 0)
    held: list[pa.Table] = []

    def bounded() -> Iterator[pa.Table]:
        for t in it:
            b = sum_bounds(t, ints)
            if any(total[c] + b[c] >= _SUM_LIMIT for c in ints):
                held.append(t)
                return
            for c in ints:
                total[c] += b[c]
            yield t

    first = _aggregated(_acero_source((schema, bounded()), keys), keys, triples)
    if not held:
        return first
    # the rest with a decimal copy of each integer sum input; an input only summed is dropped
    # (a peer's partials summed wide come as decimals, which its integer type could not hold)
    raw = {col for col, fn, _ in triples if fn != "sum"}
    drop = [c for c in ints if c not in raw]

    def widened(t: pa.Table) -> pa.Table:
        t = _wide_copies(t, ints).drop_columns(drop)
        return t if t.schema.types == wide_schema.types else t.cast(wide_schema)

    wide_schema = _wide_copies(schema.empty_table(), ints).schema
    wide_schema = pa.schema([f for f in wide_schema if f.name not in drop])
    rest = (widened(t) for t in itertools.chain(held, it))
    second = _aggregated(_acero_source((wide_schema, rest), keys), keys, _wide_triples(triples, ints))
    merge = [(out, fn if fn in ("min", "max") else "sum", out) for _, fn, out in triples]
    return _group(concat([first, second]), keys, merge)


def _agg_of(post: dict[str, Any] | None) -> tuple[list[str], list[tuple[str, str, str]]] | None:
    """(keys, triples) of a post-step that aggregates (partials of rows, or a merge of
    partials); None when it does not."""
    agg = (post or {}).get("agg")
    if agg is None:
        return None
    aggs = _aggs(agg)
    triples = _merge_triples(aggs) if agg.get("input") == "partial" else _agg_inputs(aggs)
    return list(agg.get("keys", [])), triples


def stream_post(stream: Stream, post: dict[str, Any] | None) -> pa.Table:
    """``post_ops`` over a stream of tables: an aggregate consumes it a batch at a time (Acero's
    hash aggregation holds the groups, not the rows); other post-steps take the rows whole."""
    agg = _agg_of(post)
    schema, tables = stream
    if agg is None or not schema.names:
        # rows (the result is the rows), or rows without columns (count(*) alone: a batch of
        # no columns would lose its row count in Acero's source)
        return post_ops(concat(list(tables), schema), post)
    return _aggregated_stream(stream, *agg)


def sorted_runs_post(env: Env, side: dict[str, Any], post: dict[str, Any] | None) -> pa.Table | None:
    """A group-by on one key over sources whose sub-buckets are all sorted on it (the catalog's
    ``ExtentMeta.sorted``, carried by each source as ``sorted``): each source's rows aggregated
    by runs of equal keys (``_runs.run_partials``; a source whose runs are short, or whose
    types it does not cover, hashed as before, ``partial_agg``), and the partials merged by
    group in Acero's hash aggregation; the same answer as ``stream_post``. None where it does
    not apply (the caller runs ``stream_post``)."""
    from ._runs import MIN_ROWS_PER_RUN, as_decimals, run_partials

    agg = (post or {}).get("agg")
    if agg is None or agg.get("input") == "partial" or len(agg.get("keys", [])) != 1:
        return None
    key = agg["keys"][0]
    sources = side.get("sources") or []
    if not sources or any(s.get("sorted") != key for s in sources):
        return None
    aggs = _aggs(agg)
    triples = _agg_inputs(aggs)
    merge = [(out, "min" if fn == "min" else "max" if fn == "max" else "sum", out) for _, fn, out in triples]
    tables = (t for t in side_tables(env, side) if t.num_rows)
    first = next(tables, None)
    if first is None:
        return None  # no rows: the plain path gives the empty result its types
    got = run_partials(first, key, triples, MIN_ROWS_PER_RUN)
    if got is None:
        # runs too short (or types not covered) in the first source: the rows hashed, streamed
        return stream_post(peeked(itertools.chain([first], tables), _side_schema(side)), post)
    # the runs' partials (a fraction of the rows), decimals as unscaled integers
    runs, hashed = [got], []
    for t in tables:
        more = run_partials(t, key, triples, MIN_ROWS_PER_RUN)
        if more is None or more.decimals != got.decimals:
            hashed.append(_group(t, [key], triples))  # as partials, with the decimals as such
        else:
            runs.append(more)
    decimals = got.decimals
    exact = all(sum(p.bounds.get(name, 0) for p in runs) < 1 << 63 for name in decimals)
    parts = [p.table for p in runs]
    if hashed or not exact:
        # merged as decimals (a hashed source's partials are; or the integers could overflow)
        parts = [as_decimals(t, decimals) for t in parts] + hashed
        decimals = {}
    # (a source's partials summed wide are decimals: the others' cast to them)
    schema = pa.unify_schemas([t.schema for t in parts], promote_options="permissive")
    parts = [t if t.schema.equals(schema) else t.cast(schema) for t in parts]
    merged = _aggregated_stream(peeked(iter(parts), schema), [key], merge)
    return as_decimals(merged, decimals)


def join_post(
    left: Stream, right: Stream, j: dict[str, Any], post: dict[str, Any] | None, build: str = "R"
) -> pa.Table:
    """``post_ops(join(left, right))`` with the ``build`` side ("L" or "R") held whole and the
    other streamed through Acero's hash join; an aggregate consumes the joined rows in the same
    plan as they come (the join's output is never materialised). What is held: the build side,
    its hash table, a few batches of the probe side, and the groups."""
    left_on, right_on = j["left_on"], j["right_on"]
    (b_schema, b_tables), probe = (right, left) if build == "R" else (left, right)
    b_on, p_on = (right_on, left_on) if build == "R" else (left_on, right_on)
    built = concat(list(b_tables), b_schema)
    # the join's output: left's columns, then right's without its key
    cols = list(left[0].names) + [c for c in right[0].names if c != right_on]
    agg = _agg_of(post)
    if agg is not None:
        needed = set(agg[0]) | {col for col, _, _ in agg[1] if col != "*"}
        cols = [c for c in cols if c in needed] or [left_on]
    l_out = [c for c in left[0].names if c in cols]
    r_out = [c for c in right[0].names if c != right_on and c in cols]
    p_out, b_out = (l_out, r_out) if build == "R" else (r_out, l_out)
    coded: dict[str, pa.Array] = {}
    keys: list[str] = []
    if agg is not None:
        built, coded = _coded_keys(built, b_out, agg[0], {col for col, _, _ in agg[1]})
        # float group keys made canonical on both sides (not the join key: its hash join's
        # equality is the query model's own)
        keys = [k for k in agg[0] if k not in (p_on, b_on)]
        if fk := float_keys(built.schema, keys):
            built = canonical_floats(built, fk)
    if agg is not None:
        out = _joined_aggregated(probe, built, p_on, b_on, p_out, b_out, agg[0], agg[1], keys)
        for name, dictionary in coded.items():
            i = out.schema.get_field_index(name)
            out = out.set_column(i, name, dictionary.take(out.column(name)))
        return out
    decl = _join_decl(probe, built, p_on, b_on, p_out, b_out, keys)
    return post_ops(decl.to_table(use_threads=True).select(cols), post)


def _join_decl(
    probe: Stream,
    built: pa.Table,
    p_on: str,
    b_on: str,
    p_out: Sequence[str],
    b_out: Sequence[str],
    canon: Sequence[str],
) -> acero.Declaration:
    return acero.Declaration(
        "hashjoin",
        acero.HashJoinNodeOptions("inner", [p_on], [b_on], left_output=list(p_out), right_output=list(b_out)),
        inputs=[
            _acero_source(probe, canon),
            acero.Declaration("table_source", acero.TableSourceNodeOptions(built)),
        ],
    )


def _maxabs(col: pa.ChunkedArray | pa.Array) -> int:
    """The largest |value| of an integer column (0 when it has none; a column of another type:
    past any bound)."""
    if not pa.types.is_integer(col.type):
        return _SUM_LIMIT
    if len(col) == col.null_count:
        return 0
    mm = pc.min_max(col)
    return max(abs(mm["min"].as_py()), abs(mm["max"].as_py()))


def _joined_aggregated(
    probe: Stream,
    built: pa.Table,
    p_on: str,
    b_on: str,
    p_out: Sequence[str],
    b_out: Sequence[str],
    keys: Sequence[str],
    triples: Sequence[tuple[str, str, str]],
    canon: Sequence[str],
) -> pa.Table:
    """The join's rows into ``_aggregated``, its integer sums exact as ``_aggregated_stream``
    makes a stream's: a probe table's joined rows are at most its rows times the most rows of
    the build side that share a key (first bounded by the build side's rows; its keys counted
    only when that bound is too loose), each with a |value| at most the largest of its side's
    column; while these bounds add up to under 2**63 the 64-bit sums are exact, past it the rest
    of the probe side is joined in a second plan that sums decimal copies, and the two plans'
    partials are merged."""
    p_schema, tables = probe
    p_ints = [c for c in int_sum_inputs(p_schema, triples) if c in p_out]
    b_ints = [c for c in int_sum_inputs(built.schema, triples) if c in b_out]
    if not p_ints and not b_ints:
        return _aggregated(_join_decl(probe, built, p_on, b_on, p_out, b_out, canon), keys, triples)
    it = iter(tables)
    b_max = {c: _maxabs(built.column(c)) for c in b_ints}
    mult = [built.num_rows, 0]  # joined rows per probe row at most; whether counted by key
    total = dict.fromkeys(p_ints + b_ints, 0)
    held: list[pa.Table] = []

    def bound(t: pa.Table) -> dict[str, int]:
        m = {**{c: _maxabs(t.column(c)) for c in p_ints}, **b_max}
        return {c: t.num_rows * mult[0] * v for c, v in m.items()}

    def passes(b: dict[str, int]) -> bool:
        return any(total[c] + b[c] >= _SUM_LIMIT for c in total)

    def bounded() -> Iterator[pa.Table]:
        for t in it:
            b = bound(t)
            if passes(b) and not mult[1]:
                counts = pc.value_counts(built.column(b_on)).field("counts")
                mult[:] = [pc.max(counts).as_py() or 0, 1]
                b = bound(t)
            if passes(b):
                held.append(t)
                return
            for c in total:
                total[c] += b[c]
            yield t

    first = _aggregated(
        _join_decl((p_schema, bounded()), built, p_on, b_on, p_out, b_out, canon), keys, triples
    )
    if not held:
        return first
    wide_p = _wide_copies(p_schema.empty_table(), p_ints).schema
    rest = (
        _wide_copies(t if t.schema.types == p_schema.types else t.cast(p_schema), p_ints)
        for t in itertools.chain(held, it)
    )
    second = _aggregated(
        _join_decl(
            (wide_p, rest),
            _wide_copies(built, b_ints),
            p_on,
            b_on,
            [*p_out, *(c + _WIDE for c in p_ints)],
            [*b_out, *(c + _WIDE for c in b_ints)],
            canon,
        ),
        keys,
        _wide_triples(triples, p_ints + b_ints),
    )
    merge = [(out, fn if fn in ("min", "max") else "sum", out) for _, fn, out in triples]
    return _group(concat([first, second]), keys, merge)


def _coded_keys(
    built: pa.Table, kept: Sequence[str], keys: Sequence[str], agg_inputs: set[str]
) -> tuple[pa.Table, dict[str, pa.Array]]:
    """``built`` with each of its string (or binary) group keys replaced by its dictionary's
    indices, and those dictionaries by name. The join then carries an integer per joined row
    instead of a string, and the aggregation hashes integers (the groups are the same: equal
    strings get equal codes, a null a null code); the codes are mapped back after the
    aggregation, once per group. A key that is also an aggregate's input stays as it is."""
    coded: dict[str, pa.Array] = {}
    for name in keys:
        if name not in kept or name in agg_inputs or name not in built.schema.names:
            continue
        col = built.column(name)
        if not (
            pa.types.is_string(col.type)
            or pa.types.is_large_string(col.type)
            or pa.types.is_binary(col.type)
            or pa.types.is_large_binary(col.type)
        ):
            continue
        enc = (
            col.combine_chunks().dictionary_encode()
            if col.num_chunks != 1
            else col.chunk(0).dictionary_encode()
        )
        coded[name] = enc.dictionary
        built = built.set_column(built.schema.get_field_index(name), name, enc.indices)
    return built, coded


def _aggs(spec: dict[str, Any]) -> list[Agg]:
    return [Agg(*a) for a in spec.get("aggs", [])]


def post_ops(table: pa.Table, post: dict[str, Any] | None) -> pa.Table:
    """After the scan or join: aggregate (partial, or merge of partials), or top-k / limit."""
    if not post:
        return table
    if post.get("agg") is not None:
        agg = post["agg"]
        keys, aggs = agg.get("keys", []), _aggs(agg)
        if agg.get("input") == "partial":
            return combine_partials(table, keys, aggs)
        return partial_agg(table, keys, aggs)
    if post.get("select") is not None:
        table = table.select(post["select"])
    return order_limit(table, [tuple(o) for o in post.get("order_by", [])], post.get("limit"))


def fragment_timings(t: pa.Table) -> dict[str, float]:
    """A fragment's own seconds (``read``, ``run``) from its result's metadata, or {}."""
    raw = (t.schema.metadata or {}).get(TIMINGS_META)
    try:
        return {k: float(v) for k, v in json.loads(raw).items()} if raw else {}
    except (ValueError, TypeError, AttributeError):
        return {}


def run_task(env: Env, task: dict[str, Any]) -> pa.Table:
    """Run one plan task; returns its output rows (for ``map``: rows per bucket). A task of the
    JSON model's plans that asks (``timings``: the coordinator's, not a ``PlanRead`` client's,
    whose rows are the table's) carries its own seconds (``run``) in its result's metadata."""
    if task["op"] == "sql" or not task.get("timings"):
        return _run_task(env, task)
    t0 = time.perf_counter()
    out = _run_task(env, task)
    took = json.dumps({"run": time.perf_counter() - t0}).encode()
    return out.replace_schema_metadata({**(out.schema.metadata or {}), TIMINGS_META: took})


def without_timings(t: pa.Table) -> pa.Table:
    """``t`` without a fragment's ``TIMINGS_META`` (what a result carries out is its own)."""
    meta = t.schema.metadata
    if not meta or TIMINGS_META not in meta:
        return t
    rest = {k: v for k, v in meta.items() if k != TIMINGS_META}
    return t.replace_schema_metadata(rest or None)


def _run_task(env: Env, task: dict[str, Any]) -> pa.Table:
    op = task["op"]
    if op == "sql":
        from ._sql import run_fragment

        t0 = time.perf_counter()
        inputs = sql_inputs(env, task)  # with a semi-join's key values, sent with the task
        t1 = time.perf_counter()
        out = scan_only(task, inputs)
        if out is None:
            out = run_fragment(inputs, task["sql"], getattr(env, "cancel", None))
        # the node's own seconds (read the inputs, run the SQL) travel with the result
        took = json.dumps({"read": t1 - t0, "run": time.perf_counter() - t1}).encode()
        return out.replace_schema_metadata({**(out.schema.metadata or {}), TIMINGS_META: took})
    if op == "fragment":
        if task.get("by_partition"):
            out = _by_partition(env, task)
            if out is not None:
                return out
        if task.get("right") is not None:
            j = task["join"]
            return join_post(
                side_stream(env, task["left"]),
                side_stream(env, task["right"]),
                j,
                task.get("post"),
                _build_side(j, task["left"]["sources"], task["right"]["sources"]),
            )
        out = sorted_runs_post(env, task["left"], task.get("post"))
        if out is not None:
            return out
        return stream_post(side_stream(env, task["left"]), task.get("post"))
    if op == "map":
        n = task["n"]
        if task.get("sql") is not None:
            # a SQL exchange's map (``_sql``'s ``exchange`` plan): the side's extents read, the
            # filters and projection pushed to the node run in DuckDB, the rows then split
            from ._sql import run_fragment

            tables: Iterable[pa.Table] = [
                run_fragment(
                    {task["table"]: scan_side(env, task["side"])}, task["sql"], getattr(env, "cancel", None)
                )
            ]
        elif task.get("pre") is not None:
            # pre-aggregated as the sources stream (the partials held, not the rows), then split
            tables = [stream_post(side_stream(env, task["side"]), task["pre"])]
        else:
            tables = side_tables(env, task["side"])
        # split a source at a time: a bucket is its pieces (no copy of the node's rows whole)
        pieces: list[list[pa.Table]] = [[] for _ in range(n)]
        schema = _side_schema(task["side"]) if task.get("pre") is None else None
        for t in tables:
            schema = t.schema
            for i, part in enumerate(hash_split(t, task["key"], n)):
                if part.num_rows:
                    pieces[i].append(part)
        parts = [concat(p, schema) for p in pieces]
        for i, part in enumerate(parts):
            env.shuffle_put(task["qid"], task["tag"], i, part)
        return pa.table(
            {
                "bucket": list(range(len(parts))),
                "rows": [p.num_rows for p in parts],
                "bytes": pa.array([p.nbytes for p in parts], pa.int64()),
            }
        )
    if op == "reduce":
        qid, peers = task["qid"], task["peers"]
        # bucket i of n reducers; in rounds, its sub-buckets i + n * m, one at a time
        n, rounds = int(task.get("reducers", 1)), int(task.get("rounds", 1))
        if task.get("sql") is not None:
            # a SQL exchange's reducer: its bucket of each table from every node that mapped it
            # (whole groups, whole join keys), the broadcast tables read whole, the SQL over them
            from ._sql import run_fragment

            i = task["bucket"]
            inputs = {
                name: concat([env.shuffle_get(p, qid, tag, i) for p in peers[tag]])
                for tag, name in task["tables"].items()
            }
            inputs.update({name: scan_side(env, side) for name, side in (task.get("inputs") or {}).items()})
            return run_fragment(inputs, task["sql"], getattr(env, "cancel", None))
        outs = []
        for m in range(rounds):
            i = task["bucket"] + m * n

            def bucket(tag: str, i: int = i) -> Stream:
                # the peers' buckets a peer at a time (each taken from its peer as it is consumed)
                return peeked(env.shuffle_get(p, qid, tag, i) for p in peers[tag])

            if task.get("join") is not None:
                j = task["join"]
                outs.append(join_post(bucket("L"), bucket("R"), j, task.get("post"), j.get("build", "R")))
            else:
                outs.append(stream_post(bucket("L"), task.get("post")))
        return concat(outs)
    raise ValueError(f"unknown task op {op!r}")


def _build_side(j: dict[str, Any], left: Sequence[dict[str, Any]], right: Sequence[dict[str, Any]]) -> str:
    """The side a join holds whole (its hash table's): the plan's choice, else the side whose
    sources are fewer bytes."""
    if j.get("build") in ("L", "R"):
        return str(j["build"])
    return "L" if sum(s.get("bytes", 0) for s in left) < sum(s.get("bytes", 0) for s in right) else "R"


def _units(sources: Sequence[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    parts: dict[Any, list[dict[str, Any]]] = {}
    for src in sources:
        unit = src.get("unit")
        parts.setdefault(unit[1] if unit else None, []).append(src)
    return parts


def _by_partition(env: Env, task: dict[str, Any]) -> pa.Table | None:
    """A fragment whose every group (or joined row) lies in one partition, one partition at a
    time: a group-by on the replica's partition column (``agg_local``), or a co-partitioned join
    (``join_copart``: partition p of one side joins only partition p of the other) followed by
    an aggregate. Each partition's rows stream through its aggregation (a join: one side's
    partition held whole, the other's extents streamed through the hash join into the
    aggregation), so a node holds one partition's hash tables and a few extents' columns, not
    its partitions' rows; the outputs concatenate (the coordinator merges partial aggregates as
    it would the node's). None when it does not apply (no partition read on both sides: the
    plain path keeps the result's schema)."""
    left = _units(task["left"]["sources"])
    right = _units(task["right"]["sources"]) if task.get("right") is not None else None
    keys = [p for p in left if right is None or p in right]
    if not keys or None in keys:
        return None
    outs = []
    for p in keys:
        lside = {**task["left"], "sources": left[p]}
        if right is not None:
            j = task["join"]
            rside = {**task["right"], "sources": right[p]}
            build = _build_side(j, left[p], right[p])
            outs.append(
                join_post(side_stream(env, lside), side_stream(env, rside), j, task.get("post"), build)
            )
        else:
            out = sorted_runs_post(env, lside, task.get("post"))
            outs.append(out if out is not None else stream_post(side_stream(env, lside), task.get("post")))
    return concat(outs)


def run_task_stream(env: Env, task: dict[str, Any]) -> pa.RecordBatchReader:
    """``run_task`` as record batches: a ``sql`` task's result streams out of DuckDB a batch at
    a time (the node never holds it whole; its inputs, the extents read, are held as before);
    the other tasks' results, small by construction (pre-aggregated, or a shuffle's bucket
    counts) or a ``fragment`` of the JSON model, are served from their table."""
    if task["op"] == "sql":
        from ._sql import run_fragment_stream

        t0 = time.perf_counter()
        inputs = sql_inputs(env, task)
        t1 = time.perf_counter()
        read = scan_only(task, inputs)
        if read is not None:
            read = compact(read)
            took = json.dumps({"read": t1 - t0, "run": 0.0}).encode()
            return _with_metadata(
                pa.RecordBatchReader.from_batches(read.schema, read.to_batches()), {TIMINGS_META: took}
            )
        # "run" is DuckDB's time to the start of the stream (planning; a pipeline breaker such as
        # a group-by or sort runs to its end before the first batch)
        reader = run_fragment_stream(inputs, task["sql"], getattr(env, "cancel", None))
        took = json.dumps({"read": t1 - t0, "run": time.perf_counter() - t1}).encode()
        return _with_metadata(reader, {TIMINGS_META: took})
    t = compact(run_task(env, task))
    schema, left = t.schema, deque(t.to_batches())
    del t

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            while left:
                yield left.popleft()
        finally:
            left.clear()
            release_unused()

    return pa.RecordBatchReader.from_batches(schema, batches())


def release_unused() -> None:
    """Hand the memory Arrow's pool keeps for reuse back to the system once a task's result has
    gone: mimalloc keeps freed pages, so a node's resident memory otherwise stays at the largest
    working set of any task it ran (summed over a cluster's processes on one machine, what ran
    it out of memory at scale factor 10). Done on a thread of its own, after the result's last
    batch is served, not before its end reaches the reader: ``malloc_trim`` walks every arena
    (15-18 ms after a join of 3M rows, measured here), which was on every query's path; requests
    made while one is waiting to run are one release.

    Safe anywhere, a generator's ``finally`` run by the garbage collector included (a result
    stream dropped unread): it only puts a request on a ``queue.SimpleQueue``, whose ``put`` is
    reentrant. Before (issue 19, session 31, a CI run): a stream finalised by the collector while
    its thread was inside a ``ThreadPoolExecutor.submit`` called ``submit`` again, which waited
    forever on the executors' global lock that thread already held (a query held 300 s, freed by
    the test's timeout)."""
    _RELEASE_REQUESTS.put(None)


def _releaser() -> None:
    global RELEASES
    while True:
        _RELEASE_REQUESTS.get()
        while True:  # the requests made meanwhile are this one release
            try:
                _RELEASE_REQUESTS.get_nowait()
            except queue.Empty:
                break
        try:
            _release()
        except Exception:  # noqa: BLE001, S110 - memory not handed back is kept, not an error
            pass
        RELEASES += 1


def _release() -> None:
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)  # what Acero's threads allocated outside the pool (glibc arenas)


RELEASES = 0  # releases done (by the releaser thread)
_RELEASE_REQUESTS: queue.SimpleQueue[None] = queue.SimpleQueue()
threading.Thread(target=_releaser, name="store-release", daemon=True).start()


def _with_metadata(reader: pa.RecordBatchReader, meta: dict[bytes, bytes]) -> pa.RecordBatchReader:
    schema = reader.schema.with_metadata({**(reader.schema.metadata or {}), **meta})

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for b in reader:
                yield b.replace_schema_metadata(schema.metadata)
        finally:
            reader.close()
            release_unused()

    return pa.RecordBatchReader.from_batches(schema, batches())


ReadFn = Callable[[dict[str, Any], Sequence[str] | None], pa.Table]
