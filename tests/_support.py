"""Helpers shared by the test modules (pytest puts ``tests/`` on ``sys.path`` for
``tests/conftest.py``, so test modules import this as ``from _support import ...``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class lazy_import:
    """A module imported at the first use of one of its attributes. Every xdist worker collects
    every test module, so a framework imported at a module's top is paid by each worker
    (TensorFlow: ~9 CPU-s); through this, only by the worker that runs the module's tests."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # what pytest's collector asks of every module global
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def needs(module: str) -> Any:
    """A skip mark for tests that need ``module``, found without importing it."""
    import pytest

    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"{module} is not installed")


#: The most a wait is stretched on a busy machine (``load_factor``): a 30 s wait becomes at most
#: 2 minutes, so a real hang still fails well inside pytest's own timeout.
LOAD_FACTOR_CAP = 4.0


def load_factor(cap: float = LOAD_FACTOR_CAP) -> float:
    """How many times slower than on an idle machine the test's processes may run now: the
    1-minute load average per CPU, at least 1 (an idle or lightly loaded machine), at most
    ``cap``. CI runs several xdist workers beside real servers and framework processes on two
    cores (load 4-8, more with other work beside it), and every process a test waits for (a
    service starting, a job importing torch) then runs that much slower."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return min(cap, max(1.0, load / _cpus()))


def _cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # (no sched_getaffinity on this platform)
        return os.cpu_count() or 1


def scaled(timeout: float) -> float:
    """``timeout`` stretched by the machine's load now (:func:`load_factor`): for a timeout
    handed to something that waits itself (``subprocess.run``, a client's deadline). A bound on
    how long something may take is a guard against a hang, never what a test proves."""
    return timeout * load_factor()


def wait_for(cond: Callable[[], T], timeout: float = 10.0, interval: float = 0.05) -> T | None:
    """Poll ``cond`` until it returns something truthy (returned) or ``timeout`` passes (None).
    ``timeout`` is for an idle machine: it stretches with the machine's load while waiting
    (:func:`load_factor`, the largest seen), so a wait passes on a busy machine too, slower."""
    start = time.monotonic()
    factor = 1.0
    while True:
        value = cond()
        if value:
            return value
        factor = max(factor, load_factor())
        if time.monotonic() - start >= timeout * factor:
            return None
        time.sleep(interval)


def wait_until(
    cond: Callable[[], T],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.1,
    describe: Callable[[], str] | None = None,
) -> T:
    """Like :func:`wait_for` (``timeout`` stretched with load), but fail the test on timeout,
    saying ``what`` was awaited and (``describe``) the state that was found instead."""
    start = time.monotonic()
    value = wait_for(cond, timeout, interval)
    if not value:
        found = f"\n{describe()}" if describe is not None else ""
        waited = time.monotonic() - start
        raise AssertionError(
            f"timed out after {waited:.0f} s ({timeout:g} s idle, load factor {load_factor():.1f}) "
            f"waiting for {what}{found}"
        )
    return value


def scheduler_jobs(kv: Any) -> str:
    """Every scheduler job record in ``kv``, a line each (for timeout messages)."""
    return "\n".join(
        f"{r['id']} {r['state']} step={r['step']} devices={r['devices']} {r['history']}"
        for _, r in kv.get_prefix_json("/microco/scheduler/jobs/")
    )


def wait_for_jobs(cond: Callable[[], T], kv: Any, timeout: float = 30.0, what: str = "condition") -> T:
    """:func:`wait_until` that shows the scheduler's job records when it times out."""
    return wait_until(cond, timeout, what, describe=lambda: scheduler_jobs(kv))


def synthetic_job(steps: int, compute_ms: float = 5.0, io_ms: float = 0.0, *extra: str) -> list[str]:
    """The argv of ``examples/synthetic_job.py``: a training loop whose mini-batch is
    ``compute_ms`` of CPU work plus ``io_ms`` waiting for input (so it leaves its device idle)."""
    return [
        sys.executable,
        "-m",
        "microco.examples.synthetic_job",
        "--steps",
        str(steps),
        "--compute-ms",
        str(compute_ms),
        "--io-ms",
        str(io_ms),
        *extra,
    ]


def issued(name: str, admin: bool = False) -> Any:
    """Credentials for ``name`` (``service:x``, ``user:x``, ``job:x``) from the session's CA
    (tests/conftest.py), to call a server as someone other than the tests' administrator."""
    from microco.common.identity import local_ca

    ca = local_ca()
    assert ca is not None, "the session CA (MICROCO_CA_DIR) is missing"
    return ca.issue(name, admin=admin)


def put_node(kv: Any, name: str = "n1", devices: int = 2, address: str = "127.0.0.1:1") -> None:
    """A node agent's record with ``devices`` virtual devices, as the agent writes it (for
    scheduler tests that drive the core against a fake agent)."""
    kv.put_json(
        f"/microco/nodes/{name}",
        {
            "name": name,
            "address": address,
            "devices": [
                {"id": f"{name}/{i}", "node": name, "index": i, "kind": "virtual"} for i in range(devices)
            ],
        },
    )


def small_stack(home: Path, *flags: str, store_nodes: int = 3) -> list[str]:
    """The command of ``microco up`` for a small stack whose jobs use no framework: no console,
    one device, ``store_nodes`` store nodes, and no warm zygote (it would import torch for them)."""
    return [sys.executable, "-m", "microco.cli", "up", "--home", str(home), "--no-console", "--devices", "1",
            "--store-nodes", str(store_nodes), "--preload", "none", *flags]  # fmt: skip


def params_sha256(model: Any) -> str:
    """A digest of a torch module's state (parameters and buffers, in order): equal digests are
    bit-equal weights."""
    import hashlib

    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def run_python(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh interpreter that imports this tree's microco (as a clean clone's
    CI does through its install), its output captured: for what needs a process of its own
    (ranks of a ``torch.distributed`` group, TensorFlow's devices set before it starts).
    ``timeout`` (an idle machine's) stretches with load (:func:`scaled`)."""
    import microco

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(microco.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")])))
    return subprocess.run(
        [sys.executable, *args], check=False, env=env, capture_output=True, text=True, timeout=scaled(timeout)
    )


def seeded_steps(
    model: Any,
    opt: Any,
    run: Callable[[Callable[[], float]], float] | None,
    steps: int,
    shape: tuple[int, ...],
    extra: Callable[[Any], Any] | None = None,
    inference_inputs: bool = False,
) -> list[float]:
    """``steps`` training steps of a classifier of 3 classes on batches of ``shape`` drawn from a
    generator seeded by the step's number (the same batches in every run), each step through
    ``run`` (a wrapper's ``run``; None: called as written); ``extra(model)``: a term added to the
    loss (a model's auxiliary losses); ``inference_inputs``: the inputs made under
    ``torch.inference_mode``. The losses."""
    import torch
    from torch.nn import functional as F

    losses = []
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        with torch.inference_mode(inference_inputs):
            x = torch.randn(*shape, generator=g)
        y = torch.randint(0, 3, (shape[0],), generator=g)

        def step(x: Any = x, y: Any = y) -> float:
            loss = F.cross_entropy(model(x), y)
            if extra is not None:
                loss = loss + extra(model)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return float(loss.item())

        losses.append(run(step) if run is not None else step())
    return losses


def through_probe(astra: Any, step: Callable[[], Any], limit: int = 2) -> Any:
    """Run ``step`` under a PyTorch wrapper ``astra`` (``AstraTorch``) until its probe is over,
    its space registered: one step, or two where its first says a whole-step compile could
    pay and the second counts and profiles the step (issue 18, session 40). What the last
    step returned."""
    out = None
    for _ in range(limit):
        with astra.step():
            out = step()
        if astra.spec() is not None:
            return out
    raise AssertionError(f"the probe did not end in {limit} steps")


def fails_once_under_a_trial(base: type[Any]) -> type[Any]:
    """A subclass of the optimiser class ``base`` whose first step under an Astra trial of
    another implementation (``foreach``, ``fused``) fails after its update, the parameters
    already written (as a fused kernel refusing its inputs would). Set the class's ``astra``
    to the wrapper whose running configuration it reads; ``failed`` counts its failures."""

    class FailsOnceUnderATrial(base):  # type: ignore[misc, valid-type]
        astra: Any = None
        failed = 0

        def step(self, closure: Any = None) -> Any:
            out = super().step(closure)
            if (
                self.astra is not None
                and self.astra.running.get("optimizer", "loop") != "loop"
                and not self.failed
            ):
                type(self).failed += 1
                raise RuntimeError("injected: the optimiser's step failed under a trial")
            return out

    return FailsOnceUnderATrial
