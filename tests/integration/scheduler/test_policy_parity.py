"""A policy gives the same decisions in the simulator and in the live scheduler for the same
observed state.

The simulator runs a small trace (multi-device, elastic and packable jobs on two nodes)
with each policy; every state it hands the policy is recorded with the decisions it got.
Each recorded state is then written to etcd the way the live scheduler stores it (node
records under ``/microco/nodes/``, job records under ``/microco/scheduler/jobs/`` in the
record format of ``services/scheduler/_jobs.py``), read back by a live ``SchedulerCore``
through its own view builder (``SchedulerCore.observe``: records -> ``record_to_view`` ->
``cluster_view_from_dicts``), and a fresh policy instance decides on it. The live view must
equal the simulator's and the decisions must be the same, in the same order. One job asks
for half a device (``gpu_share``), so the fractional request is part of what must match.
The live scheduler records no device telemetry yet, so ``JobView.utilization`` is left
unobserved in the simulator too (``observe_utilization=False``).
"""

from __future__ import annotations

import pytest

from microco.clients.agent import NODES_PREFIX
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._core import SchedulerCore
from microco.services.scheduler.policy import (
    cluster_view_to_dict,
    decision_to_dict,
    job_view_from_dict,
    make_policy,
)
from microco.services.scheduler.sim import ClusterSpec, PerfModel, Simulator, TraceJob
from microco.services.scheduler.sim._records import job_record

pytestmark = pytest.mark.integration

# Three model families with measured-looking numbers: A and B pack well, A and C do not (so
# gandiva packs, judges and undoes packs).
PERF = PerfModel(
    alone={"v100": {"A": 10.0, "B": 6.0, "C": 8.0}},
    pairs={
        "v100": {
            ("A", "B"): 0.85,
            ("B", "A"): 0.8,
            ("A", "C"): 0.3,
            ("C", "A"): 0.35,
            ("B", "C"): 0.6,
            ("C", "B"): 0.55,
            ("A", "A"): 0.5,
            ("B", "B"): 0.5,
            ("C", "C"): 0.45,
        }
    },
)


def _trace() -> list[TraceJob]:
    jobs = []
    shapes = [1, 1, 2, 1, 4, 1, 2, 1, 1, 8, 1, 2, 1, 1, 4, 1]
    models = "ABCABCAB"
    for i, k in enumerate(shapes):
        jobs.append(
            TraceJob(
                job_id=f"j{i:02d}",
                submit_time=37.0 * i,
                devices=k,
                duration_s=300.0 + 170.0 * ((i * 7) % 11),
                model=models[i % len(models)],
                elastic=(i % 5 == 2),
                priority=1 if i == 11 else 0,
                owner=f"user{i % 3}",
                # fractional GPU requests (one-device jobs), as the Alibaba trace has
                gpu_share=0.5 if k == 1 and i == 13 else 1.0,
            )
        )
    # a quiet tail: an elastic job alone grows onto idle devices, then shrinks for newcomers
    jobs.append(TraceJob("k0", 20000.0, 2, 3000.0, model="B", elastic=True))
    jobs.append(TraceJob("k1", 20400.0, 4, 600.0, model="A"))
    jobs.append(TraceJob("k2", 20450.0, 4, 600.0, model="C"))
    return jobs


class _Recorder:
    """Wraps a policy; keeps each state the simulator showed it and the answer."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.time_driven = getattr(policy, "time_driven", True)
        if hasattr(policy, "wakeup_at"):
            self.wakeup_at = policy.wakeup_at
        self.states: list[tuple[dict, list[dict]]] = []

    def decide(self, view):
        out = self.policy.decide(view)
        self.states.append((cluster_view_to_dict(view), [decision_to_dict(d) for d in out]))
        return out


def _record_from_view(job: dict, node_of: dict[str, str]) -> dict:
    """The live scheduler's stored record for a job the simulator shows as ``job``."""
    return job_record(job_view_from_dict(job), node_of).to_dict()


def _live_view(kv, state: dict):
    """Write ``state`` as the live scheduler stores it; read it back through its core."""
    kv.delete_prefix(J.JOBS_PREFIX)
    kv.delete_prefix(NODES_PREFIX)
    nodes: dict[str, list[dict]] = {}
    for d in state["devices"]:
        nodes.setdefault(d["node"], []).append(
            {
                "id": d["id"],
                "node": d["node"],
                "index": len(nodes.get(d["node"], [])),
                "kind": d["kind"],
                "model": d["model"],
                "memory_bytes": 0,
                "cpus": [],
            }
        )
    for name, devs in nodes.items():
        kv.put_json(NODES_PREFIX + name, {"name": name, "address": "127.0.0.1:1", "devices": devs})
    node_of = {d["id"]: d["node"] for d in state["devices"]}
    for job in state["jobs"]:
        kv.put_json(J.job_key(job["id"]), _record_from_view(job, node_of))
    core = SchedulerCore(kv, make_policy("fifo"), check_commands=False)
    return core.observe(state["now"])


CASES = {
    "fifo": ("fifo", {}),
    "fifo-strict": ("fifo", {"backfill": False}),
    "las": ("las", {"min_run_s": 30.0, "thresholds_s": (600.0, 3000.0)}),
    "gandiva": ("gandiva", {"quantum_s": 60.0}),
    # share limit 2: full-share jobs pack too, so packing and its introspection are exercised
    "gandiva-packing": ("gandiva", {"quantum_s": 60.0, "pack_share_limit": 2.0, "pack_cooldown_s": 120.0}),
    # share limit 3: a kept pair takes a third member (packs of more than two, session 7)
    "gandiva-packing-3": ("gandiva", {"quantum_s": 60.0, "pack_share_limit": 3.0, "pack_cooldown_s": 120.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_decisions_in_simulator_and_live_scheduler(case, etcd_kv) -> None:
    name, cfg = CASES[case]
    rec = _Recorder(make_policy(name, **cfg))
    # the live scheduler does not fill JobView.utilization yet (no device telemetry in its
    # records), so the simulator leaves it unobserved too: the views must be identical
    res = Simulator(
        rec, _trace(), ClusterSpec(nodes=2, devices_per_node=4), perf=PERF, observe_utilization=False
    ).run()
    assert res.jobs == 19 and all(v["finished"] is not None for v in res.per_job.values())
    acting = [s for s in rec.states if s[1]]
    idle = [s for s in rec.states if not s[1]]
    assert len(acting) >= 5, f"{case}: the run gave too few decisions to compare"
    # every state that led to a decision, and some that did not
    picked = acting + idle[:: max(1, len(idle) // 5)][:5]
    kinds: set[str] = set()
    widest = 0  # most partners a Pack named
    for state, decided in picked:
        live = _live_view(etcd_kv, state)
        assert cluster_view_to_dict(live) == state, f"{case}: live view differs at t={state['now']}"
        again = [decision_to_dict(d) for d in make_policy(name, **cfg).decide(live)]
        assert again == decided, f"{case}: decisions differ at t={state['now']}"
        kinds.update(d["kind"] for d in decided)
        widest = max([widest] + [len(d["with_jobs"]) for d in decided if d["kind"] == "pack"])
    assert "start" in kinds
    if name == "gandiva":
        assert "suspend" in kinds and "resume" in kinds, kinds
    if case == "gandiva":
        assert {"migrate", "resize"} <= kinds, kinds
    if case == "gandiva-packing":
        assert {"pack", "unpack"} <= kinds, kinds
    if case == "gandiva-packing-3":
        assert widest >= 2, f"{case}: no pack of three was decided"
