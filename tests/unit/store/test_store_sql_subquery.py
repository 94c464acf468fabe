"""Subqueries keyed to a partition column run per partition (``_sql._subqueries``), on tables of
this test's own (accounts, payments, refunds; random, with NULL keys), each answer checked
against DuckDB on the same Arrow data: correlated scalar aggregates, ``IN (SELECT k ... GROUP BY
k HAVING ...)``, ``[NOT] EXISTS`` with further non-equality conditions, several at once; and the
shapes that must not split (an uncorrelated NOT IN, a correlation off the partition columns, a
string key against an integer key) stay gathers with the same answers."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from test_store_sql import check as check_equal

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore


def _tables() -> dict[str, pa.Table]:
    rng = np.random.default_rng(20261202)
    n_acct, n_pay, n_ref = 400, 6000, 700
    start = dt.date(2024, 1, 1)
    accounts = pa.table(
        {
            "acct_id": pa.array(np.arange(1, n_acct + 1), pa.int64()),
            "region": pa.array(rng.choice(["north", "south", "east", "west", "far"], n_acct)),
            "tier": pa.array(rng.integers(0, 6, n_acct), pa.int32()),
            "opened": pa.array([start + dt.timedelta(days=int(d)) for d in rng.integers(0, 700, n_acct)]),
        }
    )
    acct = rng.integers(1, n_acct + 60, n_pay).astype(object)  # some payments of no account
    acct[rng.random(n_pay) < 0.03] = None
    prio = rng.integers(0, 6, n_pay).astype(object)
    prio[rng.random(n_pay) < 0.05] = None
    payments = pa.table(
        {
            "pay_id": pa.array(np.arange(10_000, 10_000 + n_pay), pa.int64()),
            "acct_id": pa.array(list(acct), pa.int64()),
            "amount": pa.array(np.round(rng.gamma(2.0, 40.0, n_pay), 2)),
            "channel": pa.array(rng.choice(["web", "app", "branch", "phone"], n_pay)),
            "paid": pa.array([start + dt.timedelta(days=int(d)) for d in rng.integers(0, 700, n_pay)]),
            "priority": pa.array(list(prio), pa.int32()),
        }
    )
    racct = rng.integers(1, n_acct + 1, n_ref).astype(object)
    racct[rng.random(n_ref) < 0.05] = None
    refunds = pa.table(
        {
            "refund_id": pa.array(np.arange(n_ref), pa.int64()),
            "acct_id": pa.array(list(racct), pa.int32()),  # another integer width: same hash
            "reason": pa.array(rng.choice(["fraud", "duplicate", "goodwill"], n_ref)),
            "acct_code": pa.array([None if a is None else str(a) for a in racct], pa.string()),
        }
    )
    return {"accounts": accounts, "payments": payments, "refunds": refunds}


# (column, hash partitions) of each table's three replicas: acct_id keyed alike everywhere
SPECS = {
    "accounts": [("acct_id", 3), ("region", 2), ("tier", 2)],
    "payments": [("pay_id", 3), ("acct_id", 3), ("channel", 2)],
    "refunds": [("acct_code", 3), ("acct_id", 3), ("reason", 2)],
}


@pytest.fixture(scope="module")
def data():
    return _tables()


@pytest.fixture(scope="module")
def core(data, tmp_path_factory):
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("subq")), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    )
    c = StoreCore(MemoryKV(), tr, super_extent_rows=1500, recovery_rate_bytes=0)  # several super-extents
    for name, t in data.items():
        c.create_table(name, t.schema, [PartitionSpec(col, "hash", n) for col, n in SPECS[name]])
        c.append(name, t)
    return c


@pytest.fixture(scope="module")
def duck(data):
    return (
        duckdb.connect()
        .register("accounts", data["accounts"])
        .register("payments", data["payments"])
        .register("refunds", data["refunds"])
    )


def check(core, duck, sql):
    """The store's answer equals DuckDB's, names and Arrow types included (the TPC-H tests'
    comparison), and is not empty; returns the plan."""
    plan = check_equal(core, duck, sql)
    assert duck.sql(sql).fetchall(), "a query of this test that selects nothing checks little"
    return plan


@pytest.mark.parametrize(
    "sql, kind, says",
    [
        # (a) a correlated scalar aggregate, the table correlated with itself (Q17's shape, alone)
        (
            "select count(*) as n, sum(p.amount) as s from payments p where p.amount > "
            "(select 1.5 * avg(p2.amount) from payments p2 where p2.acct_id = p.acct_id)",
            "partial_agg",
            "correlated scalar on payments.acct_id (as p2) = payments.acct_id (as p)",
        ),
        # ... correlated with the outer join's other table (Q17's shape), grouped off the key
        (
            "select a.region, count(*) as n, round(sum(p.amount), 2) as s from accounts a, payments p "
            "where a.acct_id = p.acct_id and a.tier >= 2 and p.amount < "
            "(select avg(amount) from payments where acct_id = a.acct_id and channel <> 'phone') "
            "group by a.region order by a.region",
            "partial_agg",
            "correlated scalar on payments.acct_id = accounts.acct_id",
        ),
        # ... a count, whose empty answer is 0, filtered on the key: must not prune the outer rows
        (
            "select acct_id, tier from accounts a where (select count(*) from payments p "
            "where p.acct_id = a.acct_id and p.acct_id = 8 and p.channel = 'web') = 0 "
            "order by acct_id",
            "partition_local",
            "correlated scalar",
        ),
        # ... on the partition column of another replica (channel): that replica is the split
        (
            "select channel, count(*) as n from payments p where p.amount > "
            "(select avg(amount) + stddev_samp(amount) from payments p2 where p2.channel = p.channel) "
            "group by channel order by channel",
            "partition_local",
            "payments.channel (as p2) = payments.channel (as p)",
        ),
        # (b) IN (SELECT k ... GROUP BY k HAVING ...) on a partition key (Q18's shape)
        (
            "select a.acct_id, a.region, sum(p.amount) as total from accounts a join payments p "
            "on a.acct_id = p.acct_id where a.acct_id in "
            "(select acct_id from payments group by acct_id having count(*) >= 18) "
            "group by a.acct_id, a.region order by total desc, a.acct_id limit 10",
            "partition_local",
            "IN (SELECT acct_id ...) on payments.acct_id = accounts.acct_id",
        ),
        # ... whose filter on the key prunes (a positive IN), grouped off the key
        (
            "select region, count(*) as n from accounts where acct_id in (select acct_id from payments "
            "where acct_id between 10 and 140 group by acct_id having sum(amount) > 700) "
            "group by region order by region",
            "partial_agg",
            "IN (SELECT acct_id ...)",
        ),
        # ... without GROUP BY, from a table keyed by a 32-bit integer (hashed as the 64-bit one)
        (
            "select channel, count(*) as n from payments where acct_id in "
            "(select acct_id from refunds where reason = 'fraud') group by channel order by channel",
            "partial_agg",
            "IN (SELECT acct_id ...) on refunds.acct_id = payments.acct_id",
        ),
        # ... NOT IN, correlated (NULLs of the list stay within the outer row's partition)
        (
            "select a.tier, count(*) as n from accounts a where a.tier not in "
            "(select p.priority from payments p where p.acct_id = a.acct_id and p.amount > 60) "
            "group by a.tier order by a.tier",
            "partial_agg",
            "correlated NOT IN",
        ),
        # (c) EXISTS and NOT EXISTS with non-equality conditions (Q21's shape)
        (
            "select a.region, count(*) as n from accounts a, payments p1 where a.acct_id = p1.acct_id "
            "and p1.amount > 20 and exists (select * from payments p2 where p2.acct_id = p1.acct_id "
            "and p2.channel <> p1.channel) and not exists (select * from payments p3 where "
            "p3.acct_id = p1.acct_id and p3.channel <> p1.channel and p3.amount > p1.amount) "
            "group by a.region order by n desc, a.region",
            "partial_agg",
            "correlated NOT EXISTS on payments.acct_id (as p3) = payments.acct_id (as p1)",
        ),
        # ... the first payment of each account (an inequality on a date), a scan with top-k
        (
            "select p1.pay_id, p1.acct_id, p1.paid from payments p1 where not exists (select * from "
            "payments p2 where p2.acct_id = p1.acct_id and (p2.paid < p1.paid or (p2.paid = p1.paid "
            "and p2.pay_id < p1.pay_id))) order by p1.paid, p1.pay_id limit 25",
            "partition_local",
            "correlated NOT EXISTS",
        ),
        # several kinds at once, over three tables keyed alike
        (
            "select a.acct_id, a.tier from accounts a where exists (select * from refunds r where "
            "r.acct_id = a.acct_id and r.reason <> 'goodwill') and a.tier > (select count(*) from "
            "payments p where p.acct_id = a.acct_id and p.channel = 'branch') order by a.acct_id",
            "partition_local",
            "correlated EXISTS on refunds.acct_id (as r) = accounts.acct_id (as a)",
        ),
    ],
)
def test_subqueries_keyed_to_a_partition_column_run_per_partition(core, duck, sql, kind, says):
    plan = check(core, duck, sql)
    text = plan.explain_text()
    assert plan.kind == kind and "subquery: " in text and says in text, text
    # each fragment gets its partitions of every table referenced, subqueries' included
    assert all(t["op"] == "sql" for _, t in plan.tasks)


@pytest.mark.parametrize(
    "sql",
    [
        # an uncorrelated NOT IN: a NULL anywhere in the list makes it NULL for every row
        "select count(*) as n from accounts where acct_id not in (select acct_id from refunds)",
        "select count(*) as n from accounts where acct_id not in "
        "(select acct_id from refunds where acct_id is not null and reason = 'fraud')",
        # correlated off the partition columns
        "select count(*) as n from payments p where p.amount > "
        "(select avg(p2.amount) from payments p2 where p2.paid = p.paid)",
        # a string key against an integer key: equal in SQL after a cast, hashed apart
        "select count(*) as n from accounts a where exists (select * from refunds r where r.acct_code = a.acct_id)",
        # an IN whose list is not the partition column
        "select count(*) as n from accounts where tier in (select priority from payments where acct_id < 30)",
        # an aggregate over the whole subquery table
        "select count(*) as n from payments where amount > (select avg(amount) from payments)",
        # a join inside the subquery
        "select count(*) as n from accounts a where exists (select * from payments p join refunds r "
        "on p.acct_id = r.acct_id where p.acct_id = a.acct_id)",
    ],
)
def test_subqueries_that_cannot_split_are_gathered(core, duck, sql):
    plan = check(core, duck, sql)
    # the outer query's tables are gathered; an uncorrelated subquery that splits on its own
    # runs first as a sub-plan (staged), its result an input of the coordinator's SQL
    assert plan.kind == "gather" or (plan.kind == "staged" and plan.tasks), plan.explain_text()


def test_subquery_pushdown_off_gathers(core, duck):
    sql = (
        "select count(*) as n from payments p where p.amount > "
        "(select 1.5 * avg(p2.amount) from payments p2 where p2.acct_id = p.acct_id)"
    )
    core.sql_subquery_pushdown = False
    try:
        assert check(core, duck, f"/* off */ {sql}").kind == "gather"
    finally:
        core.sql_subquery_pushdown = True
