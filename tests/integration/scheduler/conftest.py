"""Fixtures for the scheduler's integration tests: node agents as real processes."""

from __future__ import annotations

import pytest

from microco.clients.scheduler import SchedulerClient
from microco.common import channel_for
from microco.services.scheduler._local import spawn_agent, spawn_scheduler, stop_process


@pytest.fixture
def agents(etcd_endpoint, etcd_kv, tmp_path):
    """``start(node, devices=2)`` -> Popen of a real agent sharing one checkpoint root.
    ``preload="auto"`` gives it the warm zygote (torch imported once; its Python jobs are
    forked from it) and returns once the zygote is warm: for tests that start torch processes
    on one node again and again (each exec'd start imports torch and torch._dynamo, ~5 CPU-s).
    ``lease_ttl_s``: 10 s, so an agent starved of CPU on a loaded machine is not taken as lost (it
    fences its jobs at 3/4 of it); 3 s for a test that loses a node and waits for its lease to
    lapse (session 43: the default was the short one, for every test)."""
    procs = []

    def start(node: str, devices: int = 2, preload: str = "none", lease_ttl_s: int = 10):
        p = spawn_agent(
            etcd_endpoint,
            node,
            tmp_path / "agents" / node,
            devices=devices,
            checkpoint_root=tmp_path / "checkpoints",
            kv=etcd_kv,
            log_path=tmp_path / f"agent-{node}.log",
            preload=preload,
            wait_warm=preload != "none",
            lease_ttl_s=lease_ttl_s,
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
    """An uninterrupted run started in the background once per test run: under xdist the first
    worker to ask claims ``shared`` (a folder of the run's, common to its workers), starts the
    run and publishes its result there; every worker's ``result()`` waits for what is
    published. (Each worker starting its own cost a TensorFlow start-up and the training again.)"""

    def __init__(self, cmd, env, shared, steps):
        import os
        import subprocess
        import threading

        self.steps, self._value, self._proc = steps, None, None
        self._done, self._failed = shared / "result.json", shared / "failed.txt"
        try:
            os.close(os.open(shared / "claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another worker runs it
        out = shared / "out.json"
        self._proc = subprocess.Popen(
            [*cmd, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._publisher = threading.Thread(target=self._publish, args=(out,), daemon=True)
        self._publisher.start()

    def _publish(self, out):
        import os

        log, _ = self._proc.communicate()
        if self._proc.returncode == 0 and out.exists():
            os.replace(out, self._done)  # whole, at once: a reader never sees part of it
        else:
            tmp = self._failed.with_suffix(".tmp")
            tmp.write_text(f"the reference run exited with {self._proc.returncode}:\n{log[-4000:]}")
            os.replace(tmp, self._failed)

    def result(self, timeout=600):
        import json
        import time

        deadline = time.monotonic() + timeout
        while self._value is None:
            if self._done.exists():
                self._value = json.loads(self._done.read_text())
            elif self._failed.exists():
                raise AssertionError(self._failed.read_text())
            else:
                assert time.monotonic() < deadline, f"no reference result after {timeout} s"
                time.sleep(0.2)
        return self._value

    def close(self):
        import subprocess

        if self._proc is None:
            return
        try:  # other workers may still wait for it: let it finish
            self._proc.wait(300)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._publisher.join(10)


@pytest.fixture(scope="session")
def keras_reference(tmp_path_factory):
    """An uninterrupted run of the Keras example (seed 0, ``KERAS_STEPS`` steps), started once
    per test run in the background (TensorFlow's start-up is the slow part, and it overlaps the
    test's own jobs), shared by the xdist workers; ``.result()`` gives its losses and
    final-parameter digest."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the run's folder, above each worker's own
        shared = tmp_path_factory.getbasetemp().parent / "keras-ref"
        shared.mkdir(exist_ok=True)
    else:
        shared = tmp_path_factory.mktemp("keras-ref")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "microco.examples.keras_digits", "--steps", str(KERAS_STEPS)]
    ref = _Reference(cmd, env, shared, KERAS_STEPS)
    yield ref
    ref.close()
