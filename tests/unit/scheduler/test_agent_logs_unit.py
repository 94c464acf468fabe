"""The node agent keeps each attempt's log: where its last lines begin, which attempts a job
has, and which of an ended job's data garbage collection keeps (its logs) or deletes."""

from __future__ import annotations

from pathlib import Path

import pytest

from microco.common.errors import InvalidArgument
from microco.services.agent import ProcessManager, discover_devices
from microco.services.agent._procs import tail_offset


@pytest.mark.parametrize(
    "text,lines,expected",
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 1, b"c"),  # a last line without its newline is a line
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),  # fewer lines than asked: all of it
        (b"", 5, b""),
        (b"\n\n\n", 2, b"\n\n"),  # empty lines count
    ],
)
def test_tail_offset(tmp_path: Path, text: bytes, lines: int, expected: bytes) -> None:
    p = tmp_path / "log"
    p.write_bytes(text)
    assert text[tail_offset(p, lines) :] == expected


def test_tail_offset_across_blocks(tmp_path: Path) -> None:
    p = tmp_path / "log"
    body = b"".join(f"line {i}\n".encode() for i in range(5000))
    p.write_bytes(body)
    for n in (1, 7, 1000, 4999, 5000):
        assert body[tail_offset(p, n, block=100) :].count(b"\n") == n
    assert body[tail_offset(p, 3, block=100) :] == b"line 4997\nline 4998\nline 4999\n"


def _manager_with_job_data(tmp_path: Path) -> ProcessManager:
    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 1), tmp_path / "ckpt")
    for job in ("ended", "gone"):
        job_dir = tmp_path / "agent" / "jobs" / job
        (job_dir / "attempt-2").mkdir(parents=True)  # the control directory of the last attempt
        (job_dir / "attempt-1.log").write_text("first\n")
        (job_dir / "attempt-2.log").write_text("second\n")
        (tmp_path / "ckpt" / job).mkdir(parents=True)
        (tmp_path / "ckpt" / job / "checkpoint").write_bytes(b"x" * 100)
    return pm


def test_log_files_by_attempt(tmp_path: Path) -> None:
    pm = _manager_with_job_data(tmp_path)
    logs = pm.log_files("ended")
    assert sorted(logs) == [1, 2] and logs[2].read_text() == "second\n"
    assert pm.log_files("never-ran") == {}
    with pytest.raises(InvalidArgument):
        pm.log_files("../ended")
    assert not pm.is_running("ended", 2)


def test_garbage_collection_keeps_an_ended_jobs_logs_only(tmp_path: Path) -> None:
    pm = _manager_with_job_data(tmp_path)
    deleted, freed = pm.collect_garbage(keep=set(), keep_logs={"ended"})
    assert deleted == ["gone"] and freed >= 200
    ended = tmp_path / "agent" / "jobs" / "ended"
    assert sorted(p.name for p in ended.iterdir()) == ["attempt-1.log", "attempt-2.log"]
    assert not (tmp_path / "ckpt" / "ended").exists()
    assert not (tmp_path / "agent" / "jobs" / "gone").exists() and not (tmp_path / "ckpt" / "gone").exists()
    # once its retention is over, the logs go too
    assert pm.collect_garbage(keep=set())[0] == ["ended"] and not ended.exists()


def test_followed_logs_are_capped_so_the_agent_keeps_workers_for_the_scheduler(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from microco.api.agent.v1 import agent_pb2
    from microco.common.errors import ResourceExhausted
    from microco.services.agent._service import MAX_FOLLOWED_LOGS, NodeAgentServicer

    pm = _manager_with_job_data(tmp_path)
    pm.is_running = lambda job_id, attempt: True  # the job runs on: its log may grow
    servicer = NodeAgentServicer(SimpleNamespace(procs=pm, node="n"))
    ctx = SimpleNamespace(is_active=lambda: True)
    follow = agent_pb2.ReadLogRequest(job_id="ended", follow=True)
    held = [servicer.ReadLog(follow, ctx) for _ in range(MAX_FOLLOWED_LOGS)]
    for stream in held:
        first = next(stream)  # each follower now holds its slot
        assert first.data == b"second\n" and list(first.attempts) == [1, 2]
    with pytest.raises(ResourceExhausted, match="already being followed"):
        next(servicer.ReadLog(follow, ctx))
    # a plain read is never refused
    assert next(servicer.ReadLog(agent_pb2.ReadLogRequest(job_id="ended", attempt=1), ctx)).data == b"first\n"
    held.pop().close()  # a follower leaves (the client hung up)
    assert next(servicer.ReadLog(follow, ctx)).data == b"second\n"


def test_jobs_that_ignore_sigterm_are_killed_together_within_one_grace(tmp_path: Path, monkeypatch) -> None:
    """A fence stops every job of the node within one grace, not one grace per job in a row:
    with a lease of a few seconds, jobs stopped one after another outlived it (CI)."""
    import sys
    import time

    from microco.services.agent import _procs

    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 3), tmp_path / "ckpt")
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    procs = [pm.start(f"j{i}", [sys.executable, "-c", deaf], {}, [f"n/{i}"]) for i in range(3)]
    for p in procs:  # SIGTERM ignored from here on
        while "up" not in p.log_path.read_text():
            assert p.poll() is None, p.log_path.read_text()
            time.sleep(0.02)
    killed: list[int] = []
    real = _procs._kill_group

    def record(pid: int, sig: int) -> None:
        killed.append(sig)
        real(pid, sig)

    monkeypatch.setattr(_procs, "_kill_group", record)
    pm.stop_all(procs, grace_s=1.0)
    assert all(p.exit_code is not None for p in procs)
    # every SIGTERM went out before the first SIGKILL: the graces ran side by side
    assert killed == [15, 15, 15, 9, 9, 9]
