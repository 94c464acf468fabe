"""Aggregation by runs of equal keys (issue 19, session 38).

An extent's sub-buckets are sorted on its replica's partition column (``_layout.sort_order``),
so a group-by on that column (a matched plan, ``agg_local``) finds its rows in runs of equal
keys: ``run_partials`` aggregates each run with numpy's ``reduceat`` (one pass over each input
column, no hashing), and the runs' partials, several rows fewer, are then merged by group in
Acero's hash aggregation as any partials are (``_exec``). Correct whatever the rows' order (a
run is rows of one key; an unsorted input only makes the runs short), so the catalog's flag
(``ExtentMeta.sorted``) decides only whether it is worth it.

What it covers, else ``run_partials`` answers None and the caller hashes the rows as before: a
single group key of an integer, date, time, timestamp or duration type; ``count(*)``, ``count``
of any column, and ``sum``, ``min``, ``max`` (and so ``mean``, a sum and a count) of integers,
floats, those temporal types (``min``/``max``) and decimals of at most 18 digits (held in 64
bits; a run's sum that could leave 64 bits falls back). The partials have the types Acero's
hash aggregation gives the same aggregate (``sum``: int64, uint64, double, decimal128(38, s)),
nulls as it has them (a run with no valid value: a null sum, min or max; a float's min and max
skip NaN unless every value is NaN, as Arrow's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

# a run-based aggregation pays off from about this many rows a run (measured, session 38:
# docs/store.md, "A sorted replica's runs"); below it the rows are hashed
MIN_ROWS_PER_RUN = 3.0


def _key_ok(typ: pa.DataType) -> bool:
    return (
        pa.types.is_integer(typ)
        or pa.types.is_date(typ)
        or pa.types.is_timestamp(typ)
        or pa.types.is_time(typ)
        or pa.types.is_duration(typ)
    )


def _words(arr: pa.Array) -> np.ndarray:
    """A fixed-width array's values as numpy (a decimal's low 64-bit words; temporal types as
    their integers); what sits under a null is whatever the buffer holds."""
    typ = arr.type
    if pa.types.is_decimal128(typ):
        words = np.frombuffer(arr.buffers()[1], dtype=np.int64)
        return words[2 * arr.offset : 2 * (arr.offset + len(arr))][0::2]
    if pa.types.is_boolean(typ):
        return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False))
    width = typ.bit_width
    if pa.types.is_floating(typ):
        dtype: type = {16: np.float16, 32: np.float32, 64: np.float64}[width]
    elif pa.types.is_unsigned_integer(typ):
        dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
    else:
        dtype = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[width]
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + len(arr)]


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Per row, is it valid; None when no row is null."""
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))


def run_starts(key: pa.Array) -> np.ndarray | None:
    """The first row of each run of equal values of ``key`` (nulls equal to each other); None
    for a key type not covered."""
    if not _key_ok(key.type):
        return None
    n = len(key)
    if n == 0:
        return np.zeros(0, np.int64)
    k = _words(key)
    change = np.empty(n, bool)
    change[0] = True
    np.not_equal(k[1:], k[:-1], out=change[1:])
    valid = _valid(key)
    if valid is not None:
        # between two nulls: no change whatever their buffers hold; null against a value: one
        change[1:] &= valid[1:] | valid[:-1]
        change[1:] |= valid[1:] != valid[:-1]
    return np.flatnonzero(change)


def _from_words(values: np.ndarray, typ: pa.DataType, valid: np.ndarray | None) -> pa.Array:
    """numpy values back as an Arrow array of ``typ`` (a decimal128 from 64-bit words)."""
    mask = None if valid is None else ~valid
    if pa.types.is_decimal128(typ):
        v = values.astype(np.int64)
        words = np.empty(2 * len(v), np.int64)
        words[0::2] = v
        words[1::2] = v >> np.int64(63)
        bitmap = None
        if mask is not None and mask.any():
            bitmap = pa.array(~mask).buffers()[1]
        nulls = int(mask.sum()) if mask is not None else 0
        return pa.Array.from_buffers(typ, len(v), [bitmap, pa.py_buffer(words)], null_count=nulls)
    if pa.types.is_floating(typ) or pa.types.is_integer(typ):
        return pa.array(values.astype(typ.to_pandas_dtype(), copy=False), typ, mask=mask)
    # temporal: the integers, reinterpreted
    storage = pa.int32() if typ.bit_width == 32 else pa.int64()
    return pa.array(values.astype(storage.to_pandas_dtype()), storage, mask=mask).view(typ)


_SUM_OF = {"int": pa.int64(), "uint": pa.uint64(), "float": pa.float64()}


@dataclass
class Partials:
    """Per run: the key and the partials (``table``); how many runs; the output columns that
    hold a decimal as its unscaled 64-bit integer (``decimals``: their type once merged, made
    by ``as_decimals``; summing and comparing them as integers is what a decimal does, at no
    conversion per run); and for each such sum, a bound on the sum of its |values| (merging
    partials in 64 bits is exact while the bounds add up to under 2**63)."""

    table: pa.Table
    runs: int
    decimals: dict[str, pa.DataType] = field(default_factory=dict)
    bounds: dict[str, int] = field(default_factory=dict)


def as_decimals(table: pa.Table, decimals: dict[str, pa.DataType]) -> pa.Table:
    """``table`` with each column named in ``decimals`` (unscaled 64-bit integers) as its
    decimal type."""
    for name, typ in decimals.items():
        i = table.schema.get_field_index(name)
        if i < 0:
            continue
        col = table.column(i).combine_chunks()
        if pa.types.is_decimal128(col.type):  # (merged wide: the unscaled integers as decimals)
            table = table.set_column(i, name, col.view(typ))
            continue
        words = (
            np.frombuffer(col.buffers()[1], np.int64)[col.offset : col.offset + len(col)]
            if len(col)
            else np.zeros(0, np.int64)
        )
        valid = _valid(col)
        table = table.set_column(i, name, _from_words(words, typ, valid))
    return table


def _sum(arr: pa.Array, starts: np.ndarray, lengths: np.ndarray, out: Partials, name: str) -> pa.Array | None:
    typ = arr.type
    valid = _valid(arr)
    if pa.types.is_decimal128(typ):
        if typ.precision > 18:
            return None
        v = _words(arr)
        if valid is not None:
            v = np.where(valid, v, 0)
        # a sum stays in 64 bits while its rows times the largest |value| do: bounded by the
        # precision (|value| < 10**p), else by the values themselves
        n = len(v)
        bound = n * 10**typ.precision
        if bound >= 1 << 63 and n:
            bound = n * max(int(v.max()), -int(v.min()))
            if bound >= 1 << 63:
                return None
        out.decimals[name] = pa.decimal128(38, typ.scale)
        out.bounds[name] = bound
        sums = np.add.reduceat(v, starts)
        out_type: pa.DataType = pa.int64()
    elif pa.types.is_integer(typ) or pa.types.is_floating(typ):
        kind = (
            "float" if pa.types.is_floating(typ) else "uint" if pa.types.is_unsigned_integer(typ) else "int"
        )
        out_type = _SUM_OF[kind]
        v = _words(arr).astype(out_type.to_pandas_dtype(), copy=False)
        if valid is not None:
            v = np.where(valid, v, 0)
        if kind != "float" and len(v) and len(v) << typ.bit_width >= 1 << 63:
            # a run's sum could leave 64 bits (numpy's wraps around): hashed instead (``_exec``
            # sums it wide where its bound says so)
            if len(v) * max(int(v.max()), -int(v.min())) >= 1 << 63:
                return None
        sums = np.add.reduceat(v, starts)
    else:
        return None
    have = None if valid is None else np.add.reduceat(valid.astype(np.int64), starts) > 0
    return _from_words(sums, out_type, have)


def _extreme(arr: pa.Array, starts: np.ndarray, fn: str, out: Partials, name: str) -> pa.Array | None:
    typ = arr.type
    if pa.types.is_decimal128(typ):
        if typ.precision > 18:
            return None
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or _key_ok(typ)):
        return None
    v = _words(arr)
    valid = _valid(arr)
    if pa.types.is_floating(typ):
        # NaN where null: fmin/fmax skip NaN unless a run has nothing else (Arrow's rule)
        v = v.astype(np.float64)
        if valid is not None:
            v = np.where(valid, v, np.nan)
        got = (np.fmin if fn == "min" else np.fmax).reduceat(v, starts)
    else:
        if valid is not None:
            info = np.iinfo(v.dtype)
            v = np.where(valid, v, info.max if fn == "min" else info.min)
        got = (np.minimum if fn == "min" else np.maximum).reduceat(v, starts)
    have = None if valid is None else np.add.reduceat(valid.astype(np.int64), starts) > 0
    if pa.types.is_decimal128(typ):
        out.decimals[name] = typ
        return _from_words(got, pa.int64(), have)
    return _from_words(got, typ, have)


def run_partials(
    table: pa.Table, key: str, triples: Sequence[tuple[str, str, str]], min_rows_per_run: float = 0.0
) -> Partials | None:
    """Per run of equal ``key`` in ``table``, the partials of ``triples`` (``(input column,
    function, output name)``, as ``_exec._agg_inputs`` gives them: ``count_all``, ``count``,
    ``sum``, ``min``, ``max``), with the key (``Partials``). None when a type or an aggregate
    is not covered (module docstring), or the runs average under ``min_rows_per_run`` rows:
    hash the rows instead."""
    n = table.num_rows
    if n == 0:
        return None  # nothing to gain; the caller's path keeps its result's types
    k = table.column(key).combine_chunks()
    starts = run_starts(k)
    if starts is None or len(starts) * min_rows_per_run > n:
        return None
    lengths = np.diff(starts, append=n)
    out = Partials(pa.table({}), len(starts))
    cols: list[pa.Array] = [k.take(pa.array(starts))]
    names = [key]
    for col, fn, name in triples:
        if fn == "count_all":
            got: pa.Array | None = pa.array(lengths, pa.int64())
        else:
            arr = table.column(col).combine_chunks()
            if fn == "count":
                valid = _valid(arr)
                got = pa.array(
                    lengths if valid is None else np.add.reduceat(valid.astype(np.int64), starts), pa.int64()
                )
            elif fn == "sum":
                got = _sum(arr, starts, lengths, out, name)
            elif fn in ("min", "max"):
                got = _extreme(arr, starts, fn, out, name)
            else:
                got = None
        if got is None:
            return None
        cols.append(got)
        names.append(name)
    out.table = pa.table(cols, names=names)
    return out
