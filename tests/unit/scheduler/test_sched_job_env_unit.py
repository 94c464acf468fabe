"""What a started job's process is told about itself besides its credentials: the run's declared
length (``total_steps``) as ``$MICROCO_TOTAL_STEPS``, which the compiler's exploration reads
(issue 18); the job's own environment wins. A fake agent: no processes."""

from __future__ import annotations

import sys

from _support import put_node

from microco.clients.agent import AgentDirectory
from microco.clients.scheduler import ENV_TOTAL_STEPS
from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler.policy import make_policy

PY = [sys.executable, "-c", "pass"]


class RecordingAgents:
    """The real node directory; each start's environment recorded instead of a process."""

    def __init__(self, real):
        self.nodes = real.nodes
        self.started: dict[str, dict[str, str]] = {}

    def start(self, address, job_id, command, env, devices, workdir, attempt):
        self.started[job_id] = dict(env)


def _started_env(spec: dict) -> dict[str, str]:
    kv = MemoryKV()
    put_node(kv, "n1", devices=1)
    core = SchedulerCore(kv, make_policy("gandiva"))
    agents = RecordingAgents(AgentDirectory(kv))
    core.io.agents = agents
    core.io.nodes = agents.nodes()
    core.io.address = lambda node: "127.0.0.1:1"  # type: ignore[method-assign]
    rec = core.submit({"command": PY, "devices": 1, "name": "j", **spec})
    core.store.jobs = {rec.id: rec}
    core.store.save = core.store.keep  # type: ignore[method-assign]
    core.actions.start_process(rec, ["n1/0"], 1.0, "placed")
    return agents.started[rec.id]


def test_a_jobs_declared_length_reaches_its_process():
    assert _started_env({"total_steps": 5000})[ENV_TOTAL_STEPS] == "5000"


def test_an_undeclared_length_is_not_made_up():
    assert ENV_TOTAL_STEPS not in _started_env({})


def test_the_jobs_own_environment_wins():
    env = _started_env({"total_steps": 5000, "env": {ENV_TOTAL_STEPS: "300"}})
    assert env[ENV_TOTAL_STEPS] == "300"
