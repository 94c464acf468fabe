"""``microco job`` as a user runs it, against a real scheduler, node agent and training job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

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


def test_submit_list_show_cancel(etcd_endpoint, etcd_kv, tmp_path):
    agent = spawn_agent(etcd_endpoint, "e2e", tmp_path / "agent", devices=1, kv=etcd_kv)
    sched = spawn_scheduler(etcd_endpoint, tmp_path / "sched", policy="fifo", tick_s=0.2, kv=etcd_kv)
    try:
        # mostly waiting: the long job below would otherwise busy a core until it is cancelled
        job = [sys.executable, "-m", "microco.examples.synthetic_job", "--compute-ms", "1", "--io-ms", "4"]
        r = microco(
            etcd_endpoint,
            "job",
            "submit",
            "--name",
            "short",
            "--total-steps",
            "30",
            "--wait",
            "--json",
            "--",
            *job,
            "--steps",
            "30",
        )
        done = json.loads(r.stdout)
        assert done["state"] == "finished" and done["step"] == 30
        r = microco(
            etcd_endpoint, "job", "submit", "--name", "long", "--json", "--", *job, "--steps", "100000"
        )
        long_id = json.loads(r.stdout)["id"]
        deadline = time.monotonic() + 120
        while (
            json.loads(microco(etcd_endpoint, "job", "show", long_id, "--json").stdout)["state"] != "running"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        listed = microco(etcd_endpoint, "job", "list").stdout
        assert "short" in listed or done["id"] in listed
        assert long_id in listed and "running" in listed
        shown = microco(etcd_endpoint, "job", "show", long_id).stdout
        assert "history:" in shown and "running" in shown
        microco(etcd_endpoint, "job", "cancel", long_id)
        deadline = time.monotonic() + 60
        while (
            json.loads(microco(etcd_endpoint, "job", "show", long_id, "--json").stdout)["state"]
            != "cancelled"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        # Bad input: clear errors, non-zero exit.
        r = microco(etcd_endpoint, "job", "submit", "--devices", "5", "--", *job, check=False)
        assert r.returncode == 1 and "cluster has 1" in r.stderr
        r = microco(etcd_endpoint, "job", "show", "no-such-job", check=False)
        assert r.returncode == 1 and "no job" in r.stderr
        nodes = json.loads(microco(etcd_endpoint, "job", "nodes", "--json").stdout)
        assert nodes["policy"] == "fifo" and [d["id"] for d in nodes["devices"]] == ["e2e/0"]
    finally:
        stop_process(sched)
        stop_process(agent)
