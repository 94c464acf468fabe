"""Staged SQL plans (``_sql._staged``): a query that does not split over partitions whole is cut
into the parts that do (CTE bodies, set-operation branches, derived tables, uncorrelated
subqueries in expressions), each run as its own distributed sub-plan, and the rest runs at the
coordinator over their results. Found on TPC-DS (``benchmarks/store_tpcds.py``), tested here on
small tables of our own: every answer equal to DuckDB's on the same data, and the plan staged
(before: ``gather``, every table's columns brought to the coordinator)."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore
from microco.services.store._sql import _uncorrelated, parsed

RNG = np.random.default_rng(7)
N = 3000
SALES = pa.table(
    {
        "s_id": np.arange(N, dtype=np.int64),
        "s_cust": RNG.integers(0, 50, N),
        "s_day": RNG.integers(0, 40, N),
        "s_amt": np.round(RNG.random(N) * 100, 2),
    }
)
RETURNS = pa.table(
    {
        "r_id": np.arange(N // 3, dtype=np.int64),
        "r_cust": RNG.integers(0, 50, N // 3),
        "r_day": RNG.integers(0, 40, N // 3),
        "r_amt": np.round(RNG.random(N // 3) * 50, 2),
    }
)
DAYS = pa.table({"d_day": np.arange(40, dtype=np.int64), "d_week": np.arange(40) // 7})
TABLES = {"sales": SALES, "returns": RETURNS, "days": DAYS}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("staged")), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    )
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    con = duckdb.connect()
    for name, t in TABLES.items():
        key, other = t.schema.names[:2]  # id and customer (days: day and week); never the day
        core.create_table(
            name,
            t.schema,
            [PartitionSpec(key, "hash", 4), PartitionSpec(key, "hash", 3), PartitionSpec(other, "hash", 2)],
        )
        core.append(name, t)
        con.register(name, t)
    return core, con


def ordered(t: pa.Table) -> list[tuple]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in r.values()) for r in t.to_pylist()]


def rows(t: pa.Table) -> list[tuple]:
    return sorted(ordered(t), key=repr)


def answered(store, sql: str):
    """The store's plan of ``sql``, once its answer is DuckDB's (rows in order, names)."""
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert ordered(got) == ordered(want) and got.schema.names == want.schema.names
    return plan


CASES = [
    # a CTE aggregated off its partition key, read twice by the rest (one correlated on the CTE)
    (
        "with per as (select s_cust as c, s_day as d, sum(s_amt) as total from sales group by s_cust, s_day) "
        "select c, d, total from per p1 where total > (select avg(total) * 1.5 from per p2 where p1.d = p2.d) "
        "order by c, d",
        ["partition_local"],  # grouped by the customer: whole in a partition
    ),
    # UNION ALL of two fact tables' aggregates, and a derived table over it
    (
        "select channel, sum(amt) as amt from ("
        " select 'sale' as channel, s_day as day, sum(s_amt) as amt from sales group by s_day"
        " union all select 'return' as channel, r_day as day, -sum(r_amt) as amt from returns group by r_day"
        ") x group by channel order by channel",
        ["partial_agg", "partial_agg"],
    ),
    # INTERSECT / EXCEPT branches, each grouped by its partition key; a scan is not a stage
    # (its rows would reach the coordinator whole either way): gathered
    (
        "select s_cust from sales group by s_cust having sum(s_amt) > 2500 "
        "intersect select r_cust from returns group by r_cust having count(*) > 5 "
        "except select s_cust from sales where s_amt < 1",
        ["partition_local", "partition_local"],
    ),
    # an uncorrelated scalar subquery and an uncorrelated IN: each its own sub-plan
    (
        "select d_week, count(*) as n from days, sales where d_day = s_day "
        "and s_amt > (select avg(r_amt) from returns) "
        "and s_cust in (select r_cust from returns group by r_cust having count(*) > 5) "
        "group by d_week order by d_week",
        None,  # the whole query splits, its subqueries with it, or it stages: either way not gathered
    ),
    # a derived table joined to a dimension, with a window over its result at the coordinator
    (
        "select d_week, c, total, rank() over (partition by d_week order by total desc, c) as r from ("
        " select s_day as day, s_cust as c, sum(s_amt) as total from sales group by s_day, s_cust) t, days "
        "where d_day = t.day order by d_week, r limit 30",
        ["partition_local"],
    ),
]


PRE_AGGREGATED = [
    # a window over the groups (a ratio to the class total): grouped rows pre-aggregated apart
    "select s_cust, d_week, sum(s_amt) as amt, "
    "sum(s_amt) * 100 / sum(sum(s_amt)) over (partition by d_week) as share "
    "from sales, days where s_day = d_day group by s_cust, d_week order by d_week, share desc, s_cust limit 40",
    # ROLLUP with grouping(), avg, count, min and max, HAVING, a rank within each level
    "select d_week, s_day, avg(s_amt) as a, count(*) as n, min(s_amt) as lo, max(s_amt) as hi, "
    "grouping(d_week) + grouping(s_day) as lvl, "
    "rank() over (partition by grouping(d_week) + grouping(s_day) order by count(*) desc, d_week, s_day) as rk "
    "from sales, days where s_day = d_day group by rollup(d_week, s_day) having count(*) > 10 "
    "order by lvl desc, d_week nulls first, s_day nulls first",
    # CUBE over two dimensions of the fact table, counts of a column with NULLs none
    "select s_day, d_week, count(s_amt) as n, sum(s_amt) as amt from sales join days on s_day = d_day "
    "where s_amt > 50 group by cube(s_day, d_week) order by s_day nulls first, d_week nulls first",
]


@pytest.mark.parametrize("sql", PRE_AGGREGATED)
def test_windows_and_rollups_run_over_a_pre_aggregation_that_splits(store, sql):
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert ordered(got) == ordered(want)
    assert got.schema.names == want.schema.names and got.schema.types == want.schema.types
    kinds = [s.kind for _, s in plan.stages]  # partition-local when grouped by s_cust (a partition key)
    assert plan.kind == "staged" and kinds in (["partial_agg"], ["partition_local"]), plan.explain_text()
    assert "__pre" in plan.final_sql  # the coordinator's part reads the pre-aggregated rows


@pytest.mark.parametrize("sql, stages", CASES)
def test_parts_that_split_run_distributed_and_the_answer_is_duckdbs(store, sql, stages):
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert rows(got) == rows(want)
    assert got.schema.names == want.schema.names
    assert plan.kind != "gather", plan.explain_text()
    if stages is not None:
        assert plan.kind == "staged" and [s.kind for _, s in plan.stages] == stages, plan.explain_text()
        assert "plan: staged" in plan.explain_text()
    if "order by" in sql:
        assert ordered(got) == ordered(want)


def test_a_correlated_subquery_is_not_a_stage(store):
    core, con = store
    sql = (
        "select s_id from sales s where s_amt > (select avg(r_amt) * 1.9 from returns r where r.r_day = s.s_day) "
        "and exists (select 1 from returns where r_cust = s_cust and r_amt > 49)"
    )
    tree = parsed(sql)
    tables = {n: core.table(n) for n in TABLES}
    subs = [q for q in tree.find_all(pa_select()) if q is not tree]
    assert subs and not any(_uncorrelated(q, tables) for q in subs)  # s.s_day, s_cust are outer
    got, _ = core.sql(sql)
    assert rows(got) == rows(con.sql(sql).to_arrow_table())
    assert _uncorrelated(parsed("select avg(r_amt) from returns r where r.r_day = 3"), tables)
    assert not _uncorrelated(parsed("select avg(r_amt) from returns where r_day = s_day"), tables)


def pa_select():
    from sqlglot import exp

    return exp.Select


BATCHED = [
    # TPC-DS Q9's shape: bucketed count/avg pairs over one table, chosen by a CASE
    (
        "select case when (select count(*) from sales where s_day between 0 and 9) > 700 "
        "then (select avg(s_amt) from sales where s_day between 0 and 9) "
        "else (select avg(s_amt) * 2 from sales where s_day between 0 and 9) end as b1, "
        "case when (select count(*) from sales where s_day between 10 and 19) > 800 "
        "then (select max(s_amt) from sales where s_day between 10 and 19) "
        "else (select min(s_amt) from sales where s_day between 10 and 19) end as b2, "
        "(select count(*) from sales where s_day between 0 and 9) as same_again "
        "from days where d_day = 3",
        {"sales": 1},
    ),
    # over no rows (sum NULL, count 0), a subquery without WHERE, two tables, a comparison
    (
        "select d_day, (select sum(s_amt) from sales where s_amt > 1000) as none_sum, "
        "(select count(s_amt) from sales where s_amt > 1000) as none_count, "
        "(select max(s_amt) - min(s_amt) from sales) as spread, "
        "(select avg(r_amt) from returns where r_day < 5) as early, "
        "(select count(*) from returns where r_cust = 3 or r_day = 7) as some "
        "from days where d_day < (select count(*) from returns where r_amt > 49) "
        "and d_week > (select min(r_day) from returns) order by d_day",
        {"sales": 1, "returns": 1},
    ),
]


@pytest.mark.parametrize("sql, per_table", BATCHED)
def test_uncorrelated_scalar_aggregates_over_one_table_share_one_stage(store, sql, per_table):
    """Each uncorrelated scalar subquery was its own distributed sub-plan (TPC-DS Q9: fifteen
    scans of store_sales, 5.3x the gathered plan's time); those over one table now run as one."""
    core, con = store
    got, plan = core.sql(sql)
    want = con.sql(sql).to_arrow_table()
    assert ordered(got) == ordered(want)
    assert got.schema == want.schema
    assert plan.kind == "staged", plan.explain_text()
    tables = [next(iter(s.replicas)) for _, s in plan.stages]
    assert {t: tables.count(t) for t in tables} == per_table, plan.explain_text()


def test_scalar_subqueries_that_do_not_batch_stay_apart(store):
    plan = answered(
        store,
        "select (select count(distinct s_cust) from sales where s_day < 9) as a, "
        "(select sum(s_amt) from sales group by s_day order by 1 desc limit 1) as b, "
        "(select sum(s_amt) from sales where s_day < 9) as c",
    )
    assert all(s.kind != "gather" for _, s in plan.stages)
    assert len(plan.stages) >= 2  # the DISTINCT one and the grouped one are not batched with c


def test_staging_that_leaves_the_gather_as_big_is_not_chosen(store):
    """TPC-DS Q70: an uncorrelated IN list grouped over the fact table was staged (its own
    round of fragments) while the outer query, which does not split, gathered the same columns
    of the same table anyway: 2.1x the gathered plan's time. A staged plan is chosen only when
    the rest gathers fewer bytes than the whole query would."""
    plan = answered(
        store,
        "select s_day, count(distinct s_cust) as n from sales "
        "where s_day in (select s_day from sales group by s_day having max(s_cust) > 45) "
        "group by s_day order by s_day",
    )
    assert plan.kind == "gather" and "staging not chosen" in plan.explain_text(), plan.explain_text()
    # the rest gathers less (the subquery's table is not read by the rest): staged
    plan = answered(
        store,
        "select d_week, count(distinct d_day) as n from days "
        "where d_day in (select s_day from sales group by s_day having max(s_cust) > 45) "
        "group by d_week order by d_week",
    )
    assert plan.kind == "staged", plan.explain_text()


def test_the_rest_of_a_staged_plan_gathers_only_the_columns_it_uses(store):
    """A staged part is replaced by ``SELECT * FROM __microco_stageK``, and that star counted as
    "every column" of every table the rest gathers: the rest read all of them (found comparing
    a staged plan's gathered bytes with the plain gather's)."""
    core, con = store
    sql = CASES[3][0]  # the rest gathers days and sales beside two staged subqueries over returns
    got, plan = core.sql(sql)
    assert rows(got) == rows(con.sql(sql).to_arrow_table())  # unordered: rows() sorts
    assert plan.kind == "staged", plan.explain_text()
    reads = {n: side["read"] for _, task in plan.tasks for n, side in task["inputs"].items()}
    assert sorted(reads["sales"]) == ["s_amt", "s_cust", "s_day"], reads


@pytest.mark.parametrize(
    "sql",
    [
        "select (select avg(r_amt) from returns) from days where d_day = 1",
        "select d_day, (select count(*) from sales where s_day < 5), (select sum(s_amt) from sales where s_day < 9) "
        "from days where d_day < 3 order by d_day",
    ],
)
def test_a_staged_subquerys_unnamed_output_keeps_duckdbs_name(store, sql):
    """An unnamed scalar subquery in the SELECT list is named by DuckDB after its text; staged,
    it was named after its replacement (``(SELECT * FROM __microco_stage0)``)."""
    assert answered(store, sql).kind == "staged"  # answered: names and rows are DuckDB's
