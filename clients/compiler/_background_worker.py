"""The background compile worker: ``python -m microco.clients.compiler._background_worker IN OUT``.

Rebuilds the model snapshot from ``IN`` (written by :class:`BackgroundCompiler`), runs one
forward and backward under the given configuration with inputs of the captured shapes (the same
wrapper code as the training process, so the same graphs are compiled), and writes
``{"compile_s", "error"}`` to ``OUT``. The compiled code itself is thrown away; what matters is
what Inductor left in its on-disk caches for the training process to load.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# What the parent tells the worker (``_background.worker_env``): its pid, its ``sys.path``.
PARENT_ENV = "MICROCO_BACKGROUND_PARENT"
SYS_PATH_ENV = "MICROCO_BACKGROUND_SYS_PATH"

# The most steps the worker runs: the probe's (two at most) and the compiling one, with room.
MAX_STEPS = 6


class _Fixed:
    """An explorer that hands out one committed configuration (the candidate to compile)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def register(self, spec: Any) -> Any:
        from microco.clients.compiler.explore.types import Config

        return Config(
            spec.key, {**{v.name: v.choices[0] for v in spec.variables}, **self.values}, -1, committed=True
        )

    def report(self, key: str, report: Any) -> Any:
        from microco.clients.compiler.explore.types import Config

        return Config(key, dict(self.values), -1, committed=True)


def _grad_leaves(out: Any, seen: set[int] | None = None, depth: int = 0) -> list[Any]:
    """The tensors requiring grad anywhere in a forward's output: in containers (pytree's),
    dataclasses, and the attributes of other output objects (a few levels down)."""
    import dataclasses

    import torch
    from torch.utils._pytree import tree_flatten

    seen = set() if seen is None else seen
    if id(out) in seen or depth > 4:
        return []
    seen.add(id(out))
    if isinstance(out, torch.Tensor):
        return [out] if out.requires_grad else []
    leaves, _ = tree_flatten(out)
    if len(leaves) != 1 or leaves[0] is not out:  # a container pytree opens
        return [t for leaf in leaves for t in _grad_leaves(leaf, seen, depth + 1)]
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        inner: list[Any] = [getattr(out, f.name, None) for f in dataclasses.fields(out)]
    elif isinstance(out, (str, bytes, int, float, bool)) or out is None:
        return []
    else:
        inner = list(getattr(out, "__dict__", {}).values())
    return [t for v in inner for t in _grad_leaves(v, seen, depth + 1)]


def _loss(out: Any) -> Any:
    """A loss over every output requiring grad, so that the backward the training process runs
    is compiled here too (AOTAutograd compiles it at the first backward). Held out, issue 18,
    session 43: a model returning a plain dataclass (no pytree) gave no leaves, no backward ran,
    the worker reported its compile done, and the training process compiled the backward cold."""
    return sum(t.float().sum() for t in _grad_leaves(out))


@contextlib.contextmanager
def _call_context(call: dict[str, Any]) -> Iterator[None]:
    """The grad mode and autocast a training step's call of the model ran under."""
    import torch

    from microco.clients.compiler._torch import autocast_as

    with torch.set_grad_enabled(bool(call.get("grad", True))), autocast_as(tuple(call.get("autocast") or ())):
        yield


def compile_in_background(payload: dict[str, Any]) -> float:
    import torch

    from microco.clients.compiler._torch import AstraTorch

    torch.set_num_threads(int(payload.get("threads", 1)))
    model, args, kwargs = payload["model"], payload["args"], payload.get("kwargs") or {}
    astra = AstraTorch(
        model,
        _Fixed(payload["values"]),
        name="background-compile",
        compile_choices=tuple(payload["compile_choices"]),
        threads=(str(payload.get("threads", 1)),),
        background=False,
    )
    # Each distinct call of the model the training step made, under its autocast and grad mode
    # (a payload of before: the one call)
    calls = payload.get("calls") or [{"args": args, "kwargs": kwargs, "grad": True, "autocast": ()}]
    t0 = time.perf_counter()
    # The probe's steps (its first; a second counted and profiled where a whole-step compile
    # could pay), then the one that compiles the configuration, applied once the probe is done.
    # Two steps only, before (issue 18, session 43): where the probe took its second step (a
    # Hugging Face T5 at 12 ms a step) the worker compiled nothing, said it was done in 0.9 s,
    # and the trial's compile in the training process was a cold one, abandoned at its deadline.
    for _ in range(MAX_STEPS):
        applied = astra.session.spec is not None
        with astra.step():
            loss: Any = 0
            for call in calls:
                with _call_context(call):
                    loss = loss + _loss(model(*call["args"], **(call["kwargs"] or {})))
            if hasattr(loss, "backward"):
                loss.backward()
        failed = [r.failed for r in astra.runners.values() if r.failed] + list(astra.whole_failed.values())
        if failed:
            raise RuntimeError("; ".join(failed))
        if applied and not astra._needs_compile(astra.running):
            return time.perf_counter() - t0
    raise RuntimeError(f"the configuration was not compiled in {MAX_STEPS} steps")


# How often the worker looks whether its parent is still there (seconds).
PARENT_POLL_S = 0.5


def watch_parent(files: tuple[str, ...], poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """End this worker, its compiler's children and its files when the training process that
    started it is gone (a daemon thread polling the parent's pid).

    The worker runs in its own session (``BackgroundCompiler`` stops it and its children by
    process group), so a signal to the job's group does not reach it, and the parent's reaper
    runs only at a normal exit. Held out, issue 18, session 43: a training process ended by
    SIGTERM (what the node agent sends a job it stops) left its worker compiling on, reparented
    to init, and its model snapshot in the temporary directory."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0) or os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        for path in files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if os.getpgrp() == os.getpid():  # its own group (as started): its compiler's children too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    thread = threading.Thread(target=watch, name="microco-parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    src, dst = argv[1], argv[2]
    watch_parent((src, dst, src[:-3] + ".err" if src.endswith(".pt") else dst + ".err"))
    # The parent's module search path: the model's classes are found where the parent found them.
    parent_path = json.loads(os.environ.get(SYS_PATH_ENV, "[]") or "[]")
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
    nice = int(os.environ.get("MICROCO_BACKGROUND_NICE", "0") or 0)
    if nice:
        os.nice(nice)
    result: dict[str, Any] = {"compile_s": None, "error": ""}
    rc = 0
    try:
        import torch

        payload = torch.load(src, weights_only=False)
        result["compile_s"] = round(compile_in_background(payload), 3)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which compiles in line
        result["error"] = f"{type(exc).__name__}: {exc}"
        rc = 1
    with open(dst, "w") as f:
        json.dump(result, f)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
