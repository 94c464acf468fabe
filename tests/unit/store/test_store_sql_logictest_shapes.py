"""Query shapes from SQLite's sqllogictest (held out, session 35: its query files were run through
the store beside DuckDB on the same tables, see docs/store.md, "SQLite's sqllogictest queries").
Two defects were found, each kept here in queries of the same shapes (written here, not copied):

- a parenthesized join in FROM, ``SELECT * FROM ( t0 a CROSS JOIN t1 b )``: the star was taken
  for a derived table's, so the scans read one column of each table and the store answered with
  two columns instead of six, **a wrong answer given silently**;
- a unary plus, ``SELECT DISTINCT + c1, - c1 FROM t0``: sqlglot drops the plus, DuckDB names the
  output ``(+(c1))``; the fragments answered ``c1`` where the coordinator asked for ``(+(c1))``
  and the query was refused (and without DISTINCT the output was named otherwise than DuckDB's).

Every answer must equal DuckDB's: the same column names, the same multiset of rows."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from microco.clients.store import parse_partitioning
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._service import spec_from_pb

T0 = pa.table({"c0": [97, 15, 87, None], "c1": [1, 81, 21, 4], "c2": [99, 47, 10, 10]})
T1 = pa.table({"c0": [51, 85, 91], "c1": [14, 5, 47], "c2": [96, 59, None]})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("slt")), [NodeInfo(f"n{i}", f"r{i % 3}") for i in range(4)]
    )
    core = StoreCore(MemoryKV(), tr, recovery_rate_bytes=0)
    con = duckdb.connect()
    for name, data in (("t0", T0), ("t1", T1)):
        # each replica on another column, as the sqllogictest run laid them out
        replicas = ("c0:hash:3", "c1:hash:2", "c2:hash:4")
        core.create_table(name, data.schema, [spec_from_pb(parse_partitioning(r)) for r in replicas])
        core.append(name, data)
        con.register(name, data)
    return core, con


def _same(store, sql: str) -> None:
    core, con = store
    want = con.sql(sql).to_arrow_table()
    got, _plan = core.sql(sql)
    assert got.schema.names == want.schema.names, sql

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(map(tuple, zip(*(c.to_pylist() for c in t.columns), strict=True)), key=repr)

    assert rows(got) == rows(want), sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM ( t0 a CROSS JOIN t1 b )",
        "SELECT DISTINCT * FROM ( t0 a CROSS JOIN t0 b )",
        "SELECT * FROM ( t0 a CROSS JOIN t1 b ) WHERE a.c1 < b.c0",
        "SELECT b.* FROM ( t0 a CROSS JOIN t1 b )",
        "SELECT * FROM ( ( t0 a JOIN t1 b ON a.c0 < b.c0 ) CROSS JOIN t0 c )",
        "SELECT * FROM ( t0 a CROSS JOIN t1 b ) AS j",
    ],
)
def test_a_star_over_a_parenthesized_join_is_every_column_of_its_tables(store, sql):
    _same(store, sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT + c1, - c1 FROM t0",
        "SELECT + c1, - c1 FROM t0",
        "SELECT DISTINCT c2, + c1 * + + ( 23 ) * + c0 FROM t1",
        "SELECT DISTINCT + 9 FROM t0",
        "SELECT + c1 AS x, c0 FROM t0 ORDER BY x",
        "SELECT + c0, count(*) FROM t0 GROUP BY c0",
        "SELECT * FROM t0 WHERE + c1 > 5",
        "SELECT DISTINCT + b.c0 FROM t0 AS a CROSS JOIN t1 AS b GROUP BY a.c2, b.c0",
    ],
)
def test_a_unary_plus_keeps_duckdbs_name_and_the_query_is_answered(store, sql):
    _same(store, sql)
