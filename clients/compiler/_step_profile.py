"""How much of an eager step a compiler can remove: the step's op-level profile (issue 18).

Mechanism only. One eager step the run takes anyway (the probe's) is run under the
autograd profiler over Kineto (CPU only: the dispatcher's op events, no shapes, stacks or memory),
and its wall time is split in two:

* **GEMM-like time**: the intervals of matrix products, convolutions and fused attention kernels
  (``GEMM_OPS``, forward and backward). A whole-step compiler on the CPU hands these to the same
  BLAS / oneDNN kernels, so compiling cannot remove them;
* the rest: elementwise ops and reductions, copies and views, autograd's and Python's overhead
  between kernels, the optimiser's update. What fusion and a compiled graph can remove.

A share is not a gain: what to expect of a compile given the share is the caller's policy
(``_gain_rule``). On an accelerator the CPU's op intervals are launch times, not kernel times:
the profile is taken on the CPU only (the caller's concern).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ._intervals import union_length

# Kernels a compiler leaves to the vendor library on the CPU: products, convolutions, fused
# attention (their backward ops included). Union of intervals, so an op nested in another
# (``aten::convolution`` around ``aten::mkldnn_convolution``, ``aten::matmul`` around
# ``aten::mm``) counts once.
GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::_addmm_activation",
        "aten::bmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::mv",
        "aten::addmv",
        "aten::dot",
        "aten::convolution",
        "aten::_convolution",
        "aten::mkldnn_convolution",
        "aten::convolution_backward",
        "aten::_slow_conv2d_forward",
        "aten::_slow_conv2d_backward",
        "aten::slow_conv3d_forward",
        "aten::slow_conv_dilated2d",
        "aten::slow_conv_dilated3d",
        "aten::_nnpack_spatial_convolution",
        "aten::mkldnn_rnn_layer",
        "aten::mkldnn_rnn_layer_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
    }
)


@dataclass(frozen=True)
class StepProfile:
    """One profiled eager step: its wall time, the GEMM-like kernels' time in it (ms), the op
    events the profiler recorded, and what the profile cost beyond the step (ms: stopping the
    profiler and reading its events)."""

    step_ms: float
    gemm_ms: float
    events: int
    cost_ms: float
    overhead_ms: float = 0.0  # what the profiler added to the step's wall (events x its cost per event)

    @property
    def own_ms(self) -> float:
        """The step's wall less what profiling it added: the step as it runs unprofiled."""
        return max(self.gemm_ms, self.step_ms - self.overhead_ms)

    @property
    def gemm_share(self) -> float:
        """The share of the step in GEMM-like kernels (0-1): what no compile removes."""
        own = self.own_ms
        if not own > 0:
            return 1.0
        return min(1.0, max(0.0, self.gemm_ms / own))


# Kineto's own log level where the user set none: above its highest (``USDT``, 5). Kineto
# prints two lines to the process's stderr at each profile's start and stop at its default
# level ("USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start"), which landed in every
# training job's output at its probe step (found session 29, the lead's held-out runs). The
# level is read once, when Kineto first starts in the process, so it is set before the first
# profile; a process that profiled before keeps its level, and a user who wants Kineto's lines
# sets ``KINETO_LOG_LEVEL`` themselves.
KINETO_QUIET_LEVEL = "6"


def _profiler() -> Any:
    """The autograd profiler over Kineto, CPU op events only, its events left unprocessed (read
    raw, ``StepProfiler.stop``). Not ``torch.profiler.profile``: its start imports Inductor
    (``hasattr(torch, "_inductor")``, 1.5-2.2 s measured here on the first call of a process).
    Not the legacy profiler (``use_kineto=False``): reading its events took 178 ms against 2 ms
    for a step of 2,730 events."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    return torch.autograd.profiler.profile(use_cpu=True, use_kineto=True, record_shapes=False)


# What the profiler adds to a step per op event it records (µs): measured on the 2-core VM
# (issue 18, session 29: 10 eager steps unprofiled and 10 profiled, interleaved, one thread, of
# four held-out models: 0.35-0.66 µs an event, 0.9-3.0 ms a step of 2,500-4,450 events, 10-14% of
# the step). A prior: a calibration by tiny ops timed plain and profiled, tried first, read 2.1 µs
# a call, 3-6x the cost in a real step, and took out more than the profiler added (the GEMM share
# of xt-tied's step read 0.45 against 0.31 unprofiled).
EVENT_US = 0.5


class StepProfiler:
    """Profile one step: ``start()`` before it, ``stop(step_ms)`` after it, with the step's wall
    time as the caller measured it (the profiler's own per-op cost is in it, and is taken out:
    ``EVENT_US`` an event). ``stop`` returns None where the profile could not be read or the
    step failed (``step_ms`` 0)."""

    def __init__(self) -> None:
        self._prof: Any = None

    def start(self) -> bool:
        try:
            prof = _profiler()
            prof.__enter__()
        except Exception:  # noqa: BLE001 - a profiler that cannot start leaves the prior
            return False
        self._prof = prof
        return True

    def stop(self, step_ms: float) -> StepProfile | None:
        prof, self._prof = self._prof, None
        if prof is None:
            return None
        started = time.perf_counter()
        if not step_ms > 0:
            with contextlib.suppress(Exception):  # (a failed step: nothing to read)
                prof.__exit__(None, None, None)
            return None
        try:
            prof.__exit__(None, None, None)
            events = prof.kineto_results.events()
            by_thread: dict[int, list[tuple[int, int]]] = {}
            n = 0
            for ev in events:
                n += 1
                if ev.name() in GEMM_OPS:
                    s = ev.start_ns()
                    by_thread.setdefault(ev.start_thread_id(), []).append((s, s + ev.duration_ns()))
            gemm = sum(union_length(iv) for iv in by_thread.values()) / 1e6
        except Exception:  # noqa: BLE001 - an unreadable profile leaves the prior
            return None
        cost = (time.perf_counter() - started) * 1e3
        return StepProfile(
            step_ms=step_ms, gemm_ms=gemm, events=n, cost_ms=cost, overhead_ms=n * EVENT_US / 1e3
        )
