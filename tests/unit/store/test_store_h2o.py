"""The h2o.ai db-benchmark's ten group-by and five join questions (``benchmarks/store_h2o.py``),
a public suite the SQL planner was not written against, at a small N in process on six nodes,
with and without nulls: every answer equal to DuckDB's on the same Arrow data. What the suite
found: its joins' ``x.*`` failed every split plan, its top-two-per-group was gathered whole."""

from __future__ import annotations

import duckdb
import pytest

from microco.benchmarks.store_h2o import PARTITIONING, QUERIES, same, tables
from microco.clients.store import parse_partitioning
from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, StoreCore
from microco.services.store._service import spec_from_pb


@pytest.fixture(scope="module", params=[0.0, 0.05], ids=["no-nulls", "nulls"])
def suite(request, tmp_path_factory):
    data = tables(20_000, nas=request.param)
    tr = LocalTransport(
        str(tmp_path_factory.mktemp("h2o")), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]
    )
    core = StoreCore(MemoryKV(), tr, super_extent_rows=5000, recovery_rate_bytes=0)
    con = duckdb.connect()
    for name, t in data.items():
        core.create_table(name, t.schema, [spec_from_pb(parse_partitioning(r)) for r in PARTITIONING[name]])
        core.append(name, t)
        con.register(name, t)
    return core, con


def test_every_question_matches_duckdb(suite):
    core, con = suite
    wrong, plans = [], {}
    for q, sql in QUERIES.items():
        got, plan = core.sql(sql)
        plans[q] = plan.kind
        if not same(got, con.sql(sql).to_arrow_table()):
            wrong.append(q)
    assert not wrong, plans
    # the top two per id6 beside a replica on id6, and the joins' x.* beside co-partitioned or
    # small tables, run next to the data
    assert plans["q8"] == "partition_local" and plans["j1"] == "partition_local", plans
    assert plans["j5"] == "partition_local", plans
