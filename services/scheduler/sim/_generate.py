"""Synthetic traces in the native format: Poisson arrivals at a chosen load.

Used to measure the simulator at cluster scale (thousands of jobs, 1,000+ devices), where
no public trace in ``../shared/traces`` has enough jobs at once. Durations come from
Philly's run times when given (:class:`PhillyDurations`), else from a log-normal with
Philly's median order; device counts and models are drawn like the Philly-like traces of
the issue (mostly one-device jobs). Deterministic in ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ._trace import GAVEL_FAMILIES, PhillyDurations, TraceJob

# devices a job asks for, and how often (Philly: ~70% one-device jobs)
DEVICE_MIX: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.12), (8, 0.08))


def poisson_trace(
    jobs: int,
    gpus: int,
    *,
    load: float = 1.0,
    seed: int = 0,
    durations: PhillyDurations | None = None,
    max_duration_s: float = 4 * 3600.0,
    share_fraction: float = 0.3,
    models: Sequence[str] = GAVEL_FAMILIES,
) -> list[TraceJob]:
    """``jobs`` jobs arriving as a Poisson process whose offered load (device-seconds
    asked per second) is ``load`` times ``gpus``. ``share_fraction`` of the one-device jobs
    ask for a fractional device share (as the Alibaba trace's GPU-sharing pods)."""
    if jobs < 1 or gpus < 1 or load <= 0:
        raise ValueError("need jobs >= 1, gpus >= 1 and load > 0")
    rng = random.Random(seed)
    drawn = []
    for i in range(jobs):
        jid = f"p{i:06d}"
        r, k = rng.random(), DEVICE_MIX[-1][0]
        for dev, p in DEVICE_MIX:
            if r < p:
                k = dev
                break
            r -= p
        if durations is not None:
            dur = durations.sample(f"{seed}:{jid}")
        else:
            dur = rng.lognormvariate(6.5, 1.6)
        dur = max(1.0, min(max_duration_s, dur))
        share = 1.0
        if k == 1 and rng.random() < share_fraction:
            share = rng.choice((0.25, 0.5, 0.75))
        drawn.append((jid, k, dur, rng.choice(list(models)), share))
    mean_demand = sum(k * d * s for _, k, d, _, s in drawn) / jobs
    rate = load * gpus / mean_demand  # arrivals per second
    t = 0.0
    out = []
    for jid, k, dur, model, share in drawn:
        out.append(
            TraceJob(
                job_id=jid,
                submit_time=round(t, 3),
                devices=k,
                duration_s=round(dur, 3),
                model=model,
                gpu_share=share,
            )
        )
        t += rng.expovariate(rate)
    return out
