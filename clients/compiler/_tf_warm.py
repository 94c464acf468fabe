"""XLA compiles off the critical path, with a deadline (TensorFlow; issue 18, session 11).

Found in the corpus: XLA was priced from recurrent cells and then tried on a CNN, whose compile
took 360-835 s of a training run at load 20-28. A price can be wrong by an order of magnitude,
so a trial's XLA compile no longer runs in the training step. :class:`XlaWarmer` (the session's
``Warmer``) compiles the trial's step in a background thread, on *shadow* copies of the model's
and optimiser's variables: the traced step's concrete function is called with its captured
variable handles replaced by the copies' (``ConcreteFunction._call_flat``), so the step XLA
compiles and runs once is the very function the trial will call (same function, same argument
shapes: TensorFlow's XLA compilation cache then serves the trial's first call, measured 3.1 s
compile in the background against 17 ms for the first call afterwards), while the real
variables are not touched. Meanwhile the explorer holds the training on the best configuration
so far (the core's ``pending``/hold protocol, as for PyTorch's background worker).

A compile that has not finished by its **deadline** is **abandoned**: the trial is reported
failed (the core prunes it) and the graph's price on this hardware is raised to at least the
time it ran (``XlaCostModel.observe_abandoned``), so the next run does not try it where it
cannot repay that. The deadline is the smaller of ``DEADLINE_FACTOR`` times the compile's price
(at least ``MIN_DEADLINE_MS``) and the most the compile could save over the run's steps left
(the baseline's typical step, at best twice as fast). XLA's compile is C++ and cannot be
interrupted: an abandoned compile's thread runs on to its end in the background (its result is
dropped); what it costs the training steps beside it is charged by the core's hold accounting.
A step whose variables cannot all be shadowed (a captured resource that is not a model or
optimiser variable) compiles in line as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ._compile_costs import DEADLINE_FACTOR, MIN_DEADLINE_MS, compile_deadline_ms

log = logging.getLogger(__name__)

__all__ = ["DEADLINE_FACTOR", "MIN_DEADLINE_MS", "XlaWarmer", "compile_deadline_ms", "shadow_inputs"]


def _tf_variable(v: Any) -> Any:
    """The ``tf.Variable`` behind ``v`` (a Keras 3 variable keeps it as ``.value``)."""
    if hasattr(v, "handle"):
        return v
    inner = getattr(v, "value", None)
    return inner if hasattr(inner, "handle") else None


def handle_key(v: Any) -> int | None:
    """A variable's identity, its resource handle's: a Keras 3 variable is not the
    ``tf.Variable`` it wraps, nor the one a trace watches, while the handle is one (None: not a
    TF variable)."""
    tv = _tf_variable(v)
    return id(tv.handle) if tv is not None else None


def shadow_inputs(concrete: Any, variables: list[Any]) -> list[Any] | None:
    """The concrete function's captured inputs with each variable handle replaced by a copy's
    (the copies hold the variables' current values); None when a captured resource is not one
    of ``variables`` (it cannot be shadowed)."""
    captured = list(concrete.captured_inputs)
    if not captured:
        return []
    import tensorflow as tf

    by_handle = {handle_key(v): _tf_variable(v) for v in variables if _tf_variable(v) is not None}
    out = []
    for c in captured:
        if c.dtype != tf.resource:
            out.append(c)
            continue
        tv = by_handle.get(id(c))
        if tv is None:
            return None
        out.append(tf.Variable(tf.convert_to_tensor(tv), trainable=False).handle)
    return out


def _flat_inputs(*values: Any) -> list[Any]:
    """A step's inputs as its concrete function's flat arguments: a nest of tensors (a Keras
    model's dict of named inputs) is several, in ``tf.nest``'s order (a dict's by sorted key),
    each a tensor (``tf.function`` takes NumPy arrays and converts them; a concrete function's
    flat call does not: issue 18, session 31, every background compile of a step fed NumPy
    batches failed and compiled in the training step instead)."""
    import tensorflow as tf

    flat = list(tf.nest.flatten(list(values), expand_composites=True))
    return [v if isinstance(v, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(v) for v in flat]


class _Job:
    def __init__(self, values: dict[str, str], fid: int, kind: str, deadline_ms: float) -> None:
        self.values, self.fid, self.kind, self.deadline_ms = values, fid, kind, deadline_ms
        self.started = time.perf_counter()
        self.ms: float | None = None
        self.error = ""
        self.thread: threading.Thread | None = None

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1e3


class XlaWarmer:
    """One background XLA compile at a time for an ``AstraTF`` (``owner``): implements the
    session's ``Warmer`` protocol (``ready``, ``start``, ``busy``, ``cancel``)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.done: set[int] = set()  # ids of step variants compiled in the background
        self.abandoned: dict[int, str] = {}  # id of a step variant -> why its compile was abandoned
        self.inline: set[int] = set()  # variants that cannot be shadowed: they compile in line
        self._queue: list[dict[str, str]] = []
        self._job: _Job | None = None
        self._orphans: list[_Job] = []  # abandoned compiles still running (C++: not interruptible)
        self.log: list[dict[str, Any]] = []

    # -- the Warmer protocol
    def ready(self, values: dict[str, str]) -> bool:
        fn, kind = self.owner._mode(values)
        fid = id(fn)
        if (
            not kind
            or fid in self.owner._called
            or fid in self.done
            or fid in self.abandoned
            or fid in self.inline
        ):
            return True
        queued = (self._job is not None and self._job.fid == fid) or any(
            id(self.owner._mode(v)[0]) == fid for v in self._queue
        )
        if not queued and self.owner.compiles_in_line(kind):
            # Its compile runs in the trial's first step (``AstraTF.compiles_in_line``).
            self.inline.add(fid)
            self.log.append({"values": dict(values), "kind": kind, "outcome": "in line"})
            return True
        return False

    def start(self, values: dict[str, str]) -> None:
        fid = id(self.owner._mode(values)[0])
        if (self._job is not None and self._job.fid == fid) or any(
            id(self.owner._mode(v)[0]) == fid for v in self._queue
        ):
            return
        self._queue.append(dict(values))
        self._pump()

    def busy(self) -> bool:
        self._pump()
        return self._job is not None or bool(self._queue)

    def cancel(self) -> None:
        """Nothing left to compile for: the queue is dropped, a running compile left to finish
        on its own (it cannot be interrupted) and its result ignored."""
        self._queue.clear()
        if self._job is not None:
            self._orphans.append(self._job)
            self.log.append(self._entry(self._job, "cancelled"))
            self._job = None

    # -- mechanism
    def _pump(self) -> None:
        job = self._job
        if job is not None:
            assert job.thread is not None
            if not job.thread.is_alive():
                self._finish(job)
            elif job.elapsed_ms() > job.deadline_ms:
                self._abandon(job)
        self._orphans = [j for j in self._orphans if j.thread is not None and j.thread.is_alive()]
        # One compile at a time, an abandoned one included (it still holds a core).
        while self._job is None and self._queue and not self._orphans:
            self._launch(self._queue.pop(0))

    def _launch(self, values: dict[str, str]) -> None:
        owner = self.owner
        fn, kind = owner._mode(values)
        fid = id(fn)
        if self.ready(values):
            return
        x, y = owner._example
        try:
            concrete = fn.get_concrete_function(x, y)  # traced here, in the training thread
            shadows = shadow_inputs(concrete, owner._all_variables())
        except Exception as exc:  # noqa: BLE001 - the trial then compiles in line, as before
            log.info("astra-tf: background compile unavailable (%s); compiling in line", exc)
            shadows, concrete = None, None
        if shadows is None or concrete is None:
            self.inline.add(fid)
            return
        job = _Job(values, fid, kind, owner._compile_deadline_ms(kind))
        flat_inputs = _flat_inputs(x, y)

        def run() -> None:
            t0 = time.perf_counter()
            try:
                # (the step's inputs as the function's flat arguments: a dict of named inputs,
                # keras-hub's, is several; passed as one, the call was refused, issue 18, session 27)
                concrete._call_flat(flat_inputs, shadows)
                job.ms = (time.perf_counter() - t0) * 1e3
            except Exception as exc:  # noqa: BLE001 - reported; the trial compiles in line
                job.error = f"{type(exc).__name__}: {exc}"[:300]

        job.thread = threading.Thread(target=run, name="astra-tf-xla-compile", daemon=True)
        self._job = job
        job.thread.start()

    def _finish(self, job: _Job) -> None:
        self._job = None
        if job.error or job.ms is None:
            log.warning("astra-tf: background XLA compile failed (%s); the trial compiles in line", job.error)
            self.inline.add(job.fid)
            self.log.append(self._entry(job, "failed"))
            return
        self.done.add(job.fid)
        self.owner._observe_background_compile(job.kind, job.ms)
        self.log.append(self._entry(job, "done"))

    def _abandon(self, job: _Job) -> None:
        self._job = None
        elapsed = job.elapsed_ms()
        self.abandoned[job.fid] = (
            f"XLA compile abandoned: not done after {elapsed / 1e3:.1f} s (deadline {job.deadline_ms / 1e3:.1f} s)"
        )
        self._orphans.append(job)
        self.owner._observe_abandoned_compile(job.kind, elapsed)
        self.log.append(self._entry(job, "abandoned"))
        log.info("astra-tf: %s", self.abandoned[job.fid])

    @staticmethod
    def _entry(job: _Job, outcome: str) -> dict[str, Any]:
        return {
            "values": dict(job.values),
            "kind": job.kind,
            "outcome": outcome,
            "elapsed_s": round(job.elapsed_ms() / 1e3, 3),
            "compile_s": round(job.ms / 1e3, 3) if job.ms is not None else None,
            "deadline_s": round(job.deadline_ms / 1e3, 3),
            "error": job.error,
        }
