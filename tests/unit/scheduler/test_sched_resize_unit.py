"""The mechanism's side of growth that must pay: a grow records the mini-batch time before
it, the time measured wholly after it reaches the policy, an undo caps the job's size, and
every resize is in the job's history (fake agent: no processes)."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

from _support import put_node

from microco.clients.agent import AgentDirectory
from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._record import GrowTrial
from microco.services.scheduler.policy import Resize, make_policy

PY = [sys.executable, "-c", "pass"]


class FakeAgents:
    """The node directory of the real one; control calls recorded instead of sent."""

    def __init__(self, real):
        self.nodes = real.nodes
        self.sent = []
        self.seq = 0

    def control(self, address, job_id, action, devices=None):
        self.seq += 1
        self.sent.append((action, list(devices or [])))
        return SimpleNamespace(control_seq=self.seq)


def core_with_running_elastic_job():
    kv = MemoryKV()
    put_node(kv, "n1", devices=4)
    core = SchedulerCore(kv, make_policy("gandiva"))
    core.io.agents = FakeAgents(AgentDirectory(kv))
    core.io.nodes = core.agents.nodes()
    core.io.address = lambda node: "127.0.0.1:1"  # type: ignore[method-assign]
    rec = core.submit({"command": PY, "devices": 1, "name": "e", "elastic": True})
    rec = replace(
        rec,
        state=J.RUNNING,
        node="n1",
        devices=("n1/0",),
        minibatch_ms=10.0,
        step=100,
        step_at_change=0,
        settled_ms=(0, 10.0),
    )
    core.store.jobs = {rec.id: rec}  # what a tick reads from the store
    core.store.save = core.store.keep  # type: ignore[method-assign]  # (the compare-and-set is not tested)
    return core, rec.id


def test_grow_then_undo_is_recorded_and_caps_the_size():
    core, jid = core_with_running_elastic_job()
    assert core.actions.apply(Resize(jid, ("n1/0", "n1/1"), "gandiva: grow onto idle devices"), 10.0)
    rec = core.store.jobs[jid]
    assert rec.grow_trial == GrowTrial(("n1/0",), 10.0, at_step=100)  # (no trend measured: none)
    assert core.agents.sent[-1] == ("resize", ["n1/0", "n1/1"])
    view = next(j for j in core._view(11.0).jobs if j.id == jid)
    assert (
        view.grown_from == ("n1/0",) and view.minibatch_ms_before_grow == 10.0 and view.grown_at_step == 100
    )
    assert view.minibatch_ms_settled is None  # the 10 ms was measured before the change
    # measured on two devices (what the reconciler stores once 25 mini-batches ran since the change)
    core.store.keep(replace(rec, pending=None, settled_ms=(rec.step_at_change, 14.8)))
    view = next(j for j in core._view(20.0).jobs if j.id == jid)
    assert view.minibatch_ms_settled == 14.8
    decisions = core.policy.decide(core._view(20.0))
    (undo,) = [d for d in decisions if isinstance(d, Resize)]
    assert undo.devices == ("n1/0",) and "undo grow" in undo.reason
    assert core.actions.apply(undo, 21.0)
    rec = core.store.jobs[jid]
    assert rec.max_useful_devices == 2 and rec.grow_trial is None
    resizes = [h for h in rec.history if h.message.startswith("resized")]
    assert [h.message.split(":")[0] for h in resizes] == [
        "resized from 1 to 2 devices",
        "resized from 2 to 1 devices",
    ]


def test_a_migration_in_place_is_in_the_history():
    from microco.services.scheduler.policy import Migrate

    core, jid = core_with_running_elastic_job()
    assert core.actions.apply(Migrate(jid, ("n1/3",), "operator: migrate"), 10.0)
    rec = core.store.jobs[jid]
    assert core.agents.sent[-1] == ("resume", ["n1/3"]) and rec.devices == ("n1/3",)
    assert (rec.history[-1].state, rec.history[-1].message) == (
        "running",
        "migrated in place onto n1/3 (same node, re-pinned): operator: migrate",
    )
