"""`microco job submit -q` prints only the id (for `JOB=$(...)`), and `microco job logs -f` on a
job that is still queued waits for it to start instead of failing with "no node keeps a log"."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from microco.api.scheduler.v1 import scheduler_pb2
from microco.cli import job as job_cli
from microco.cli import main


def _job(state: int, node: str = "") -> Any:
    return scheduler_pb2.Job(id="j-1", state=state, node=node, spec=scheduler_pb2.JobSpec(name="j"))


class _Scheduler:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.asked = 0
        self.submitted: list[Any] = []

    def get(self, job_id: str) -> Any:
        self.asked += 1
        return self.answers[min(self.asked - 1, len(self.answers) - 1)]

    def submit(self, spec: Any) -> Any:
        self.submitted.append(spec)
        return _job(scheduler_pb2.JOB_STATE_QUEUED)


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> _Scheduler:
    sched = _Scheduler(
        [
            _job(scheduler_pb2.JOB_STATE_QUEUED),
            _job(scheduler_pb2.JOB_STATE_QUEUED),
            _job(scheduler_pb2.JOB_STATE_RUNNING, node="n1"),
        ]
    )
    monkeypatch.setattr(job_cli, "_kv", lambda args: object())
    monkeypatch.setattr(job_cli, "_client", lambda args, kv=None: sched)
    monkeypatch.setattr(job_cli.time, "sleep", lambda s: None)
    return sched


def test_follow_waits_for_a_queued_job(
    scheduler: _Scheduler, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import microco.clients.agent as sched_mod

    opened: dict[str, Any] = {}

    class Agents:
        def __init__(self, kv: Any, timeout_s: float) -> None:
            pass

        def open_log(self, job_id: str, **kw: Any) -> Any:
            opened.update(kw, job_id=job_id)
            first = SimpleNamespace(attempt=1, attempts=[1], data=b"hello\n")
            return "n1", first, iter([SimpleNamespace(data=b"bye\n")])

    monkeypatch.setattr(sched_mod, "AgentDirectory", Agents)
    assert main(["job", "logs", "-f", "j-1"]) == 0
    out = capsys.readouterr()
    assert out.out == "hello\nbye\n" and "queued; waiting for it to start" in out.err
    assert opened["first_node"] == "n1" and opened["follow"] is True and scheduler.asked == 3


def test_submit_quiet_prints_only_the_id(scheduler: _Scheduler, capsys) -> None:
    assert main(["job", "submit", "-q", "--devices", "1", "--", "python", "t.py"]) == 0
    assert capsys.readouterr().out == "j-1\n"
    assert list(scheduler.submitted[0].command) == ["python", "t.py"]
