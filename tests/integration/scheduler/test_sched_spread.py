"""A multi-device job spread over two node agents when no node has room (one PyTorch process
per node, gloo), restarted from its checkpoint when one rank is killed, and consolidated onto
one node by the gandiva policy's Migrate once a node has room, continuing from the step it
left."""

from __future__ import annotations

import json
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.agent import AgentDirectory
from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
from microco.common import channel_for
from microco.services.scheduler._local import spawn_scheduler, stop_process

pytestmark = [
    pytest.mark.integration,
    pytest.mark.torch,
    pytest.mark.slow,
]  # two agents, three restarts of torch ranks

STEPS = 600


def need(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def test_spread_job_is_consolidated_and_continues(agents, etcd_endpoint, etcd_kv, tmp_path):
    need("torch")
    # Warm zygotes on n1 and n2 (started side by side): the ranks of the first two attempts are
    # forked from them instead of four processes importing torch (n3's are started the ordinary
    # way: the policy consolidates onto it as soon as it registers, before a zygote is warm).
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda node: agents(node, devices=1, preload="auto"), ["n1", "n2"]))
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="gandiva",
        policy_config={
            "allow_spread": True,
            "quantum_s": 1000,
            "enable_packing": False,
            "enable_grow_shrink": False,
        },
        tick_s=0.2,
        kv=etcd_kv,
        log_path=tmp_path / "scheduler.log",
    )
    d = AgentDirectory(etcd_kv)
    try:
        c = SchedulerClient(channel_for(etcd_kv, "scheduler"))
        out = tmp_path / "out.json"
        cmd = [
            sys.executable,
            "-m",
            "microco.examples.torch_digits",
            "--steps",
            str(STEPS),
            "--step-sleep-ms",
            "15",
            "--out",
            str(out),
        ]
        env = {"MICROCO_CHECKPOINT_EVERY_S": "0.5"}
        j = c.submit(make_spec(cmd, devices=2, name="wide", total_steps=STEPS, env=env)).id
        # No node has two devices: one process per node, both training (gloo all-reduce).
        wait_for(lambda: job_to_dict(c.get(j))["step"] >= 30, etcd_kv, 120, "spread job trains")
        rec = etcd_kv.get_json(f"/microco/scheduler/jobs/{j}")
        assert rec["state"] == "running" and sorted(rec["devices"]) == ["n1/0", "n2/0"], rec
        assert [r["node"] for r in rec["ranks"]] in (["n1", "n2"], ["n2", "n1"])
        ranks = {}
        for node in ("n1", "n2"):
            procs = [p for p in d.list_processes(d.nodes()[node]["address"]) if p.job_id == j]
            assert len(procs) == 1 and procs[0].attempt == 1 and procs[0].step >= 20
            ranks[node] = procs[0]
        # kill -9 of the rank that is not rank 0: the other rank is stopped (it would wait in
        # an all-reduce forever) and the job restarts, spread again, from rank 0's checkpoint.
        other = rec["ranks"][1]["node"]
        wait_for(lambda: job_to_dict(c.get(j))["checkpoint_step"] > 0, etcd_kv, 120, "a checkpoint")
        os.kill(ranks[other].pid, signal.SIGKILL)
        wait_for(
            lambda: (
                (r := etcd_kv.get_json(f"/microco/scheduler/jobs/{j}"))["attempt"] == 2
                and r["state"] == "running"
            ),
            etcd_kv,
            120,
            "restarted after a rank was killed",
        )
        rec = etcd_kv.get_json(f"/microco/scheduler/jobs/{j}")
        assert rec["restarts"] == 1 and len(rec["ranks"]) == 2, rec
        assert any(f"rank process on {other} killed by signal 9" in h[2] for h in rec["history"]), rec[
            "history"
        ]
        first = rec["ranks"][0]["node"]
        p0 = wait_for(
            lambda: [
                p
                for p in d.list_processes(d.nodes()[first]["address"])
                if p.job_id == j and p.attempt == 2 and p.job_state
            ],
            etcd_kv,
            120,
            "rank 0 restored",
        )[0]
        assert p0.restored_from_step > 0
        wait_for(
            lambda: job_to_dict(c.get(j))["step"] > p0.restored_from_step + 10, etcd_kv, 120, "trains again"
        )
        # A node with room for the whole job appears: the policy consolidates it there.
        agents("n3", devices=2)
        wait_for(lambda: job_to_dict(c.get(j))["node"] == "n3", etcd_kv, 120, "consolidated onto n3")
        rec = etcd_kv.get_json(f"/microco/scheduler/jobs/{j}")
        # (the whole history in the message: a list is cut short in pytest's report)
        assert any(h[1] == "migrating" and "consolidate" in h[2] for h in rec["history"]), "\n".join(
            map(str, rec["history"])
        )
        assert rec["ranks"] == [] and sorted(rec["devices"]) == ["n3/0", "n3/1"] and rec["attempt"] == 3
        left_at = rec["checkpoint_step"]
        # it trained on after its restore before it moved (a bound of 30 steps here was a
        # figure of the machine's speed: 28 in a CI run of 2026-12-03)
        assert left_at > p0.restored_from_step
        p = wait_for(
            lambda: [
                p for p in d.list_processes(d.nodes()["n3"]["address"]) if p.job_id == j and p.job_state
            ],
            etcd_kv,
            120,  # a torch start-up and the checkpoint's load on n3: 30 s was missed beside the suite
            "restored on n3",
        )[0]
        assert p.restored_from_step == left_at  # continued from the step it left
        wait_for(lambda: job_to_dict(c.get(j))["state"] == "finished", etcd_kv, 240, "finished")
        result = json.loads(out.read_text())
        assert result["restored_from_step"] == left_at and len(result["losses"]) == STEPS
        assert job_to_dict(c.get(j))["step"] == STEPS
    finally:
        d.close()
        stop_process(sched)
