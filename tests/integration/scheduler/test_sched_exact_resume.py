"""A job suspended and resumed N times and moved once (checkpoint, exit, restart from the
checkpoint) has exactly the same loss curve as an uninterrupted run with the same seed; grown
onto a second device and shrunk back afterwards, it goes on the same training, equal up to
float summation order (a resize changes a CPU job's compute threads, and on some CPUs a matmul
or reduction sums in another order with two threads: seen on an AMD EPYC, where one step at two
threads moved later losses by one float32 ulp). Real training processes (PyTorch, Keras on
TensorFlow), real control files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from _support import scaled

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel


def need(module: str) -> None:
    """Skip without the framework, found without importing it (TensorFlow's import alone
    takes 15 s: the job processes pay it, the test process need not)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


STEPS = 40


def launch(module, tmp, out, *, control=None, ckpt=None, sleep_ms=0.0):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1"}
    for k in ("MICROCO_CONTROL_DIR", "MICROCO_CHECKPOINT_DIR"):
        env.pop(k, None)
    if control:
        env["MICROCO_CONTROL_DIR"] = str(control)
        env["MICROCO_CHECKPOINT_DIR"] = str(ckpt)
    cmd = [
        sys.executable,
        "-m",
        module,
        "--steps",
        str(STEPS),
        "--out",
        str(out),
        "--step-sleep-ms",
        str(sleep_ms),
    ]
    return subprocess.Popen(
        cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_step(ch: ControlChannel, step: int, timeout=120):
    return ch.wait_status(lambda s: s.get("step", 0) >= step, scaled(timeout))


def run_interrupted(module, tmp_path, reference=None):
    """``reference``: the uninterrupted run, when the caller started one (else run here)."""
    ckpt = tmp_path / "ckpt"
    baseline = None if reference else launch(module, tmp_path, tmp_path / "a.json")
    ch1 = ControlChannel(tmp_path / "ctl1")
    p1 = launch(module, tmp_path, tmp_path / "b.json", control=ch1.dir, ckpt=ckpt, sleep_ms=40)
    # Suspend / resume twice in the first process...
    for at in (3, 8):
        wait_step(ch1, at)
        seq = ch1.send("suspend")
        st = ch1.wait_ack(seq, scaled(60))
        assert st["state"] == "parked"
        parked_step = st["step"]
        time.sleep(0.3)
        assert ch1.status()["step"] == parked_step  # no progress while parked
        ch1.wait_ack(ch1.send("resume"), scaled(30))
    # ...then checkpoint-and-move: the process exits and a new one continues from the checkpoint.
    wait_step(ch1, 12)
    ch1.send("stop")
    out1, _ = p1.communicate(timeout=scaled(60))
    assert p1.returncode == EXIT_CHECKPOINTED, out1
    moved_at = ch1.status()["checkpoint_step"]
    assert 12 <= moved_at < STEPS
    ch2 = ControlChannel(tmp_path / "ctl2")
    p2 = launch(module, tmp_path, tmp_path / "b.json", control=ch2.dir, ckpt=ckpt, sleep_ms=40)
    # and once more suspended / resumed after the move
    st = wait_step(ch2, moved_at + 2)
    assert st["restored_from_step"] == moved_at
    ch2.wait_ack(ch2.send("suspend"), scaled(60))
    ch2.wait_ack(ch2.send("resume"), scaled(30))
    # ...and last, grown onto a second device and shrunk back in place (an elastic job's
    # resize: the hook changes the compute threads with the devices).
    grown_at = ch2.wait_ack(ch2.send("resize", ["vdev/0", "vdev/1"]), scaled(60))["step"]
    wait_step(ch2, grown_at + 3)
    st = ch2.wait_ack(ch2.send("resize", ["vdev/0"]), scaled(60))
    assert st["state"] == "running" and st["devices"] == ["vdev/0"], st
    out2, _ = p2.communicate(timeout=scaled(120))
    assert p2.returncode == 0, out2
    if baseline is not None:
        out0, _ = baseline.communicate(timeout=scaled(120))
        assert baseline.returncode == 0, out0
        reference = json.loads((tmp_path / "a.json").read_text())
    else:
        reference = reference.result()
    a = reference
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["restored_from_step"] == moved_at
    assert len(a["losses"]) == len(b["losses"]) == STEPS
    assert moved_at + 2 <= grown_at < STEPS
    # bit for bit, every step before the grow (both suspensions, the move, one more suspension)
    assert a["losses"][:grown_at] == b["losses"][:grown_at]
    # from the grow on, the same training up to float summation order
    assert b["losses"][grown_at:] == pytest.approx(a["losses"][grown_at:], rel=1e-5, abs=1e-7)
    if a["losses"] == b["losses"]:  # where two threads sum as one does, nothing moved at all
        assert a["params_sha256"] == b["params_sha256"]
    final = ch2.status()
    assert final["state"] == "finished" and final["step"] == STEPS


@pytest.mark.slow
@pytest.mark.torch
def test_torch_job_suspended_resumed_and_moved_is_exact(tmp_path):
    need("torch")
    run_interrupted("microco.examples.torch_digits", tmp_path)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_keras_job_suspended_resumed_and_moved_is_exact(tmp_path, keras_reference):
    need("tensorflow")
    assert keras_reference.steps == STEPS
    run_interrupted("microco.examples.keras_digits", tmp_path, keras_reference)
