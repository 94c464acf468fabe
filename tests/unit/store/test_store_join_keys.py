"""A join followed by an aggregation groups on the build side's string keys by their dictionary
codes: the hash join carries an integer per joined row, not a string, and the codes are mapped
back to the strings once per group. The answers are the plain join's and aggregation's (nulls,
a key that is also aggregated, several keys from both sides), checked against DuckDB."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from pyarrow import acero

from microco.services.store import _exec

PRIOS = ["1-URGENT", "2-HIGH", "3-MEDIUM", None, "5-LOW"]


def _tables(rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    n_o, n_l = 400, 3000
    orders = pa.table(
        {
            "o_key": np.arange(n_o, dtype=np.int64),
            "o_prio": pa.array([PRIOS[i] for i in rng.integers(0, 5, n_o)], pa.string()),
            "o_clerk": pa.array([f"c{i}".encode() for i in rng.integers(0, 7, n_o)], pa.binary()),
            "o_cust": rng.integers(0, 20, n_o),
        }
    )
    items = pa.table(
        {
            "l_key": rng.integers(0, n_o + 50, n_l),  # some match no order
            "l_qty": rng.integers(1, 50, n_l),
            "l_mode": pa.array([["AIR", "RAIL", None][i] for i in rng.integers(0, 3, n_l)], pa.string()),
        }
    )
    return orders, items


def _chunks(t: pa.Table, n: int) -> _exec.Stream:
    step = -(-t.num_rows // n)
    return t.schema, iter([t.slice(i, step) for i in range(0, t.num_rows, step)])


def _want(orders: pa.Table, items: pa.Table, keys: list[str], aggs: list[list[str]]) -> list[tuple]:
    con = duckdb.connect()
    con.register("o", orders)
    con.register("li", items)
    sel = ", ".join([*keys, *(f"{fn}({col})" if col != "*" else "count(*)" for fn, col, _ in aggs)])
    rows = con.sql(f"select {sel} from o join li on o_key = l_key group by {', '.join(keys)}").fetchall()
    return sorted(rows, key=repr)


CASES = [
    # a build-side string key with nulls
    (["o_prio"], [["sum", "l_qty", "q"]]),
    # two build-side keys (string, binary) and one from the probe side
    (["o_prio", "o_clerk", "l_mode"], [["sum", "l_qty", "q"], ["count", "*", "n"]]),
    # a key that is also an aggregate's input stays a string
    (["o_prio"], [["max", "o_prio", "m"], ["min", "l_qty", "lo"]]),
    # an integer key beside a string one
    (["o_cust", "o_prio"], [["sum", "l_qty", "q"]]),
]


@pytest.mark.parametrize(("keys", "aggs"), CASES)
@pytest.mark.parametrize("build", ["L", "R"])
def test_a_joins_aggregation_by_build_side_strings_answers_as_the_plain_join(keys, aggs, build):
    orders, items = _tables(np.random.default_rng(5))
    post = {"agg": {"keys": keys, "aggs": aggs}}
    j = {"left_on": "o_key", "right_on": "l_key"}
    part = _exec.join_post(_chunks(orders, 3), _chunks(items, 4), j, post, build)
    got = _exec.finalize_agg(
        _exec.combine_partials(part, keys, _exec._aggs(post["agg"])), keys, _exec._aggs(post["agg"])
    )
    assert got.schema.field("o_prio").type == pa.string()
    rows = sorted((tuple(r.values()) for r in got.to_pylist()), key=repr)
    assert rows == _want(orders, items, keys, aggs)


def test_the_hash_join_carries_codes_for_the_build_sides_string_keys(monkeypatch):
    orders, items = _tables(np.random.default_rng(6))
    seen: list[pa.Table] = []
    real = acero.TableSourceNodeOptions

    def spy(table: pa.Table) -> acero.TableSourceNodeOptions:
        seen.append(table)
        return real(table)

    monkeypatch.setattr(_exec.acero, "TableSourceNodeOptions", spy)
    post = {"agg": {"keys": ["o_prio", "o_cust"], "aggs": [["sum", "l_qty", "q"], ["max", "o_clerk", "c"]]}}
    got = _exec.join_post(
        _chunks(orders, 2), _chunks(items, 2), {"left_on": "o_key", "right_on": "l_key"}, post, "L"
    )
    (built,) = seen
    # the grouped string travels as integer codes; the aggregated one and the integer as they are
    assert pa.types.is_integer(built.schema.field("o_prio").type)
    assert built.schema.field("o_clerk").type == pa.binary()
    assert built.schema.field("o_cust").type == pa.int64()
    assert got.schema.field("o_prio").type == pa.string() and None in got["o_prio"].to_pylist()
