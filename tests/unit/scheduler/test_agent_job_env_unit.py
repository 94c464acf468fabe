"""What a job's process starts with: a bare ``python``/``python3`` is the platform's interpreter
(where microco is installed), another interpreter named by path is left alone, and the job's
environment carries the platform's addresses, its id and its devices, under what its spec asks."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from microco.services.agent import ProcessManager, discover_devices
from microco.services.agent._procs import job_command, job_environment

PLATFORM = {"MICROCO_ETCD": "127.0.0.1:23790", "MICROCO_REDIS": "redis://127.0.0.1:63790/0"}
PRINT_ENV = (
    "import json, os, sys; import microco; "
    "print(json.dumps({'python': sys.executable, 'env': dict(os.environ)}))"
)


def _run(pm: ProcessManager, job_id: str, command: list[str], env: dict[str, str] | None = None) -> dict:
    proc = pm.start(job_id, command, env or {}, ["n/0"])
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    out = proc.log_path.read_text()
    assert proc.exit_code == 0, out
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessManager:
    # The agent as `microco up` starts it from a shell whose PATH does not hold the platform's
    # virtualenv (what `make demo` does): a bare `python` on that PATH is some other interpreter.
    here = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != here]
    monkeypatch.setenv("PATH", os.pathsep.join(path or ["/usr/bin", "/bin"]))
    monkeypatch.delenv("MICROCO_ETCD", raising=False)
    monkeypatch.delenv("MICROCO_REDIS", raising=False)
    pm = ProcessManager(
        tmp_path / "agent",
        discover_devices("n", 1),
        pin_cpus=False,
        platform_env={**PLATFORM, "MICROCO_NODE": "n"},
    )
    yield pm
    pm.shutdown()


@pytest.mark.parametrize("python", ["python", "python3"])
def test_a_bare_python_is_the_platforms_interpreter(manager: ProcessManager, python: str) -> None:
    seen = _run(manager, f"job-{python}", [python, "-c", PRINT_ENV])  # imports microco
    assert os.path.realpath(seen["python"]) == os.path.realpath(sys.executable)


def test_the_job_is_told_the_platform_its_id_and_devices(manager: ProcessManager) -> None:
    env = _run(manager, "job-env", ["python", "-c", PRINT_ENV])["env"]
    assert env["MICROCO_ETCD"] == PLATFORM["MICROCO_ETCD"]
    assert env["MICROCO_REDIS"] == PLATFORM["MICROCO_REDIS"]
    assert env["MICROCO_NODE"] == "n"
    assert env["MICROCO_JOB_ID"] == "job-env"
    assert env["MICROCO_DEVICES"] == "n/0"
    assert env["MICROCO_CHECKPOINT_DIR"] and env["MICROCO_CONTROL_DIR"]


def test_the_jobs_own_env_wins(manager: ProcessManager) -> None:
    env = _run(manager, "job-own", ["python", "-c", PRINT_ENV], {"MICROCO_ETCD": "elsewhere:2379", "X": "1"})[
        "env"
    ]
    assert env["MICROCO_ETCD"] == "elsewhere:2379" and env["X"] == "1"
    assert env["MICROCO_REDIS"] == PLATFORM["MICROCO_REDIS"]


def test_an_interpreter_named_by_path_is_left_alone() -> None:
    assert job_command(["/opt/venv/bin/python", "train.py"], python="/p/bin/python") == [
        "/opt/venv/bin/python",
        "train.py",
    ]
    assert job_command(["python3.11", "train.py"], python="/p/bin/python") == ["python3.11", "train.py"]
    assert job_command(["bash", "-c", "python x.py"], python="/p/bin/python")[0] == "bash"
    assert job_command(["python", "-m", "m"], python="/p/bin/python") == ["/p/bin/python", "-m", "m"]


def test_platform_addresses_skip_empty_values() -> None:
    env = job_environment({"A": "1"}, {"MICROCO_ETCD": "", "MICROCO_REDIS": "r"}, {}, python="")
    assert "MICROCO_ETCD" not in env and env["MICROCO_REDIS"] == "r" and env["A"] == "1"


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the platform is not in a virtualenv here")
def test_the_platforms_virtualenv_comes_first_on_path(manager: ProcessManager) -> None:
    # so that a `python` inside the job's own scripts (bash -c "python ...") is the platform's too
    env = _run(manager, "job-path", ["python", "-c", PRINT_ENV])["env"]
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
