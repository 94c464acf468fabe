"""Protobuf <-> domain conversions for the compiler API, shared by the servicer and the client."""

from __future__ import annotations

import math

from microco.api.compiler.v1 import compiler_pb2 as pb

from ._core import Exploration
from .types import Config, GraphSpec, TrialReport, Variable


def variable_to_proto(v: Variable) -> pb.Variable:
    return pb.Variable(
        name=v.name,
        choices=list(v.choices),
        region=v.region,
        stage=v.stage,
        compiles=v.compiles,
        compile_prior_ms=v.compile_prior_ms,
        prior_calibrated=v.prior_calibrated,
        subsumes=list(v.subsumes),
    )


def variable_from_proto(m: pb.Variable) -> Variable:
    return Variable(
        m.name,
        tuple(m.choices),
        m.region,
        m.stage,
        m.compiles,
        m.compile_prior_ms,
        m.prior_calibrated,
        tuple(m.subsumes),
    )


def spec_to_proto(s: GraphSpec) -> pb.RegisterGraphRequest:
    return pb.RegisterGraphRequest(
        fingerprint=s.fingerprint,
        input_shapes=s.input_shapes,
        hardware=s.hardware,
        variables=[variable_to_proto(v) for v in s.variables],
        model_name=s.model_name,
        framework=s.framework,
        total_steps=s.total_steps,
    )


def spec_from_proto(m: pb.RegisterGraphRequest) -> GraphSpec:
    """Raises ``ValueError`` for a malformed variable (the servicer turns it into InvalidArgument)."""
    return GraphSpec(
        fingerprint=m.fingerprint,
        input_shapes=m.input_shapes,
        hardware=m.hardware,
        variables=tuple(variable_from_proto(v) for v in m.variables),
        model_name=m.model_name,
        framework=m.framework or "torch",
        total_steps=m.total_steps or 1000,
    )


def config_to_proto(c: Config) -> pb.Config:
    return pb.Config(
        key=c.key, values=c.values, committed=c.committed, trial=c.trial, steps=c.steps, hold=c.hold
    )


def config_from_proto(m: pb.Config) -> Config:
    return Config(
        key=m.key, values=dict(m.values), trial=m.trial, committed=m.committed, steps=m.steps, hold=m.hold
    )


def report_to_proto(key: str, r: TrialReport) -> pb.ReportTimingsRequest:
    return pb.ReportTimingsRequest(
        key=key,
        trial=r.trial,
        step_ms=list(r.step_ms),
        regions=[pb.RegionTiming(region=k, ms=v) for k, v in sorted(r.region_ms.items())],
        failed=r.failed,
        error=r.error,
        pending=r.pending,
        runnable=r.runnable,
        step_cpu_ms=list(r.step_cpu_ms),
    )


def report_from_proto(m: pb.ReportTimingsRequest) -> TrialReport:
    return TrialReport(
        trial=m.trial,
        step_ms=list(m.step_ms),
        region_ms={r.region: r.ms for r in m.regions},
        failed=m.failed,
        error=m.error,
        pending=m.pending,
        runnable=m.runnable,
        step_cpu_ms=list(m.step_cpu_ms),
    )


def _f(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else 0.0


def state_to_proto(s: Exploration) -> pb.GraphState:
    best = s.best_trial
    base_ms, best_ms = s.measured_ms()  # interleaved where measured (issue 18)
    return pb.GraphState(
        key=s.key,
        model_name=s.spec.model_name,
        framework=s.spec.framework,
        variables=[variable_to_proto(v) for v in s.spec.variables],
        trials=[
            pb.Trial(
                trial=t.trial,
                values=t.values,
                step_ms=_f(t.step_ms),
                compile_ms=t.compile_ms,
                steps=t.steps,
                regions=[pb.RegionTiming(region=k, ms=v) for k, v in sorted(t.region_ms.items())],
                done=t.done,
                failed=t.failed,
                error=t.error,
                stage=t.stage,
                kind=t.kind,
                runnable=t.runnable,
                cpu_steps=t.cpu_steps,
            )
            for t in s.trials
        ],
        best=pb.Config(
            key=s.key, values=s.best_values, committed=s.committed, trial=best.trial if best else -1
        ),
        committed=s.committed,
        explore_steps=s.explore_steps,
        explore_ms=s.explore_ms,
        compile_ms=s.compile_ms,
        baseline_ms=_f(base_ms),
        best_ms=_f(best_ms),
        speedup=s.speedup,
        pruned=s.pruned,
        fingerprint=s.spec.fingerprint,
        input_shapes=s.spec.input_shapes,
        hardware=s.spec.hardware,
        total_steps=s.spec.total_steps,
        runs=s.runs,
        compile_costs=s.compile_costs,
        reopened=s.reopened,
        wait_steps=s.wait_steps,
        wait_ms=s.wait_ms,
        deferred=len(s.deferred),
        jobs=[
            pb.GraphJob(
                job_id=j["job_id"],
                registered_at=j.get("registered_at", 0.0),
                committed=j.get("committed", False),
            )
            for j in s.jobs
        ],
        retimes=[
            f"trial {r['best']} ({_f(r['best_ms']):.2f} ms) vs trial {r['runner_up']} "
            f"({_f(r['runner_up_ms']):.2f} ms): trial {r['winner']} kept"
            for r in s.retime_log
        ]
        + [
            f"trial {r['best']} against the baseline, interleaved: {_f(r['best_ms']):.2f} vs "
            f"{_f(r['baseline_ms']):.2f} ms, faster in {r['wins']} of {r['pairs']} pairs (sign test "
            f"p={r['p']:.3f}): {'committed' if r['confirmed'] else 'not faster, baseline kept'}"
            for r in s.confirm_log
        ],
    )
