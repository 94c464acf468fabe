"""Costs found running TPC-DS's 99 queries through the store (issue 19, session 33), each a
general one: the answers were right, the work was not."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from microco.clients.store import parse_partitioning
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._service import spec_from_pb

RNG = np.random.default_rng(33)
N = 4000
SALES = pa.table(
    {
        "s_id": np.arange(N, dtype=np.int64),
        "s_wh": RNG.integers(0, 5, N).astype(np.int64),
        "s_qty": RNG.integers(1, 50, N).astype(np.int32),
        "s_note": [f"note {k % 97}" for k in range(N)],
        "s_price": RNG.random(N),
    }
)
WAREHOUSE = pa.table(
    {
        "w_sk": np.arange(5, dtype=np.int64),
        "w_name": [f"warehouse number {k}" for k in range(5)],
        "w_city": [f"c{k % 2}" for k in range(5)],
    }
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("tpcds")), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    )
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1000, recovery_rate_bytes=0)
    for name, data, replicas in (
        ("sales", SALES, ("s_id:hash:4", "s_wh:hash:4", "s_qty:hash:2")),
        ("warehouse", WAREHOUSE, ("w_sk:hash:2", "w_sk:hash:2", "w_sk:hash:2")),
    ):
        core.create_table(name, data.schema, [spec_from_pb(parse_partitioning(r)) for r in replicas])
        core.append(name, data)
    con = duckdb.connect()
    con.register("sales", SALES)
    con.register("warehouse", WAREHOUSE)
    return core, con


def _read(plan) -> dict[str, set[str]]:
    """The columns each table's fragments read, over every task of the plan and its parts."""
    out: dict[str, set[str]] = {}
    for sub in [plan, *(s for _, s in plan.stages)]:
        for _node, task in sub.tasks:
            for name, side in (task.get("inputs") or {}).items():
                out.setdefault(name, set()).update(side["read"])
    return out


def _rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


@pytest.mark.parametrize(
    "sql",
    [
        # TPC-DS Q62/Q99's shape: a star over a small table in a derived table, joined
        (
            "select w_substr, count(*) as n, sum(s_qty) as q from sales, "
            "(select substring(w_name, 1, 12) w_substr, * from warehouse) sq1 "
            "where s_wh = w_sk group by w_substr"
        ),
        "select w.*, s_qty from sales join warehouse w on s_wh = w_sk where s_id < 50",
    ],
)
def test_a_star_over_one_table_reads_that_table_whole_and_no_other(store, sql):
    """A star over a table anywhere in the query read every column of every table: TPC-DS
    Q99's ``(SELECT .., * FROM warehouse)`` read all 34 columns of ``catalog_sales`` (570 MB
    at scale factor 1) for the five the query uses."""
    core, con = store
    got, plan = core.sql(sql)
    assert _rows(got) == _rows(con.sql(sql).to_arrow_table())
    read = _read(plan)
    assert set(read["warehouse"]) == {"w_sk", "w_name", "w_city"}
    assert set(read["sales"]) <= {"s_id", "s_wh", "s_qty"}, read


@pytest.mark.parametrize(
    "sql",
    [
        "select a.s_wh, count(*) as n from sales a join sales b on a.s_id = b.s_id + 1 group by a.s_wh",
        "select s_wh, count(*) as n, sum(s_qty) as q from sales left join warehouse on s_wh = w_sk group by s_wh",
        (
            "select w_city, s_note, count(*) as n from sales, warehouse where s_wh = w_sk "
            "and s_qty > (select avg(s_qty) from sales where s_price < 0.5) group by w_city, s_note"
        ),
    ],
)
def test_a_gathered_read_with_nothing_to_do_skips_duckdb_on_the_node(store, monkeypatch, sql):
    """A gather's fragment for a table with no filter to push is ``SELECT <the columns read>
    FROM t``: DuckDB copied every value into its vectors and back out to Arrow for no change
    (TPC-DS Q71 at scale factor 1: ~0.1 s a node). The node hands the read on as it is (its
    types the table's); a fragment with anything to do still runs in DuckDB; the answers are
    DuckDB's."""
    from microco.services.store import _sql

    ran: list[str] = []
    for fn in ("run_fragment", "run_fragment_stream"):
        real = getattr(_sql, fn)

        def spy(inputs, sql, cancel=None, real=real):
            ran.append(sql)
            return real(inputs, sql, cancel)

        monkeypatch.setattr(_sql, fn, spy)
    core, con = store
    monkeypatch.setattr(core, "sql_plans", None, raising=False)
    got, plan = core.sql(sql)
    assert plan.kind in ("gather", "staged"), plan.explain_text()
    assert _rows(got) == _rows(con.sql(sql).to_arrow_table())
    plain = [t["sql"] for _, t in plan.tasks if " WHERE " not in t["sql"]]
    assert plain, [t["sql"] for _, t in plan.tasks]
    assert not set(plain) & set(ran), ran


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        (
            "select d1.w_city as c1, d2.w_name as n2, count(*) as n, sum(s_qty) as q "
            "from sales, warehouse d1, warehouse d2 "
            "where s_wh = d1.w_sk and s_qty % 5 = d2.w_sk group by d1.w_city, d2.w_name",
            "partial_agg",
        ),
        # a filter on one occurrence (one partition of warehouse's replicas) prunes neither
        (
            "select d1.w_name, count(*) as n from sales, warehouse d1, warehouse d2 "
            "where s_wh = d1.w_sk and s_qty % 5 = d2.w_sk and d2.w_sk = 2 group by d1.w_name",
            "partial_agg",
        ),
        (
            "select s_id, d1.w_name as a, d2.w_name as b from sales join warehouse d1 on s_wh = d1.w_sk "
            "join warehouse d2 on s_qty % 5 = d2.w_sk where s_id < 300",
            "partition_local",
        ),
        # the split table itself twice: not split
        (
            "select a.s_wh, count(*) as n from sales a join sales b on a.s_id = b.s_id + 1 group by a.s_wh",
            None,
        ),
    ],
)
def test_a_small_table_twice_in_the_from_is_broadcast(store, sql, kind):
    """TPC-DS joins ``date_dim`` as d1, d2, d3 (Q25, Q29, Q50, Q85...): any table twice in one
    FROM made the query a gather of every table's rows. A small table twice is broadcast now
    (each fragment reads it whole, unpruned by either occurrence's filters), the big one split."""
    core, con = store
    got, plan = core.sql(sql)
    assert _rows(got) == _rows(con.sql(sql).to_arrow_table())
    if kind is not None:
        assert plan.kind == kind, plan.explain_text()
        assert "warehouse" in plan.explain_text().split("broadcast:")[1]
    else:
        assert plan.kind in ("gather", "staged", "exchange"), plan.explain_text()
