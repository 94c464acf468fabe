"""`microco job submit -q` prints only the id (for `JOB=$(...)`), and `microco job logs -f` on a
job that is still queued waits for it to start instead of failing with "no node keeps a log", and
one placed on a node whose log is not there yet waits for the log (while the job has not ended)."""

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


class _LateLog:
    """Agents whose log of the job appears after ``missing`` asks."""

    def __init__(self, missing: int) -> None:
        self.missing = missing
        self.asked = 0

    def __call__(self, kv: Any, timeout_s: float) -> _LateLog:
        return self

    def open_log(self, job_id: str, **kw: Any) -> Any:
        from microco.common.errors import NotFound

        self.asked += 1
        if self.asked <= self.missing:
            raise NotFound(f"no node keeps a log of job {job_id}")
        return "n1", SimpleNamespace(attempt=1, attempts=[1], data=b"hello\n"), iter(())


def _placed(monkeypatch: pytest.MonkeyPatch, answers: list[Any], agents: _LateLog) -> _Scheduler:
    import microco.clients.agent as agent_mod

    sched = _Scheduler(answers)
    monkeypatch.setattr(job_cli, "_kv", lambda args: object())
    monkeypatch.setattr(job_cli, "_client", lambda args, kv=None: sched)
    monkeypatch.setattr(job_cli.time, "sleep", lambda s: None)
    monkeypatch.setattr(agent_mod, "AgentDirectory", agents)
    return sched


def test_follow_waits_for_the_log_of_a_job_placed_but_not_yet_started_on_its_node(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Found by the docs' first-job test on a loaded machine: the scheduler had named the job's
    node, the node had not created the log yet, and `job logs -f` failed with NotFound."""
    running = _job(scheduler_pb2.JOB_STATE_RUNNING, node="n1")
    agents = _LateLog(missing=3)
    _placed(monkeypatch, [running], agents)
    assert main(["job", "logs", "-f", "j-1"]) == 0
    out = capsys.readouterr()
    assert out.out == "hello\n" and "waiting for its log" in out.err and agents.asked == 4


def test_follow_of_an_ended_job_without_a_log_fails_at_once(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    agents = _LateLog(missing=100)
    _placed(monkeypatch, [_job(scheduler_pb2.JOB_STATE_FINISHED, node="n1")], agents)
    assert main(["job", "logs", "-f", "j-1"]) != 0
    assert "no node keeps a log" in capsys.readouterr().err and agents.asked == 1


def test_follow_of_a_job_that_ends_while_its_log_is_missing_asks_once_more_then_fails(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    agents = _LateLog(missing=100)
    answers = [
        _job(scheduler_pb2.JOB_STATE_RUNNING, node="n1"),
        _job(scheduler_pb2.JOB_STATE_FAILED, node="n1"),
    ]
    _placed(monkeypatch, answers, agents)
    assert main(["job", "logs", "-f", "j-1"]) != 0
    assert "no node keeps a log" in capsys.readouterr().err and agents.asked == 2


def test_without_follow_a_missing_log_fails_at_once(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    agents = _LateLog(missing=100)
    _placed(monkeypatch, [_job(scheduler_pb2.JOB_STATE_RUNNING, node="n1")], agents)
    assert main(["job", "logs", "j-1"]) != 0
    assert agents.asked == 1
