"""The scheduler's own Prometheus metrics (beside the common RPC metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("microco_scheduler_jobs", "jobs by state (as seen by the leader's last tick)", ["state"])
DECISIONS = Counter(
    "microco_scheduler_decisions_total", "policy decisions carried out or refused", ["decision", "outcome"]
)
LOST = Counter("microco_scheduler_jobs_lost_total", "jobs whose process or node was lost (rescheduled)")
TICK = Histogram(
    "microco_scheduler_tick_seconds",
    "duration of one control-loop tick",
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
IS_LEADER = Gauge("microco_scheduler_is_leader", "1 while this instance runs the control loop")
GC_JOBS = Counter("microco_scheduler_gc_jobs_total", "jobs whose node data (checkpoints, logs) was deleted")
GC_BYTES = Counter("microco_scheduler_gc_bytes_total", "bytes of job data deleted on the nodes")
