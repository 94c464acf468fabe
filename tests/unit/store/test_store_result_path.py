"""The JSON model's result path: what a run reports of its phases, and the shapes a result takes
from the nodes to the coordinator (docs/store.md, "Where a matched plan's time goes")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import Agg, Join, LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._exec import TIMINGS_META

RNG = np.random.default_rng(19)
N_ORD, N_ITEM = 2000, 6000
ORDERS = pa.table(
    {
        "o_id": np.arange(N_ORD, dtype=np.int64),
        "o_cust": RNG.integers(0, 50, N_ORD),
        "o_price": np.round(RNG.random(N_ORD) * 100, 2),
    }
)
ITEMS = pa.table(
    {
        "l_oid": RNG.integers(0, N_ORD, N_ITEM),
        "l_part": RNG.integers(0, 300, N_ITEM),
        "l_qty": RNG.integers(1, 50, N_ITEM),
    }
)
NODES = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tr = LocalTransport(str(tmp_path_factory.mktemp("result-path")), NODES)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=1500, recovery_rate_bytes=0)
    for name, data, columns in (
        ("orders", ORDERS, ("o_id", "o_cust")),
        ("items", ITEMS, ("l_oid", "l_part")),
    ):  # (two replicas of 4 hash partitions, the third of 2 on the table's last column)
        specs = [PartitionSpec(c, "hash", 4) for c in columns] + [
            PartitionSpec(data.column_names[-1], "hash", 2)
        ]
        core.create_table(name, data.schema, specs)
        core.append(name, data)
    return core


GROUP_ON_KEY = Query("items", group_by=("l_oid",), aggs=(Agg("sum", "l_qty", "q"), Agg("count", "*", "n")))
# on replica 0 (by l_oid): a group-by off its partition column, a shuffle
GROUP_OFF_KEY = Query(
    "items",
    group_by=("l_part",),
    aggs=(Agg("sum", "l_qty", "q"), Agg("mean", "l_qty", "m")),
    replica=0,
)
JOIN = Query(
    "orders",
    join=Join("items", "o_id", "l_oid"),
    group_by=("o_cust",),
    aggs=(Agg("sum", "l_qty", "q"),),
)
SCAN = Query("items", where=(("l_part", "<", 10),), select=("l_oid", "l_qty"))


@pytest.mark.parametrize(
    "q", [GROUP_ON_KEY, GROUP_OFF_KEY, JOIN, SCAN], ids=["on-key", "off-key", "join", "scan"]
)
def test_a_run_reports_its_phases_and_the_result_carries_none(store, q):
    """EXPLAIN of a run names its phases (as a SQL plan's does): planning, the fragments (the
    nodes' tasks and their results' transfer), the slowest fragment's own run on its node, and the
    coordinator's merge; the per-fragment seconds travel in the fragments' results, not in the
    query's."""
    res, plan = store.query(q)
    text = plan.explain_text()
    line = next((ln for ln in text.splitlines() if ln.startswith("timings: ")), None)
    assert line is not None, text
    for phase in ("plan", "fragments", "slowest fragment run", "merge"):
        assert f"{phase} " in line, line
    run = float(line.split("slowest fragment run ")[1].split(" ")[0])
    assert run > 0.0
    assert TIMINGS_META not in (res.schema.metadata or {})
    # a plan from the cache reports its own run, not the one it was cached from
    again, plan2 = store.query(q)
    assert plan2.cached and plan2 is not plan and "timings: " in plan2.explain_text()


def test_the_benchmark_reads_a_model_plans_phases(store):
    """``microco bench store`` records each plan's phases from its EXPLAIN (``_phases``): a
    shuffle's second stage too."""
    from microco.benchmarks.store import _phases

    _, plan = store.query(GROUP_OFF_KEY)
    assert plan.kind == "agg_shuffle"
    got = _phases(plan.explain_text())
    for k in (
        "plan_s",
        "fragments_s",
        "slowest_fragment_run_s",
        "stage_2_s",
        "stage_2_slowest_run_s",
        "merge_s",
    ):
        assert k in got and got[k] >= 0.0, got


def test_a_task_carries_its_seconds_only_when_the_coordinator_asks(store):
    """The coordinator's tasks bring their seconds back; the same task as a ``PlanRead`` client
    reads it (the plan's task as planned) brings the rows alone."""
    plan = store.plan(GROUP_ON_KEY)
    node, task = plan.stages[0][0]
    info = plan.nodes[node]
    plain = store.transport.run_task(info, task)
    assert TIMINGS_META not in (plain.schema.metadata or {})
    asked = store.transport.run_task(info, {**task, "timings": True})
    assert TIMINGS_META in (asked.schema.metadata or {})
    assert asked.select(plain.schema.names).equals(plain)
