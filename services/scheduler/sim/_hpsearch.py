"""Hyper-parameter search scenario (Gandiva's Fig. 'AutoML'): many jobs of one model with
different settings, submitted together; each reports its early loss after
``probe_fraction`` of its training, and the searcher (asynchronous successive halving,
as ASHA does) stops it there unless that loss is among the best ``1/eta`` of the early
losses seen so far; survivors train to the end.

The figure, ``time_to_identify_s``, is the time from submission until the best
configuration is identified: every configuration has reported its early loss, so the
best one is known. ``time_to_best_trained_s`` adds the time until that configuration has
also finished training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from microco.services.scheduler.policy import Policy

from ._engine import ClusterSpec, SimResult, Simulator
from ._perf import CostModel, PerfModel
from ._trace import TraceJob


@dataclass(frozen=True)
class HPSearchResult:
    policy: str
    configs: int
    gpus: int
    time_to_identify_s: float
    time_to_best_trained_s: float
    found_best: bool
    stopped_early: int
    avg_time_to_first_feedback_s: float
    makespan_s: float
    sim: SimResult

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "configs": self.configs,
            "gpus": self.gpus,
            "time_to_identify_s": round(self.time_to_identify_s, 3),
            "time_to_best_trained_s": round(self.time_to_best_trained_s, 3),
            "found_best": self.found_best,
            "stopped_early": self.stopped_early,
            "avg_time_to_first_feedback_s": round(self.avg_time_to_first_feedback_s, 3),
            "makespan_s": round(self.makespan_s, 3),
        }


def hp_search_trace(
    n_configs: int = 32,
    *,
    model: str = "ResNet-50 (batch size 64)",
    duration_s: float = 3600.0,
    seed: int = 0,
    noise: float = 0.02,
) -> tuple[list[TraceJob], dict[str, float], dict[str, float]]:
    """The jobs, their final losses and their early (probe-time) losses; deterministic in
    ``seed``. Final losses spread over [0.2, 1.0]; early = final + Gaussian noise."""
    rng = random.Random(seed)
    jobs, final, early = [], {}, {}
    for i in range(n_configs):
        jid = f"hp-{i:03d}"
        f = rng.uniform(0.2, 1.0)
        final[jid] = f
        early[jid] = f + rng.gauss(0.0, noise)
        jobs.append(TraceJob(job_id=jid, submit_time=0.0, devices=1, duration_s=duration_s, model=model))
    return jobs, final, early


def run_hp_search(
    policy: Policy,
    *,
    gpus: int = 8,
    per_node: int = 8,
    n_configs: int = 32,
    eta: int = 4,
    probe_fraction: float = 0.1,
    duration_s: float = 3600.0,
    seed: int = 0,
    perf: PerfModel | None = None,
    costs: CostModel | None = None,
    tick_s: float = 30.0,
) -> HPSearchResult:
    trace, final, early = hp_search_trace(n_configs, duration_s=duration_s, seed=seed)
    seen: list[float] = []
    probe_times: dict[str, float] = {}

    def on_probe(job_id: str, now: float) -> bool:
        e = early[job_id]
        seen.append(e)
        probe_times[job_id] = now
        keep = max(1, len(seen) // eta)
        return e > sorted(seen)[keep - 1]  # stop unless among the best 1/eta so far

    sim = Simulator(
        policy,
        trace,
        ClusterSpec.for_gpus(gpus, per_node),
        perf=perf,
        costs=costs,
        tick_s=tick_s,
        probe_fraction=probe_fraction,
        on_probe=on_probe,
    )
    res = sim.run()
    best = min(final, key=final.get)
    pj = res.per_job[best]
    found = not pj["stopped_early"] and pj["finished"] is not None
    if found:
        t_best = pj["finished"]
    else:  # the true best was cut: the search ends when the last survivor finishes
        t_best = max(v["finished"] for v in res.per_job.values() if v["finished"] is not None)
    t_identify = max(probe_times.values()) if len(probe_times) == n_configs else float("inf")
    return HPSearchResult(
        policy=res.policy,
        configs=n_configs,
        gpus=res.gpus,
        time_to_identify_s=t_identify,
        time_to_best_trained_s=t_best,
        found_best=found,
        stopped_early=res.stopped_early,
        avg_time_to_first_feedback_s=res.avg_time_to_first_feedback_s,
        makespan_s=res.makespan_s,
        sim=res,
    )
