"""A PyTorch Lightning job (``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, which
launches its second rank itself; ``MicrocoCallback``) run through the platform as one unit:
suspended (both ranks park in place at one boundary) and resumed in place, then moved to
another node (checkpoint-and-exit of both ranks: the job's first process is Lightning's
launcher and rank 0 at once, it exits with 75 or is SIGKILLed by Lightning's child observer,
and the ranks' records make it "checkpointed" either way), and finished there with every batch
trained once.

Slow: two Lightning launches of two processes each; nothing waits for a fixed time. That the
restored run equals an uninterrupted one (losses and weights, mid-epoch and at an epoch's end:
data order, RNG, LR schedule) is tested where it is cheap, in one process, in
tests/unit/scheduler/test_sched_lightning_unit.py; a third launch for a reference run here
would cost ~40% more.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.scheduler import job_to_dict, make_spec
from microco.clients.scheduler._ranks import read_records

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

EPOCHS = 2
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


def record(kv, j):
    return kv.get_json(f"/microco/scheduler/jobs/{j}")


def test_lightning_ddp_job_parks_in_place_is_moved_and_finishes(agents, sched, etcd_kv, tmp_path):
    if importlib.util.find_spec("pytorch_lightning") is None:  # (not imported here: seconds)
        pytest.skip("pytorch_lightning is not installed")
    # The two agents start side by side. Their node leases are 10 s, not 3: no node is lost here,
    # and beside the suite (load 8-14) an agent whose two ranks were importing Lightning missed
    # its 3 s lease and its job restarted from the beginning (18:20 UTC, 2026-12-02).
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda node: agents(node, devices=2, lease_ttl_s=10), ["n1", "n2"]))
    # The policy moves nothing by itself: the moves below are the operator's.
    c = sched({"enable_packing": False, "enable_grow_shrink": False, "enable_migration": False})
    out = tmp_path / "out.json"
    j = c.submit(make_spec(lightning_cmd(out, 40), devices=2, name="lightning", total_steps=STEPS)).id
    wait_for(lambda: job_to_dict(c.get(j))["step"] >= 3, etcd_kv, 180, "the Lightning job trains")
    node = record(etcd_kv, j)["node"]
    here, there = [f"{node}/0", f"{node}/1"], [f"{n}/{i}" for n in ("n1", "n2") if n != node for i in (0, 1)]
    # Suspended: both ranks park in place at one boundary; resumed in place, both go on.
    c.control(j, "suspend")
    wait_for(lambda: record(etcd_kv, j)["state"] == "suspended", etcd_kv, 60, "parked")
    c.control(j, "resume", here)
    wait_for(lambda: record(etcd_kv, j)["state"] == "running", etcd_kv, 60, "resumed")
    history = [h[2] for h in record(etcd_kv, j)["history"]]
    assert (
        any(f"parked on {node}" in h for h in history)
        and f"resumed in place on {', '.join(here)} (resume)" in history
    )
    # Moved to the other node: both ranks checkpoint at one boundary and exit (Lightning's
    # launcher is rank 0: 75, or SIGKILL from its child observer); the job restarts there.
    c.control(j, "migrate", there)
    wait_for(lambda: (r := record(etcd_kv, j))["node"] != node and r["attempt"] == 2, etcd_kv, 120, "moved")
    ranks = read_records(tmp_path / "agents" / node / "jobs" / j / "attempt-1")
    assert [(r["rank"], r["state"]) for r in ranks] == [(0, "checkpointed"), (1, "checkpointed")], ranks
    assert ranks[0]["step"] == ranks[1]["step"]  # one boundary
    wait_for(lambda: job_to_dict(c.get(j))["state"] == "finished", etcd_kv, 180, "the job finishes")
    rec = record(etcd_kv, j)
    assert rec["restarts"] == 0, rec["history"]  # a move, not a failure or a lost rank
    assert rec["step"] == STEPS, rec["history"]
    result = json.loads(out.read_text())
    assert result["restored_from_step"] == ranks[0]["step"] and result["world"] == 2
    assert len(result["losses"]) == STEPS  # every batch once: none re-run, none skipped
