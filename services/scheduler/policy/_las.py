"""``las``: Tiresias-style discretised least attained service with preemption.

Jobs are ranked by the queue their attained service (device-seconds, Tiresias' 2D
measure) falls in, then first come first served inside a queue. The best-ranked jobs that
fit the cluster should run; a running job outside that set is suspended (once it has run
``min_run_s`` since its last change, so the cluster does not thrash) when, and only when,
that frees a placement for a better-ranked waiting job.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ._registry import register_policy
from ._state import Occupancy, place, preempt_for
from ._types import (
    HOLDING_PHASES,
    WAITING_PHASES,
    ClusterView,
    Decision,
    JobPhase,
    JobView,
    Resume,
    Start,
    Suspend,
)


@dataclass(frozen=True)
class LasConfig:
    # Queue boundaries in device-seconds (Tiresias uses a few exponentially spaced ones).
    thresholds_s: tuple[float, ...] = (3600.0, 36000.0)
    min_run_s: float = 60.0
    allow_spread: bool = True

    def __post_init__(self) -> None:
        if list(self.thresholds_s) != sorted(self.thresholds_s):
            raise ValueError("thresholds_s must be increasing")
        if self.min_run_s < 0:
            raise ValueError("min_run_s must be >= 0")
        object.__setattr__(self, "thresholds_s", tuple(float(x) for x in self.thresholds_s))


@register_policy("las", config=LasConfig)
class LasPolicy:
    """Discretised least-attained-service (Tiresias) with preemption."""

    name = "las"
    time_driven = True  # attained service grows, so rankings change with time

    def __init__(self, config: LasConfig | None = None) -> None:
        self.config = config or LasConfig()

    def _key(self, j: JobView) -> tuple:
        return (
            bisect.bisect_right(self.config.thresholds_s, j.attained_service_s),
            -j.priority,
            j.submitted_at,
            j.id,
        )

    def decide(self, view: ClusterView) -> list[Decision]:
        cfg = self.config
        n_dev = len(view.devices)
        waiting = [j for j in view.jobs if j.state in WAITING_PHASES and 0 < j.devices_wanted <= n_dev]
        if not waiting:
            return []
        holders = [j for j in view.jobs if j.state in HOLDING_PHASES]
        ranked = sorted(waiting + holders, key=self._key)
        # Which jobs deserve to run: best-ranked first, skipping those that no longer fit in
        # the remaining capacity (backfill). Jobs that may not be preempted now count first.
        protected = {
            j.id
            for j in holders
            if j.state is JobPhase.MIGRATING
            or j.state is JobPhase.PACKED
            or not j.preemptible
            or view.now - j.last_change_at < cfg.min_run_s
        }
        cap = n_dev - sum(len(j.devices) for j in holders if j.id in protected)
        desired: set[str] = set()
        for j in ranked:
            if j.id in protected:
                continue
            need = len(j.devices) if j.state in HOLDING_PHASES else j.devices_wanted
            if need <= cap:
                desired.add(j.id)
                cap -= need
        victims = sorted(
            (j for j in holders if j.id not in protected and j.id not in desired),
            key=self._key,
            reverse=True,  # worst-ranked first
        )
        occ = Occupancy(view)
        out: list[Decision] = []
        suspended: set[str] = set()
        started: set[str] = set()
        for w in ranked:
            if w.state not in WAITING_PHASES or w.id not in desired:
                continue
            wkey = self._key(w)
            cands = [v for v in victims if v.id not in suspended and self._key(v) > wkey]
            got = preempt_for(occ, w.devices_wanted, cands, allow_spread=cfg.allow_spread)
            if got is None:
                continue
            devs, used = got
            for v in used:
                suspended.add(v.id)
                out.append(Suspend(v.id, f"las: preempted for {w.id} (less attained service)"))
            occ.take(w.id, devs)
            started.add(w.id)
            out.append(_run(w, devs, "las: least attained service"))
        # Backfill: fragmentation can leave free devices no desired job can use.
        free = occ.free_by_node()
        n_free = sum(len(v) for v in free.values())
        for w in ranked:
            if n_free == 0:
                break
            if w.state not in WAITING_PHASES or w.id in started or w.devices_wanted > n_free:
                continue
            fit = place(free, w.devices_wanted, allow_spread=cfg.allow_spread)
            if fit is None:
                continue
            devs = fit
            occ.take(w.id, devs)
            free = occ.free_by_node()
            n_free -= len(devs)
            out.append(_run(w, devs, "las: backfill on idle devices"))
        return out

    def wakeup_at(self, view: ClusterView) -> float | None:
        """Earliest time at which, with no event in between, ``decide`` could answer
        differently: a running job's ``min_run_s`` ending or its attained service crossing a
        queue threshold, while someone waits. None: nothing pending on the clock."""
        if not any(j.state in WAITING_PHASES for j in view.jobs):
            return None
        cfg = self.config
        best = float("inf")
        for r in view.jobs:
            if r.state not in HOLDING_PHASES or not r.devices:
                continue
            t = r.last_change_at + cfg.min_run_s
            if t > view.now:
                best = min(best, t)
            i = bisect.bisect_right(cfg.thresholds_s, r.attained_service_s)
            if i < len(cfg.thresholds_s):
                best = min(
                    best, view.now + (cfg.thresholds_s[i] - r.attained_service_s) / len(r.devices) + 1e-6
                )
        return None if best == float("inf") else best


def _run(job: JobView, devs: tuple[str, ...], reason: str) -> Decision:
    if job.state is JobPhase.SUSPENDED:
        return Resume(job.id, devs, reason)
    return Start(job.id, devs, reason)
