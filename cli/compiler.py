"""``microco compiler ...``: Astra's explorations, committed configurations and speedups."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._platform import add_etcd_arguments


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compiler",
        help="Astra: explorations of training-step configurations and what was committed",
        description=(
            "Astra tunes training steps online: each mini-batch runs under a configuration the\n"
            "compiler service picks (regions compiled or eager, batched and hoisted matrix products,\n"
            "thread counts), timed, until the fastest is committed. Committed configurations live in\n"
            "etcd by graph fingerprint, input shapes and hardware, so the next run starts there.\n"
            "These commands read that state from etcd (the service need not be running)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_etcd_arguments(p)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    s = p.add_subparsers(dest="compiler_command", metavar="SUBCOMMAND")

    g = s.add_parser("graphs", help="every explored graph: state, steps spent exploring, speedup")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(func=cmd_graphs)

    sh = s.add_parser(
        "show",
        help="one graph: its variables, every trial with timings, what was pruned and committed",
        description="KEY is a graph key from `microco compiler graphs` (a unique prefix suffices).",
    )
    sh.add_argument("key", help="a graph key from `microco compiler graphs` (a unique prefix suffices)")
    sh.add_argument("--json", action="store_true", help="print JSON")
    sh.set_defaults(func=cmd_show)

    f = s.add_parser(
        "forget",
        help="delete a graph's exploration and committed configuration (the next run explores again)",
    )
    f.add_argument("key", help="a graph key from `microco compiler graphs` (a unique prefix suffices)")
    f.set_defaults(func=cmd_forget)


def _core(args: argparse.Namespace) -> Any:
    from microco.clients.compiler.explore import CompilerCore
    from microco.common.kv import EtcdKV

    from . import etcd_for

    return CompilerCore(EtcdKV(etcd_for(args)))


def _find(core: Any, prefix: str) -> Any:
    from microco.common.errors import InvalidArgument, NotFound

    states = [s for s in core.list() if s.key.startswith(prefix)]
    if not states:
        raise NotFound(
            f"no explored graph has a key starting with {prefix!r} (see `microco compiler graphs`)"
        )
    if len(states) > 1:
        raise InvalidArgument(f"{prefix!r} matches {len(states)} graphs; give more of the key")
    return states[0]


def summary(state: Any) -> dict[str, Any]:
    """The figures an operator looks at first (also used by the console)."""
    base_ms, best_ms = state.measured_ms()
    inter = state.interleaved
    return {
        "key": state.key,
        "model": state.spec.model_name,
        "framework": state.spec.framework,
        "committed": state.committed,
        "trials": sum(1 for t in state.trials if t.done),
        "explore_steps": state.explore_steps,
        "explore_s": round(state.explore_ms / 1e3, 3),
        "compile_s": round(state.compile_ms / 1e3, 3),
        # The committed configuration against the baseline, measured interleaved (alternating
        # blocks of steps; sign test over paired steps), not a ratio of two trials' minima.
        "baseline_ms": round(base_ms, 3) if base_ms is not None else None,
        "best_ms": round(best_ms, 3) if best_ms is not None else None,
        "speedup": round(state.speedup, 3),
        "speedup_measured": "interleaved" if inter else "none",
        "speedup_p": round(inter["p"], 4) if inter else None,
        "runs": state.runs,
        "wait_steps": state.wait_steps,
        "deferred": len(state.deferred),
        "compile_costs_s": {k: round(v / 1e3, 3) for k, v in state.compile_costs.items()},
        "config": state.best_values,
    }


def cmd_graphs(args: argparse.Namespace) -> int:
    rows = [summary(s) for s in _core(args).list()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no graphs explored yet (wrap a training step with microco.clients.compiler)")
        return 0
    print(
        f"{'KEY':<14} {'MODEL':<16} {'FW':<10} {'STATE':<10} {'TRIALS':>6} {'STEPS':>6} "
        f"{'BASE ms':>9} {'BEST ms':>9} {'SPEEDUP':>8}"
    )
    for r in rows:
        state = "committed" if r["committed"] else "exploring"
        print(
            f"{r['key'][:12]:<14} {r['model'][:16]:<16} {r['framework']:<10} {state:<10} {r['trials']:>6} "
            f"{r['explore_steps']:>6} {_ms(r['baseline_ms']):>9} {_ms(r['best_ms']):>9} {r['speedup']:>7.2f}x"
        )
    return 0


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def cmd_show(args: argparse.Namespace) -> int:
    state = _find(_core(args), args.key)
    if args.json:
        print(json.dumps({**summary(state), "state": state.to_json()}, indent=2, default=str))
        return 0
    s = summary(state)
    print(f"graph {state.key}  model={s['model']}  framework={s['framework']}")
    print(f"  inputs:   {state.spec.input_shapes}")
    print(f"  hardware: {state.spec.hardware}")
    print(
        f"  state:    {'committed' if state.committed else 'exploring'} after {s['explore_steps']} steps "
        f"({s['explore_s']} s, of which compile {s['compile_s']} s); runs seen: {s['runs']}"
    )
    how = (
        f"interleaved A/B, sign test p={s['speedup_p']}"
        if s["speedup_measured"] == "interleaved"
        else "not measured against the baseline"
    )
    print(
        f"  speedup:  {s['speedup']:.2f}x  ({_ms(s['baseline_ms'])} ms -> {_ms(s['best_ms'])} ms per step; {how})"
    )
    print("variables:")
    for v in state.spec.variables:
        compiles = ""
        if v.compiles:
            prior = f", prior {v.compile_prior_ms / 1e3:.0f} s" if v.compile_prior_ms else ""
            compiles = f"  (compiles{prior})"
        print(f"  {v.name:<40} stage {v.stage}  {'/'.join(v.choices)}{compiles}")
    base = {v.name: v.choices[0] for v in state.spec.variables}
    print("trials:")
    for t in state.trials:
        changed = {k: v for k, v in t.values.items() if base.get(k) != v} or "baseline"
        ms = "failed" if t.failed else ("running" if not t.done else f"{t.step_ms:8.2f} ms")
        comp = f"  compile {t.compile_ms / 1e3:.1f} s" if t.compile_ms > 50 else ""
        if t.background_ms > 0:
            comp += f" (+{t.background_ms / 1e3:.1f} s slowdown beside its background compile)"
        if t.runnable > 0:
            comp += f"  runnable {t.runnable:.1f}"
        print(f"  #{t.trial:<3} stage {t.stage:<2} {t.kind:<9} {ms}{comp}  {changed}")
    for p in state.pruned:
        print(f"  pruned: {p}")
    if state.wait_steps or state.deferred:
        print(
            f"  waited {state.wait_steps} steps ({state.wait_ms / 1e3:.1f} s) under the best while compiles ran "
            f"in the background; {len(state.deferred)} trial(s) waiting now"
        )
    for r in state.retime_log:
        sign = f" ({r['wins']}/{r['pairs']} pairs, p={r['p']:.3f})" if "p" in r else ""
        print(
            f"  re-timed interleaved: #{r['best']} {_ms(r['best_ms'])} ms vs #{r['runner_up']} "
            f"{_ms(r['runner_up_ms'])} ms -> #{r['winner']}{sign}"
        )
    print("committed:" if state.committed else "best so far:")
    for k, v in sorted(state.best_values.items()):
        print(f"  {k} = {v}")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    from microco.clients.compiler.explore import COMMITTED, EXPLORATIONS

    core = _core(args)
    state = _find(core, args.key)
    core.kv.delete(EXPLORATIONS + state.key)
    core.kv.delete(COMMITTED + state.key)
    print(f"forgot {state.key} ({state.spec.model_name}); its next run explores again")
    return 0
