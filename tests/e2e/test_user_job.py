"""A user's own job works out of the box: after `microco up` started the way `make demo` starts
it (the platform's venv not on PATH), `microco job submit -- python -m ...` runs with the
platform's interpreter, and the job is told where the platform is, its id and its devices, so
the client libraries inside it find etcd with no flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # a whole stack and two real jobs (~40 s)

MICROCO = [sys.executable, "-m", "microco.cli"]

PROBE = (
    "import json, os, sys\n"
    "from microco.common import find_etcd\n"
    "from microco.clients.scheduler import SchedulerClient\n"
    "found = find_etcd()\n"
    "with SchedulerClient.from_etcd() as c:\n"
    "    me = c.get(os.environ['MICROCO_JOB_ID']).id\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith(('MICROCO_', 'CUDA_'))}\n"
    "print('PROBE ' + json.dumps({'python': sys.executable, 'env': env, 'found': found.source, 'me': me}))\n"
)


def _user_env(tmp_path: Path) -> dict[str, str]:
    here = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("MICROCO_ETCD", "MICROCO_REDIS")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != here)
    env["MICROCO_HOME"] = str(tmp_path / "home")
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MICROCO, *args], env=env, check=False, capture_output=True, text=True, timeout=timeout
    )


def _wait_ended(env: dict[str, str], job_id: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + scaled(timeout)
    # One `job logs -f` (it returns when the job's process ends) rather than a `job show` every
    # half second meanwhile: a CLI process costs ~0.5 CPU-s, and a job's torch start-up on a
    # loaded machine took dozens of them. Then `job show` until the scheduler records the end.
    _cli(env, "job", "logs", "-f", job_id, timeout=timeout)
    while time.monotonic() < deadline:
        job = json.loads(_cli(env, "job", "show", job_id, "--json").stdout)
        if job["state"] in ("finished", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"{job_id} did not end")


def test_a_users_job_runs_with_the_platform(tmp_path: Path) -> None:
    env = _user_env(tmp_path)
    up = _cli(env, "up", "--detach", "--no-console", "--no-standby", "--devices", "2", "--store-nodes", "3")
    assert up.returncode == 0, up.stderr[-3000:]
    state = json.loads((tmp_path / "home" / "stack.json").read_text())
    try:
        sub = _cli(
            env,
            "job",
            "submit",
            "-q",
            "--devices",
            "1",
            "--",
            "python",
            "-m",
            "microco.examples.torch_digits",
            "--steps",
            "60",
        )
        assert sub.returncode == 0, sub.stderr
        digits = sub.stdout.strip()
        probe = _cli(env, "job", "submit", "-q", "--devices", "1", "--", "python3", "-c", PROBE)
        assert probe.returncode == 0, probe.stderr
        probe_id = probe.stdout.strip()

        job = _wait_ended(env, digits)
        logs = _cli(env, "job", "logs", digits).stdout
        assert job["state"] == "finished" and job["step"] == 60, (job, logs)
        assert "step 60/60: loss" in logs and "No module named" not in logs

        job = _wait_ended(env, probe_id)
        logs = _cli(env, "job", "logs", "--home", env["MICROCO_HOME"], probe_id).stdout
        assert job["state"] == "finished", (job, logs)
        seen = json.loads(next(line for line in logs.splitlines() if line.startswith("PROBE "))[6:])
        assert os.path.realpath(seen["python"]) == os.path.realpath(sys.executable)
        assert seen["env"]["MICROCO_ETCD"] == state["etcd"] and seen["found"] == "MICROCO_ETCD"
        assert seen["env"]["MICROCO_REDIS"] == state["redis"]
        assert seen["env"]["MICROCO_JOB_ID"] == probe_id == seen["me"]
        devices = seen["env"]["MICROCO_DEVICES"].split(",")
        assert len(devices) == 1 and devices[0].startswith(job["node"] + "/"), (devices, job["node"])
    finally:
        down = _cli(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert f"stopped {len(state['processes'])} processes" in down.stderr, down.stderr
