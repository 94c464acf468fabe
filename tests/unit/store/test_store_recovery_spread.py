"""Recovery spreads rebuilt extents over every eligible node (least-loaded first), not one partner:
with three nodes per fault domain, a dead node's extents go to both other nodes of its domain (the
only domain the invariant allows), and the invariant holds row by row afterwards."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore, check_row_copies
from microco.services.store._placement import Copy
from microco.services.store._recovery import plan_recovery

N = 12_000
DATA = pa.table({"k": np.arange(N, dtype=np.int64), "g": np.arange(N) % 11, "v": np.arange(N) % 97})
SPECS = [PartitionSpec("k", "hash", 6), PartitionSpec("g", "hash", 6), PartitionSpec("v", "hash", 6)]


def test_rebuilt_extents_spread_over_all_eligible_nodes(tmp_path):
    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(9)]
    tr = LocalTransport(str(tmp_path), nodes)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=2000, recovery_rate_bytes=0)
    core.create_table("t", DATA.schema, SPECS)
    core.append("t", DATA)
    victim = "n0"
    lost = [e for e in core.table("t").extents() if e.node == victim]
    assert len(lost) >= 4
    tr.kill(victim)
    plan = plan_recovery(core.tables(), tr.live_nodes(), core.domains())
    targets = Counter(task.target for task in plan.tasks)
    eligible = {n.name for n in nodes if n.fault_domain == "rack0" and n.name != victim}
    assert set(targets) == eligible  # both partners of the domain, never another domain
    assert max(targets.values()) - min(targets.values()) <= max(1, len(lost) // 2)
    rep = core.recover()
    assert rep["rebuilt"] == len(lost) and core.lost_count() == 0
    placed = Counter(
        e.node for e in core.table("t").extents() if e.id not in {x.id for x in lost} and e.node in eligible
    )
    assert placed  # the rebuilt extents now sit on the eligible nodes
    copies: dict[int, list[Copy]] = {}
    domain = {n.name: n.fault_domain for n in nodes}
    for e in core.table("t").extents():
        t = tr.stores[e.node].read("t", e.id, columns=["k"])
        for k in t.column("k").to_pylist():
            copies.setdefault(k, []).append(Copy(e.replica, e.node, domain[e.node]))
    assert len(copies) == N and all(check_row_copies(c) is None for c in copies.values())
    got, _ = core.query(Query("t", select=("k",)))
    assert sorted(got.column("k").to_pylist()) == list(range(N))
