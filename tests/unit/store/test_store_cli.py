"""The store CLI's parsing (no sockets)."""

from __future__ import annotations

import pytest

from microco.cli import build_parser
from microco.cli.store import build_query, parse_where
from microco.clients.store import Frame, parse_partitioning
from microco.common.errors import InvalidArgument
from microco.services.store import Query


def test_query_flags_become_a_valid_query():
    args = build_parser().parse_args(
        [
            "store",
            "query",
            "orders",
            "--where",
            "o_cust in 1,2",
            "--where",
            "o_date >= 1995-01-01",
            "--join",
            "items",
            "--on",
            "o_id=l_oid",
            "--group-by",
            "o_cust",
            "--agg",
            "sum:l_qty:q",
            "--agg",
            "count:*",
            "--order-by",
            "q:desc",
            "--limit",
            "3",
            "--replica",
            "1",
        ]
    )
    q = Query.from_json(build_query(args))
    assert q.where == (("o_cust", "in", (1, 2)), ("o_date", ">=", "1995-01-01"))
    assert q.join.left_on == "o_id" and q.group_by == ("o_cust",) and q.limit == 3 and q.replica == 1
    assert [a.name for a in q.aggs] == ["q", "count_all"] and q.order_by == (("q", True),)


def test_bad_flags_are_clear_errors():
    with pytest.raises(InvalidArgument):
        parse_where("o_cust 7")
    for bad in ('"My Col < 3', '"" = 3', '"My Col" <'):
        with pytest.raises(InvalidArgument, match="bad --where"):
            parse_where(bad)


def test_a_where_names_a_column_sql_would_quote():
    """Held out (session 39): a column named with a space (a pandas frame's ``My Col``) could not
    be filtered on from the CLI: the flag split its name ("filter operator 'Col' ...")."""
    assert parse_where('"My Col" < 3') == ["My Col", "<", 3]
    assert parse_where('"select" in (1, 2)') == ["select", "in", [1, 2]]
    assert parse_where('"Ünï" = v 1') == ["Ünï", "=", "v 1"]
    with pytest.raises(InvalidArgument):
        parse_partitioning("x:zigzag")
    assert parse_partitioning("d:range:1,2").range_bounds == ["1", "2"]


def test_frame_builds_the_query_json():
    f = Frame(None, {"table": "orders"}).filter("o_cust", "=", 3).group_by("o_cust").agg(n=("count", "*"))
    q = Query.from_json(f.to_json())
    assert q.where == (("o_cust", "=", 3),) and q.aggs[0].fn == "count"
    with pytest.raises(InvalidArgument):
        f.collect()


def test_sql_subcommand_parses():
    from microco.cli.store import cmd_sql

    args = build_parser().parse_args(
        ["store", "sql", "select 1 as x from orders", "--format", "json", "--explain"]
    )
    assert (
        args.func is cmd_sql
        and args.query == "select 1 as x from orders"
        and args.format == "json"
        and args.explain
    )
    assert build_parser().parse_args(["store", "sql", "-", "--explain-only"]).explain_only


def test_a_results_null_is_shown_apart_from_a_dash(capsys):
    """Held out (session 39): ``microco store query``/``sql`` printed a NULL as ``-``, so a
    string ``-`` read as a NULL (and a NaN as ``-`` too). Now ``NULL`` and ``NaN``, as DuckDB's
    shell shows them, in lists and structs too; an empty string stays empty."""
    import argparse

    import pyarrow as pa

    from microco.cli.store import _print_result

    table = pa.table(
        {
            "s": ["-", None, "", "x"],
            "f": [1.5, float("nan"), None, 2.0],
            "l": [[1, None], None, [], [3]],
            "st": [{"a": None}, {"a": 1}, None, {"a": 2}],
        }
    )
    _print_result(argparse.Namespace(format="table", explain=False), table, 0.1, {"kind": "scan"})
    lines = capsys.readouterr().out.splitlines()
    cells = [ln.split() for ln in lines[1:]]
    assert cells[0] == ["-", "1.5", "[1,", "NULL]", "{a:", "NULL}"]
    assert cells[1] == ["NULL", "NaN", "NULL", "{a:", "1}"]
    assert cells[2] == ["NULL", "[]", "NULL"]  # the empty string: no cell text
    assert lines[3].startswith("    ")  # (the empty string's column is blank)
