"""A node agent's followed logs are shared out per caller (session 42's held-out round): the agent
followed at most four logs at once, whoever asked, so one user following four logs of their own
jobs had every other user's and the console's ``job logs --follow`` refused for as long as those
jobs ran. Now one user or job follows at most ``MAX_FOLLOWED_LOGS_PER_CALLER``, of a larger
total; the servicer is driven directly, with the callers' certificates in its contexts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _support import issued

from microco.api.agent.v1 import agent_pb2
from microco.common.errors import ResourceExhausted
from microco.common.kv import MemoryKV
from microco.services.agent import _service
from microco.services.agent._devices import discover_devices
from microco.services.agent._procs import ProcessManager
from microco.services.agent._service import NodeAgentServicer
from microco.services.runtime.auth import JOB_RECORDS_PREFIX


def _context(who: str) -> Any:
    pem = issued(who).cert_pem
    return SimpleNamespace(
        is_active=lambda: True,
        auth_context=lambda: {"x509_pem_cert": [pem], "transport_security_type": [b"ssl"]},
    )


def test_one_user_following_logs_leaves_others_theirs(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 1), tmp_path / "ckpt")
    kv = MemoryKV()
    for job, owner in (("a-1", "alice"), ("b-1", "bob")):
        log = tmp_path / "agent" / "jobs" / job / "attempt-1.log"
        log.parent.mkdir(parents=True)
        log.write_bytes(f"{job} runs\n".encode())
        kv.put_json(JOB_RECORDS_PREFIX + job, {"spec": {"user": owner}})
    pm.is_running = lambda job_id, attempt: True  # both jobs run on: their logs may grow
    servicer = NodeAgentServicer(SimpleNamespace(procs=pm, node="n", kv=kv))
    alice, bob = _context("user:alice"), _context("user:bob")
    follow = agent_pb2.ReadLogRequest(job_id="a-1", follow=True)
    held = []
    with pytest.raises(ResourceExhausted) as refused:
        for _ in range(100):  # alice follows her job's log until the agent says no more
            held.append(servicer.ReadLog(follow, alice))
            assert next(held[-1]).data == b"a-1 runs\n"  # this follower now holds its slot
    assert "user:alice already follows" in str(refused.value)
    assert len(held) - 1 == getattr(_service, "MAX_FOLLOWED_LOGS_PER_CALLER", None)
    # bob follows his own job's log all the same
    theirs = servicer.ReadLog(agent_pb2.ReadLogRequest(job_id="b-1", follow=True), bob)
    assert next(theirs).data == b"b-1 runs\n"
    theirs.close()
    held.pop().close()  # (the refused one)
    held.pop().close()  # one of alice's followers leaves: she may follow again
    assert next(servicer.ReadLog(follow, alice)).data == b"a-1 runs\n"
