"""Old job data is cleaned up: a finished or cancelled job's checkpoints and control
directories are deleted from the nodes and its logs after the log retention, a failed job's data
is kept for inspection, data of jobs the scheduler does not know is collected, a running job's
checkpoint is never touched. ``microco job logs`` reads what is kept, and follows a running job."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from _support import synthetic_job, wait_until

from microco.cli import main as cli
from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
from microco.common import channel_for
from microco.services.scheduler._local import spawn_scheduler, stop_process

pytestmark = pytest.mark.integration


def job_cmd(steps, fail_at=-1):
    return synthetic_job(steps, 1, 4, "--fail-at", str(fail_at))


wait_for = wait_until


def test_job_data_is_collected(agents, etcd_endpoint, etcd_kv, tmp_path, capsys):
    agents("n1", devices=2)
    ckpt_root = tmp_path / "checkpoints"
    jobs_dir = tmp_path / "agents" / "n1" / "jobs"
    # Data of a job no scheduler knows (e.g. left by a wiped cluster).
    (ckpt_root / "ghost-0001").mkdir(parents=True)
    (ckpt_root / "ghost-0001" / "checkpoint").write_bytes(b"x" * 1000)
    (jobs_dir / "ghost-0001" / "attempt-1").mkdir(parents=True)
    sched = spawn_scheduler(
        etcd_endpoint,
        tmp_path / "sched",
        policy="fifo",
        tick_s=0.2,
        kv=etcd_kv,
        log_path=tmp_path / "scheduler.log",
        extra_args=["--gc-interval-s", "1", "--log-retention-s", "15"],
    )
    try:
        c = SchedulerClient(channel_for(etcd_kv, "scheduler"))
        env = {"MICROCO_CHECKPOINT_EVERY_S": "0.05"}
        run = c.submit(make_spec(job_cmd(100000), devices=1, name="run", env=env)).id
        fin = c.submit(make_spec(job_cmd(60), devices=1, name="fin", env=env)).id
        wait_for(lambda: (ckpt_root / fin / "checkpoint").exists(), 30, "fin checkpointed")
        wait_for(lambda: job_to_dict(c.get(fin))["state"] == "finished", 30, "fin finished")
        wait_for(
            lambda: not (ckpt_root / fin).exists() and not (jobs_dir / fin / "attempt-1").exists(),
            10,
            "fin collected",
        )
        # ... all but its log, which its user can still read
        assert [p.name for p in (jobs_dir / fin).iterdir()] == ["attempt-1.log"]
        capsys.readouterr()
        assert cli(["job", "--etcd", etcd_endpoint, "logs", fin]) == 0
        out = capsys.readouterr()
        lines = out.out.splitlines()
        assert lines[0] == "synthetic job: steps 0 to 60" and lines[1].startswith(
            "finished 60 steps, digest "
        )
        assert len(lines) == 2
        assert f"{fin} attempt 1 on n1" in out.err
        wait_for(lambda: not (ckpt_root / "ghost-0001").exists(), 10, "unknown job collected")
        assert not (jobs_dir / "ghost-0001").exists()

        bad = c.submit(make_spec(job_cmd(1000, fail_at=40), devices=1, name="bad", env=env)).id
        wait_for(lambda: job_to_dict(c.get(bad))["state"] == "failed", 30, "bad failed")
        assert "exited with 3" in job_to_dict(c.get(bad))["message"]
        assert cli(["job", "--etcd", etcd_endpoint, "logs", "--tail", "1", bad]) == 0
        assert capsys.readouterr().out == "failing at step 40, as asked (--fail-at)\n"
        assert cli(["job", "--etcd", etcd_endpoint, "logs", "--attempt", "7", bad]) == 1
        assert "no node keeps a log of attempt 7" in capsys.readouterr().err
        assert cli(["job", "--etcd", etcd_endpoint, "logs", "no-such-job"]) == 1
        assert "no-such-job" in capsys.readouterr().err
        # cancelled: gone; failed: kept (default retention a day) for the user to inspect.
        c.cancel(run)
        wait_for(lambda: job_to_dict(c.get(run))["state"] == "cancelled", 20, "cancelled")
        wait_for(
            lambda: not (ckpt_root / run).exists() and not (jobs_dir / run / "attempt-1").exists(),
            10,
            "run collected",
        )
        time.sleep(1.5)  # at least one periodic collection after the failure
        assert (ckpt_root / bad / "checkpoint").exists()
        assert (jobs_dir / bad / "attempt-1.log").exists()

        # A live job keeps its single, latest checkpoint across collections.
        live = c.submit(make_spec(job_cmd(100000), devices=1, name="live", env=env)).id
        wait_for(lambda: (ckpt_root / live / "checkpoint").exists(), 30, "live checkpointed")
        time.sleep(1.5)
        assert [p.name for p in (ckpt_root / live).iterdir() if not p.name.endswith(".tmp")] == ["checkpoint"]
        assert job_to_dict(c.get(live))["state"] == "running"
        # following a running job's log ends when its process does
        follow = subprocess.Popen(
            [sys.executable, "-m", "microco.cli", "job", "--etcd", etcd_endpoint, "logs", "-f", live],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follow.stdout.readline() == "synthetic job: steps 0 to 100000\n"
        assert follow.poll() is None  # still following
        c.cancel(live)
        assert follow.wait(30) == 0, follow.stderr.read()
        wait_for(lambda: not (ckpt_root / live).exists(), 20, "live collected after cancel")
        # the ended jobs' logs go once the log retention (15 s here) is over
        wait_for(
            lambda: not (jobs_dir / fin).exists() and not (jobs_dir / run).exists(), 45, "logs collected"
        )
        assert (jobs_dir / bad / "attempt-1.log").exists()  # failed: kept for the failed retention
    finally:
        stop_process(sched)
