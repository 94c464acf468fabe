"""``microco sim``: run a scheduling policy over a job trace in the discrete-event simulator.

microco sim --trace ../shared/traces/tiresias_60_job.csv --policy gandiva --gpus 16 --json
microco sim --trace alibaba --policy las --gpus 64 --opt min_run_s=120
microco sim --hp-search --policy gandiva --gpus 8 --hp-eta 3 --hp-min-fraction 1/81 --json
microco sim --trace poisson:8000 --gpus 1024 --policy gandiva --json   # the scale target
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_ALIASES = {
    "alibaba": "alibaba-gpu-v2023/openb_pod_list_default.csv",
    "alibaba-multigpu": "alibaba-gpu-v2023/openb_pod_list_multigpu50.csv",
    "alibaba-gpushare": "alibaba-gpu-v2023/openb_pod_list_gpushare100.csv",
    "tiresias": "tiresias_60_job.csv",
}


def _parse_opt(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--opt wants KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    low = raw.strip().lower()
    if low in ("true", "false"):
        return key.strip(), low == "true"
    try:
        return key.strip(), ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key.strip(), raw


def _checked(kind: Callable[[str], float], ok: Callable[[float], bool], need: str) -> Callable[[str], float]:
    """An argparse type: ``kind(text)`` that ``ok`` accepts, else a message saying what is needed."""

    def parse(text: str) -> float:
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"want {'a whole number' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not ok(x):
            raise argparse.ArgumentTypeError(f"must be {need}, got {text}")
        return x

    return parse


_positive_int = _checked(int, lambda n: n >= 1, "at least 1")
_positive_float = _checked(float, lambda x: 0 < x < math.inf, "a positive number")
_fraction = _checked(float, lambda x: 0 <= x <= 1, "between 0 and 1")


def _parse_costs(text: str) -> dict[str, float]:
    """``kind=seconds,...`` -> {CostModel field: seconds}; applied over the base profile."""
    from dataclasses import fields

    from microco.services.scheduler.sim import CostModel

    names = {f.name[:-2]: f.name for f in fields(CostModel)}
    kw = {}
    for part in text.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in names:
            raise argparse.ArgumentTypeError(f"unknown cost {key!r}; known: {', '.join(names)}")
        try:
            kw[names[key]] = float(val)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--costs {key} wants seconds, got {val!r}") from None
        if kw[names[key]] < 0:
            raise argparse.ArgumentTypeError(f"--costs {key} must not be negative")
    return kw


def resolve_costs(args: argparse.Namespace):
    """The CostModel a run uses: the measured profile from ``--costs-from`` if given, else
    session 1's hand-set profile (``COST_PROFILES["session1"]``), with ``--costs`` applied
    on top. Raises SystemExit with a clear message for an unusable file."""
    from dataclasses import replace

    from microco.services.scheduler.sim import COST_PROFILES, CostModel

    if getattr(args, "costs_from", None):
        try:
            base = CostModel.from_scheduler_bench(args.costs_from)
        except ValueError as exc:
            raise SystemExit(f"microco sim: --costs-from {exc}") from None
    else:
        base = COST_PROFILES["session1"]
    return replace(base, **(args.costs or {}))


def _model_map_item(text: str) -> tuple[str, str]:
    from microco.services.scheduler.sim import parse_model_map_item

    try:
        return parse_model_map_item(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The simulator's ``model_map`` and ``on_unknown_model`` from the flags (ValueError for
    an unreadable mapping file)."""
    from microco.services.scheduler.sim import read_model_map

    mapping = read_model_map(args.model_map_file) if getattr(args, "model_map_file", None) else {}
    mapping.update(dict(getattr(args, "model_map", None) or []))
    return {"model_map": mapping, "on_unknown_model": getattr(args, "unknown_models", "error")}


def add_sim_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``microco sim`` and the sim benchmark."""
    p.add_argument(
        "--trace",
        default="alibaba",
        help="trace file (native CSV, an Alibaba gpu-v2023 pod list, the Tiresias trace or a Philly "
        "cluster_job_log), an alias: "
        + ", ".join(TRACE_ALIASES)
        + ", or poisson:JOBS[:LOAD[:SEED]] for a generated trace of Poisson arrivals at LOAD (default 1.0) "
        "times the cluster's capacity, seed SEED (default 1) (default: alibaba)",
    )
    p.add_argument(
        "--traces-dir",
        default=None,
        help="where the public traces live (default: $MICROCO_TRACES or ../shared/traces from the repo root)",
    )
    p.add_argument(
        "--gpus",
        type=_positive_int,
        default=None,
        help="devices in the simulated cluster (default: per trace)",
    )
    p.add_argument("--gpus-per-node", type=_positive_int, default=8, help="devices per node (default 8)")
    p.add_argument(
        "--device-models",
        default="v100",
        help="comma-separated device models cycled over nodes, e.g. v100,p100,k80 (default v100)",
    )
    p.add_argument(
        "--time-scale", type=_positive_float, default=1.0, help="multiply the Alibaba trace's times by this"
    )
    p.add_argument(
        "--elastic-fraction", type=_fraction, default=0.0, help="fraction of Alibaba jobs marked elastic"
    )
    p.add_argument(
        "--limit", type=_positive_int, default=None, help="simulate only the first N jobs of the trace"
    )
    p.add_argument(
        "--philly-durations",
        action="store_true",
        help="replace the trace's durations by ones drawn from Philly's run times (for traces without them)",
    )
    p.add_argument(
        "--tick", type=_positive_float, default=60.0, help="fallback decision period in seconds (default 60)"
    )
    p.add_argument(
        "--quantum", type=_positive_float, default=None, help="gandiva time-slice quantum in seconds"
    )
    p.add_argument(
        "--costs",
        type=_parse_costs,
        default=None,
        metavar="KIND=S,...",
        help="seconds without progress per mechanism action, over the base profile, e.g. "
        "suspend=0.5,resume=0.5 (kinds: start, suspend, resume, migrate, resize; session1 profile: "
        "5, 1, 5, 10, 5)",
    )
    p.add_argument(
        "--costs-from",
        default=None,
        metavar="FILE",
        help="take the mechanism costs from the live scheduler's benchmark JSON "
        "(`microco bench scheduler --json > FILE`): start = migration.migrate_restart_ms, suspend = "
        "suspend_ms, resume = resume_ms, migrate = migrate_ms, resize = resume_ms",
    )

    p.add_argument(
        "--model-map",
        action="append",
        type=_model_map_item,
        default=[],
        metavar="NAME=KNOWN",
        help="run the trace's model NAME as the measured model KNOWN (repeatable); a trace model the "
        "performance model has not measured is refused unless mapped",
    )
    p.add_argument(
        "--model-map-file",
        default=None,
        metavar="FILE",
        help="model names to map, as a JSON object {NAME: KNOWN} or lines NAME=KNOWN (--model-map "
        "entries win)",
    )
    p.add_argument(
        "--unknown-models",
        choices=("error", "default"),
        default="error",
        help="what to do with trace models neither measured nor mapped: error (default) or run them at "
        "default speeds (100 ms mini-batch, device fully busy)",
    )
    p.add_argument(
        "--opt",
        action="append",
        type=_parse_opt,
        default=[],
        metavar="KEY=VALUE",
        help="policy option, repeatable (e.g. --opt enable_packing=false)",
    )


def fraction(text: str) -> float:
    """``0.0123`` or ``1/81``: a fraction in (0, 1)."""
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            v = float(num) / float(den)
        else:
            v = float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a fraction: {text!r} (e.g. 1/81 or 0.0123)") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"fraction must be in (0, 1), got {text!r}")
    return v


def add_hp_arguments(p: argparse.ArgumentParser) -> None:
    """The ASHA search's settings (shared by ``microco sim --hp-search`` and the benchmark)."""
    p.add_argument("--hp-configs", type=int, default=81, help="configurations searched (default 81)")
    p.add_argument("--hp-eta", type=int, default=3, help="ASHA reduction factor (default 3)")
    p.add_argument(
        "--hp-min-fraction",
        type=fraction,
        default=1.0 / 81.0,
        help="ASHA minimum resource as a fraction of full training, e.g. 1/27 (default 1/81)",
    )
    p.add_argument(
        "--hp-no-priority",
        action="store_true",
        help="do not raise the priority of configurations that pass ASHA's last rung",
    )
    p.add_argument(
        "--hp-model",
        default=None,
        help="the model every configuration trains, a Gavel family (default 'ResNet-50 (batch size 64)', "
        "which keeps its device busy alone; e.g. 'ResNet-18 (batch size 64)' keeps half of it busy, "
        "so gandiva can pack two configurations per device)",
    )


def hp_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.hp_configs < 1 or args.hp_eta < 2:
        raise SystemExit("microco sim: --hp-configs must be >= 1 and --hp-eta >= 2")
    out: dict[str, Any] = {
        "n_configs": args.hp_configs,
        "eta": args.hp_eta,
        "min_fraction": args.hp_min_fraction,
        "promote_priority": not args.hp_no_priority,
    }
    if args.hp_model:
        from microco.services.scheduler.sim import GAVEL_FAMILIES

        if args.hp_model not in GAVEL_FAMILIES:
            raise SystemExit(f"microco sim: --hp-model must be one of {', '.join(GAVEL_FAMILIES)}")
        out["model"] = args.hp_model
    return out


def resolve_trace(trace: str, traces_dir: str | None) -> Path:
    from microco.services.scheduler.sim import default_traces_dir

    base = Path(traces_dir) if traces_dir else default_traces_dir()
    if trace in TRACE_ALIASES:
        return base / TRACE_ALIASES[trace]
    return Path(trace)


def default_gpus(trace: str) -> int:
    return 16 if trace == "tiresias" or "tiresias" in trace else 32


POISSON = "poisson:"


def poisson_spec(text: str) -> tuple[int, float, int]:
    """``poisson:JOBS[:LOAD[:SEED]]`` -> (jobs, load, seed); load 1.0 and seed 1 by default
    (the scale benchmark's trace: ``microco bench sim --scale``). ValueError with what is
    wrong."""
    parts = text[len(POISSON) :].split(":")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"--trace {text!r}: want poisson:JOBS[:LOAD[:SEED]], e.g. poisson:8000:1.0:1")
    try:
        jobs = int(parts[0])
        load = float(parts[1]) if len(parts) > 1 else 1.0
        seed = int(parts[2]) if len(parts) > 2 else 1
    except ValueError:
        raise ValueError(
            f"--trace {text!r}: JOBS and SEED are whole numbers, LOAD a number (poisson:8000:1.0:1)"
        ) from None
    if jobs < 1 or not 0 < load < math.inf:
        raise ValueError(f"--trace {text!r}: need at least one job and a positive load")
    return jobs, load, seed


def load_jobs(args: argparse.Namespace):
    from microco.services.scheduler.sim import TraceError, load_trace

    if args.trace.startswith(POISSON):
        # generated for the cluster being simulated (its load is relative to --gpus)
        from microco.services.scheduler.sim import poisson_trace

        try:
            n, load, seed = poisson_spec(args.trace)
        except ValueError as exc:
            raise TraceError(str(exc)) from None
        jobs = poisson_trace(n, args.gpus or default_gpus(args.trace), load=load, seed=seed)
        if args.limit is not None:
            jobs = jobs[: args.limit]
        return args.trace, jobs
    path = resolve_trace(args.trace, args.traces_dir)
    if not path.exists():
        raise SystemExit(f"microco sim: trace {path} not found (set --traces-dir or MICROCO_TRACES)")
    jobs = load_trace(path, time_scale=args.time_scale, elastic_fraction=args.elastic_fraction)
    if args.limit is not None:
        jobs = jobs[: args.limit]
    if args.philly_durations:
        from microco.services.scheduler.sim import PhillyDurations, default_traces_dir

        base = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
        jobs = PhillyDurations(base / "philly_runtime.csv").resample(jobs)
    return path, jobs


def policy_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    opts = dict(args.opt)
    if args.quantum is not None and name == "gandiva":
        opts.setdefault("quantum_s", args.quantum)
    return opts


def run(args: argparse.Namespace) -> int:
    from microco.services.scheduler.policy import PolicyError, make_policy
    from microco.services.scheduler.sim import (
        ClusterSpec,
        TraceError,
        default_perf_model,
        default_traces_dir,
        run_hp_search,
        simulate,
    )

    cpu0 = time.process_time()
    traces_dir = Path(args.traces_dir) if args.traces_dir else default_traces_dir()
    perf = default_perf_model(traces_dir if traces_dir.exists() else None)
    try:
        policy = make_policy(args.policy, **policy_options(args.policy, args))
        models_kw = model_options(args)
    except (PolicyError, ValueError) as exc:
        print(f"microco sim: {exc}", file=sys.stderr)
        return 2
    models = tuple(m.strip() for m in args.device_models.split(",") if m.strip())
    if args.hp_search:
        res = run_hp_search(
            policy,
            gpus=args.gpus or 8,
            per_node=args.gpus_per_node,
            perf=perf,
            costs=resolve_costs(args),
            **hp_options(args),
        )
        out = res.to_dict()
    else:
        try:
            path, jobs = load_jobs(args)
        except TraceError as exc:
            print(f"microco sim: {exc}", file=sys.stderr)
            return 2
        gpus = args.gpus or default_gpus(args.trace)
        cluster = ClusterSpec.for_gpus(gpus, args.gpus_per_node, models)
        try:
            sim_res = simulate(
                policy, jobs, cluster, perf=perf, costs=resolve_costs(args), tick_s=args.tick, **models_kw
            )
        except ValueError as exc:  # UnknownModelError, a model map onto an unmeasured model
            print(f"microco sim: {exc}", file=sys.stderr)
            return 2
        out = sim_res.to_dict()
        out["trace"] = str(path)
    # the process's CPU seconds for the run (loading the trace and the model included)
    out["cpu_s"] = round(time.process_time() - cpu0, 3)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from ._format import cell

        for k, v in out.items():
            print(f"{k:34s} {cell(v)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``microco sim`` to the CLI."""
    p = subparsers.add_parser(
        "sim",
        help="simulate a scheduling policy on a job trace",
        description=(
            "Run one scheduling policy (the same plugin the live scheduler uses) over a job trace in the "
            "discrete-event simulator and print utilisation, job completion times, time to first feedback "
            "and makespan. Trace format: docs/scheduler-sim.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from ._lazy import PolicyFlag

    p.add_argument(
        "--policy",
        default="gandiva",
        metavar="NAME",
        action=PolicyFlag,
        help="policy plugin: {policies} (default gandiva)",
    )
    p.add_argument(
        "--hp-search", action="store_true", help="run the hyper-parameter search scenario instead of a trace"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_sim_arguments(p)
    add_hp_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="microco")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
