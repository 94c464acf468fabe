"""What a whole-step compile is expected to save, from the eager step's profile (issue 18).

Policy only: the profile (``_step_profile``) says how much of the step is in GEMM-like kernels
that a compile on the CPU leaves to the same library; this rule turns that share into the share
of each step a compile is expected to save, where this host never measured the compile's gain on
the graph (a measured gain is used as it is, ``AstraTorch._gain_fraction``).

* **Optimistic (Amdahl)**: a compile removes at most everything but the GEMM-like time, so the
  step runs at most ``1 / gemm_share`` faster and saves at most ``1 - gemm_share`` of it.
* **Expected**: ``fraction`` of that bound. A priori ``PRIOR_FRACTION`` = 0.5, the midpoint,
  for the reason the exploration core expects half of its own optimistic bound
  (``ExplorationPolicy.expected_gain_share``): before it runs, a compile's gain is anywhere from
  nothing to the bound. Where this host has measured gains of compiled whole steps on graphs
  whose profile it also kept (at least ``MIN_PAIRS`` graphs), the fraction is their median of
  the saving measured over the saving bound (each clipped to [0, 1]): what compiles realised here
  of their bound.
* **Capped** at ``cap`` (the core's own optimistic saving, ``1 - 1/max_speedup``): the
  deadlines and the abandonment of a compile running over are drawn from that bound, and an
  estimate above it would plan compiles they then abandon.

A step mostly in elementwise work and overhead (a small share) thus expects more than the core's
fixed prior (a quarter of the step: 2x at best, half of that expected), a GEMM-dominated step
(share above one half) less.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True)
class CompileGainRule:
    prior_fraction: float = 0.5  # PRIOR_FRACTION: expected share of the Amdahl bound, a priori
    min_pairs: int = 2  # graphs with a profile and a measured gain needed to calibrate the fraction
    cap: float = 0.5  # the core's optimistic saving share (ExplorationPolicy.max_speedup 2)

    @staticmethod
    def bound(gemm_share: float) -> float:
        """The most of each step a compile can save: all but the GEMM-like time (0-1)."""
        return min(1.0, max(0.0, 1.0 - gemm_share))

    def fraction(self, pairs: Sequence[tuple[float, float]]) -> float:
        """The share of its bound a compile is expected to realise: the median over ``pairs``
        (gemm share, measured speedup) of this host's graphs where there are enough of them,
        else the prior."""
        realised = []
        for share, gain in pairs:
            bound = self.bound(share)
            if bound > 0 and gain > 0:
                realised.append(min(1.0, max(0.0, (1.0 - 1.0 / gain) / bound)))
        return _median(realised) if len(realised) >= self.min_pairs else self.prior_fraction

    def expected_share(self, gemm_share: float, pairs: Sequence[tuple[float, float]] = ()) -> float:
        """The share of each step a compile of a step with ``gemm_share`` is expected to save."""
        return min(self.cap, self.fraction(pairs) * self.bound(gemm_share))
