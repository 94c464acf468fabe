"""A job migrated to another node restarts there only once that node's cache server reports
the job's working set warm (``/microco/cache/warm/<job>``), or ``warm_wait_s`` after its
checkpoint when no report comes (and not at all with no cache server registered on the new
node); the job's history says which. A real ``SchedulerCore`` over ``MemoryKV`` with fake
agents (the process checkpoints and exits at once); each tick's reconciliation looks again,
never blocking (the live tests are in ``tests/integration/codesign/test_codesign_live.py``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

from _support import put_node

from microco.clients.agent import AgentDirectory
from microco.clients.cache import report_warm, warm_report
from microco.clients.scheduler import EXIT_CHECKPOINTED, read_phases
from microco.common.kv import MemoryKV
from microco.common.registry import ServiceRecord
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._nodes import EXITED
from microco.services.scheduler.policy import make_policy

PY = [sys.executable, "-c", "pass"]


class FakeAgents:
    """The real node directory; control, start and stop recorded."""

    def __init__(self, real):
        self.nodes = real.nodes
        self.sent: list[tuple[str, str]] = []

    def control(self, address, job_id, action, devices=None):
        self.sent.append((action, address))
        return SimpleNamespace(control_seq=len(self.sent))

    def start(self, address, job_id, command, env, devices, workdir, attempt):
        self.sent.append(("start", address))

    def stop(self, address, job_id):
        self.sent.append(("stop", address))


def _moved(wait_s: float = 5.0, cache_on_n2: bool = True):
    """A job running on n1, migrated by the scheduler to n2 (where a cache server is registered,
    unless told otherwise): its process checkpointed and exited."""
    kv = MemoryKV()
    put_node(kv, "n1", devices=1)
    put_node(kv, "n2", devices=1)
    if cache_on_n2:
        cache = ServiceRecord("cache", "cache-n2", "n2:2", labels={"node": "n2"})
        kv.put(cache.key, cache.to_json())
    core = SchedulerCore(kv, make_policy("gandiva"), warm_wait_s=wait_s)
    core.io.agents = FakeAgents(AgentDirectory(kv))
    core.io.nodes = core.agents.nodes()
    core.io.address = lambda node: f"{node}:1"  # type: ignore[method-assign]
    rec = core.submit({"command": PY, "devices": 1, "name": "j"})
    rec = replace(rec, state=J.RUNNING, node="n1", devices=("n1/0",), attempt=1)
    core.store.jobs = {rec.id: rec}
    core.store.save = core.store.keep  # type: ignore[method-assign]
    exited = SimpleNamespace(
        attempt=1, state=EXITED, exit_code=EXIT_CHECKPOINTED, checkpoint_step=7, step=7, first_step_at=1.0,
        seq_done=1, job_state="", minibatch_ms=0.0, started_at=1.0,
    )  # fmt: skip
    core.io.wait_proc = lambda rec, ok: exited  # type: ignore[method-assign]
    report_warm(kv, rec.id, "n2", 9)  # a report from an earlier move: not this one's
    core.actions.move(rec, ["n2/0"], 100.0, "operator")
    core.io.procs = {"n1": {rec.id: exited}, "n2": {}}
    return core, kv, rec.id


def _tick(core, job_id, now):
    rec = core.reconciler.reconcile(core.store.jobs[job_id], now, 0.0)
    core.store.jobs[job_id] = rec
    return rec


def _said(rec, words):
    return any(words in h.message for h in rec.history)


def test_the_restart_waits_for_the_new_hosts_cache_to_report_the_job_warm():
    core, kv, job = _moved()
    assert warm_report(kv, job) is None  # the move forgot the old report
    assert read_phases(kv)[job].target == "n2"  # the new host's cache is told to warm
    rec = core.store.jobs[job]
    assert ("start", "n2:1") not in core.agents.sent
    assert rec.state == J.MIGRATING and rec.pending is not None and rec.pending.op == "warm"
    assert _said(rec, "waiting for the cache on n2 to warm")
    rec = _tick(core, job, 101.0)  # no report yet: still waiting, nothing started
    assert rec.pending is not None and rec.pending.op == "warm"
    assert ("start", "n2:1") not in core.agents.sent
    report_warm(kv, job, "n1", 5)  # another host's report does not count
    rec = _tick(core, job, 102.0)
    assert ("start", "n2:1") not in core.agents.sent
    report_warm(kv, job, "n2", 5)
    rec = _tick(core, job, 103.0)
    assert core.agents.sent[-1] == ("start", "n2:1")
    assert rec.state == J.RUNNING and rec.node == "n2" and rec.devices == ("n2/0",) and rec.attempt == 2
    assert _said(rec, "cache on n2 warm after")
    assert not _said(rec, "went on without a warm cache")


def test_with_no_report_the_job_restarts_after_the_deadline_and_says_so():
    core, _kv, job = _moved(wait_s=4.0)
    rec = _tick(core, job, 103.9)
    assert rec.state == J.MIGRATING and ("start", "n2:1") not in core.agents.sent
    rec = _tick(core, job, 104.0)
    assert core.agents.sent[-1] == ("start", "n2:1") and rec.state == J.RUNNING and rec.node == "n2"
    assert _said(rec, "went on without a warm cache on n2 after 4.0 s")


def test_a_failed_warm_lets_the_job_go_on_at_once():
    core, kv, job = _moved()
    report_warm(kv, job, "n2", 0, "its dataset is not known to the cache servers")
    rec = _tick(core, job, 100.5)
    assert core.agents.sent[-1] == ("start", "n2:1") and rec.state == J.RUNNING
    assert _said(rec, "cache on n2 could not warm (its dataset is not known")


def test_with_no_wait_set_the_job_restarts_at_once():
    core, _kv, job = _moved(wait_s=0.0)
    rec = core.store.jobs[job]
    assert core.agents.sent[-1] == ("start", "n2:1") and rec.state == J.RUNNING
    assert not _said(rec, "warm")


def test_with_no_cache_server_on_the_new_node_the_job_restarts_at_once():
    core, _kv, job = _moved(cache_on_n2=False)
    rec = core.store.jobs[job]
    assert core.agents.sent[-1] == ("start", "n2:1") and rec.state == J.RUNNING
    assert _said(rec, "no cache server on n2: restarting without waiting")
