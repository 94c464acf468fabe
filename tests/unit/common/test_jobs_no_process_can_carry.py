"""A job no process can be started with (session 42's held-out round): a NUL byte in an argument,
an environment value or the working directory, an environment name that is empty or holds '='.
The scheduler took such a job; the agent's exec then raised ``ValueError``, answered as INTERNAL,
which the scheduler takes for the node's fault: the job went back to the queue and was started
again, and failed again, every tick, with a traceback in the agent's log each time. It is now
refused at submission, and the agent refuses it as the job's own error (InvalidArgument: the
scheduler then fails the job instead of retrying)."""

from __future__ import annotations

from pathlib import Path

import pytest

from microco.common.errors import InvalidArgument
from microco.services.agent._devices import discover_devices
from microco.services.agent._procs import ProcessManager
from microco.services.scheduler._jobs import validate_spec

BAD = (
    {"command": ["sleep", "1\0"]},
    {"env": {"A": "x\0y"}},
    {"env": {"A=B": "1"}},
    {"env": {"": "1"}},
    {"env": {"A\0": "1"}},
    {"workdir": "/tmp\0x"},
)


@pytest.mark.parametrize("bad", BAD, ids=lambda b: repr(b))
def test_the_scheduler_refuses_what_no_process_can_carry(bad):
    spec = {"name": "t", "command": ["sleep", "1"], "devices": 1, **bad}
    with pytest.raises(InvalidArgument, match="NUL|env names"):
        validate_spec(spec, None, check_command=False)


def test_the_agent_refuses_it_as_the_jobs_own_error(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 1), tmp_path / "ckpt", pin_cpus=False)
    try:
        for bad in BAD:
            if bad == {"env": {"": "1"}}:
                continue  # (an exec takes it: only the scheduler refuses it)
            command = bad.get("command", ["sleep", "1"])
            with pytest.raises(InvalidArgument):
                pm.start(
                    "j-1", list(command), dict(bad.get("env", {})), ["n/0"], workdir=bad.get("workdir", "")
                )
        assert pm.list() == []
        assert validate_spec(
            {"name": "t", "command": ["sleep", "1"], "devices": 1, "env": {"A": "1=2"}}, None
        )
    finally:
        pm.shutdown()
