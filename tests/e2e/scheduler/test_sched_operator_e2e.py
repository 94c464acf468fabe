"""``microco job suspend|resume|migrate|resize`` as an operator runs them, against a real
scheduler (gandiva) and two node agents: each command carried out at a mini-batch boundary,
a held job left alone by the policy, and a clear error for a transition the job's state does
not allow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _support import wait_for_jobs as wait_for

from microco.services.scheduler._local import spawn_agent, spawn_scheduler, stop_process

pytestmark = pytest.mark.e2e


def microco(etcd, *args, check=True):
    env = {**os.environ, "MICROCO_ETCD": etcd}
    r = subprocess.run(
        [sys.executable, "-m", "microco.cli", *args],
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"microco {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def rec(kv, j):
    return kv.get_json(f"/microco/scheduler/jobs/{j}")


def test_operator_suspends_resumes_migrates_and_resizes(etcd_endpoint, etcd_kv, tmp_path):
    agents = [
        spawn_agent(etcd_endpoint, n, tmp_path / n, devices=2, kv=etcd_kv, checkpoint_root=tmp_path / "ckpt")
        for n in ("n1", "n2")
    ]
    config = tmp_path / "policy.json"
    config.write_text(json.dumps({"quantum_s": 1000, "enable_packing": False, "enable_grow_shrink": False}))
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="gandiva",
        tick_s=0.2,
        kv=etcd_kv,
        extra_args=["--policy-config", str(config)],  # a file
    )
    try:
        job = [
            sys.executable,
            "-m",
            "microco.examples.synthetic_job",
            "--compute-ms",
            "1",
            "--io-ms",
            "9",  # mostly waiting: two busy loops until cancelled would take both cores
            "--steps",
            "100000",
        ]
        a = json.loads(microco(etcd_endpoint, "job", "submit", "--name", "a", "--json", "--", *job).stdout)[
            "id"
        ]
        e = json.loads(
            microco(etcd_endpoint, "job", "submit", "--name", "e", "--elastic", "--json", "--", *job).stdout
        )["id"]
        for j in (a, e):
            wait_for(lambda j=j: rec(etcd_kv, j)["step"] > 5, etcd_kv, 60, f"{j} trains")

        r = microco(etcd_endpoint, "job", "resume", a, check=False)
        assert r.returncode == 1 and f"cannot resume job {a}: it is running, not suspended" in r.stderr, (
            r.stderr
        )
        assert "Traceback" not in r.stderr

        microco(etcd_endpoint, "job", "suspend", a)
        wait_for(lambda: rec(etcd_kv, a)["state"] == "suspended", etcd_kv, 30, "suspended by the operator")
        assert rec(etcd_kv, a)["held"] is True
        r = microco(etcd_endpoint, "job", "suspend", a, check=False)
        assert r.returncode == 1 and "it is suspended, not running" in r.stderr, r.stderr

        r = microco(etcd_endpoint, "job", "resize", a, "2", check=False)  # (not elastic, nor running)
        assert r.returncode == 1 and f"cannot resize job {a}" in r.stderr, r.stderr

        # the elastic job grows onto a free device of its node (the held job's devices are
        # free, and the policy, with devices free for a while now, still leaves it suspended)
        microco(etcd_endpoint, "job", "resize", e, "2")
        wait_for(lambda: len(rec(etcd_kv, e)["devices"]) == 2, etcd_kv, 30, "resized to 2")
        assert rec(etcd_kv, a)["state"] == "suspended"
        assert any(
            h[2].startswith("resized from 1 to 2 devices: operator: resize")
            for h in rec(etcd_kv, e)["history"]
        )

        microco(etcd_endpoint, "job", "resume", a)
        wait_for(lambda: rec(etcd_kv, a)["state"] == "running", etcd_kv, 30, "resumed")
        assert rec(etcd_kv, a)["held"] is False
        # and shrinks back onto the device it names (freeing one on its node for the move)
        first = rec(etcd_kv, e)["devices"][0]
        microco(etcd_endpoint, "job", "resize", e, "--devices", first)
        wait_for(lambda: rec(etcd_kv, e)["devices"] == [first], etcd_kv, 30, "resized back to 1")
        here = rec(etcd_kv, a)["node"]
        there = "n2" if here == "n1" else "n1"
        target = next(
            f"{there}/{i}"
            for i in range(2)
            if f"{there}/{i}" not in {d for j in (a, e) for d in rec(etcd_kv, j)["devices"]}
        )
        step = rec(etcd_kv, a)["step"]
        microco(etcd_endpoint, "job", "migrate", a, "--devices", target)
        wait_for(
            lambda: (r := rec(etcd_kv, a))["node"] == there and r["state"] == "running" and r["step"] > step,
            etcd_kv,
            60,
            "migrated and training",
        )
        assert rec(etcd_kv, a)["devices"] == [target]

        r = microco(etcd_endpoint, "job", "migrate", a, "--devices", "n9/0", check=False)
        assert r.returncode == 1 and "not in the cluster" in r.stderr, r.stderr
        microco(etcd_endpoint, "job", "cancel", a, e)
    finally:
        stop_process(sched)
        for p in agents:
            stop_process(p)
