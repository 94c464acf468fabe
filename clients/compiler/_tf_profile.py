"""How much of a TensorFlow step XLA can remove: the step's op-level profile (issue 18).

Mechanism only, the TensorFlow side of ``_step_profile``. One plain step the run takes anyway
is run under TensorFlow's profiler (host events only: no Python tracer, no device tracer), and
its wall time is split in two:

* **library time**: the union of the intervals in which a matrix product or a convolution
  (``LIBRARY_OPS``, forward and backward, oneDNN's ``_Mkl*`` kernels included) runs on any of the
  executor's threads. XLA on the CPU does not fuse these away: it calls a product library for
  its dots and emits its own code for its convolutions, which is no faster than oneDNN's (on
  MobileNetV3Small's depthwise convolutions, 4x slower: issue 18, session 40);
* the rest: elementwise ops, reductions, copies, the executor's dispatch between kernels, the
  optimiser's update. What XLA's fusion and one compiled module can remove.

The share is measured against the step's span on the executor's threads (from its first op's
start to its last op's end): the executor's dispatch between kernels is in it, the Python call of
the ``tf.function`` and the wait for its result are not (XLA's compiled step is called the same
way), nor is the profiler's own start-up (its first start in a process holds the step's first
ops by ~90 ms here). keras-sublstm's step, 3.8-7.6 ms of wall at load 5, spanned 2.1-2.3 ms on
the executor, 0.35-0.41 of it in products (0.12-0.19 of the wall); MobileNetV3Small's 0.67-0.88
in convolutions (2-core VM, 2026-12-05). A share is not a gain: what to expect of XLA given the
share is the caller's policy (``_gain_rule``, as for PyTorch's whole-step compiles).
"""

from __future__ import annotations

import bisect
import glob
import logging
import shutil
import statistics
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._intervals import union_length

log = logging.getLogger(__name__)

# Op types (the part of an op event's name after its last ":") whose kernels are products or
# convolutions: any type containing one of these. oneDNN's rewrites keep the name inside their
# own (``_MklMatMul``, ``_MklNativeFusedConv2D``, ``_MklNativeDepthwiseConv2dNativeBackpropFilter``).
LIBRARY_OPS = ("MatMul", "Conv2D", "Conv3D", "DepthwiseConv2d", "Einsum", "Conv1D")
# Of those, the convolutions: XLA's CPU backend emits its own code for them, not oneDNN's.
CONVOLUTION_OPS = ("Conv2D", "Conv3D", "DepthwiseConv2d", "Conv1D")


@dataclass(frozen=True)
class TfStepProfile:
    """One profiled plain step: its wall time, its span on the executor's threads, the library
    kernels' time in it (ms, the union of their intervals over those threads), the op events
    read, and what the profile cost beyond the step (ms: starting and stopping the profiler,
    reading its trace)."""

    step_ms: float
    span_ms: float  # from the step's first op's start to its last op's end, on the executor
    library_ms: float
    events: int
    cost_ms: float
    convolution_ms: float = 0.0  # the convolutions' part of ``library_ms``
    steps: int = 1  # the steps profiled (the figures are the median one's)

    @property
    def library_share(self) -> float:
        """The share of the step's span in products and convolutions (0-1): what XLA does not
        fuse."""
        if not self.span_ms > 0:
            return 1.0
        return min(1.0, max(0.0, self.library_ms / self.span_ms))

    @property
    def convolution_share(self) -> float:
        """The share of the step's span in convolutions (0-1)."""
        if not self.span_ms > 0:
            return 0.0
        return min(1.0, max(0.0, self.convolution_ms / self.span_ms))


def _windows(space: Any, function: str) -> list[tuple[int, int]]:
    """The calls of the step's concrete function (``function``, its name) on the Python thread:
    (start, end) in ps, one per step run under the profile."""
    out = []
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            if line.name != "python":
                continue
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = meta[e.metadata_id].name
                if name.startswith("EagerLocalExecute") and name.endswith(function):
                    out.append((base + e.offset_ps, base + e.offset_ps + e.duration_ps))
    return sorted(out)


def _step_reads(space: Any, windows: list[tuple[int, int]]) -> list[tuple[float, float, float, int]]:
    """Per window (one step): (span ms, library ms, convolution ms, op events) of the op events
    on the executor's threads that start in it; windows with no op event are left out."""
    per: list[dict[str, Any]] = [{"lib": [], "conv": [], "n": 0, "first": -1, "last": -1} for _ in windows]
    starts = [w[0] for w in windows]
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            if not line.name.startswith("tf_"):
                continue  # (the executor's threads: ``tf_Compute/...``; not the Python thread)
            base = line.timestamp_ns * 1000
            for e in line.events:
                name = meta[e.metadata_id].name
                if ":" not in name or "::" in name:
                    continue  # (the executor's own events, ``ExecutorState::Process``)
                start = base + e.offset_ps
                i = bisect.bisect_right(starts, start) - 1
                if i < 0 or start > windows[i][1]:
                    continue  # (outside every call of the step)
                end = start + e.duration_ps
                w = per[i]
                w["n"] += 1
                w["first"] = start if w["first"] < 0 else min(w["first"], start)
                w["last"] = max(w["last"], end)
                op = name.rsplit(":", 1)[1]
                if any(k in op for k in LIBRARY_OPS):
                    w["lib"].append((start, end))
                    if any(k in op for k in CONVOLUTION_OPS):
                        w["conv"].append((start, end))
    return [
        ((w["last"] - w["first"]) / 1e9, union_length(w["lib"]) / 1e9, union_length(w["conv"]) / 1e9, w["n"])
        for w in per
        if w["n"]
    ]


class StepsProfiler:
    """TensorFlow's profiler over several calls of one step, each call a profile of its own
    (started before it and stopped after it, inside the one call of the user's loop: the
    process-wide profiler is never left running between the user's steps, where it would hold
    their own profile off and buffer their work's events), read together at the end: the
    profile of the step whose library share is their median. On a loaded host a preemption
    inside a kernel stretches its interval, and one step's share read 0.35-0.75 for the same
    step (keras-sublstm at load 4, 2026-12-05); the median of three holds where one step is
    disturbed. Host events only (no Python tracer, no device tracer)."""

    def __init__(self) -> None:
        self._dirs: list[str] = []
        self._step_ms: list[float] = []
        self._cost_ms = 0.0
        # (the traces are removed when read, or with the profiler where never read)
        self._cleanup = weakref.finalize(self, _remove, self._dirs)

    @property
    def steps(self) -> int:
        return len(self._dirs)

    def run(self, step: Callable[[], Any]) -> Any:
        """Call ``step`` (one training step, waited for) under a profile of its own and return
        what it returns. Where the profiler cannot be started (another profile running, none
        built in) the step runs unprofiled. A step that raises raises, the profiler stopped."""
        import tensorflow as tf

        t0 = time.perf_counter()
        directory = tempfile.mkdtemp(prefix="microco-tfprof-")
        try:
            options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0)
            tf.profiler.experimental.start(directory, options=options)
        except Exception as exc:  # noqa: BLE001 - another profile running, or none built in
            log.info("astra-tf: the step was not profiled (%s)", exc)
            shutil.rmtree(directory, ignore_errors=True)
            return step()
        t1 = time.perf_counter()
        try:
            out = step()
        finally:
            t2 = time.perf_counter()
            try:
                tf.profiler.experimental.stop()
                self._dirs.append(directory)
            except Exception as exc:  # noqa: BLE001
                log.info("astra-tf: the profiler did not stop cleanly (%s)", exc)
                shutil.rmtree(directory, ignore_errors=True)
        self._step_ms.append((t2 - t1) * 1e3)
        self._cost_ms += (time.perf_counter() - t0) * 1e3 - (t2 - t1) * 1e3
        return out

    def read(self, function: str) -> TfStepProfile | None:
        """The profiles' calls of the concrete function named ``function``: the median step's
        figures; None where none was taken or none holds a call of it. The traces are removed."""
        t0 = time.perf_counter()
        reads: list[tuple[float, float, float, int]] = []
        try:
            for directory in self._dirs:
                try:
                    reads.extend(_read(directory, function))
                except Exception as exc:  # noqa: BLE001 - an unreadable trace: left out
                    log.info("astra-tf: a step's profile was not read (%s)", exc)
        finally:
            _remove(self._dirs)
        if not reads:
            return None
        reads.sort(key=lambda r: r[1] / r[0] if r[0] > 0 else 1.0)
        span_ms, library_ms, convolution_ms, events = reads[len(reads) // 2]
        cost_ms = self._cost_ms + (time.perf_counter() - t0) * 1e3
        step_ms = statistics.median(self._step_ms)
        return TfStepProfile(step_ms, span_ms, library_ms, events, cost_ms, convolution_ms, len(reads))


def _remove(dirs: list[str]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    dirs.clear()


def _read(directory: str, function: str) -> list[tuple[float, float, float, int]]:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)
    if not files:
        return []
    space = xplane_pb2.XSpace()
    with open(files[0], "rb") as f:
        space.ParseFromString(f.read())
    return _step_reads(space, _windows(space, function))
