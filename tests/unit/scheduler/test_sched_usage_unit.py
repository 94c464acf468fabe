"""Session 40 held-out round, usage over time: how a job's end reads when its process never
reported through the hook, and where the last lines of a log begin when the job draws a
progress bar (carriage returns, no newline)."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

from _support import put_node

from microco.common.kv import MemoryKV
from microco.services.agent._procs import tail_offset
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler.policy import make_policy


def _running_job(**changes):
    kv = MemoryKV()
    put_node(kv, "n1", devices=2)
    core = SchedulerCore(kv, make_policy("gandiva"))
    rec = core.submit({"command": [sys.executable, "-c", "pass"], "devices": 1, "name": "plain"})
    return core, replace(rec, state=J.RUNNING, node="n1", devices=("n1/0",), attempt=1, **changes)


def test_a_job_that_ends_before_the_hook_grace_without_reporting_says_so():
    """It read "finished at step 0" (as if it had trained nothing) unless it had run past the
    scheduler's ``--hook-grace-s`` (120 s) first."""
    core, rec = _running_job()
    done = core.reconciler._exited(rec, SimpleNamespace(exit_code=0, job_state="", message=""), 10.0)
    assert done.state == J.FINISHED
    assert done.message == "finished (its steps were not reported: it ran without the scheduler's hook)"
    # a job with the hook that reported says its step, even 0 (restored at its end, say)
    core, rec = _running_job(step=0)
    done = core.reconciler._exited(rec, SimpleNamespace(exit_code=0, job_state="finished", message=""), 10.0)
    assert done.message == "finished at step 0"
    core, rec = _running_job(step=40, first_step_at=5.0)
    done = core.reconciler._exited(rec, SimpleNamespace(exit_code=0, job_state="finished", message=""), 10.0)
    assert done.message == "finished at step 40"


def test_the_last_lines_of_a_log_that_draws_a_progress_bar(tmp_path):
    """A progress bar (tqdm's, Keras') redraws one line with carriage returns and no newline
    until it ends: hours of it were one "line", so ``microco job logs --tail 3`` and the
    console's last 200 lines sent the whole log. A carriage return not followed by a newline
    now ends a line as a terminal shows it; a tail is at most ``max_bytes`` whatever the lines."""
    p = tmp_path / "log"
    bar = b"".join(b"\r%3d%%|" % i + b"#" * i for i in range(101))
    text = b"epoch 1\n" + bar + b"\nepoch 2\r\nloss 0.5\r\n"
    p.write_bytes(text)
    assert text[tail_offset(p, 2) :] == b"epoch 2\r\nloss 0.5\r\n"  # CRLF is one line end
    assert text[tail_offset(p, 3) :] == b"100%|" + b"#" * 100 + b"\nepoch 2\r\nloss 0.5\r\n"
    p.write_bytes(b"epoch 1\n" + bar)  # still drawing
    assert (b"epoch 1\n" + bar)[
        tail_offset(p, 2, block=64) :
    ] == b" 99%|" + b"#" * 99 + b"\r100%|" + b"#" * 100
    # one long line without any line end: the last max_bytes of it
    p.write_bytes(b"x" * 5000)
    assert tail_offset(p, 3, max_bytes=1000) == 4000
