"""Node agents as real processes: registration under a lease, launch, control, migration
between two agents, exits, and jobs dying with a killed agent."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import grpc
import pytest
from _support import issued

from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
from microco.clients.agent import NODES_PREFIX
from microco.common.channel import dial

pytestmark = pytest.mark.integration

JOB = [sys.executable, "-m", "microco.examples.synthetic_job", "--compute-ms", "2", "--io-ms", "8"]


def stub(kv, node):
    rec = kv.get_json(NODES_PREFIX + node)
    # as the scheduler: the one identity a node agent starts and signals processes for
    return agent_pb2_grpc.NodeAgentServiceStub(dial(rec["address"], identity=issued("service:scheduler")))


def wait_proc(s, job_id, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        procs = {p.job_id: p for p in s.ListProcesses(agent_pb2.ListProcessesRequest(), timeout=5).processes}
        p = procs.get(job_id)
        if p is not None and pred(p):
            return p
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id}: {p}")
        time.sleep(0.05)


def test_register_start_control_migrate(agents, etcd_kv, tmp_path):
    agents("n1")
    agents("n2")
    rec = etcd_kv.get_json(NODES_PREFIX + "n1")
    assert [d["id"] for d in rec["devices"]] == ["n1/0", "n1/1"] and rec["devices"][0]["kind"] == "virtual"
    a1, a2 = stub(etcd_kv, "n1"), stub(etcd_kv, "n2")
    assert a1.GetNode(agent_pb2.GetNodeRequest()).name == "n1"

    # Bad input: unknown device, missing command.
    with pytest.raises(grpc.RpcError) as e:
        a1.StartProcess(agent_pb2.StartProcessRequest(job_id="x", command=["true"], device_ids=["n2/0"]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        a1.StartProcess(
            agent_pb2.StartProcessRequest(job_id="x", command=["/no/such/cmd"], device_ids=["n1/0"])
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not found" in e.value.details()

    out = tmp_path / "out.json"
    cmd = JOB + ["--steps", "150", "--out", str(out)]
    st = a1.StartProcess(
        agent_pb2.StartProcessRequest(job_id="j1", command=cmd, device_ids=["n1/1"], attempt=1)
    )
    assert st.pid > 0 and st.state == agent_pb2.PROCESS_STATE_RUNNING
    p = wait_proc(a1, "j1", lambda p: p.step >= 10)
    assert p.minibatch_ms > 0 and p.first_step_at > 0
    with open(f"/proc/{p.pid}/environ", "rb") as f:
        env = f.read().split(b"\0")
    assert b"MICROCO_DEVICES=n1/1" in env and b"MICROCO_ATTEMPT=1" in env
    assert os.sched_getaffinity(p.pid) == {sorted(os.sched_getaffinity(0))[1 % len(os.sched_getaffinity(0))]}

    # Suspend parks it at a boundary; resume continues.
    c = a1.ControlProcess(agent_pb2.ControlProcessRequest(job_id="j1", control=agent_pb2.CONTROL_SUSPEND))
    p = wait_proc(a1, "j1", lambda p: p.seq_done >= c.control_seq)
    assert p.job_state == "parked" and p.checkpoint_step == p.step
    time.sleep(0.2)
    assert wait_proc(a1, "j1", lambda p: True).step == p.step
    a1.ControlProcess(agent_pb2.ControlProcessRequest(job_id="j1", control=agent_pb2.CONTROL_RESUME))
    wait_proc(a1, "j1", lambda p: p.step > p.checkpoint_step + 3)

    # Checkpoint-and-move: stop on n1 (exit 75), start on n2 from the shared checkpoint.
    a1.ControlProcess(agent_pb2.ControlProcessRequest(job_id="j1", control=agent_pb2.CONTROL_STOP))
    p = wait_proc(a1, "j1", lambda p: p.state == agent_pb2.PROCESS_STATE_EXITED)
    assert p.exit_code == 75
    left_at = p.checkpoint_step
    a2.StartProcess(agent_pb2.StartProcessRequest(job_id="j1", command=cmd, device_ids=["n2/0"], attempt=2))
    q = wait_proc(a2, "j1", lambda p: p.state == agent_pb2.PROCESS_STATE_EXITED, timeout=60)
    assert q.exit_code == 0 and q.restored_from_step == left_at and q.step == 150
    result = json.loads(out.read_text())
    assert result["restored_from_step"] == left_at

    # Same digest as an uninterrupted run.
    ref = tmp_path / "ref.json"
    import subprocess

    subprocess.run(
        [*JOB[:3], "--steps", "150", "--compute-ms", "0", "--out", str(ref)],
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")},
    )
    assert json.loads(ref.read_text())["digest"] == result["digest"]


def test_failed_job_and_killed_agent(agents, etcd_kv, tmp_path):
    agent = agents("n3", lease_ttl_s=3)  # (killed: its record must lapse)
    a = stub(etcd_kv, "n3")
    a.StartProcess(
        agent_pb2.StartProcessRequest(
            job_id="bad", command=JOB + ["--steps", "50", "--fail-at", "3"], device_ids=["n3/0"]
        )
    )
    p = wait_proc(a, "bad", lambda p: p.state == agent_pb2.PROCESS_STATE_EXITED)
    assert p.exit_code == 3 and "exited with 3" in p.message

    a.StartProcess(
        agent_pb2.StartProcessRequest(job_id="long", command=JOB + ["--steps", "100000"], device_ids=["n3/1"])
    )
    pid = wait_proc(a, "long", lambda p: p.step > 2).pid
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()
    # The job dies with its agent (no orphan keeps a device busy) and the node record expires.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        pytest.fail("job outlived its agent")
    deadline = time.monotonic() + 60
    while etcd_kv.get(NODES_PREFIX + "n3") is not None:
        assert time.monotonic() < deadline, "node record outlived the agent's lease"
        time.sleep(0.1)
