"""Keras ``fit(x, y, epochs=N)`` as people write it (arrays, Keras' shuffling, BatchNorm,
Dropout, an accuracy metric), checkpointed and exited mid-epoch and restarted from the
checkpoint: it continues at the same epoch and batch, and its per-batch logs, the ``History``
``fit`` returns and its final weights equal an uninterrupted run's.

Slow (TensorFlow's start-up, three times, on a busy CI machine); the reference run overlaps
the interrupted one, and nothing waits for a fixed time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _support import scaled

from microco.clients.scheduler import EXIT_CHECKPOINTED, ControlChannel

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

EPOCHS = 4
STEPS_PER_EPOCH = 10  # 640 samples, batches of 64


def launch(out, control=None, ckpt=None, sleep_ms=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    if control:
        env.update(MICROCO_CONTROL_DIR=str(control), MICROCO_CHECKPOINT_DIR=str(ckpt))
    cmd = [sys.executable, "-m", "microco.examples.keras_fit", "--epochs", str(EPOCHS), "--out", str(out)]
    cmd += ["--step-sleep-ms", str(sleep_ms)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_keras_fit_with_epochs_restarted_mid_epoch_equals_an_uninterrupted_run(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    ref = launch(tmp_path / "ref.json")
    ch1 = ControlChannel(tmp_path / "ctl1")
    p1 = launch(tmp_path / "out.json", ch1.dir, tmp_path / "ckpt", sleep_ms=60)
    try:
        # the third epoch's first batch: the checkpoint is mid-epoch. Nine batches of 60 ms for
        # the stop to arrive before the epoch ends (a `.ci/run` at load ~5, session 30: with six
        # of 30 ms the job was past the epoch's end, checkpointed at step 31)
        ch1.wait_status(lambda s: s["step"] >= 2 * STEPS_PER_EPOCH + 1, scaled(400))
        ch1.send("stop")
        out1, _ = p1.communicate(timeout=scaled(300))
        assert p1.returncode == EXIT_CHECKPOINTED, out1
        at = ch1.status()["checkpoint_step"]
        assert 2 * STEPS_PER_EPOCH < at < 3 * STEPS_PER_EPOCH  # mid-epoch, global (not per epoch)
        p2 = launch(tmp_path / "out.json", tmp_path / "ctl2", tmp_path / "ckpt")
        out2, _ = p2.communicate(timeout=scaled(400))
        assert p2.returncode == 0, out2
        log, _ = ref.communicate(timeout=scaled(400))
        assert ref.returncode == 0, log
    finally:
        for p in (ref, p1):
            if p.poll() is None:
                p.kill()
                p.wait()
    a = json.loads((tmp_path / "ref.json").read_text())
    b = json.loads((tmp_path / "out.json").read_text())
    assert b["restored_from_step"] == at
    assert a["steps"] == b["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert [s for s, _ in b["batches"]] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert a["batches"] == b["batches"]  # loss and accuracy of every batch, running means included
    assert a["history"] == b["history"] and a["epochs"] == b["epochs"] == list(range(EPOCHS))
    assert a["params_sha256"] == b["params_sha256"]
    assert ControlChannel(tmp_path / "ctl2").status()["step"] == EPOCHS * STEPS_PER_EPOCH
