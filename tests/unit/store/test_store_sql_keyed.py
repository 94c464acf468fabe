"""A query over one table whose every step that combines rows is keyed by a replica's partition
column (its GROUP BYs, its windows' PARTITION BY, its DISTINCT), under derived tables, as the
top-n-per-group shape of public suites writes it (the h2o db-benchmark's "largest two v3 by
id6": ``row_number() OVER (PARTITION BY id6 ORDER BY v3 DESC)`` in a subquery, filtered
outside): it was gathered whole to the coordinator; it runs per partition now
(``partition_local``), and a query that combines rows across the key still does not. Every
answer equals DuckDB's on the same data."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import parse_partitioning
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._service import spec_from_pb

RNG = np.random.default_rng(29)
N = 4000
X = pa.table(
    {
        "id1": [f"id{k:03d}" for k in RNG.integers(1, 30, N)],
        "id6": RNG.integers(1, 300, N),
        "v1": RNG.integers(1, 6, N),
        "v3": np.round(RNG.uniform(0, 100, N), 6),
    }
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("keyed")), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    )
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    specs = ("id1:hash:4", "id6:hash:4", "v1:range:3")
    core.create_table("x", X.schema, [spec_from_pb(parse_partitioning(r)) for r in specs])
    core.append("x", X)
    con = duckdb.connect()
    con.register("x", X)
    return core, con


def _rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


TOP2 = (
    "select id6, v3 as largest2_v3 from (select id6, v3, row_number() over (partition by id6 "
    "order by v3 desc) as order_v3 from x where v3 is not null) sub_query where order_v3 <= 2"
)


@pytest.mark.parametrize(
    ("sql", "replica"),
    [
        (TOP2, 1),
        # a star over the derived table, an outer ORDER BY and LIMIT (a top-k per fragment)
        (
            "select * from (select id1, v3, rank() over (partition by id1 order by v3) r from x) q "
            "where r = 1 order by id1 limit 5",
            0,
        ),
        ("select distinct id6, v1 from x where v3 > 50", 1),
        ("select id1, count(distinct id6) as n from x group by id1", 0),
        ("select id6, s from (select id6, sum(v1) as s from x group by id6) g where s > 40", 1),
        ("select v1, id6, count(*) from x group by v1, id6 having count(*) > 2", None),
        ("select id6, sum(v1) over (partition by id6, id1) as w from x", None),  # (either key)
        (
            "select k, n from (select id6 as k, count(*) as n from x group by id6) t order by n desc, k limit 3",
            1,
        ),
    ],
)
def test_a_query_keyed_by_a_partition_column_runs_per_partition(store, sql, replica):
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert got.schema.names == want.schema.names
    assert _rows(got) == _rows(want)
    if "order by" in sql.split(")")[-1]:
        assert got.to_pylist() == want.to_pylist()
    assert plan.kind == "partition_local", plan.explain_text()
    if replica is not None:
        assert plan.replicas == {"x": replica}, plan.explain_text()


@pytest.mark.parametrize(
    "sql",
    [
        # each combines rows of different keys: one partition's rows would answer wrongly
        "select id6, v3 from (select id6, v3, row_number() over (order by v3 desc) as r from x) s where r <= 3",
        "select id6, v3 from (select id6, v3, row_number() over (partition by v1 % 2 order by v3) as r from x) s where r = 1",
        "select count(*) from (select distinct v3 from x)",
        "select id6, c from (select id6, count(*) over () as c from x) s",
        "select id6, v3 from (select id6, v3 from x order by v3 limit 10) s",
        "select id6, (select max(v3) from x) as m from x where v1 = 2",
        "select id1, n from (select id1, count(*) as n from x group by id1) a where n > (select avg(v1) from x)",
    ],
)
def test_a_query_combining_rows_across_the_key_is_not_run_per_partition(store, sql):
    core, con = store
    got, plan = core.sql(sql)
    assert _rows(got) == _rows(con.sql(sql).to_arrow_table())
    assert plan.kind != "partition_local", plan.explain_text()


@pytest.mark.parametrize(
    ("sql", "split"),
    [
        # aggregates sqlglot knows only as anonymous functions: each fragment answered its own
        ("select histogram(v1) as h from x", False),
        ("select mean(v1) as m, product(v1 % 2 + 1) as p, fsum(v1) as s from x where id6 < 60", False),
        ("select id6, mean(v1) as m, entropy(v1) as e from x group by id6", True),
        ("select id1, kurtosis_pop(v1) as k from x group by id1", True),
    ],
)
def test_an_aggregate_the_engine_knows_is_one_whatever_its_name(store, sql, split):
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert got.num_rows == want.num_rows
    a, b = _rows(got), _rows(want)
    assert all(
        x == pytest.approx(y, rel=1e-9) if isinstance(x, float) else x == y
        for ra, rb in zip(a, b)
        for x, y in zip(ra, rb)
    )
    assert (plan.kind == "partition_local") is split, plan.explain_text()


def test_a_sample_is_of_the_whole_table(store):
    """``USING SAMPLE n ROWS`` ran in each fragment (n rows each, concatenated)."""
    core, _ = store
    got, plan = core.sql("select * from x using sample 10 rows")
    assert got.num_rows == 10, plan.explain_text()
    # (DuckDB samples the FROM's rows, then the WHERE filters them: at most 7)
    got, plan = core.sql("select id6, v3 from x using sample 7 rows where v1 > 1")
    assert got.num_rows <= 7, plan.explain_text()
