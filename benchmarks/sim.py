"""Scheduler simulator benchmark: every policy on the same trace and cluster in one run.

    microco bench sim --json --plot sim.png              # Alibaba default trace, 32 GPUs
    python -m microco.benchmarks.sim --quick --json      # Tiresias 60-job trace, seconds

Prints JSON with each policy's figures, the gandiva/fifo and gandiva/las ratios, the
paper's targets with whether each is met, the hyper-parameter search scenario and (with
``--ablations``) gandiva with one mechanism at a time. ``--plot`` writes a PNG of GPU
utilisation and queue length over time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from microco.clients.cli.sim import add_sim_arguments, default_gpus, load_jobs, policy_options

POLICIES = ("fifo", "las", "gandiva")
ABLATIONS = {
    "gandiva[time-slicing only]": {
        "enable_packing": False,
        "enable_migration": False,
        "enable_grow_shrink": False,
    },
    "gandiva[packing only]": {
        "enable_time_slicing": False,
        "enable_migration": False,
        "enable_grow_shrink": False,
    },
    "gandiva[no packing]": {"enable_packing": False},
    "gandiva[no migration]": {"enable_migration": False},
}


def _ratio(a: float, b: float) -> float | None:
    return float(f"{a / b:.4g}") if b else None


def _plot(path: str, results: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, res in results.items():
        s = res.series
        if not s:
            continue
        hours = [t / 3600.0 for t in s["t_s"]]
        ax1.step(hours, s["utilization"], where="post", label=name, linewidth=0.8)
        ax2.step(hours, s["queue_len"], where="post", label=name, linewidth=0.8)
    ax1.set_ylabel("GPU utilisation")
    ax1.set_ylim(0, 1.05)
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("hours since first submission")
    ax2.set_yscale("symlog")
    ax2.set_ylim(bottom=0)
    ax1.legend(loc="lower right", fontsize=8)
    ax1.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import (
        ClusterSpec,
        TraceError,
        default_perf_model,
        default_traces_dir,
        run_hp_search,
        simulate,
    )

    p = argparse.ArgumentParser(
        prog="microco bench sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sim_arguments(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="the Tiresias 60-job trace on 16 GPUs and a small search (seconds)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (the default output is JSON too)")
    p.add_argument("--plot", default=None, help="write a PNG of utilisation and queue length over time here")
    p.add_argument(
        "--ablations", action="store_true", help="also run gandiva with one mechanism switched at a time"
    )
    p.add_argument(
        "--hp-configs", type=int, default=32, help="configurations in the hyper-parameter search (default 32)"
    )
    p.add_argument(
        "--hp-gpus", type=int, default=8, help="devices for the hyper-parameter search (default 8)"
    )
    p.add_argument("--no-hp-search", action="store_true", help="skip the hyper-parameter search scenario")
    args = p.parse_args(argv)
    if args.quick:
        args.trace = "tiresias" if args.trace == "alibaba" else args.trace
        args.hp_configs = min(args.hp_configs, 16)

    traces_dir = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    perf = default_perf_model(traces_dir if traces_dir.exists() else None)
    try:
        path, jobs = load_jobs(args)
    except TraceError as exc:
        print(f"microco bench sim: {exc}", file=sys.stderr)
        return 2
    gpus = args.gpus or default_gpus(args.trace)
    models = tuple(m.strip() for m in args.device_models.split(",") if m.strip())
    cluster = ClusterSpec.for_gpus(gpus, args.gpus_per_node, models)

    runs = {name: (name, policy_options(name, args)) for name in POLICIES}
    if args.ablations:
        for label, extra in ABLATIONS.items():
            runs[label] = ("gandiva", {**policy_options("gandiva", args), **extra})
    results = {}
    t0 = time.perf_counter()
    for label, (name, opts) in runs.items():
        print(f"simulating {label} on {len(jobs)} jobs, {gpus} GPUs ...", file=sys.stderr, flush=True)
        results[label] = simulate(make_policy(name, **opts), jobs, cluster, perf=perf, tick_s=args.tick)

    f, l, g = results["fifo"], results["las"], results["gandiva"]
    out: dict = {
        "trace": str(path),
        "jobs": len(jobs),
        "gpus": gpus,
        "gpus_per_node": args.gpus_per_node,
        "device_models": list(models),
        "results": {k: v.to_dict() for k, v in results.items()},
        "ratios": {
            "gandiva_vs_fifo": {
                "gpu_utilization": _ratio(g.gpu_utilization, f.gpu_utilization),
                "gpu_utilization_while_queued": _ratio(
                    g.gpu_utilization_while_queued, f.gpu_utilization_while_queued
                ),
                "avg_time_to_first_feedback_s": _ratio(
                    g.avg_time_to_first_feedback_s, f.avg_time_to_first_feedback_s
                ),
                "avg_jct_s": _ratio(g.avg_jct_s, f.avg_jct_s),
                "makespan_s": _ratio(g.makespan_s, f.makespan_s),
            },
            "gandiva_vs_las": {
                "avg_jct_s": _ratio(g.avg_jct_s, l.avg_jct_s),
                "p95_jct_s": _ratio(g.p95_jct_s, l.p95_jct_s),
                "avg_time_to_first_feedback_s": _ratio(
                    g.avg_time_to_first_feedback_s, l.avg_time_to_first_feedback_s
                ),
            },
        },
    }
    targets = {
        "gandiva_utilization_plus_26pct_vs_fifo": g.gpu_utilization >= 1.26 * f.gpu_utilization,
        "gandiva_ttff_minus_77pct_vs_fifo": g.avg_time_to_first_feedback_s
        <= 0.23 * f.avg_time_to_first_feedback_s,
        "gandiva_avg_jct_not_worse_than_las": g.avg_jct_s <= l.avg_jct_s,
        "sim_under_60s_cpu_per_policy": max(r.sim_cpu_s for r in results.values()) < 60.0,
    }
    if not args.no_hp_search:
        hp = {}
        for name in POLICIES:
            print(f"hyper-parameter search with {name} ...", file=sys.stderr, flush=True)
            hp[name] = run_hp_search(
                make_policy(name, **policy_options(name, args)),
                gpus=args.hp_gpus,
                per_node=args.gpus_per_node,
                n_configs=args.hp_configs,
                perf=perf,
            )
        out["hp_search"] = {k: v.to_dict() for k, v in hp.items()}
        speedup = hp["fifo"].time_to_identify_s / hp["gandiva"].time_to_identify_s
        out["ratios"]["hp_search_speedup_gandiva_vs_fifo"] = round(speedup, 3)
        out["ratios"]["hp_search_speedup_las_vs_fifo"] = round(
            hp["fifo"].time_to_identify_s / hp["las"].time_to_identify_s, 3
        )
        targets["hp_search_5x_faster_than_fifo"] = speedup >= 5.0
    out["targets_met"] = targets
    out["bench_wall_s"] = round(time.perf_counter() - t0, 2)
    if args.plot:
        _plot(args.plot, results, f"{Path(path).name}: {len(jobs)} jobs on {gpus} GPUs")
        out["plot"] = args.plot
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
