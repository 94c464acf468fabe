"""The live scheduler across hosts (network namespaces, tests/_netns.py): etcd and the scheduler
on host ``ctl``, a node agent with two virtual devices on each of hosts ``b`` and ``c``, a
checkpoint root both reach. Two jobs are placed; the operator suspends and resumes one and
migrates it to the other host; then that host is cut off the network. Its agent stops its
jobs before its lease expires (fencing), the scheduler sees the node lost and resumes every
job of it on the other host from its last checkpoint, and leaves the other host's jobs alone:
no job failed, none restarted from scratch. Skipped, with the reason, where network
namespaces cannot be made (no root, no iproute2)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from _netns import NetnsBed, unavailable
from _support import wait_for_jobs, wait_until

from microco.clients.agent import NODES_PREFIX, AgentDirectory
from microco.clients.scheduler import SchedulerClient, make_spec
from microco.common import channel_for
from microco.common.discovery import pid_alive
from microco.common.kv import EtcdKV
from microco.common.registry import discover
from microco.services.stack import EtcdServer

pytestmark = pytest.mark.integration

TTL = 6  # the agents' lease (s): they fence at 0.75 of it after the last confirmed keep-alive, and
# their jobs are dead 0.125 of it (0.75 s) before it can expire: a margin a loaded CI host
# keeps (with 3 s, one run killed 0.33 s after the expiry)
JOBS = "/microco/scheduler/jobs/"
# a mini-batch of 2 ms of CPU and 8 ms of input wait; steps enough never to finish here
JOB = [sys.executable, "-m", "microco.examples.synthetic_job", "--compute-ms", "2", "--io-ms", "8"]
JOB += ["--steps", "1000000"]
EVERY = {"MICROCO_CHECKPOINT_EVERY_S": "0.2"}  # periodic checkpoints: a lost host leaves one
POLICY = {"quantum_s": 1000, "enable_packing": False, "enable_grow_shrink": False, "enable_migration": False}


@pytest.fixture
def bed():
    why = unavailable()
    if why:
        pytest.skip(f"no multi-host test bed here: {why}")
    with NetnsBed(["ctl", "b", "c"]) as b:
        yield b


def _kv(endpoint):
    try:
        return EtcdKV(endpoint, timeout=1.0)
    except Exception:  # noqa: BLE001 - not up yet
        return None


def _service(module: str, *args: str) -> list[str]:
    common = ["--metrics-port", "-1", "--log-format", "text", "--log-level", "warning"]
    return [sys.executable, "-m", module, *args, *common]


def test_scheduler_places_moves_and_survives_a_host_cut_off(bed, tmp_path):
    ctl = bed.addr("ctl")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def log(name):
        return open(tmp_path / f"{name}.log", "ab")

    # etcd serves mutual TLS as the stack's does (a certificate for host ctl's address).
    etcd = EtcdServer(tmp_path / "etcd", host=ctl, port=2379, peer_port=2380).command()
    bed.popen("ctl", etcd, stdout=log("etcd"), stderr=-2)
    endpoint = f"{ctl}:2379"
    # The agents and the scheduler start while etcd does (each waits for it).
    for h in ("b", "c"):
        agent = _service(
            "microco.services.agent", "--etcd", endpoint, "--node", h, "--host", bed.addr(h),
            "--data-dir", str(tmp_path / h), "--virtual-devices", "2",
            "--checkpoint-root", str(tmp_path / "shared-checkpoints"),
            "--node-lease-ttl-s", str(TTL), "--preload", "none",
        )  # fmt: skip
        bed.popen(h, agent, stdout=log(f"agent-{h}"), stderr=-2, env=env)
    sched = _service(
        "microco.services.scheduler", "--etcd", endpoint, "--host", ctl, "--data-dir",
        str(tmp_path / "sched"), "--policy", "gandiva", "--policy-config", json.dumps(POLICY),
        "--tick-s", "0.2", "--lease-ttl-s", "2",
    )  # fmt: skip
    bed.popen("ctl", sched, stdout=log("scheduler"), stderr=-2, env=env)
    kv = wait_until(lambda: _kv(endpoint), 20, "etcd on host ctl")

    def rec(j):
        return kv.get_json(JOBS + j)

    def wait(cond, timeout, what):
        return wait_for_jobs(cond, kv, timeout, what)

    wait(lambda: all(kv.get(NODES_PREFIX + h) for h in "bc"), 30, "agents on b and c")
    # The election is won before the instance registers its address (it registers once its
    # gRPC server listens), so wait for both: the leader key alone raced the dial below in CI.
    wait(lambda: kv.get("/microco/leader/scheduler"), 30, "a scheduler leader on ctl")
    wait(lambda: discover(kv, "scheduler"), 30, "the scheduler registered on ctl")
    nodes = AgentDirectory(kv).nodes()
    assert {h: nodes[h]["address"].rsplit(":", 1)[0] for h in "bc"} == {h: bed.addr(h) for h in "bc"}
    client = SchedulerClient(channel_for(kv, "scheduler"))
    ids = [client.submit(make_spec(JOB, devices=1, name=f"j{i}", env=EVERY)).id for i in (1, 2)]
    j1, j2 = ids
    wait(lambda: all((r := rec(j)) and r["state"] == "running" and r["step"] > 5 for j in ids), 30, "placed")

    # the operator suspends j1 (it is held, its device kept or freed by the policy) and resumes it
    client.control(j1, "suspend")
    wait(lambda: rec(j1)["state"] == "suspended", 20, "j1 suspended")
    at = rec(j1)["step"]
    client.control(j1, "resume")
    wait(lambda: (r := rec(j1))["state"] == "running" and r["step"] > at + 5, 20, "j1 resumed and training")

    # ... and moves it to the other host
    here = rec(j1)["node"]
    there = "c" if here == "b" else "b"
    taken = {d for j in ids for d in rec(j)["devices"]}
    target = next(d for d in (f"{there}/0", f"{there}/1") if d not in taken)
    at = rec(j1)["step"]
    client.control(j1, "migrate", devices=[target])
    wait(
        lambda: (r := rec(j1))["node"] == there and r["state"] == "running" and r["step"] > at,
        30,
        "j1 migrated to the other host and training",
    )
    assert rec(j1)["devices"] == [target]

    # Cut host ``there`` (j1's, and j2's if it was placed there) off the network.
    victim, survivor = there, here
    before = {j: rec(j) for j in ids}
    lost = [j for j in ids if before[j]["node"] == victim]
    kept = [j for j in ids if before[j]["node"] == survivor]
    directory = AgentDirectory(kv)
    procs = {p.job_id: p for p in directory.list_processes(directory.nodes()[victim]["address"])}
    pids = [procs[j].pid for j in lost]
    bed.cut(victim)
    cut_at = time.monotonic()
    dead_at = gone_at = None
    while time.monotonic() - cut_at < 3 * TTL and (dead_at is None or gone_at is None):
        if dead_at is None and not any(pid_alive(p) for p in pids):
            dead_at = time.monotonic()
        if gone_at is None and kv.get(NODES_PREFIX + victim) is None:
            gone_at = time.monotonic()
        time.sleep(0.02)
    assert dead_at is not None, f"the jobs on the cut-off host {victim} were never stopped"
    assert gone_at is not None, f"host {victim}'s node record outlived its lease"
    assert dead_at < gone_at, (
        f"jobs stopped {dead_at - cut_at:.2f}s after the cut, lease gone {gone_at - cut_at:.2f}s"
    )

    # The scheduler resumes every job of the lost host on the survivor, from its checkpoint.
    for j in lost:
        r = wait(
            lambda j=j: (r := rec(j))["node"] == survivor and r["state"] == "running" and r["step"] > 0 and r,
            30,
            f"{j} resumed on {survivor}",
        )
        assert r["attempt"] == before[j]["attempt"] + 1
        assert any(f"node {victim} was lost" in h[2] for h in r["history"]), r["history"]
        p = wait(
            lambda j=j, a=r["attempt"]: [
                p
                for p in directory.list_processes(directory.nodes()[survivor]["address"])
                if p.job_id == j and p.attempt == a and p.job_state
            ],
            20,
            f"{j}'s new process reporting",
        )[0]
        # nothing lost: it went on from (at least) the last checkpoint the scheduler knew of
        assert p.restored_from_step >= before[j]["checkpoint_step"] > 0
    for j in kept:  # the other host's jobs were not touched
        r = rec(j)
        assert r["state"] == "running" and r["node"] == survivor and r["attempt"] == before[j]["attempt"]
    assert all(rec(j)["state"] == "running" for j in ids)
    for j in ids:
        client.cancel(j)
    directory.close()
    kv.close()
