"""Fixtures for the scheduler's integration tests: node agents as real processes."""

from __future__ import annotations

import pytest

from microco.clients.scheduler import SchedulerClient
from microco.common import channel_for
from microco.services.scheduler._local import spawn_agent, spawn_scheduler, stop_process


@pytest.fixture
def agents(etcd_endpoint, etcd_kv, tmp_path):
    """``start(node, devices=2)`` -> Popen of a real agent sharing one checkpoint root."""
    procs = []

    def start(node: str, devices: int = 2):
        p = spawn_agent(
            etcd_endpoint,
            node,
            tmp_path / "agents" / node,
            devices=devices,
            checkpoint_root=tmp_path / "checkpoints",
            kv=etcd_kv,
            log_path=tmp_path / f"agent-{node}.log",
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        stop_process(p)


@pytest.fixture
def sched(etcd_endpoint, etcd_kv, tmp_path):
    """``start(policy_config)`` -> a client of a real gandiva scheduler (0.2 s ticks)."""
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


KERAS_STEPS = 40


class _Reference:
    """An uninterrupted run started in the background; ``result()`` waits for it (once)."""

    def __init__(self, cmd, env, out, steps):
        import subprocess

        self.out, self.steps, self._value = out, steps, None
        self._proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def result(self):
        import json

        if self._value is None:
            log, _ = self._proc.communicate(timeout=300)
            assert self._proc.returncode == 0, log
            self._value = json.loads(self.out.read_text())
        return self._value

    def close(self):
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


@pytest.fixture(scope="session")
def keras_reference(tmp_path_factory):
    """An uninterrupted run of the Keras example (seed 0, ``KERAS_STEPS`` steps), started once
    per session in the background (TensorFlow's start-up is the slow part, and it overlaps the
    test's own jobs); ``.result()`` gives its losses and final-parameter digest."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    out = tmp_path_factory.mktemp("keras-ref") / "ref.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "microco.examples.keras_digits",
        "--steps",
        str(KERAS_STEPS),
        "--out",
        str(out),
    ]
    ref = _Reference(cmd, env, out, KERAS_STEPS)
    yield ref
    ref.close()
