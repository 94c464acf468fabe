"""The exploration core: pure decisions, persisted state, commit and reuse (MemoryKV, no sockets)."""

from __future__ import annotations

import json

import pytest
from microco.services.common import InvalidArgument, MemoryKV, NotFound
from microco.services.compiler import (
    STAGE_COMPILE,
    STAGE_FINE,
    STAGE_STRUCTURE,
    CompilerCore,
    Exploration,
    ExplorationPolicy,
    GraphSpec,
    TrialReport,
    Variable,
    next_config,
    report,
    start,
)

POLICY = ExplorationPolicy(measure_steps=2)


def spec(total_steps=100_000, framework="torch", variables=None):
    if variables is None:
        variables = (
            Variable("A.hoist", ("off", "on"), "A", STAGE_STRUCTURE),
            Variable("A.batch", ("off", "on"), "A", STAGE_STRUCTURE),
            Variable("B.hoist", ("off", "on"), "B", STAGE_STRUCTURE),
            Variable("A.compile", ("eager", "inductor"), "A", STAGE_COMPILE, compiles=True),
            Variable("threads", ("2", "1"), "", STAGE_FINE),
        )
    return GraphSpec("fp", "(4, 8)", "cpu", tuple(variables), "m", framework, total_steps)


def cost(values):
    """A synthetic machine: region A gains from hoist and batch, B from hoist, compile helps A."""
    a = 10.0 - 3 * (values["A.hoist"] == "on") - 2 * (values["A.batch"] == "on")
    if values.get("A.compile") == "inductor":
        a -= 2
    b = 6.0 - 3 * (values["B.hoist"] == "on")
    step = 3 * (a + b) + (1.0 if values.get("threads") == "1" else 0.0)
    return step, {"A": a, "B": b}


def run_trial(state, cfg, compile_ms=0.0):
    step, regions = cost(cfg.values)
    warm = step + (compile_ms if any(v.endswith("inductor") for v in cfg.values.values()) else 0.0)
    rep = TrialReport(cfg.trial, [warm] + [step] * POLICY.measure_steps, regions)
    return report(state, rep, POLICY)


def explore(state, compile_ms=0.0, limit=100):
    cfg = next_config(state, POLICY)
    seen = []
    while not cfg.committed and limit:
        seen.append(dict(cfg.values))
        cfg = run_trial(state, cfg, compile_ms)
        limit -= 1
    return cfg, seen


def test_baseline_first_then_stages_then_commit_of_the_best():
    state = start(spec(), POLICY)
    first = next_config(state, POLICY)
    assert first.values == {
        "A.hoist": "off",
        "A.batch": "off",
        "B.hoist": "off",
        "A.compile": "eager",
        "threads": "2",
    }
    assert first.steps == 1 + POLICY.measure_steps
    cfg, seen = explore(state)
    assert cfg.committed and cfg.steps == 0
    assert cfg.values == {
        "A.hoist": "on",
        "A.batch": "on",
        "B.hoist": "on",
        "A.compile": "inductor",
        "threads": "2",
    }
    assert state.speedup == pytest.approx(cost(seen[0])[0] / cost(cfg.values)[0])
    # Coarse before fine: no compiled trial before every structural trial.
    stages = [t.stage for t in state.trials]
    assert stages == sorted(stages)


def test_independent_regions_are_explored_together():
    state = start(spec(), POLICY)
    explore(state)
    structural = [t for t in state.trials if t.stage == STAGE_STRUCTURE and t.kind == "explore"]
    # Region A has 3 non-baseline combinations, region B one: 3 trials, not 4 (nor 7 for a grid).
    assert len(structural) == 3
    first = structural[0].values
    assert first["B.hoist"] == "on" and (first["A.hoist"], first["A.batch"]) != ("off", "off")


def test_compose_verifies_per_region_winners():
    # Make region timings pick a combination that no single trial measured.
    variables = (
        Variable("A.x", ("0", "1", "2"), "A"),
        Variable("B.x", ("0", "1", "2"), "B"),
    )
    state = start(spec(variables=variables), POLICY)
    costs_a = {"0": 5.0, "1": 4.0, "2": 1.0}
    costs_b = {"0": 5.0, "1": 1.0, "2": 4.0}
    cfg = next_config(state, POLICY)
    while not cfg.committed:
        a, b = costs_a[cfg.values["A.x"]], costs_b[cfg.values["B.x"]]
        cfg = report(state, TrialReport(cfg.trial, [a + b] * 3, {"A": a, "B": b}), POLICY)
    assert [t.kind for t in state.trials] == ["baseline", "explore", "explore", "compose"]
    assert cfg.values == {"A.x": "2", "B.x": "1"}


def test_compile_that_cannot_pay_for_itself_is_pruned():
    state = start(spec(total_steps=60), ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0))
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    cfg = next_config(state, policy)
    while not cfg.committed:
        step, regions = cost(cfg.values)
        cfg = report(state, TrialReport(cfg.trial, [step] * 3, regions), policy)
    assert all(t.values["A.compile"] == "eager" for t in state.trials)
    assert any("cannot repay compile time" in p for p in state.pruned)


def test_a_compile_with_a_large_prior_is_pruned_while_a_cheap_one_is_tried():
    # A cell compile (core default prior) can repay itself over the run; a whole-step compile
    # whose client-side prior is far larger cannot, and is pruned before it costs anything.
    variables = spec().variables + (
        Variable("model.compile", ("eager", "inductor"), "", STAGE_COMPILE, True, compile_prior_ms=3.6e6),
    )
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    state = start(spec(total_steps=20_000, variables=variables), policy)
    cfg = next_config(state, policy)
    while not cfg.committed:
        step, regions = cost(cfg.values)
        cfg = report(state, TrialReport(cfg.trial, [step] * 3, regions), policy)
    assert any(t.values["A.compile"] == "inductor" for t in state.trials)
    assert all(t.values["model.compile"] == "eager" for t in state.trials)
    assert any("model.compile" in p and "cannot repay" in p for p in state.pruned)
    # The prior travels with the spec (JSON state and the wire).
    again = Exploration.from_json(json.loads(json.dumps(state.to_json())))
    assert again.spec.variables[-1].compile_prior_ms == 3.6e6


def test_exploration_stops_at_its_share_of_the_run():
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=0.1)
    state = start(spec(total_steps=100), policy)
    cfg = next_config(state, policy)
    while not cfg.committed:
        step, regions = cost(cfg.values)
        cfg = report(state, TrialReport(cfg.trial, [step] * 3, regions), policy)
    assert state.explore_steps <= 10
    assert cfg.committed


def test_failed_trials_are_never_committed():
    state = start(
        spec(variables=(Variable("A.compile", ("eager", "inductor"), "A", 1, True),), total_steps=10**6),
        POLICY,
    )
    cfg = next_config(state, POLICY)
    cfg = report(state, TrialReport(cfg.trial, [10, 10, 10]), POLICY)
    assert cfg.values["A.compile"] == "inductor"
    cfg = report(state, TrialReport(cfg.trial, [1, 1], failed=True, error="boom"), POLICY)
    assert cfg.committed and cfg.values["A.compile"] == "eager"


def test_stale_and_repeated_reports_are_ignored_and_next_is_idempotent():
    state = start(spec(), POLICY)
    cfg = next_config(state, POLICY)
    assert next_config(state, POLICY) == cfg  # same trial until it is reported
    nxt = run_trial(state, cfg)
    again = report(state, TrialReport(cfg.trial, [1.0, 1.0, 1.0]), POLICY)
    assert again == nxt and len(state.trials) == 2


def test_state_round_trips_through_json_mid_exploration():
    state = start(spec(), POLICY)
    cfg = next_config(state, POLICY)
    cfg = run_trial(state, cfg)
    cfg = run_trial(state, cfg)
    restored = Exploration.from_json(json.loads(json.dumps(state.to_json())))
    assert next_config(restored, POLICY) == cfg
    a, _ = explore(state)
    b, _ = explore(restored)
    assert a == b


def test_core_commits_to_kv_and_next_run_reuses_it_with_zero_exploration():
    kv = MemoryKV()
    core = CompilerCore(kv, POLICY)
    s = spec()
    cfg = core.register(s)
    while not cfg.committed:
        step, regions = cost(cfg.values)
        cfg = core.report(s.key, TrialReport(cfg.trial, [step] * 3, regions))
    assert kv.get_json(f"/microco/compiler/committed/{s.key}")["values"] == cfg.values
    # A new job (and a new core: a restarted service) starts at the committed configuration.
    again = CompilerCore(kv, POLICY).register(s)
    assert again.committed and again.values == cfg.values and again.steps == 0
    # Even if the exploration record is lost, the commit alone suffices.
    kv.delete(f"/microco/compiler/explorations/{s.key}")
    third = CompilerCore(kv, POLICY).register(s)
    assert third.committed and third.values == cfg.values


def test_restarted_core_resumes_the_exploration_where_it_was():
    kv = MemoryKV()
    s = spec()
    core = CompilerCore(kv, POLICY)
    cfg = core.register(s)
    step, regions = cost(cfg.values)
    cfg = core.report(s.key, TrialReport(cfg.trial, [step] * 3, regions))
    restarted = CompilerCore(kv, POLICY)
    assert restarted.register(s) == cfg  # the trial in flight is handed out again
    assert restarted.get(s.key).explore_steps == 3


def test_bad_input_is_refused_clearly():
    core = CompilerCore(MemoryKV(), POLICY)
    with pytest.raises(NotFound):
        core.next_config("nope")
    with pytest.raises(InvalidArgument):
        core.register(GraphSpec("", "", "", ()))
    with pytest.raises(ValueError):
        Variable("x", ("a", "a"))
    s = spec()
    core.register(s)
    with pytest.raises(InvalidArgument):
        core.report(s.key, TrialReport(0, [-1.0]))


def test_a_graph_without_variables_is_committed_at_once():
    core = CompilerCore(MemoryKV(), POLICY)
    cfg = core.register(spec(variables=()))
    assert cfg.committed and cfg.values == {}


def test_spec_with_compile_priors_round_trips_through_the_wire():
    from microco.services.compiler import wire

    s = spec(
        variables=spec().variables
        + (Variable("model.compile", ("eager", "inductor"), "", STAGE_COMPILE, True, 64000.0),)
    )
    back = wire.spec_from_proto(wire.spec_to_proto(s))
    assert back == s and back.key == s.key
    assert back.variables[-1].compile_prior_ms == 64000.0
