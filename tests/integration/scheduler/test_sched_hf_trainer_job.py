"""A Hugging Face ``Trainer`` job (``microco.examples.hf_trainer``: a BERT classifier built from a
config, AdamW, a linear schedule with warm-up; ``train(trainer)`` from
``microco.clients.scheduler.hf``) run through the platform: suspended and resumed in place by
the operator, then moved to another node (the Trainer's own checkpoint under the job's
checkpoint directory, exit 75, restart there), and finished with every step trained once and
the same logged losses and final weights as the same script run alone. The exactness of the
restore in its corners (a stop inside a logging window, the folders kept) is tested in one
process in tests/unit/scheduler/test_sched_hf_trainer.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from _support import wait_for_jobs as wait_for

from microco.clients.scheduler import job_to_dict, make_spec

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

EPOCHS = 2
STEPS = 57 * EPOCHS  # 1,797 digits, 32 a batch


def hf_cmd(out, sleep_ms):
    return [sys.executable, "-m", "microco.examples.hf_trainer", "--epochs", str(EPOCHS),
            "--step-sleep-ms", str(sleep_ms), "--out", str(out)]  # fmt: skip


def record(kv, j):
    return kv.get_json(f"/microco/scheduler/jobs/{j}")


def test_hf_trainer_job_parks_in_place_is_moved_and_ends_as_a_run_alone(agents, sched, etcd_kv, tmp_path):
    if importlib.util.find_spec("transformers") is None:  # (not imported here: seconds)
        pytest.skip("transformers is not installed")
    for node in ("n1", "n2"):
        agents(node, devices=1, lease_ttl_s=10)
    c = sched({"enable_packing": False, "enable_grow_shrink": False, "enable_migration": False})
    out = tmp_path / "out.json"
    # (100 ms a step: the job must still run when the operator's commands come, on a busy machine)
    j = c.submit(make_spec(hf_cmd(out, 100), devices=1, name="hf-trainer", total_steps=STEPS)).id
    wait_for(lambda: job_to_dict(c.get(j))["step"] >= 3, etcd_kv, 180, "the Trainer job trains")
    node = record(etcd_kv, j)["node"]
    other = "n2" if node == "n1" else "n1"
    c.control(j, "suspend")
    wait_for(lambda: record(etcd_kv, j)["state"] == "suspended", etcd_kv, 60, "parked")
    c.control(j, "resume", [f"{node}/0"])
    wait_for(lambda: record(etcd_kv, j)["state"] == "running", etcd_kv, 60, "resumed")
    c.control(j, "migrate", [f"{other}/0"])
    wait_for(lambda: (r := record(etcd_kv, j))["node"] == other and r["attempt"] == 2, etcd_kv, 120, "moved")
    # The reference: the same script alone, while the job goes on (its result does not depend on time).
    alone = tmp_path / "alone.json"
    subprocess.run(hf_cmd(alone, 0), check=True, capture_output=True, timeout=300)
    wait_for(lambda: job_to_dict(c.get(j))["state"] == "finished", etcd_kv, 180, "the job finishes")
    rec = record(etcd_kv, j)
    assert rec["restarts"] == 0 and rec["step"] == STEPS, rec["history"]
    history = [h[2] for h in rec["history"]]
    assert any(f"parked on {node}" in h for h in history), history
    result, reference = json.loads(out.read_text()), json.loads(alone.read_text())
    assert 0 < result["restored_from_step"] < STEPS and result["steps"] == STEPS
    assert result["losses"] == reference["losses"]  # every step once, logged as a run alone logs it
    assert result["params_sha256"] == reference["params_sha256"]
