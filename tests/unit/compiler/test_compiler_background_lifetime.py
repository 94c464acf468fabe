"""The background compile worker as a user's training process starts it (issue 18, session 43,
held out): from a script whose model lives in a module beside it, and in a job that is ended by
a signal. Each test runs a real training-side process (a script of the shape users write) that
starts the worker through ``BackgroundCompiler``; no compile is run (a payload that compiles
nothing, or one whose unpickling waits), so no timing is asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import microco

pytestmark = pytest.mark.torch


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # the package as this test imports it, and nothing of the test's own search path besides
    env["PYTHONPATH"] = str(Path(next(iter(microco.__path__))).parent)
    env["MICROCO_COMPILER_HOME"] = str(tmp_path / "home")
    env["MICROCO_COMPILE_COSTS"] = str(tmp_path / "costs.json")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_a_model_in_a_module_beside_the_users_script_is_rebuilt_by_the_worker(tmp_path):
    """``python proj/train.py`` run from another directory: the parent imports ``mymodel`` from the
    script's directory (``sys.path[0]``); the worker (``python -m``, in the parent's working
    directory) failed with "No module named 'mymodel'", so every compile ran cold in the step."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "mymodel.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(4, 3)

                def forward(self, x):
                    return self.a(x)
            """
        )
    )
    (proj / "train.py").write_text(
        textwrap.dedent(
            """
            import json, time
            import torch
            from mymodel import Net
            from microco.clients.compiler._background import BackgroundCompiler

            # a configuration that compiles nothing: the worker rebuilds the model, runs its
            # steps and is done
            payload = {"model": Net(), "args": (torch.randn(2, 4),), "kwargs": {}, "values": {},
                       "threads": 1, "compile_choices": ["eager"]}
            job = BackgroundCompiler(lambda values: True, lambda values: payload)
            job.start({"threads": "1"})
            deadline = time.monotonic() + 240
            while job.busy() and time.monotonic() < deadline:
                time.sleep(0.1)
            print(json.dumps(job.log))
            """
        )
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, str(proj / "train.py")],
        cwd=elsewhere,
        check=False,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    log = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(log) == 1, log
    assert log[0]["error"] == "" and log[0]["rc"] == 0, log[0]


def _alive(pid: int) -> bool:
    """Running (a zombie no one reaps counts as gone: a container's init may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_the_worker_ends_with_the_training_process_that_started_it(tmp_path):
    """A training process ended by SIGTERM (the node agent's stop) runs no exit handler: its
    worker, in a session of its own that the job's process group signal does not reach, went on
    compiling, reparented to init, its model snapshot left in the temporary directory. Here the
    worker's unpickling waits (a payload whose reduction is ``time.sleep``), as a long compile."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from microco.clients.compiler._background import BackgroundCompiler

            class Slow:
                def __reduce__(self):
                    return (time.sleep, (600,))

            job = BackgroundCompiler(lambda values: True, lambda values: {"model": Slow()})
            job.start({"threads": "1"})
            print(job._proc.pid, *job._files, flush=True)
            time.sleep(600)
            """
        )
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)], env=_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    worker, files = 0, []
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        worker, files = int(line[0]), line[1:]
        assert _alive(worker)
        time.sleep(1.0)  # the worker under way (a compile does not end this soon)
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived the training process"
        assert not [p for p in files if os.path.exists(p)], "the worker's files were left behind"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
        for p in files:
            Path(p).unlink(missing_ok=True)
