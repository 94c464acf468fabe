"""``fifo``: exclusive devices, first come first served, never preempts.

What a plain cluster (Kubernetes with the default device plugin) does. With ``backfill``
(default) a later job that fits starts while an earlier, larger one waits, as the
Kubernetes scheduler does; without it the queue head blocks everyone behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._registry import register_policy
from ._state import Occupancy, arrival_order, place, waiting
from ._types import ClusterView, Decision, JobPhase, Resume, Start


@dataclass(frozen=True)
class FifoConfig:
    backfill: bool = True
    allow_spread: bool = True  # may a multi-device job span nodes when no node has room


@register_policy("fifo", config=FifoConfig)
class FifoPolicy:
    """First come, first served on exclusive devices."""

    name = "fifo"
    time_driven = False  # only arrivals and completions change its decisions

    def __init__(self, config: FifoConfig | None = None) -> None:
        self.config = config or FifoConfig()

    def decide(self, view: ClusterView) -> list[Decision]:
        occ = Occupancy(view)
        free = {n: list(v) for n, v in occ.free_by_node().items()}  # (changed below)
        n_free = sum(len(v) for v in free.values())
        out: list[Decision] = []
        if n_free == 0:
            return out
        for job in arrival_order(waiting(view)):
            if job.devices_wanted <= 0 or job.devices_wanted > len(view.devices):
                continue  # can never run here; the mechanism rejects such jobs at submit
            devs = (
                place(free, job.devices_wanted, allow_spread=self.config.allow_spread)
                if job.devices_wanted <= n_free
                else None
            )
            if devs is None:
                if not self.config.backfill:
                    break
                continue
            for d in devs:
                free[occ.node_of[d]].remove(d)
            free = {n: v for n, v in free.items() if v}
            n_free -= len(devs)
            if job.state is JobPhase.SUSPENDED:
                out.append(Resume(job.id, devs, "fifo: resume in arrival order"))
            else:
                out.append(Start(job.id, devs, "fifo: next in arrival order"))
            if n_free == 0:
                break
        return out
