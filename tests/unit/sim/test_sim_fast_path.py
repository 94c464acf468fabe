"""The simulator's and gandiva's fast paths decide exactly as a straightforward reference does.

The fast paths (occupancy kept by take/release with its free-by-node and shared-device
indexes, the shared topology and spread memo, the pre-check that skips decisions no job can
lead to, cached job views, utilisation recomputed per touched device) are swapped for plain
versions that rebuild and rescan everything at every call; the same random trace of a few
hundred jobs must give the same decisions, in the same order, and bit-identical figures."""

from __future__ import annotations

import dataclasses
import random

import pytest

from microco.services.scheduler.policy import ClusterView, DeviceView, JobPhase, JobView, make_policy
from microco.services.scheduler.policy import _gandiva as G
from microco.services.scheduler.policy._types import HOLDING_PHASES, WAITING_PHASES
from microco.services.scheduler.sim import ClusterSpec, PerfModel, Simulator, TraceJob


class _RefOccupancy:
    """Occupancy as a plain scan: nothing kept between queries."""

    def __init__(self, view) -> None:
        self.node_of = {d.id: d.node for d in view.devices}
        self.nodes: dict[str, list[str]] = {}
        for d in view.devices:
            self.nodes.setdefault(d.node, []).append(d.id)
        self.holders: dict[str, tuple[str, ...]] = {d.id: () for d in view.devices}
        for j in view.jobs:
            if j.state in HOLDING_PHASES:
                for dev in j.devices:
                    if dev in self.holders:
                        self.holders[dev] = (*self.holders[dev], j.id)
        self.version = 0

    def free(self):
        return [d for d, h in self.holders.items() if not h]

    def n_free(self):
        return sum(1 for h in self.holders.values() if not h)

    def free_by_node(self):
        return self._free_by_node_of(self)

    @staticmethod
    def _free_by_node_of(occ):
        """Free devices by node of any occupancy, by a scan of every device."""
        out = {}
        for node, devs in occ.nodes.items():
            f = [d for d in devs if not occ.holders[d]]
            if f:
                out[node] = f
        return out

    def nodes_of(self, devices):
        return {self.node_of[d] for d in devices if d in self.node_of}

    def spread(self, devices):
        return len(self.nodes_of(devices)) >= 2

    def shared_in_order(self):
        return [d for d, h in self.holders.items() if len(h) >= 2]

    def release(self, job_id, devices):
        for d in devices:
            h = self.holders.get(d)
            if h is not None and job_id in h:
                i = h.index(job_id)
                self.holders[d] = h[:i] + h[i + 1 :]
                self.version += 1

    def take(self, job_id, devices):
        for d in devices:
            self.holders[d] = (*self.holders[d], job_id)
            self.version += 1


def _ref_may_act(self, view, n_dev):
    """The pre-check before the fast path: any waiting, packed, growable or multi-device job."""
    cfg = self.config
    for j in view.jobs:
        if j.state in WAITING_PHASES:
            if 0 < j.devices_wanted <= n_dev:
                return True
        elif j.state is JobPhase.PACKED:
            return True
        elif j.state is JobPhase.RUNNING:
            if j.elastic and cfg.enable_grow_shrink:
                return True
            if cfg.enable_migration and len(j.devices) > 1:
                return True
    return False


class _RefSimulator(Simulator):
    """Every job's view built afresh at every decision as a plain snapshot, in a plain
    ClusterView (no index: the policy passes over every job); utilisation summed over all
    devices."""

    def view(self):
        views = []
        for j in self.active.values():
            v = self._build_view(j)
            views.append(JobView(**{f.name: getattr(v, f.name) for f in dataclasses.fields(JobView)}))
        return ClusterView(now=self.now, devices=self.devices, jobs=tuple(views))

    def _aggregate(self):
        util, alloc = 0.0, 0
        for hs in self.holders.values():
            if hs:
                alloc += 1
                u = 0.0
                for o in hs:
                    u += o.util
                util += min(1.0, u)
        self._util_now, self._alloc_now = util, alloc
        if self.series_points:
            self._series.append((self.now, util, alloc, self.waiting))


PERF = PerfModel(
    alone={"v100": {"A": 10.0, "B": 6.0, "C": 8.0}, "p100": {"A": 16.0, "B": 9.0, "C": 12.0}},
    pairs={
        m: {("A", "B"): 0.85, ("B", "A"): 0.8, ("A", "C"): 0.3, ("C", "A"): 0.35, ("B", "C"): 0.6,
            ("C", "B"): 0.55, ("A", "A"): 0.5, ("B", "B"): 0.5, ("C", "C"): 0.45}
        for m in ("v100", "p100")
    },
)  # fmt: skip


def _trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 25.0)
        k = rng.choice((1, 1, 1, 1, 2, 2, 4, 8))
        out.append(
            TraceJob(
                job_id=f"r{i:04d}",
                submit_time=round(t, 3),
                devices=k,
                duration_s=rng.lognormvariate(5.5, 1.0),
                model=rng.choice("ABC"),
                elastic=rng.random() < 0.1,
                priority=1 if rng.random() < 0.05 else 0,
                gpu_share=rng.choice((0.25, 0.5, 1.0)) if k == 1 else 1.0,
            )
        )
    return out


class _Log:
    def __init__(self, policy) -> None:
        self.policy, self.name, self.time_driven = policy, policy.name, policy.time_driven
        self.wakeup_at = policy.wakeup_at
        self.seen: list[tuple[float, list]] = []

    def decide(self, view):
        out = self.policy.decide(view)
        self.seen.append((view.now, out))
        return out


@pytest.mark.parametrize("seed,gpus,per_node", [(2, 24, 8)])
def test_fast_path_decides_as_the_reference(monkeypatch, seed, gpus, per_node) -> None:
    trace = _trace(200, seed)
    cluster = ClusterSpec.for_gpus(gpus, per_node, ("v100", "p100"))

    def run(sim_type):
        log = _Log(make_policy("gandiva"))
        r = sim_type(log, trace, cluster, perf=PERF, check_invariants=False).run()
        return log.seen, r

    fast_seen, fast = run(Simulator)
    with monkeypatch.context() as m:
        m.setattr(G, "Occupancy", _RefOccupancy)
        m.setattr(G, "_largest_node", lambda nodes: max((len(v) for v in nodes.values()), default=0))
        m.setattr(G.GandivaPolicy, "_may_act", _ref_may_act)
        ref_seen, ref = run(_RefSimulator)
    assert sum(len(d) for _, d in ref_seen) > 100 and fast.preemptions and fast.packs and fast.migrations
    assert len(fast_seen) == len(ref_seen)
    for (t1, d1), (t2, d2) in zip(fast_seen, ref_seen):
        assert t1 == t2 and d1 == d2, f"at {t1}: {d1} != {d2}"
    assert fast.per_job == ref.per_job
    assert (fast.gpu_utilization, fast.gpu_allocation) == (ref.gpu_utilization, ref.gpu_allocation)


def test_precheck_sees_a_device_shared_by_running_jobs() -> None:
    """Two RUNNING jobs on one device (a state a live view may show): the pre-check must let
    the pack be judged, as the scan of every device did."""
    from microco.services.scheduler.policy import ClusterView, JobView

    devs = (DeviceView("n0/0", "n0"), DeviceView("n0/1", "n0"), DeviceView("n1/0", "n1"))
    jobs = (
        JobView("big", 2, state=JobPhase.RUNNING, devices=("n0/0", "n0/1")),
        JobView(
            "a", 1, state=JobPhase.RUNNING, devices=("n1/0",), minibatch_ms=30.0, minibatch_ms_alone=10.0
        ),
        JobView(
            "b", 1, state=JobPhase.RUNNING, devices=("n1/0",), minibatch_ms=30.0, minibatch_ms_alone=10.0
        ),
    )
    view = ClusterView(now=1000.0, devices=devs, jobs=jobs)
    pol = make_policy("gandiva")
    assert pol._may_act(view, 3) and pol.decide(view)
    alone = ClusterView(now=1000.0, devices=devs, jobs=jobs[:2])
    assert not pol._may_act(alone, 3) and pol.decide(alone) == []


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"slice_order": "round_robin"},
        {"slice_packs": False, "pack_observe_s": 30.0},
        {"finish_grace_s": 60.0, "max_jobs_per_device": 3},
    ],
)
def test_holder_table_decides_as_the_views(monkeypatch, opts) -> None:
    """gandiva reading the simulator's HolderTable (wake-ups, time-slice victims, pack
    slots, spread jobs) decides as it does from plain views, under non-default options
    too. (Read from any size here; by default only from ``table_min_rows`` holders on.)"""
    monkeypatch.setattr(G.GandivaPolicy, "table_min_rows", 0)
    trace = _trace(80, 5)
    cluster = ClusterSpec.for_gpus(16, 8, ("v100", "p100"))

    def run(sim_type):
        log = _Log(make_policy("gandiva", **opts))
        r = sim_type(log, trace, cluster, perf=PERF, check_invariants=False).run()
        return log.seen, r

    fast_seen, fast = run(Simulator)
    ref_seen, ref = run(_RefSimulator)
    assert fast.preemptions and fast.packs
    assert fast_seen == ref_seen
    assert fast.per_job == ref.per_job


def test_occupancy_free_by_node_kept_per_node() -> None:
    """``Occupancy.free_by_node`` rescans only the nodes changed since the last one it
    built (session 28): after any sequence of take / release it equals a full scan, and a
    dict handed out earlier is not changed."""
    from microco.services.scheduler.policy._state import Occupancy

    rng = random.Random(7)
    devs = tuple(DeviceView(f"n{n}/{i}", f"n{n}") for n in range(12) for i in range(4))
    view = ClusterView(now=0.0, devices=devs, jobs=())
    occ = Occupancy(view)
    held: dict[str, tuple[str, ...]] = {}
    for step in range(400):
        if held and rng.random() < 0.45:
            jid = rng.choice(sorted(held))
            occ.release(jid, held.pop(jid))
        else:
            jid = f"j{step}"
            held[jid] = tuple(rng.sample([d.id for d in devs], rng.choice((1, 1, 2, 4))))
            occ.take(jid, held[jid])
        if rng.random() < 0.5:
            before = occ.free_by_node()
            snapshot = {n: list(v) for n, v in before.items()}
            assert before == _RefOccupancy._free_by_node_of(occ)
            occ.take("probe", (devs[rng.randrange(len(devs))].id,))
            occ.release("probe", [d.id for d in devs])
            assert before == snapshot  # (a dict handed out is never changed)
    assert occ.free_by_node() == _RefOccupancy._free_by_node_of(occ)
