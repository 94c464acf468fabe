"""Scheduler simulator benchmark: every policy on the same trace and cluster in one run.

    microco bench sim --json --plot sim.png              # Alibaba default trace, 32 GPUs
    microco bench sim --sweep-gpus 8,12,16,24,32 --json  # utilisation vs cluster size
    python -m microco.benchmarks.sim --quick --json      # Tiresias 60-job trace, seconds
    microco bench scheduler --quick --json > sched.json  # the live scheduler's measured costs
    microco bench sim --costs-from sched.json --json     # session-1 and measured costs side by side

Prints JSON with each policy's figures, the gandiva/fifo and gandiva/las ratios, the
paper's targets with whether each is met, the hyper-parameter search (ASHA) scenario with
a sweep over its settings and (with ``--ablations``) gandiva with one mechanism at a time.
``fifo[strict]`` is fifo without backfilling (pure first come, first served), a second
baseline. The utilisation target is judged on ``gpu_utilization_load``: useful busy
device-seconds over the device-seconds of the trace's load window (the window ending at
the last arrival that holds 99% of the arrivals; the same for every policy);
``gpu_utilization_window`` (first to last arrival) is reported beside it. ``--plot``
writes a PNG of GPU utilisation and queue length over time.

Cost profiles: every figure is computed under session 1's hand-set mechanism costs
(``session1``) and, with ``--costs-from FILE``, again under the costs the live scheduler's
benchmark measured (``measured``); ``by_cost_profile`` puts the key ratios side by side and
the top-level figures are the last profile's (the measured one when given).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from microco.cli.sim import (
    add_hp_arguments,
    add_sim_arguments,
    default_gpus,
    hp_options,
    load_jobs,
    model_options,
    policy_options,
    resolve_costs,
)

POLICIES = ("fifo", "las", "gandiva")
STRICT = "fifo[strict]"  # fifo without backfilling: pure first come, first served
TRIAL = "gandiva[no trial packs]"  # pack_unprofiled=False: the default before session 3's follow-up
# the placement defaults before session 7: packs of two only, multi-device jobs spread at once
PAIRS = "gandiva[pairs, spread]"
PAIRS_OPTS: dict[str, Any] = {"max_jobs_per_device": 2, "allow_spread": True}
GRACE = "gandiva[finish grace 60 s]"  # finish_grace_s=60, run with --ablations
# ASHA settings swept (reduction factor, minimum resource as a fraction of training, configs)
HP_SWEEP = ((3, 1 / 27, 81), (3, 1 / 81, 81), (4, 1 / 64, 81), (3, 1 / 81, 243), (4, 1 / 16, 64))
HP_SEEDS = tuple(range(8))  # loss draws for the search's seed sweep (seed 0 is the headline run)
ABLATIONS: dict[str, dict[str, Any]] = {
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
    # not a mechanism off but an option on: a job about to finish is not time-sliced out
    GRACE: {"finish_grace_s": 60.0},
}


def _ratio(a: float, b: float) -> float | None:
    return float(f"{a / b:.4g}") if b else None


def _ratio_opt(a: float | None, b: float | None) -> float | None:
    return _ratio(a, b) if a is not None and b is not None else None


# the figures a gandiva variant is compared on, against fifo (the targets) and against las
VARIANT_FIGURES = (
    "gpu_utilization_load",
    "gpu_utilization_window",
    "avg_time_to_first_feedback_s",
    "avg_jct_s",
)
VS_LAS_FIGURES = ("avg_jct_s", "p95_jct_s", "avg_time_to_first_feedback_s")


def _ratios(r, base, figures: tuple[str, ...] = VARIANT_FIGURES) -> dict:
    """``figures`` of run ``r`` over those of run ``base`` (None where either has none)."""
    return {k: _ratio_opt(getattr(r, k), getattr(base, k)) for k in figures}


def _round(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


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


def _hp_runs(make_policy, run_hp_search, args, perf, opts: dict, costs, names=POLICIES) -> dict:
    return {
        name: run_hp_search(
            make_policy(name, **policy_options(name, args)),
            gpus=args.hp_gpus,
            per_node=args.gpus_per_node,
            perf=perf,
            costs=costs,
            **opts,
        )
        for name in names
    }


def _gpu_sweep(args, jobs, models, perf, costs) -> list[dict]:
    """fifo, fifo[strict], gandiva, gandiva[no trial packs] and gandiva[pairs, spread] at each
    cluster size: utilisation over the trace's load window, over the common window, over the
    contended window (where its demand exceeds capacity) and over each run's makespan."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import ClusterSpec, contended_window, simulate

    rows = []
    for size in [int(x) for x in args.sweep_gpus.split(",") if x.strip()]:
        cluster = ClusterSpec.for_gpus(size, args.gpus_per_node, models)
        cw = contended_window(jobs, cluster.size)
        row: dict = {
            "gpus": cluster.size,
            "load_window_s": None,  # the trace's: filled from the runs below
            "contended_window_s": list(cw) if cw else None,
        }
        res = {}
        for label, name, extra in (
            ("fifo", "fifo", {}),
            (STRICT, "fifo", {"backfill": False}),
            ("gandiva", "gandiva", {}),
            (TRIAL, "gandiva", {"pack_unprofiled": False}),
            (PAIRS, "gandiva", PAIRS_OPTS),
        ):
            print(f"sweep: {label} on {cluster.size} GPUs, costs {costs} ...", file=sys.stderr, flush=True)
            opts = {**policy_options(name, args), **extra}
            res[label] = simulate(
                make_policy(name, **opts),
                jobs,
                cluster,
                perf=perf,
                costs=costs,
                tick_s=args.tick,
                series_points=0,
                extra_windows={"contended": cw} if cw else None,
                **model_options(args),
            )
        lw = res["fifo"].load_window_s
        row["load_window_s"] = list(lw) if lw else None
        for label in ("fifo", STRICT, "gandiva", TRIAL, PAIRS):
            r = res[label]
            row[label] = {
                "gpu_utilization_load": _round(r.gpu_utilization_load),
                "gpu_utilization_window": round(r.gpu_utilization_window, 4),
                "gpu_utilization_contended": (round(r.gpu_utilization_extra["contended"], 4) if cw else None),
                "gpu_utilization": round(r.gpu_utilization, 4),
                "gpu_utilization_while_queued": round(r.gpu_utilization_while_queued, 4),
                "gpu_allocation": round(r.gpu_allocation, 4),
                "makespan_s": round(r.makespan_s, 1),
                "avg_jct_s": round(r.avg_jct_s, 1),
                "avg_time_to_first_feedback_s": round(r.avg_time_to_first_feedback_s, 2),
                "packs": r.packs,
                "preemptions": r.preemptions,
                "sim_cpu_s": round(r.sim_cpu_s, 2),
            }
        for gl, base in (("gandiva", "fifo"), ("gandiva", STRICT), (TRIAL, "fifo"), (PAIRS, "fifo")):
            g, b = res[gl], res[base]
            row[f"{gl}_vs_{base}"] = {
                "gpu_utilization_load": _ratio_opt(g.gpu_utilization_load, b.gpu_utilization_load),
                "gpu_utilization_window": _ratio(g.gpu_utilization_window, b.gpu_utilization_window),
                "gpu_utilization_contended": (
                    _ratio(g.gpu_utilization_extra["contended"], b.gpu_utilization_extra["contended"])
                    if cw
                    else None
                ),
                "gpu_utilization": _ratio(g.gpu_utilization, b.gpu_utilization),
                "makespan_s": _ratio(g.makespan_s, b.makespan_s),
            }
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from microco.services.scheduler.sim import ClusterSpec, TraceError, default_perf_model, default_traces_dir

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
        "--ablations",
        action="store_true",
        help="also run gandiva with one mechanism switched at a time, and with finish_grace_s=60",
    )
    add_hp_arguments(p)
    p.add_argument(
        "--hp-gpus", type=int, default=8, help="devices for the hyper-parameter search (default 8)"
    )
    p.add_argument("--no-hp-search", action="store_true", help="skip the hyper-parameter search scenario")
    p.add_argument(
        "--sweep-gpus",
        default=None,
        help="comma-separated cluster sizes: run fifo, fifo[strict] and gandiva at each (slow on the "
        "full Alibaba trace: minutes per size)",
    )
    p.add_argument(
        "--sweep-only", action="store_true", help="only the --sweep-gpus runs (no comparison at --gpus)"
    )
    p.add_argument(
        "--cost-profiles",
        default=None,
        metavar="NAMES",
        help="comma-separated subset of the cost profiles to report (session1, measured; default: "
        "session1, plus measured with --costs-from)",
    )
    p.add_argument(
        "--scale",
        default=None,
        metavar="GPUS,...",
        help="only the scale runs: for each cluster size, a generated Poisson trace of --scale-jobs jobs "
        "at --scale-load times its capacity, simulated under --scale-policy; reports CPU seconds",
    )
    p.add_argument("--scale-jobs", type=int, default=8000, help="jobs per generated trace (default 8000)")
    p.add_argument("--scale-load", type=float, default=1.0, help="offered load of the traces (default 1.0)")
    p.add_argument("--scale-policy", default="gandiva", help="policy of the scale runs (default gandiva)")
    p.add_argument(
        "--scale-until",
        type=float,
        default=float("inf"),
        metavar="S",
        help="stop each scale run at this simulated time (s): a slice of the run, for profiles and ratios",
    )
    p.add_argument(
        "--baselines",
        action="store_true",
        help="only gandiva against the strong baselines (fifo and las with fractional-GPU sharing as "
        "the source cluster ran them, Tiresias' two-queue las) on --trace at --gpus, or on generated "
        "Poisson traces with --baselines-poisson; utilisation over the load window and the whole "
        "arrival span side by side",
    )
    p.add_argument(
        "--baselines-poisson",
        default=None,
        metavar="LOADS",
        help="with --baselines: comma-separated offered loads of generated Poisson traces (of "
        "--baselines-jobs jobs at --gpus) instead of --trace",
    )
    p.add_argument("--baselines-jobs", type=int, default=2000, help="jobs per generated trace (default 2000)")
    p.add_argument(
        "--search-target",
        action="store_true",
        help="only the search scenario on the paper's metric (time until a configuration reaching the "
        "target quality has finished training): ASHA's stopping form under fifo, las and gandiva, and "
        "its promotion form under fifo and las, beside ASHA's identify time",
    )
    args = p.parse_args(argv)
    if args.scale:
        return _scale(args)
    if args.baselines:
        return _baselines(args)
    if args.search_target:
        return _search_target(args)
    if args.quick:
        args.trace = "tiresias" if args.trace == "alibaba" else args.trace
        args.hp_configs = min(args.hp_configs, 27)

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
    try:
        # refuse unmeasured, unmapped trace models before any run (the runs would each refuse)
        from microco.services.scheduler.policy import make_policy
        from microco.services.scheduler.sim import Simulator

        Simulator(make_policy("fifo"), jobs, cluster, perf=perf, **model_options(args))
    except ValueError as exc:
        print(f"microco bench sim: {exc}", file=sys.stderr)
        return 2

    profiles = _cost_profiles(args)
    if args.sweep_only:
        if not args.sweep_gpus:
            print("microco bench sim: --sweep-only needs --sweep-gpus", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        out: dict[str, Any] = {"trace": str(path), "jobs": len(jobs)}
        out["cost_profiles"] = {}
        for pname, costs in profiles.items():
            out["cost_profiles"][pname] = {
                "costs_s": dataclasses.asdict(costs),
                "gpu_sweep": _gpu_sweep(args, jobs, models, perf, costs),
            }
        out.update(out["cost_profiles"][list(profiles)[-1]])
        out["cost_profile"] = list(profiles)[-1]
        out["bench_wall_s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(out, indent=2))
        return 0

    t0 = time.perf_counter()
    per_profile: dict[str, dict] = {}
    plotted: dict = {}
    for pname, costs in profiles.items():
        part, results = _run_profile(args, jobs, cluster, models, perf, costs, pname)
        per_profile[pname] = part
        plotted = results
    primary = list(profiles)[-1]  # the measured profile when --costs-from is given
    out = {
        "trace": str(path),
        "jobs": len(jobs),
        "gpus": gpus,
        "gpus_per_node": args.gpus_per_node,
        "device_models": list(models),
        "cost_profile": primary,
        **per_profile[primary],
        "cost_profiles": per_profile,
    }
    if len(per_profile) > 1:
        out["by_cost_profile"] = _side_by_side(per_profile)
    out["bench_wall_s"] = round(time.perf_counter() - t0, 2)
    if args.plot:
        _plot(args.plot, plotted, f"{Path(path).name}: {len(jobs)} jobs on {gpus} GPUs, {primary} costs")
        out["plot"] = args.plot
    print(json.dumps(out, indent=2))
    return 0


def _baselines(args) -> int:
    """gandiva against every strong baseline (``sim._baselines.baseline_policies``) on one
    trace or on generated Poisson traces at several loads; the figures as measured."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import (
        ClusterSpec,
        TraceError,
        baseline_policies,
        default_perf_model,
        default_traces_dir,
        poisson_trace,
        simulate,
    )

    traces_dir = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    perf = default_perf_model(traces_dir if traces_dir.exists() else None)
    gpus = args.gpus or (64 if args.baselines_poisson else default_gpus(args.trace))
    cluster = ClusterSpec.for_gpus(gpus, args.gpus_per_node)
    runs: list[tuple[str, list]] = []
    if args.baselines_poisson:
        for load in [float(x) for x in args.baselines_poisson.split(",") if x.strip()]:
            runs.append((f"poisson load {load}", poisson_trace(args.baselines_jobs, gpus, load=load, seed=1)))
    else:
        try:
            path, jobs = load_jobs(args)
        except TraceError as exc:
            print(f"microco bench sim: {exc}", file=sys.stderr)
            return 2
        runs.append((str(path), jobs))
    t0 = time.perf_counter()
    out_runs = []
    for label, jobs in runs:
        print(f"baselines: {label}, {len(jobs)} jobs on {gpus} GPUs ...", file=sys.stderr, flush=True)
        pols = {"gandiva": make_policy("gandiva", **policy_options("gandiva", args)), **baseline_policies()}
        res = {}
        for name, pol in pols.items():
            try:
                res[name] = simulate(pol, jobs, cluster, perf=perf, series_points=0, **model_options(args))
            except ValueError as exc:
                print(f"microco bench sim: {exc}", file=sys.stderr)
                return 2
        g = res["gandiva"]
        out_runs.append(
            {
                "trace": label,
                "jobs": len(jobs),
                "gpus": gpus,
                "policies": {
                    name: {
                        "gpu_utilization_load": _round(r.gpu_utilization_load),
                        "gpu_utilization_window": round(r.gpu_utilization_window, 4),
                        "avg_jct_s": round(r.avg_jct_s, 1),
                        "avg_time_to_first_feedback_s": round(r.avg_time_to_first_feedback_s, 2),
                        "packs": r.packs,
                        "preemptions": r.preemptions,
                        "sim_cpu_s": round(r.sim_cpu_s, 2),
                    }
                    for name, r in res.items()
                },
                "gandiva_vs": {
                    name: {
                        "gpu_utilization_load": _ratio_opt(g.gpu_utilization_load, r.gpu_utilization_load),
                        "gpu_utilization_window": _ratio(g.gpu_utilization_window, r.gpu_utilization_window),
                        "avg_jct_s": _ratio(g.avg_jct_s, r.avg_jct_s),
                    }
                    for name, r in res.items()
                    if name != "gandiva"
                },
            }
        )
    print(json.dumps({"baselines": out_runs, "bench_wall_s": round(time.perf_counter() - t0, 2)}, indent=2))
    return 0


def _search_target(args) -> int:
    """The search scenario on the paper's metric, each searcher under each policy."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import (
        default_perf_model,
        default_traces_dir,
        run_asha_promotion,
        run_hp_search,
    )

    traces_dir = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    perf = default_perf_model(traces_dir if traces_dir.exists() else None)
    t0 = time.perf_counter()
    hp = hp_options(args)
    common = {"gpus": args.hp_gpus, "perf": perf, **{k: v for k, v in hp.items() if k != "promote_priority"}}
    rows = {}
    for name in ("fifo", "las", "gandiva"):
        r = run_hp_search(make_policy(name), promote_priority=hp["promote_priority"], **common)
        rows[f"asha-stopping/{name}"] = {
            "time_to_target_s": r.to_dict()["time_to_target_s"],
            "time_to_identify_s": round(r.time_to_identify_s, 1),
            "time_to_best_trained_s": round(r.time_to_best_trained_s, 1),
            "avg_time_to_first_feedback_s": round(r.avg_time_to_first_feedback_s, 1),
            "target_loss": round(r.target_loss, 4),
        }
    for name in ("fifo", "las"):
        pr = run_asha_promotion(make_policy(name), **common)
        rows[f"asha-promotion/{name}"] = {
            "time_to_target_s": pr.to_dict()["time_to_target_s"],
            "time_to_best_trained_s": pr.to_dict()["time_to_best_trained_s"],
            "avg_time_to_first_feedback_s": round(pr.avg_time_to_first_feedback_s, 1),
            "segments": pr.segments,
            "target_loss": round(pr.target_loss, 4),
        }
    g = rows["asha-stopping/gandiva"]["time_to_target_s"]
    ratios = {
        f"{label}_over_gandiva": _ratio(v["time_to_target_s"], g)
        for label, v in rows.items()
        if label != "asha-stopping/gandiva" and v["time_to_target_s"] is not None and g
    }
    out = {
        "gpus": args.hp_gpus,
        "configs": args.hp_configs,
        "searches": rows,
        "time_to_target_speedup_of_gandiva": ratios,
        "bench_wall_s": round(time.perf_counter() - t0, 2),
    }
    print(json.dumps(out, indent=2))
    return 0


def _scale(args) -> int:
    """The simulator's own cost at cluster scale: one run per size on a generated Poisson
    trace (``poisson_trace``, seed 1, log-normal run times), CPU seconds of the process for
    the run (``sim_cpu_s``), decisions and events."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import (
        ClusterSpec,
        default_perf_model,
        default_traces_dir,
        poisson_trace,
        simulate,
    )

    traces_dir = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    perf = default_perf_model(traces_dir if traces_dir.exists() else None)
    rows = []
    t0 = time.perf_counter()
    for size in [int(x) for x in args.scale.split(",") if x.strip()]:
        jobs = poisson_trace(args.scale_jobs, size, load=args.scale_load, seed=1)
        print(f"scale: {args.scale_policy} on {size} GPUs, {len(jobs)} jobs ...", file=sys.stderr, flush=True)
        r = simulate(
            make_policy(args.scale_policy, **policy_options(args.scale_policy, args)),
            jobs,
            ClusterSpec.for_gpus(size, args.gpus_per_node),
            perf=perf,
            tick_s=args.tick,
            series_points=0,
            max_time_s=args.scale_until,
        )
        rows.append(
            {
                "gpus": size,
                "jobs": r.jobs,
                "sim_cpu_s": round(r.sim_cpu_s, 2),
                "decide_calls": r.decide_calls,
                "events": r.events,
                "cpu_ms_per_decision": round(1000 * r.sim_cpu_s / max(r.decide_calls, 1), 3),
                "gpu_utilization": round(r.gpu_utilization, 4),
                "avg_jct_s": round(r.avg_jct_s, 1),
                "preemptions": r.preemptions,
                "packs": r.packs,
            }
        )
    out = {
        "policy": args.scale_policy,
        "load": args.scale_load,
        "scale": rows,
        "bench_wall_s": round(time.perf_counter() - t0, 2),
    }
    print(json.dumps(out, indent=2))
    return 0


def _cost_profiles(args) -> dict:
    """The cost profiles one run reports side by side: session 1's hand-set costs, and the
    live scheduler's measured ones when ``--costs-from`` is given (``--costs`` applies to
    both)."""
    from dataclasses import replace

    from microco.services.scheduler.sim import COST_PROFILES

    out = {"session1": replace(COST_PROFILES["session1"], **(args.costs or {}))}
    if args.costs_from:
        out["measured"] = resolve_costs(args)
    only = [x.strip() for x in (getattr(args, "cost_profiles", None) or "").split(",") if x.strip()]
    if only:
        unknown = [x for x in only if x not in out]
        if unknown:
            raise SystemExit(
                f"microco bench sim: --cost-profiles: unknown or unavailable {unknown} (have {sorted(out)}; "
                "'measured' needs --costs-from)"
            )
        out = {k: v for k, v in out.items() if k in only}
    return out


# figures compared across cost profiles (path into one profile's output)
SIDE_BY_SIDE = (
    ("gpu_utilization_load gandiva/fifo", ("ratios", "gandiva_vs_fifo", "gpu_utilization_load")),
    (
        "gpu_utilization_load gandiva[pairs, spread]/fifo",
        ("ratios", "gandiva_pairs_spread_vs_fifo", "gpu_utilization_load"),
    ),
    ("gpu_utilization_window gandiva/fifo", ("ratios", "gandiva_vs_fifo", "gpu_utilization_window")),
    (
        "gpu_utilization_window gandiva/fifo[strict]",
        ("ratios", "gandiva_vs_fifo_strict", "gpu_utilization_window"),
    ),
    (
        "avg_time_to_first_feedback_s gandiva/fifo",
        ("ratios", "gandiva_vs_fifo", "avg_time_to_first_feedback_s"),
    ),
    ("avg_jct_s gandiva/las", ("ratios", "gandiva_vs_las", "avg_jct_s")),
    ("gandiva gpu_utilization_window", ("results", "gandiva", "gpu_utilization_window")),
    ("fifo gpu_utilization_window", ("results", "fifo", "gpu_utilization_window")),
    ("gandiva preemptions", ("results", "gandiva", "preemptions")),
    ("gandiva packs", ("results", "gandiva", "packs")),
    (
        "gpu_utilization_window gandiva[no trial packs]/fifo",
        ("ratios", "gandiva_no_trial_packs_vs_fifo", "gpu_utilization_window"),
    ),
    (
        "avg_time_to_first_feedback_s gandiva[no trial packs]/fifo",
        ("ratios", "gandiva_no_trial_packs_vs_fifo", "avg_time_to_first_feedback_s"),
    ),
    ("hp_search identify speed-up gandiva/fifo", ("ratios", "hp_search_speedup_gandiva_vs_fifo")),
    ("hp_search best-trained speed-up gandiva/fifo", ("ratios", "hp_best_trained_speedup_gandiva_vs_fifo")),
    ("hp_search identify speed-up, mean over seeds", ("hp_search_seeds", "identify_speedup_mean")),
    ("hp_search gandiva time to identify (s)", ("hp_search", "gandiva", "time_to_identify_s")),
    ("hp_search fifo time to identify (s)", ("hp_search", "fifo", "time_to_identify_s")),
)


def _side_by_side(per_profile: dict) -> dict:
    out = {}
    for label, path in SIDE_BY_SIDE:
        row = {}
        for pname, part in per_profile.items():
            v = part
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            row[pname] = v
        out[label] = row
    return out


def _run_profile(args, jobs, cluster, models, perf, costs, pname: str) -> tuple[dict, dict]:
    """Every policy on the trace, the search and its sweep, and the GPU sweep, under one
    cost profile. Returns (its JSON part, the SimResults by label)."""
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import run_hp_search, simulate

    runs = {name: (name, policy_options(name, args)) for name in POLICIES}
    runs[STRICT] = ("fifo", {**policy_options("fifo", args), "backfill": False})
    runs[TRIAL] = ("gandiva", {**policy_options("gandiva", args), "pack_unprofiled": False})
    runs[PAIRS] = ("gandiva", {**policy_options("gandiva", args), **PAIRS_OPTS})
    if args.ablations:
        for label, extra in ABLATIONS.items():
            runs[label] = ("gandiva", {**policy_options("gandiva", args), **extra})
    results = {}
    for label, (name, opts) in runs.items():
        print(
            f"[{pname} costs] simulating {label} on {len(jobs)} jobs, {cluster.size} GPUs ...",
            file=sys.stderr,
            flush=True,
        )
        results[label] = simulate(
            make_policy(name, **opts),
            jobs,
            cluster,
            perf=perf,
            costs=costs,
            tick_s=args.tick,
            **model_options(args),
        )

    f, las, g, fs = results["fifo"], results["las"], results["gandiva"], results[STRICT]
    out: dict = {
        "costs_s": dataclasses.asdict(costs),
        "results": {k: v.to_dict() for k, v in results.items()},
        "util_window_s": list(f.util_window_s),
        "load_window_s": list(f.load_window_s) if f.load_window_s else None,
        "ratios": {
            "gandiva_vs_fifo": {
                "gpu_utilization_load": _ratio_opt(g.gpu_utilization_load, f.gpu_utilization_load),
                "gpu_utilization_window": _ratio(g.gpu_utilization_window, f.gpu_utilization_window),
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
            "gandiva_vs_fifo_strict": {
                "gpu_utilization_load": _ratio_opt(g.gpu_utilization_load, fs.gpu_utilization_load),
                "gpu_utilization_window": _ratio(g.gpu_utilization_window, fs.gpu_utilization_window),
                "gpu_utilization": _ratio(g.gpu_utilization, fs.gpu_utilization),
                "avg_time_to_first_feedback_s": _ratio(
                    g.avg_time_to_first_feedback_s, fs.avg_time_to_first_feedback_s
                ),
                "avg_jct_s": _ratio(g.avg_jct_s, fs.avg_jct_s),
            },
            "gandiva_no_trial_packs_vs_fifo": _ratios(results[TRIAL], f),
            "gandiva_pairs_spread_vs_fifo": _ratios(results[PAIRS], f),
            "gandiva_vs_las": _ratios(g, las, VS_LAS_FIGURES),
        },
    }
    if GRACE in results:
        out["ratios"]["gandiva_finish_grace_vs_las"] = _ratios(results[GRACE], las, VS_LAS_FIGURES)
        out["ratios"]["gandiva_finish_grace_vs_fifo"] = _ratios(results[GRACE], f)
    targets = {
        "gandiva_utilization_plus_26pct_vs_fifo": (
            g.gpu_utilization_load is not None
            and f.gpu_utilization_load is not None
            and g.gpu_utilization_load >= 1.26 * f.gpu_utilization_load
        ),
        "gandiva_utilization_plus_26pct_vs_fifo_whole_arrival_span": g.gpu_utilization_window
        >= 1.26 * f.gpu_utilization_window,
        "gandiva_ttff_minus_77pct_vs_fifo": g.avg_time_to_first_feedback_s
        <= 0.23 * f.avg_time_to_first_feedback_s,
        "gandiva_avg_jct_not_worse_than_las": g.avg_jct_s <= las.avg_jct_s,
        "sim_under_60s_cpu_per_policy": max(r.sim_cpu_s for r in results.values()) < 60.0,
    }
    if not args.no_hp_search:
        print(f"[{pname} costs] hyper-parameter search (ASHA) ...", file=sys.stderr, flush=True)
        hpo = hp_options(args)
        hp = _hp_runs(make_policy, run_hp_search, args, perf, hpo, costs)
        out["hp_search"] = {
            "settings": {**hpo, "gpus": args.hp_gpus},
            **{k: v.to_dict() for k, v in hp.items()},
        }
        speedup = hp["fifo"].time_to_identify_s / hp["gandiva"].time_to_identify_s
        out["ratios"]["hp_search_speedup_gandiva_vs_fifo"] = round(speedup, 3)
        out["ratios"]["hp_search_speedup_las_vs_fifo"] = round(
            hp["fifo"].time_to_identify_s / hp["las"].time_to_identify_s, 3
        )
        out["ratios"]["hp_best_trained_speedup_gandiva_vs_fifo"] = round(
            hp["fifo"].time_to_best_trained_s / hp["gandiva"].time_to_best_trained_s, 3
        )
        sweep = []
        for eta, mf, n in () if args.quick else HP_SWEEP:  # the sweep is the full run's
            opts = {**hpo, "eta": eta, "min_fraction": mf, "n_configs": n}
            r = _hp_runs(make_policy, run_hp_search, args, perf, opts, costs)
            sweep.append(
                {
                    "eta": eta,
                    "min_fraction": f"1/{round(1 / mf)}",
                    "configs": n,
                    **{f"identify_s_{k}": round(v.time_to_identify_s, 1) for k, v in r.items()},
                    **{f"best_trained_s_{k}": round(v.time_to_best_trained_s, 1) for k, v in r.items()},
                    "identify_speedup_gandiva_vs_fifo": round(
                        r["fifo"].time_to_identify_s / r["gandiva"].time_to_identify_s, 3
                    ),
                    "best_trained_speedup_gandiva_vs_fifo": round(
                        r["fifo"].time_to_best_trained_s / r["gandiva"].time_to_best_trained_s, 3
                    ),
                }
            )
        if sweep:
            out["hp_search_sweep"] = sweep
        if not args.quick:
            # the same search over each model family the traces' jobs are given: a model that
            # leaves its device partly idle lets gandiva pack configurations
            from microco.services.scheduler.sim import GAVEL_FAMILIES

            by_model = []
            for model in GAVEL_FAMILIES:
                mo = {**hpo, "model": model}
                r = _hp_runs(make_policy, run_hp_search, args, perf, mo, costs, names=("fifo", "gandiva"))
                by_model.append(
                    {
                        "model": model,
                        "solo_busy_v100": round(perf.solo_busy(model, "v100"), 3),
                        **{f"identify_s_{k}": round(v.time_to_identify_s, 1) for k, v in r.items()},
                        "identify_speedup_gandiva_vs_fifo": round(
                            r["fifo"].time_to_identify_s / r["gandiva"].time_to_identify_s, 3
                        ),
                        "best_trained_speedup_gandiva_vs_fifo": round(
                            r["fifo"].time_to_best_trained_s / r["gandiva"].time_to_best_trained_s, 3
                        ),
                        "gandiva_packs": r["gandiva"].sim.packs,
                    }
                )
            out["hp_search_by_model"] = by_model
            # the same search with other draws of the configurations' losses: how much of
            # the speed-up is the luck of one draw (fifo's order meets good configurations
            # early or late)
            seeds = []
            for seed in HP_SEEDS:
                r = _hp_runs(make_policy, run_hp_search, args, perf, {**hpo, "seed": seed}, costs)
                seeds.append(
                    {
                        "seed": seed,
                        **{f"identify_s_{k}": round(v.time_to_identify_s, 1) for k, v in r.items()},
                        "identify_speedup_gandiva_vs_fifo": round(
                            r["fifo"].time_to_identify_s / r["gandiva"].time_to_identify_s, 3
                        ),
                    }
                )
            sp = [x["identify_speedup_gandiva_vs_fifo"] for x in seeds]
            out["hp_search_seeds"] = {
                "runs": seeds,
                "identify_speedup_mean": round(sum(sp) / len(sp), 3),
                "identify_speedup_min": min(sp),
                "identify_speedup_max": max(sp),
            }
        targets["hp_search_5x_faster_than_fifo"] = speedup >= 5.0
        targets["hp_best_trained_not_worse_than_fifo"] = (
            hp["gandiva"].time_to_best_trained_s <= hp["fifo"].time_to_best_trained_s
        )
    if args.sweep_gpus:
        out["gpu_sweep"] = _gpu_sweep(args, jobs, models, perf, costs)
    out["targets_met"] = targets
    return out, results


if __name__ == "__main__":
    raise SystemExit(main())
