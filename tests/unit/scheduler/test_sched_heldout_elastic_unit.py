"""Session 42: a launcher that restarts its ranks when they exit non-zero, as ``torchrun
--max-restarts N`` does (torch elastic's fault tolerance, the torchrun docs' "tolerates 3
failures" launch). A checkpoint-and-move exits every rank with 75 once the checkpoint is
written; torchrun takes that for a failure and starts the ranks again: each new generation
restored, trained, saw the same stop and checkpointed again, or hung joining its process
group. ``examples/torch_ddp.py`` under ``torchrun --max-restarts 2``, told to stop through the
agent: its launcher exited 4.7 s after the stop (run alone with a control directory: 3.8 s,
at a checkpoint one step past the stop's, which the second restarted generation had trained);
in another run a restarted generation hung in ``init_process_group`` for more than 5 minutes (through the platform the scheduler's 30 s operation timeout would have
stopped it). The agent now ends the launcher once every rank has checkpointed: 0.46 s.

The launcher here is a few lines with torchrun's rule (restart every rank while restarts are
left, exit 1 when none are), so the test needs no torch: the ranks are real processes running
the real hook (``JobContext``), started and controlled by the agent's real ``ProcessManager``.
"""

from __future__ import annotations

import json
import sys
import time

LAUNCHER = """
import os, subprocess, sys
max_restarts, rank_script = int(sys.argv[1]), sys.argv[2]
for generation in range(max_restarts + 1):
    with open(os.environ["GENERATIONS"], "a") as f:
        f.write(f"{generation}\\n")
    env = {**os.environ, "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": str(generation)}
    ranks = [subprocess.Popen([sys.executable, rank_script], env={**env, "RANK": str(r)}) for r in (0, 1)]
    if all(p.wait() == 0 for p in ranks):
        sys.exit(0)
sys.exit(1)
"""

RANK = """
import json, time
from microco.clients.scheduler import JobContext

ctx = JobContext()
ctx.save = lambda step: json.dumps({"step": step}).encode()
ctx.load = lambda blob: json.loads(blob)["step"]
step = ctx.restore()
while True:
    time.sleep(0.01)
    step += 1
    ctx.step_end(step)
"""


def test_a_launcher_that_restarts_its_ranks_is_ended_once_every_rank_checkpointed(tmp_path):
    from microco.clients.scheduler._ranks import read_records
    from microco.services.agent import ProcessManager, discover_devices

    (tmp_path / "launcher.py").write_text(LAUNCHER)
    (tmp_path / "rank.py").write_text(RANK)
    generations = tmp_path / "generations"
    pm = ProcessManager(tmp_path / "agent", discover_devices("n", 1), tmp_path / "ckpt")
    cmd = [sys.executable, str(tmp_path / "launcher.py"), "3", str(tmp_path / "rank.py")]
    p = pm.start("elastic", cmd, {"GENERATIONS": str(generations)}, ["n/0"], attempt=1)
    try:
        deadline = time.monotonic() + 120
        while [r.get("state") for r in read_records(p.control.dir)] != ["running", "running"]:
            assert p.poll() is None, p.log_path.read_text()
            assert time.monotonic() < deadline, "the ranks never reported"
            time.sleep(0.02)
        first = {r["rank"]: r["pid"] for r in read_records(p.control.dir)}
        pm.control("elastic", "stop")
        deadline = time.monotonic() + 120
        while p.poll() is None:  # (the scheduler's tick: ListProcesses polls every process)
            assert time.monotonic() < deadline, p.log_path.read_text()
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            pm.stop("elastic", grace_s=1.0)
    records = read_records(p.control.dir)
    assert [(r["rank"], r["state"]) for r in records] == [(0, "checkpointed"), (1, "checkpointed")]
    assert p.exit_code == 75, (p.exit_code, p.message)
    # the ranks that checkpointed are the first ones: no generation the launcher started again
    # trained (the agent may end the launcher as it starts one: it restarts within milliseconds)
    assert {r["rank"]: r["pid"] for r in records} == first, generations.read_text()
    assert (
        json.loads((tmp_path / "ckpt" / "elastic" / "checkpoint").read_text())["step"] == records[0]["step"]
    )
    step = max(r["step"] for r in records)
    assert p.message.startswith(f"checkpointed at step {step} (the launcher"), p.message
