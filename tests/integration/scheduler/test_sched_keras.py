"""The examples under the full scheduler: a Keras job and a PyTorch job submitted to a real
scheduler and node agent (with its warm zygote) share one virtual device by time-slicing, each
suspended and resumed in place at mini-batch boundaries, and each ends with exactly the losses
and parameters of an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from microco.clients.agent import AgentDirectory
from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
from microco.common import channel_for
from microco.services.scheduler._local import spawn_agent, spawn_scheduler, stop_process


def need(module: str) -> None:
    """Skip without the framework, found without importing it (TensorFlow's import alone
    takes 15 s: the job processes pay it, the test process need not)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.tensorflow, pytest.mark.torch]

TORCH_STEPS = 300


def test_keras_and_torch_jobs_time_sliced_by_the_scheduler_are_exact(
    etcd_endpoint, etcd_kv, tmp_path, keras_reference
):
    need("tensorflow")
    need("torch")
    steps = keras_reference.steps  # its result comes later: the TF start-ups overlap
    torch_cmd = [sys.executable, "-m", "microco.examples.torch_digits", "--steps", str(TORCH_STEPS)]
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    torch_ref = subprocess.Popen(
        [*torch_cmd, "--out", str(tmp_path / "torch-ref.json")], env={**clean_env, "OMP_NUM_THREADS": "1"}
    )
    agent = spawn_agent(
        etcd_endpoint,
        "k1",
        tmp_path / "agent",
        devices=1,
        kv=etcd_kv,
        preload="auto",
        wait_warm=True,
        log_path=tmp_path / "agent.log",
    )
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="gandiva",
        policy_config={
            "quantum_s": 1.0,
            # Round robin rather than least-attained-service first: the Keras job is charged
            # its TensorFlow start-up as service, and would otherwise wait that long to resume.
            "slice_order": "round_robin",
            "enable_packing": False,
            "enable_migration": False,
            "enable_grow_shrink": False,
        },
        tick_s=0.2,
        kv=etcd_kv,
        log_path=tmp_path / "scheduler.log",
    )
    d = AgentDirectory(etcd_kv)
    try:
        c = SchedulerClient(channel_for(etcd_kv, "scheduler"))
        keras_cmd = [sys.executable, "-m", "microco.examples.keras_digits", "--steps", str(steps)]
        k = c.submit(
            make_spec(
                [*keras_cmd, "--step-sleep-ms", "60", "--out", str(tmp_path / "keras.json")],
                devices=1,
                name="keras",
                env={"TF_CPP_MIN_LOG_LEVEL": "3"},
                total_steps=steps,
            )
        ).id
        t = c.submit(
            make_spec(
                [*torch_cmd, "--step-sleep-ms", "10", "--out", str(tmp_path / "torch.json")],
                devices=1,
                name="torch",
                total_steps=TORCH_STEPS,
            )
        ).id
        forked: dict[str, bool] = {}
        address = d.nodes()["k1"]["address"]
        deadline = time.monotonic() + 240
        while not all(job_to_dict(c.get(j))["state"] in ("finished", "failed") for j in (k, t)):
            assert time.monotonic() < deadline, "jobs did not finish"
            for p in d.list_processes(address):
                if p.job_state:
                    forked[p.job_id] = p.forked
            time.sleep(0.2)
        recs = {
            name: etcd_kv.get_json(f"/microco/scheduler/jobs/{j}") for name, j in (("keras", k), ("torch", t))
        }
        story = "\n".join(
            f"{name} +{h[0] - r['submitted_at']:.2f}s {h[1]}: {h[2]}"
            for name, r in recs.items()
            for h in r["history"]
        )
        for r in recs.values():
            states = [h[1] for h in r["history"]]
            assert r["state"] == "finished", story
            # Time-sliced: suspended and resumed at least once, sharing the device.
            assert states.count("suspended") >= 1 and states.count("running") >= 2, story
            # Resumed in place from park each time: one process, never restarted.
            assert r["attempt"] == 1 and r["restarts"] == 0, story
        # Both started by fork from the agent's warm zygote (torch preloaded; Keras imports TF).
        assert forked == {k: True, t: True}, forked
        assert torch_ref.wait(120) == 0
        for got, ref in (
            (tmp_path / "keras.json", keras_reference.result()),
            (tmp_path / "torch.json", json.loads((tmp_path / "torch-ref.json").read_text())),
        ):
            res = json.loads(got.read_text())
            assert len(res["losses"]) == ref["steps"] and res["steps"] == ref["steps"]
            assert res["losses"] == ref["losses"]  # bit for bit, every step
            assert res["params_sha256"] == ref["params_sha256"]
    finally:
        d.close()
        stop_process(sched)
        stop_process(agent)
        if torch_ref.poll() is None:
            torch_ref.kill()
            torch_ref.wait()
