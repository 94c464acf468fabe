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


class _Decoded:
    """A dataset whose every sample costs its worker 3 ms of CPU (a decode)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import time

        import torch

        t_end = time.thread_time() + 0.003
        while time.thread_time() < t_end:
            pass
        return torch.zeros(4)


def test_a_loop_fed_by_data_loader_workers_counts_their_cpu_in_its_busy_fraction(tmp_path):
    """On a virtual device (a CPU share) a loader's workers run on the job's cores: a loop
    whose two workers decoded every sample reported itself 9% busy while its processes kept
    its core 94% busy (measured through the platform), so gandiva's share rule saw room to
    pack a second job there. The busy fraction now counts the CPU of the job's child processes."""
    import pytest

    torch = pytest.importorskip("torch")
    from microco.clients.scheduler import JobContext

    loader = torch.utils.data.DataLoader(_Decoded(), batch_size=8, num_workers=2)
    ctx = JobContext(devices=["n/0"], control_dir=tmp_path / "ctl")
    ctx.on_gpu = False
    step = 0
    for _ in range(2):
        for _batch in loader:  # the loop itself does next to nothing
            step += 1
            ctx.step_end(step)
    util = ctx.utilization()
    # 8 samples x 3 ms of workers' CPU per mini-batch, whatever the wall time: at least a
    # share of it is counted (the bound is loose: the machine may be busy)
    cpu = sum(list(ctx._cpu_ms)[1:])
    assert cpu >= 0.5 * 24.0 * (len(ctx._cpu_ms) - 1), (cpu, util)


def test_a_job_whose_own_sigterm_handler_exits_0_when_the_agent_stops_it_is_not_finished(tmp_path):
    """Many scripts catch SIGTERM to save and leave with status 0. The agent sends SIGTERM when
    the scheduler stops a job that did not carry out an operation in time (a suspend sent during
    a 45 s validation pass: through the platform the job then read "finished at step 5" of 24
    and was never run again), and when a fenced node stops its jobs. An exit after the agent's
    stop is the stop's (-SIGTERM, rescheduled from the checkpoint), whatever status the script's
    handler chose; a checkpointed exit (75) keeps its meaning."""
    import signal
    import time

    from microco.services.agent import ProcessManager, discover_devices

    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 2), tmp_path / "ckpt")
    polite = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit({code}))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    for i, code in enumerate((75, 1, 0)):
        p = pm.start(f"j{i}", [sys.executable, "-c", polite.format(code=code)], {}, [f"n/{i % 2}"])
        while "up" not in p.log_path.read_text():
            assert p.poll() is None, p.log_path.read_text()
            time.sleep(0.02)
        pm.stop(f"j{i}", grace_s=10.0)
        if code == 75:
            assert p.exit_code == 75
        else:
            assert p.exit_code == -signal.SIGTERM, (code, p.exit_code, p.message)
            assert (
                p.message == f"stopped by the node agent (SIGTERM); the job's own handler exited with {code}"
            )
    # the scheduler's reading of such an exit: lost, back to the queue (no checkpoint yet)
    core, rec = _running_job()
    seen = SimpleNamespace(exit_code=-15, job_state="running", message=p.message)
    after = core.reconciler._exited(rec, seen, 10.0)
    assert after.state in (J.QUEUED, J.SUSPENDED) and after.restarts == 1, after


def test_the_status_is_current_when_a_loop_goes_off_to_its_end_of_epoch_work(tmp_path):
    """An epoch's last boundary waits for the loop's end-of-epoch work (``hook.epoch``); a
    status refreshed at most every 0.2 s then showed an older step through a whole validation
    pass (through the platform: step 5 shown for 45 s while the job was at step 8)."""
    import json

    from microco.clients.scheduler import JobContext

    ctx = JobContext(control_dir=tmp_path / "ctl", devices=["n/0"])
    for step in range(1, 8):
        ctx.step_end(step)
    ctx.step_end(8, obey=False)
    assert json.loads((tmp_path / "ctl" / "status.json").read_text())["step"] == 8
