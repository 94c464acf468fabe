"""Bound parameters (``services/store/_sqlparams.py``): placeholders replaced by literals in the
parsed tree, in the order of the text."""

from __future__ import annotations

import datetime as dt
import decimal

import duckdb
import pytest

from microco.common.errors import InvalidArgument
from microco.services.store._sqlparams import bind, placeholders


def test_question_marks_take_the_values_in_the_texts_order():
    # the CTE's placeholder comes first in the text, not in the tree's walk; a ? in a string or
    # a comment is not one
    sql = "with c as (select '?' as q, a from t where a > ?) select q, ? as y from c where a < ? limit ? -- ?"
    assert placeholders(sql) == 4
    out = bind(sql, [1, "x", 9, 5])
    assert "a > 1" in out and "'x' AS y" in out and "a < 9" in out and "LIMIT 5" in out and "'?'" in out


def test_values_are_literals_of_their_type():
    con = duckdb.connect()
    values = [
        None,
        True,
        3,
        2.5,
        decimal.Decimal("1.50"),
        "it's; drop table t",
        dt.date(2020, 1, 2),
        dt.datetime(2020, 1, 2, 3, 4, 5),
        dt.time(1, 2, 3),
    ]
    sql = "select " + ", ".join("?" for _ in values)
    got = con.execute(bind(sql, values)).fetchone()
    assert list(got) == values


@pytest.mark.parametrize(
    ("sql", "value"),
    [
        ("select count(*) from t where f = ?", 0.1),
        ("select typeof(? * 3), ? * 3 from t", 0.1),
        ("select count(*) from t where f < ?", float("inf")),
        ("select ? from t", float("-inf")),
    ],
)
def test_a_float_is_bound_as_duckdb_binds_it(sql, value):
    """A Python float is DuckDB's DOUBLE when DuckDB binds it: the bound text answers as DuckDB's
    own prepared statement does. Before (held out, session 41) 0.1 was written ``0.1``, a
    DECIMAL literal, which a FLOAT column's 0.1 equals (one row for DuckDB's none), and infinity
    was written ``inf``, a column name."""
    con = duckdb.connect()
    con.execute("create table t as select 0.1::FLOAT as f")
    values = [value] * sql.count("?")
    assert con.execute(bind(sql, values)).fetchall() == con.execute(sql, values).fetchall()


def test_numbered_placeholders_may_repeat():
    assert placeholders("select $2, $1, $2") == 2
    got = duckdb.connect().execute(bind("select $2 as a, $1 as b, $2 as c", ["x", 7])).fetchone()
    assert got == (7, "x", 7)


@pytest.mark.parametrize(
    ("sql", "values", "error"),
    [
        ("select ?", [], "takes 1 parameter"),
        ("select ?, $1", [1], "mixed"),
        ("select ?", [[1, 2]], "not supported"),  # (bytes are bound since session 42)
        ("select 1; select ?", [1], "one SQL statement"),
    ],
)
def test_bad_bindings_are_clear_errors(sql, values, error):
    with pytest.raises(InvalidArgument, match=error):
        bind(sql, values)


@pytest.mark.parametrize(
    "value",
    [
        b"ab",
        bytes([0, 255, 92, 39, 10]),
        b"",
        dt.timedelta(days=1, seconds=5, microseconds=7),
        dt.timedelta(days=-3, seconds=86399),
        dt.timedelta(0),
    ],
)
def test_bytes_and_durations_are_bound_as_duckdb_binds_them(value):
    """A DataFrame's binary and duration columns: DuckDB binds a Python bytes as a BLOB and a
    timedelta as an INTERVAL; both were refused ("a bound parameter of type bytes is not
    supported"; held out, session 42)."""
    con = duckdb.connect()
    assert (
        con.execute(bind("SELECT ? AS v, typeof(?) AS t", [value, value])).fetchall()
        == con.execute("SELECT ? AS v, typeof(?) AS t", [value, value]).fetchall()
    )
