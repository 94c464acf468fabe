"""Across hosts (network namespaces, tests/_netns.py): etcd on one host, node agents on two
others, each with its own address. Host b is cut off the network while it runs a job: its agent
stops the job before its lease can expire (fencing), the job moves to host c from the shared
checkpoint and finishes there, and when b's link comes back its agent registers again under a
new epoch, with nothing of the job running on it. Skipped, with the reason, where network
namespaces cannot be made (no root, no iproute2)."""

from __future__ import annotations

import os
import sys
import time

import grpc
import pytest
from _netns import NetnsBed, unavailable
from _support import issued, wait_until

from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
from microco.clients.agent import NODES_PREFIX
from microco.common.channel import dial
from microco.common.discovery import pid_alive
from microco.common.kv import EtcdKV
from microco.services.stack import EtcdServer

pytestmark = pytest.mark.integration

TTL = 3  # the agents' lease (s): they fence at 0.75 of it after the last confirmed keep-alive
JOB = [sys.executable, "-m", "microco.examples.synthetic_job", "--compute-ms", "2", "--io-ms", "8"]


@pytest.fixture
def bed():
    why = unavailable()
    if why:
        pytest.skip(f"no multi-host test bed here: {why}")
    with NetnsBed(["ctl", "b", "c"]) as b:
        yield b


def _procs(stub, job_id):
    got = {p.job_id: p for p in stub.ListProcesses(agent_pb2.ListProcessesRequest(), timeout=5).processes}
    return got.get(job_id)


def test_a_host_cut_off_fences_its_job_which_moves_to_another_host(bed, tmp_path):
    ctl = bed.addr("ctl")
    # etcd serves mutual TLS as the stack's does (a certificate for its address, from the
    # session's CA); the command is built here and run inside host ctl's namespace.
    etcd_cmd = EtcdServer(tmp_path / "etcd", host=ctl, port=2379, peer_port=2380).command()
    bed.popen("ctl", etcd_cmd, stdout=open(tmp_path / "etcd.log", "ab"), stderr=-2)
    kv = wait_until(lambda: _kv(f"{ctl}:2379"), timeout=20, what="etcd on host ctl")
    ckpt = tmp_path / "shared-checkpoints"  # storage every host reaches
    for h in ("b", "c"):
        agent = [
            sys.executable, "-m", "microco.services.agent", "--etcd", f"{ctl}:2379", "--node", h,
            "--host", bed.addr(h), "--data-dir", str(tmp_path / h), "--virtual-devices", "1",
            "--checkpoint-root", str(ckpt), "--node-lease-ttl-s", str(TTL), "--metrics-port", "-1",
            "--preload", "none", "--log-format", "text", "--log-level", "warning",
        ]  # fmt: skip
        bed.popen(h, agent, stdout=open(tmp_path / f"agent-{h}.log", "ab"), stderr=-2, env=_env())
    recs = {
        h: wait_until(lambda h=h: kv.get_json(NODES_PREFIX + h), timeout=30, what=f"agent {h}") for h in "bc"
    }
    assert recs["b"]["address"].startswith(bed.addr("b") + ":") and recs["c"]["address"].startswith(
        bed.addr("c")
    )
    epoch_b = recs["b"]["epoch"]
    assert epoch_b
    # Only the scheduler may start processes on an agent: the test acts as it.
    scheduler = issued("service:scheduler")
    sb, sc = (agent_pb2_grpc.NodeAgentServiceStub(dial(recs[h]["address"], identity=scheduler)) for h in "bc")

    out = tmp_path / "out.json"
    cmd = JOB + ["--steps", "400", "--out", str(out)]
    every = {"MICROCO_CHECKPOINT_EVERY_S": "0.2"}  # periodic checkpoints: a fenced job leaves one
    sb.StartProcess(
        agent_pb2.StartProcessRequest(job_id="j1", command=cmd, env=every, device_ids=["b/0"], attempt=1)
    )
    p = wait_until(
        lambda: (q := _procs(sb, "j1")) and q.step >= 30 and q, timeout=30, what="j1 stepping on b"
    )
    pid_b = p.pid

    # Cut b off: its agent cannot reach etcd; its lease expires in etcd TTL s after the last
    # keep-alive etcd got, and the job must be dead before then.
    bed.cut("b")
    cut_at = time.monotonic()
    dead_at = gone_at = None
    while time.monotonic() - cut_at < 3 * TTL and (dead_at is None or gone_at is None):
        if dead_at is None and not pid_alive(pid_b):
            dead_at = time.monotonic()
        if gone_at is None and kv.get(NODES_PREFIX + "b") is None:
            gone_at = time.monotonic()
        time.sleep(0.02)
    assert dead_at is not None, "the job on the cut-off host was never stopped"
    assert gone_at is not None, "host b's node record outlived its lease"
    assert dead_at < gone_at, (
        f"job stopped {dead_at - cut_at:.2f}s after the cut, lease gone at {gone_at - cut_at:.2f}s"
    )

    # What a scheduler does for a lost node: the job moves to host c, from the shared checkpoint.
    sc.StartProcess(
        agent_pb2.StartProcessRequest(job_id="j1", command=cmd, env=every, device_ids=["c/0"], attempt=2)
    )
    q = wait_until(
        lambda: (q := _procs(sc, "j1")) and q.state == agent_pb2.PROCESS_STATE_EXITED and q,
        timeout=60,
        what="j1 on c",
    )
    assert q.exit_code == 0 and q.step == 400 and q.restored_from_step > 0

    # b comes back: registered again under a new epoch, and nothing of j1 runs there.
    bed.heal("b")
    rec = wait_until(
        lambda: (r := kv.get_json(NODES_PREFIX + "b")) and r["epoch"] != epoch_b and r,
        timeout=20,
        what="b rejoins",
    )
    assert rec["epoch"] and not pid_alive(pid_b)
    # A fresh channel: the old one to b is in gRPC's reconnect back-off after the cut.
    sb = agent_pb2_grpc.NodeAgentServiceStub(dial(rec["address"], identity=scheduler))
    back = wait_until(lambda: _answers(sb, "j1"), timeout=30, what="b's agent answers again")
    assert back[0] is None or back[0].state == agent_pb2.PROCESS_STATE_EXITED
    kv.close()


def _answers(stub, job_id):
    """``(process or None,)`` once the agent answers, else None (to retry)."""
    try:
        return (_procs(stub, job_id),)
    except grpc.RpcError:
        return None


def _kv(endpoint):
    try:
        return EtcdKV(endpoint, timeout=1.0)
    except Exception:  # noqa: BLE001 - not up yet
        return None


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1"}
