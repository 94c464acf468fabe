"""An operator's suspend or migrate sent before the job's process has finished its first
mini-batch is held, recorded, until that first boundary, then carried out; it is not refused
(the console and CLI answer at once, and a refusal would only show in the job's message).
A fake agent: no processes."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

from _support import put_node

from microco.clients.agent import AgentDirectory
from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore, _operator
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._record import OperatorRequest

PY = [sys.executable, "-c", "pass"]


class FakeAgents:
    """The real node directory; control calls recorded, and the process parks at once."""

    def __init__(self, real):
        self.nodes = real.nodes
        self.sent: list[str] = []

    def control(self, address, job_id, action, devices=None):
        self.sent.append(action)
        return SimpleNamespace(control_seq=len(self.sent))


def running_job_without_a_minibatch():
    kv = MemoryKV()
    put_node(kv, "n1", devices=2)
    core = SchedulerCore(kv, _policy())
    core.io.agents = FakeAgents(AgentDirectory(kv))
    core.io.nodes = core.agents.nodes()
    core.io.address = lambda node: "127.0.0.1:1"  # type: ignore[method-assign]
    rec = core.submit({"command": PY, "devices": 1, "name": "j"})
    rec = replace(rec, state=J.RUNNING, node="n1", devices=("n1/0",), attempt=1)
    rec = replace(rec, operator=OperatorRequest("suspend", (), 0, 1.0))
    core.store.jobs = {rec.id: rec}
    core.store.save = core.store.keep  # type: ignore[method-assign]
    proc = SimpleNamespace(
        attempt=1, first_step_at=0.0, seq_done=0, state="running", checkpoint_step=0, step=0
    )
    core.io.procs = {"n1": {rec.id: proc}}
    core.io.wait_proc = lambda rec, ok: SimpleNamespace(  # type: ignore[method-assign]
        state="running", checkpoint_step=3, step=3, seq_done=1
    )
    return core, rec.id, proc


def _policy():
    from microco.services.scheduler.policy import make_policy

    return make_policy("gandiva")


def test_a_suspend_before_the_first_minibatch_waits_for_it_then_is_carried_out():
    core, jid, proc = running_job_without_a_minibatch()
    rec = _operator.carry_out(core.actions, core.store.jobs[jid], 2.0)
    assert rec.operator is not None and rec.operator.action == "suspend"  # still recorded
    assert core.agents.sent == []  # nothing sent to a process with no boundary yet
    assert "waits for the job's first mini-batch boundary" in rec.message
    assert not any("refused" in h.message for h in rec.history)
    again = _operator.carry_out(core.actions, rec, 3.0)
    assert again == rec  # waiting: no change, nothing to write

    proc.first_step_at = 4.0  # the hook reported its first mini-batch
    rec = _operator.carry_out(core.actions, rec, 5.0)
    assert core.agents.sent == ["suspend"]
    assert rec.operator is None and rec.held
    assert rec.state == J.SUSPENDED


def test_a_job_found_to_run_without_the_hook_has_its_waiting_suspend_refused():
    core, jid, _proc = running_job_without_a_minibatch()
    rec = replace(core.store.jobs[jid], no_hook=True)
    core.store.jobs[jid] = rec
    rec = _operator.carry_out(core.actions, rec, 2.0)
    assert rec.operator is None and core.agents.sent == []
    assert any(
        "operator suspend refused" in h.message and "without the scheduler's hook" in h.message
        for h in rec.history
    )
