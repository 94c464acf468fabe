"""A PyTorch Lightning job (``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, which
launches its second rank itself; ``MicrocoCallback``) run through the platform as one unit:
time-sliced with another job on its node (both ranks park in place and resume together), held
and resumed by an operator, then moved to another node by an operator (checkpoint-and-exit of both ranks: the job's first process
is Lightning's launcher and rank 0 at once, it exits with 75 or is SIGKILLed by Lightning's
child observer, and the ranks' records make it "checkpointed" either way), and finished there
with exactly the losses and weights of an uninterrupted run of the same script.

Slow: two Lightning launches through the platform and one reference launch (two processes
each), overlapped; nothing waits for a fixed time. The callback's own restore (mid-epoch, epoch
end, data order, RNG) is tested in one process in tests/unit/scheduler/test_sched_lightning_unit.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
from microco.common import channel_for
from microco.services.scheduler._local import spawn_scheduler, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

EPOCHS = 3
STEPS = 29 * EPOCHS  # 1797 digits, 32 a batch per rank, 2 ranks: 29 batches an epoch


def lightning_cmd(out, sleep_ms):
    return [
        sys.executable,
        "-m",
        "microco.examples.lightning_ddp",
        "--epochs",
        str(EPOCHS),
        "--step-sleep-ms",
        str(sleep_ms),
        "--out",
        str(out),
    ]


def synthetic_cmd():
    return [sys.executable, "-m", "microco.examples.synthetic_job", "--steps", "100000", "--compute-ms", "2"]


def record(kv, j):
    return kv.get_json(f"/microco/scheduler/jobs/{j}")


@pytest.fixture
def sched(etcd_endpoint, etcd_kv, tmp_path):
    procs = []

    def start(config):
        procs.append(
            spawn_scheduler(
                etcd_endpoint,
                tmp_path / "sched",
                policy="gandiva",
                policy_config=config,
                tick_s=0.2,
                kv=etcd_kv,
                log_path=tmp_path / "scheduler.log",
            )
        )
        return SchedulerClient(channel_for(etcd_kv, "scheduler"))

    yield start
    for p in procs:
        stop_process(p)


def test_lightning_ddp_job_parks_in_place_moves_and_finishes_exactly(agents, sched, etcd_kv, tmp_path):
    pytest.importorskip("pytorch_lightning")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    ref = subprocess.Popen(
        lightning_cmd(tmp_path / "ref.json", 0),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        agents("n1", devices=2)
        # The policy moves nothing by itself: the move below is the operator's.
        c = sched(
            {
                "quantum_s": 1.0,
                "enable_packing": False,
                "enable_grow_shrink": False,
                "enable_migration": False,
            }
        )
        out = tmp_path / "out.json"
        j = c.submit(make_spec(lightning_cmd(out, 40), devices=2, name="lightning", total_steps=STEPS)).id
        wait_for(lambda: job_to_dict(c.get(j))["step"] >= 3, etcd_kv, 180, "the Lightning job trains")
        # Another job for the same two devices: at each quantum's end the Lightning job's ranks
        # park together in place and later resume in place.
        other = c.submit(make_spec(synthetic_cmd(), devices=2, name="other")).id
        wait_for(
            lambda: any("resumed in place" in h[2] for h in record(etcd_kv, j)["history"]),
            etcd_kv,
            120,
            "the Lightning job suspended and resumed in place",
        )
        c.cancel(other)
        rec = record(etcd_kv, j)
        assert any(h[1] == "suspended" and "parked" in h[2] for h in rec["history"]), rec["history"]
        assert rec["attempt"] == 1 and rec["restarts"] == 0
        # Held by an operator (parked in place) while a second node joins, so the move below
        # finds the job with training left to do however long the node takes to start.
        wait_for(lambda: record(etcd_kv, j)["state"] == "running", etcd_kv, 60, "running again")
        c.control(j, "suspend")
        agents("n2", devices=2)
        wait_for(lambda: record(etcd_kv, j)["state"] == "suspended", etcd_kv, 60, "held")
        wait_for(lambda: any(d.node == "n2" for d in c.list_nodes().devices), etcd_kv, 60, "n2 joins")
        c.control(j, "resume", ["n1/0", "n1/1"])
        wait_for(lambda: record(etcd_kv, j)["state"] == "running", etcd_kv, 60, "resumed by the operator")
        # Moved by an operator to n2: both ranks checkpoint at one boundary and exit (Lightning's
        # launcher is rank 0: 75, or SIGKILL from its child observer); the job restarts on n2.
        c.control(j, "migrate", ["n2/0", "n2/1"])
        wait_for(
            lambda: (r := record(etcd_kv, j))["node"] == "n2" and r["attempt"] == 2,
            etcd_kv,
            120,
            "moved to n2",
        )
        wait_for(lambda: job_to_dict(c.get(j))["state"] == "finished", etcd_kv, 180, "the job finishes")
        rec = record(etcd_kv, j)
        assert rec["restarts"] == 0, rec["history"]  # a move, not a failure or a lost rank
        assert rec["step"] == STEPS, rec["history"]
        log, _ = ref.communicate(timeout=180)
        assert ref.returncode == 0, log[-3000:]
        a = json.loads((tmp_path / "ref.json").read_text())
        b = json.loads(out.read_text())
        assert b["restored_from_step"] and 0 < b["restored_from_step"] < STEPS
        assert len(a["losses"]) == len(b["losses"]) == STEPS
        assert a["losses"] == b["losses"]  # bit-for-bit, every step, across the parks and the move
        assert a["params_sha256"] == b["params_sha256"]
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
