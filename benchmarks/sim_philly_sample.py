"""A sample in Microsoft Philly's ``cluster_job_log`` format, for the simulator's Philly reader.

    python -m microco.benchmarks.sim_philly_sample --jobs 400 --gpus 64 --load 0.9 --seed 1 --out log.json
    microco sim --trace log.json --policy gandiva --gpus 32 --json

The Philly trace itself (msr-fiddle/philly-traces, 6.6 GB) is not in ``../shared/traces`` and
cannot be downloaded here, so this writes jobs in its published format (one JSON list; each job
``status``, ``vc``, ``jobid``, ``attempts`` with ``start_time``/``end_time``/``detail: [{ip,
gpus}]``, ``submitted_time``, ``user``; times ``YYYY-mm-dd HH:MM:SS``). What is real: the run
times, drawn from Philly's own 83,154 (``philly_runtime.csv``). What is this script's choice
(seeded, deterministic): Poisson arrivals at ``load`` times ``gpus`` devices' worth of the mean
demand, GPU counts 1/2/4/8/16 with weights 0.70/0.10/0.10/0.08/0.02 (16 over two 8-GPU
servers), a failed first attempt of 10-600 s for 10% of jobs, statuses Pass/Killed/Failed
0.7/0.2/0.1.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

SIZES = (1, 2, 4, 8, 16)
WEIGHTS = (0.70, 0.10, 0.10, 0.08, 0.02)


def philly_sample(
    jobs: int, gpus: int, load: float, seed: int, run_times: list[float]
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    mean_demand = sum(run_times) / len(run_times) * sum(s * w for s, w in zip(SIZES, WEIGHTS))
    rate = load * gpus / mean_demand
    t = datetime(2017, 10, 3, 0, 0, 0)

    def fmt(d: datetime) -> str:
        return d.strftime("%Y-%m-%d %H:%M:%S")

    out = []
    for i in range(jobs):
        t += timedelta(seconds=round(rng.expovariate(rate)))
        g = rng.choices(SIZES, WEIGHTS)[0]
        servers = [[f"gpu{k}" for k in range(min(g, 8))] for _ in range(max(1, g // 8))]
        start = t + timedelta(seconds=rng.randint(5, 120))
        attempts = []
        if rng.random() < 0.1:  # a first attempt that failed after a while, then retried
            end = start + timedelta(seconds=rng.randint(10, 600))
            detail = [{"ip": f"m{rng.randint(1, 500)}", "gpus": s} for s in servers]
            attempts.append({"start_time": fmt(start), "end_time": fmt(end), "detail": detail})
            start = end + timedelta(seconds=rng.randint(5, 60))
        end = start + timedelta(seconds=max(1, round(rng.choice(run_times))))
        detail = [{"ip": f"m{rng.randint(1, 500)}", "gpus": s} for s in servers]
        attempts.append({"start_time": fmt(start), "end_time": fmt(end), "detail": detail})
        out.append(
            {
                "status": rng.choices(["Pass", "Killed", "Failed"], [0.7, 0.2, 0.1])[0],
                "vc": f"{rng.getrandbits(24):06x}",
                "jobid": f"application_1506638472019_{10000 + i}",
                "attempts": attempts,
                "submitted_time": fmt(t),
                "user": f"{rng.getrandbits(24):06x}",
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    from microco.services.scheduler.sim import PhillyDurations, default_traces_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--gpus", type=int, default=64, help="the cluster the load is relative to")
    p.add_argument("--load", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--traces-dir", default=None, help="where philly_runtime.csv is (default: the public traces)"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    base = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    run_times = PhillyDurations(base / "philly_runtime.csv", min_s=0.0).values
    Path(args.out).write_text(
        json.dumps(philly_sample(args.jobs, args.gpus, args.load, args.seed, run_times), indent=4)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
