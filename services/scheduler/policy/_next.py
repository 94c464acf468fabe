"""Which waiting jobs a policy will run next: what a scheduler-aware cache prefetches for.

The scheduler publishes one waiting job as ``resuming`` (``microco.clients.scheduler``
``job_phases``); by default the least-served one, Gandiva's order. A policy may pass it over
(``gandiva``'s ``dataset_affinity`` starts first a job whose dataset is being read), and then
the cache brings in data nobody reads next. :func:`next_to_run` asks the policy itself: it
moves the view to the policy's next decision point (``wakeup_at``, the running jobs' service
grown by then) and returns the jobs that ``decide`` would start or resume there.

Valid for policies whose ``decide`` is a function of the view alone (``fifo``, ``las``,
``gandiva``: they keep no state between calls); the answer is a forecast, not a decision: an
event before then (a job ending, a new one) may change it.
"""

from __future__ import annotations

from dataclasses import replace

from ._registry import Policy
from ._types import HOLDING_PHASES, ClusterView, Resume, Start


def next_to_run(policy: Policy, view: ClusterView, horizon_s: float | None = None) -> tuple[str, ...] | None:
    """The ids of the jobs ``policy`` would start or resume at its next decision point, in
    its order (empty: it would start none there). The point is ``policy.wakeup_at(view)`` when
    the policy has it and names one, else ``view.now + horizon_s``; None when there is no such
    point (only an event can change the policy's answer: no forecast)."""
    wake = getattr(policy, "wakeup_at", None)
    at = wake(view) if wake is not None else None
    if at is None:
        if horizon_s is None:
            return None
        at = view.now + horizon_s
    dt = max(0.0, at - view.now)
    later = ClusterView(
        now=view.now + dt,
        devices=view.devices,
        jobs=tuple(
            replace(j, attained_service_s=j.attained_service_s + dt * len(j.devices))
            if j.state in HOLDING_PHASES
            else j
            for j in view.jobs
        ),
    )
    return tuple(d.job_id for d in policy.decide(later) if isinstance(d, Start | Resume))
