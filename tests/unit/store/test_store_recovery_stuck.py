"""Recovery never stays stuck silently. Losing every node of one of three fault domains leaves no
node the invariant allows: the progress record (what `microco store recovery` prints) says why
and what to do, and recovery resumes by itself on a node started in another domain; where some
nodes hold no copy of the rows, the operator's `--relax-fault-domains` rebuilds on them (spread,
three copies on three nodes). Rows without a complete copy name the dead nodes to bring back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._recovery import RELAX_COMMAND, plan_recovery

N = 6000
DATA = pa.table({"k": np.arange(N, dtype=np.int64), "g": np.arange(N) % 11, "v": np.arange(N) % 97})
SPECS = [PartitionSpec("k", "hash", 4), PartitionSpec("g", "hash", 2), PartitionSpec("v", "hash", 2)]


def _store(tmp_path, nodes, absent=()):
    tr = LocalTransport(str(tmp_path), nodes)
    for n in absent:  # not started yet
        tr.kill(n)
    core = StoreCore(MemoryKV(), tr, super_extent_rows=3000, recovery_rate_bytes=0)
    core.create_table("t", DATA.schema, SPECS)
    core.append("t", DATA)
    return core, tr


def _holders(core, tr) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for e in core.table("t").extents():
        for k in tr.stores[e.node].read("t", e.id, columns=["k"]).column("k").to_pylist():
            out.setdefault(k, []).append(e.node)
    return out


def _keys(core) -> list[int]:
    got, _ = core.query(Query("t", select=("k",)))
    return sorted(got.column("k").to_pylist())


def test_a_lost_domain_is_stuck_with_a_reason_until_a_node_in_another_domain_starts(tmp_path):
    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)] + [NodeInfo("spare", "rack3")]
    core, tr = _store(tmp_path, nodes, absent=["spare"])
    tr.kill("n0")
    first = core.recover()
    assert first["state"] == "done" and first["targets"] == {"n3": first["rebuilt"]}  # the only eligible node
    tr.kill("n3")  # rack0 is gone; every survivor holds a copy of some rows of each lost extent
    stuck = core.recover()
    lost = core.lost_count()
    assert stuck["state"] == "stuck" and lost > 0 and stuck["rebuilt"] == 0 and len(stuck["stuck"]) == lost
    (advice,) = stuck["advice"]
    assert (
        f"{lost} lost extents" in advice
        and "start a store node in a fault domain other than rack1, rack2" in advice
    )
    assert core.catalog.recovery()["advice"] == [advice]  # kept for `microco store recovery`
    assert core.recover(relax_domains=True)["state"] == "stuck"  # no node holds none of the rows
    assert _keys(core) == list(range(N))  # meanwhile reads are degraded, and exact
    tr.dead.discard("spare")  # an operator starts a node in rack3
    done = core.recover()
    assert done["state"] == "done" and done["targets"] == {"spare": lost} and core.lost_count() == 0
    assert all(len(set(h)) == 3 for h in _holders(core, tr).values())
    assert _keys(core) == list(range(N))


def test_the_operator_relaxes_fault_domains_and_rebuilt_extents_spread(tmp_path):
    # three nodes per domain, two partitions per group: some nodes hold no copy of a lost extent's rows
    nodes = [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(9)]
    core, tr = _store(tmp_path, nodes)
    for n in ("n0", "n3", "n6"):  # all of rack0
        tr.kill(n)
    stuck = core.recover()
    lost = core.lost_count()
    assert stuck["state"] == "stuck" and lost > 1
    assert any(RELAX_COMMAND in a for a in stuck["advice"])
    done = core.recover(relax_domains=True)
    assert done["state"] == "done" and core.lost_count() == 0 and len(done["relaxed"]) == lost
    assert len(done["targets"]) > 1  # spread over the eligible survivors, not one
    holders = _holders(core, tr)
    assert len(holders) == N and all(len(set(h)) == 3 for h in holders.values())  # three nodes per row
    assert _keys(core) == list(range(N))


def test_rows_without_a_complete_copy_name_the_nodes_to_bring_back(tmp_path):
    core, tr = _store(tmp_path, [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    for n in ("n0", "n1", "n2"):  # one node of every domain, before any recovery
        tr.kill(n)
    plan = plan_recovery(core.tables(), tr.live_nodes(), core.domains(), relax_domains=True)
    no_source = [s for s in plan.stuck if "no complete source replica" in s]
    assert no_source and all("dead nodes" in s for s in no_source)
    assert any("bring back store node(s)" in a for a in plan.advice)


class _Context:
    def __init__(self, metadata=()):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


def test_start_recovery_relaxes_only_when_asked_by_a_trusted_caller(tmp_path, monkeypatch):
    import pytest

    from microco.api.store.v1 import store_pb2 as pb
    from microco.clients.store import RELAX_METADATA
    from microco.common.errors import PermissionDenied
    from microco.services.runtime.auth import Caller
    from microco.services.store import _service

    core, tr = _store(tmp_path, [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(9)])
    for n in ("n0", "n3", "n6"):
        tr.kill(n)
    servicer = _service.StoreServicer(core)
    assert servicer.StartRecovery(pb.StartRecoveryRequest(), _Context()).unavailable_extents > 0
    monkeypatch.setattr(_service, "caller", lambda ctx: Caller("user:bob", False))
    with pytest.raises(PermissionDenied):
        servicer.StartRecovery(pb.StartRecoveryRequest(), _Context(((RELAX_METADATA, "1"),)))
    monkeypatch.setattr(_service, "caller", lambda ctx: Caller("user:root", True))
    assert (
        servicer.StartRecovery(
            pb.StartRecoveryRequest(), _Context(((RELAX_METADATA, "1"),))
        ).unavailable_extents
        == 0
    )
