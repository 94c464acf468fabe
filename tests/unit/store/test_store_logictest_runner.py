"""The sqllogictest runner (``benchmarks/store_logictest.py``) on a script written here in the
suite's format: guards and ``halt`` are honoured, DuckDB's refusals and views are counted apart,
every other query is answered by the store as DuckDB answers it, and a store that drops a row is
caught."""

from __future__ import annotations

import pyarrow as pa

from microco.benchmarks.store_logictest import records, run_text
from microco.services.store import StoreCore

SCRIPT = """\
hash-threshold 8

statement ok
CREATE TABLE tab0(col0 INTEGER, col1 INTEGER, col2 TEXT)

statement ok
INSERT INTO tab0 VALUES(3,7,'a'),(11,2,'b'),(5,NULL,'a'),(8,9,NULL)

statement ok
CREATE VIEW v0 AS SELECT col0 FROM tab0

onlyif mssql
halt

query I rowsort
SELECT DISTINCT + col1 * 2 FROM tab0
----
4
14
18
NULL

skipif duckdb
query I nosort
SELECT 'not for us'
----

onlyif sqlite
query I nosort
SELECT 'sqlite only'
----

query I nosort
SELECT 20 DIV 3
----
6

query IT rowsort label-1
SELECT col0, group_concat(col2) FROM tab0 GROUP BY col0
----

query I rowsort
SELECT * FROM v0
----

statement ok
DELETE FROM tab0 WHERE col0 = 11

query II rowsort
SELECT * FROM ( tab0 a CROSS JOIN tab0 b ) WHERE a.col1 > b.col0
----

onlyif duckdb
halt

query I nosort
SELECT 'after the halt'
----
"""


def test_records_honour_guards_and_halt():
    got = [sql for _head, sql in records(SCRIPT)]
    assert "SELECT 'not for us'" not in got and "SELECT 'sqlite only'" not in got
    assert "SELECT 'after the halt'" not in got  # (halted, guarded for this engine)
    assert got[-1].startswith("SELECT * FROM ( tab0 a CROSS JOIN")
    assert sum(1 for h, _ in records(SCRIPT) if h.startswith("statement")) == 4


def test_every_query_duckdb_answers_is_answered_alike(tmp_path):
    r = run_text(SCRIPT, "script", work=str(tmp_path))
    assert r["findings"] == []
    # DISTINCT + col1 * 2, group_concat, the view's query, the cross join after the DELETE
    assert (r["queries"], r["equal"], r["over_a_view"]) == (4, 3, 1)
    assert r["duckdb_refused"] == 1  # SELECT 20 DIV 3: MySQL's, not DuckDB's
    assert r["wrong"] == r["store_refused"] == 0


def test_a_store_that_drops_a_row_is_caught(tmp_path, monkeypatch):
    real = StoreCore.sql

    def lossy(self, text, *a, **k):
        got, plan = real(self, text, *a, **k)
        return (got.slice(1) if got.num_rows else pa.table({"x": [1]})), plan

    monkeypatch.setattr(StoreCore, "sql", lossy)
    r = run_text(SCRIPT, "script", work=str(tmp_path))
    assert r["wrong"] == 3 and {f["kind"] for f in r["findings"]} == {"wrong"}
