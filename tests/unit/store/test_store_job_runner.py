"""``benchmarks/store_job.py``, the Join Order Benchmark's runner, on a suite of two tables and
three queries written here in JOB's style (the real suite is not in the repository)."""

from __future__ import annotations

from microco.benchmarks import store_job

SCHEMA = """
CREATE TABLE title (id integer NOT NULL PRIMARY KEY, title text NOT NULL, production_year integer);
CREATE TABLE movie_info (id integer NOT NULL PRIMARY KEY, movie_id integer NOT NULL, info text NOT NULL, note text);
"""
QUERIES = {
    "1a.sql": "SELECT MIN(t.title) AS movie_title FROM title AS t, movie_info AS mi "
    "WHERE mi.info IN ('Drama', 'Horror') AND mi.note LIKE '%(USA)%' AND t.id = mi.movie_id;",
    "1b.sql": "SELECT MIN(mi.info) AS info, MIN(t.production_year) AS y FROM title AS t, movie_info AS mi "
    "WHERE t.production_year BETWEEN 2005 AND 2010 AND t.id = mi.movie_id;",
    "2a.sql": "SELECT MIN(at.title) AS t FROM title AS at WHERE at.title = 'Drama';",
}


def test_the_runner_makes_the_schemas_tables_and_checks_every_query(tmp_path):
    (tmp_path / "schema.sql").write_text(SCHEMA)
    for name, text in QUERIES.items():
        (tmp_path / name).write_text(text)
    src = store_job.Source(folder=str(tmp_path))
    data = store_job.tables(src, seed=3)
    assert set(data) == {"title", "movie_info"}
    mi = data["movie_info"]
    assert mi.schema.field("note").nullable and not mi.schema.field("info").nullable
    assert set(mi.column("movie_id").to_pylist()) <= set(data["title"].column("id").to_pylist())
    assert {"Drama", "Horror"} <= set(mi.column("info").to_pylist())  # the queries' literals
    assert any("(USA)" in (x or "") for x in mi.column("note").to_pylist())
    res = store_job.run(src, seed=3, work=str(tmp_path))
    assert res["queries"] == 3 and res["equal"] == 3, res["findings"]
    assert res["non_empty"] >= 2
    assert res["quoted"] == ["2a"]  # DuckDB 2 refuses the alias ``at`` as written
