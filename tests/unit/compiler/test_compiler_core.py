"""The exploration core: pure decisions, persisted state, commit and reuse (MemoryKV, no sockets)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from microco.clients.compiler.explore import (
    STAGE_COMPILE,
    STAGE_FINE,
    STAGE_STRUCTURE,
    CompilerCore,
    Exploration,
    ExplorationPolicy,
    GraphSpec,
    TrialReport,
    Variable,
    _core,
    next_config,
    report,
    start,
)
from microco.common import InvalidArgument, MemoryKV, NotFound

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
    # (then the composed winner measured interleaved against the baseline before its commit; the
    # baseline measured again after the first other trial)
    assert [t.kind for t in state.trials if t.kind != "confirm"] == [
        "baseline",
        "explore",
        "rebase",
        "explore",
        "compose",
    ]
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
    # The interleaved A/B against the baseline before commit is not counted against the share.
    assert sum(len(t.steps) for t in state.trials if t.kind != "confirm") <= 10
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
    from microco.clients.compiler.explore import wire

    s = spec(
        variables=spec().variables
        + (Variable("model.compile", ("eager", "inductor"), "", STAGE_COMPILE, True, 64000.0),)
    )
    back = wire.spec_from_proto(wire.spec_to_proto(s))
    assert back == s and back.key == s.key
    assert back.variables[-1].compile_prior_ms == 64000.0
    subsuming = _whole_spec(3000, subsumes=("A.hoist", "A.batch"))
    back = wire.spec_from_proto(wire.spec_to_proto(subsuming))
    assert back == subsuming and back.variables[-1].subsumes == ("A.hoist", "A.batch")
    assert Variable.from_dict(json.loads(json.dumps(back.variables[-1].to_dict()))) == back.variables[-1]


def test_a_variable_subsuming_an_unknown_one_is_refused():
    bad = replace(WHOLE, subsumes=("nope",))
    with pytest.raises(InvalidArgument, match="subsumes"):
        CompilerCore(MemoryKV(), POLICY).register(spec(variables=spec().variables + (bad,)))


def test_configurations_differing_only_in_subsumed_variables_are_one():
    """Under the whole-step compile the region rewrites do nothing (dynamo traces the cells'
    plain code): no trial pairs it with a region choice, and the commit shows the rewrites off."""
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    regions = ("A.hoist", "A.batch", "B.hoist", "A.compile")

    def explore(s):
        core = CompilerCore(MemoryKV(), policy)
        cfg = core.register(s)
        tried = []
        while not cfg.committed:
            tried.append(dict(cfg.values))
            if cfg.values["model.compile"] == "inductor":  # one compiled step, rewrites or not
                step, warm = 15.0, 3000.0
            else:
                step, warm = cost(cfg.values)[0], 0.0
            cfg = core.report(s.key, TrialReport(cfg.trial, [step + warm] + [step] * policy.measure_steps))
        return cfg, [t for t in tried if t["model.compile"] == "inductor"]

    s = _whole_spec(300_000, subsumes=regions)
    cfg, whole = explore(s)
    assert whole
    baseline = {v.name: v.choices[0] for v in s.variables}
    assert all(t[n] == baseline[n] for t in whole for n in regions)
    assert cfg.values["model.compile"] == "inductor"
    assert all(cfg.values[n] == baseline[n] for n in regions)
    # Without the declaration the same exploration pairs the compile with region rewrites,
    # trials of the same code that the core cannot tell apart.
    _, plain = explore(_whole_spec(300_000))
    assert any(any(t[n] != baseline[n] for n in regions) for t in plain)


# -- compile time priced by what it really costs (measured, persisted per key)

WHOLE = Variable("model.compile", ("eager", "inductor"), "", STAGE_COMPILE, True, compile_prior_ms=64_000.0)


def _whole_spec(total_steps, subsumes=()):
    return spec(total_steps=total_steps, variables=spec().variables + (replace(WHOLE, subsumes=subsumes),))


def _run(core, s, compile_ms):
    """Drive one run through the core; the warm-up step of a compiling trial costs ``compile_ms``
    (per compiled choice: {"A.compile=inductor": ms, "model.compile=inductor": ms})."""
    cfg = core.register(s)
    tried = []
    while not cfg.committed:
        tried.append(dict(cfg.values))
        step, regions = cost(cfg.values)
        if cfg.values.get("model.compile") == "inductor":
            step -= 12.0  # the whole-step compile is the fastest configuration on this machine
        warm = step + sum(
            ms for c, ms in compile_ms.items() if cfg.values.get(c.split("=")[0]) == c.split("=")[1]
        )
        cfg = core.report(s.key, TrialReport(cfg.trial, [warm] + [step] * POLICY.measure_steps, regions))
    return cfg, tried


def test_measured_compile_costs_are_kept_per_choice_and_persisted_with_the_key():
    kv = MemoryKV()
    core = CompilerCore(kv, ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0))
    s = spec()
    _run(core, s, {"A.compile=inductor": 1500.0})
    state = core.get(s.key)
    assert state.compile_costs == {"A.compile=inductor": 1500.0}
    assert kv.get_json(f"/microco/compiler/compile_costs/{s.key}") == {"A.compile=inductor": 1500.0}
    assert kv.get_json(f"/microco/compiler/committed/{s.key}")["compile_costs"] == state.compile_costs
    # A forgotten exploration (explorations and commit deleted) starts with the measured costs.
    kv.delete(f"/microco/compiler/explorations/{s.key}")
    kv.delete(f"/microco/compiler/committed/{s.key}")
    core.register(s)
    assert core.get(s.key).compile_costs == {"A.compile=inductor": 1500.0}


def test_a_whole_step_compile_priced_at_its_prior_is_pruned_but_tried_once_measured_cheap():
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    # The best step is ~30 ms; at most half of it saved over 3000 steps is 45 s < the 64 s prior.
    kv = MemoryKV()
    s = _whole_spec(3000)
    _, tried = _run(CompilerCore(kv, policy), s, {"A.compile=inductor": 8000.0})
    assert all(t["model.compile"] == "eager" for t in tried)
    # An earlier run of the same key measured it (e.g. a longer run paid the cold compile):
    # 3 s, warm. The next exploration prices it at that and tries it.
    kv2 = MemoryKV()
    kv2.put_json(f"/microco/compiler/compile_costs/{s.key}", {"model.compile=inductor": 3000.0})
    cfg, tried = _run(
        CompilerCore(kv2, policy), s, {"A.compile=inductor": 8000.0, "model.compile=inductor": 3000.0}
    )
    assert any(t["model.compile"] == "inductor" for t in tried)
    assert cfg.values["model.compile"] == "inductor"


def test_calibration_scales_unmeasured_priors_by_measured_compiles_within_bounds():
    policy = ExplorationPolicy(measure_steps=2)
    state = start(_whole_spec(3000), policy)
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == 64_000.0
    state.compile_costs["A.compile=inductor"] = 4000.0  # half of the 8 s default prior
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == pytest.approx(32_000.0)
    state.compile_costs["A.compile=inductor"] = 10.0  # a cache hit elsewhere: at most 4x cheaper
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == pytest.approx(16_000.0)
    state.compile_costs["model.compile=inductor"] = 2500.0  # its own measurement wins outright
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == 2500.0


def test_a_client_calibrated_prior_is_used_as_given_and_does_not_calibrate_the_others():
    calibrated = Variable(
        "xla", ("off", "on"), "", STAGE_COMPILE, True, compile_prior_ms=14_000.0, prior_calibrated=True
    )
    state = start(spec(total_steps=3000, variables=spec().variables + (WHOLE, calibrated)), POLICY)
    # A cell compile measured at half its prior halves the plain whole-step prior, not the
    # client's calibrated estimate.
    state.compile_costs["A.compile=inductor"] = 4000.0
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == pytest.approx(32_000.0)
    assert _core.compile_estimate(state, [(calibrated, "on")]) == 14_000.0
    # Its own measurement still wins, and (far below its estimate) it does not pull the others.
    state.compile_costs["xla=on"] = 1000.0
    assert _core.compile_estimate(state, [(calibrated, "on")]) == 1000.0
    assert _core.compile_estimate(state, [(WHOLE, "inductor")]) == pytest.approx(32_000.0)
    # The flag survives the JSON the state is kept in and the wire; absent, old states load.
    assert Variable.from_dict(calibrated.to_dict()) == calibrated
    assert "prior_calibrated" not in WHOLE.to_dict()
    from microco.clients.compiler.explore import wire

    assert wire.variable_from_proto(wire.variable_to_proto(calibrated)) == calibrated


def test_a_committed_run_reports_its_warm_recompile_and_a_pruned_candidate_that_now_pays_is_tried():
    # Priced against the best case (the arithmetic below); the expected share is tested apart.
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0, expected_gain_share=1.0)
    kv = MemoryKV()
    core = CompilerCore(kv, policy)
    s = _whole_spec(3000)
    first, _ = _run(core, s, {"A.compile=inductor": 8000.0})  # cold cell compile: 8 s
    assert first.values["A.compile"] == "inductor" and first.values["model.compile"] == "eager"
    state = core.get(s.key)
    assert any(c["combo"] == {"model.compile": "inductor"} for c in state.pruned_candidates)
    # Next run, same length: nothing new is known, zero exploration.
    again = CompilerCore(kv, policy).register(s)
    assert again.committed and again.values == first.values
    # It started compiled; its first two steps say the recompile took 6 s: recorded; the
    # whole-step prior re-priced at 6/8 of 64 s = 48 s still cannot pay (18 ms x 1/2 x 3000).
    step, _ = cost(first.values)
    nxt = core.report(s.key, TrialReport(-1, [step + 6000.0, step]))
    assert core.get(s.key).compile_costs["A.compile=inductor"] == 6000.0
    assert nxt.committed and nxt.values == first.values
    # Another run finds the cache warm: the cell recompiles in 0.1 s. The whole-step compile,
    # re-priced at 64 s / 4 = 16 s, now pays back within the run: it gets one trial.
    again = CompilerCore(kv, policy).register(s)
    assert again.committed
    cfg = core.report(s.key, TrialReport(-1, [step + 100.0, step]))
    assert core.get(s.key).compile_costs["A.compile=inductor"] == 100.0
    assert not cfg.committed and cfg.values["model.compile"] == "inductor"
    base = cost(cfg.values)[0] - 12.0
    done = core.report(s.key, TrialReport(cfg.trial, [base + 16_000.0, base, base], {}))
    while not done.committed:  # measured interleaved against the baseline before its commit
        ms = cost(done.values)[0] - (12.0 if done.values["model.compile"] == "inductor" else 0.0)
        done = core.report(s.key, TrialReport(done.trial, [ms] * done.steps, {}))
    assert done.committed and done.values["model.compile"] == "inductor"
    state = core.get(s.key)
    assert state.compile_costs["model.compile=inductor"] == pytest.approx(16_000.0)
    assert state.reopened == 1
    # The run after that starts at the new commit, compiled, with zero exploration.
    last = CompilerCore(kv, policy).register(s)
    assert last.committed and last.values == done.values and last.steps == 0


def test_a_run_whose_client_found_the_compile_cached_reopens_the_pruned_whole_step_compile():
    """A client that measured on its host that the whole-step compile is in Inductor's caches
    (a calibrated 1.2 s instead of the 64 s cold prior) gets one trial of it on a committed key;
    a run that did not (the prior uncalibrated) keeps the commit with zero exploration."""
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    kv = MemoryKV()
    first, _ = _run(CompilerCore(kv, policy), _whole_spec(3000), {"A.compile=inductor": 8000.0})
    assert first.values["model.compile"] == "eager"
    again = CompilerCore(kv, policy).register(_whole_spec(3000))
    assert again.committed and again.steps == 0
    cached = replace(WHOLE, compile_prior_ms=1200.0, prior_calibrated=True)
    warm = spec(total_steps=3000, variables=spec().variables + (cached,))
    assert warm.key == _whole_spec(3000).key
    cfg = CompilerCore(kv, policy).register(warm)
    assert not cfg.committed and cfg.values["model.compile"] == "inductor"
    # Only the client's calibrated priors are taken, and only for the same variable.
    other = replace(cached, choices=("eager", "inductor", "inductor-cudagraphs"))
    stored = _whole_spec(3000)
    assert _core.with_run_priors(stored, spec(variables=spec().variables + (other,))) == stored
    assert _core.with_run_priors(stored, _whole_spec(10)) == stored


def test_a_pruned_compile_gets_a_trial_when_a_longer_run_registers():
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    kv = MemoryKV()
    core = CompilerCore(kv, policy)
    first, _ = _run(core, _whole_spec(3000), {"A.compile=inductor": 8000.0})
    assert first.values["model.compile"] == "eager"
    # Ten times longer: the calibrated prior (64 s x 8/8) pays back now.
    cfg = CompilerCore(kv, policy).register(_whole_spec(30_000))
    assert not cfg.committed and cfg.values["model.compile"] == "inductor"


def test_a_candidate_pruned_before_any_compile_was_measured_is_repriced_before_the_commit():
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    # Planned at the 64 s prior against ~24 ms x 1/2 x 4000 = 48 s: pruned. Then the cell
    # compile measures 2 s (1/4 of its 8 s prior): the whole step is re-priced at 16 s against
    # ~18 ms x 1/2 x 4000 = 36 s and gets its trial before the exploration commits.
    cfg, tried = _run(
        CompilerCore(MemoryKV(), policy),
        _whole_spec(4000),
        {"A.compile=inductor": 2000.0, "model.compile=inductor": 2000.0},
    )
    assert [t["model.compile"] for t in tried].count("inductor") >= 1
    assert tried.index(next(t for t in tried if t["model.compile"] == "inductor")) > tried.index(
        next(t for t in tried if t["A.compile"] == "inductor")
    )
    assert cfg.values["model.compile"] == "inductor"
    # Shorter, the same re-pricing still finds it too dear: never tried.
    cfg, tried = _run(CompilerCore(MemoryKV(), policy), _whole_spec(1000), {"A.compile=inductor": 2000.0})
    assert all(t["model.compile"] == "eager" for t in tried)


def test_a_planned_compile_is_priced_again_just_before_it_runs():
    # Two whole-step compiled choices planned together at a 10 s prior (expected to gain 10 ms x
    # 1/2 x 1/2 x 12000 = 30 s, enough for both); the first one measures 200 s, so the second,
    # priced again at the calibrated 10 s x 4 = 40 s, is skipped.
    xla = Variable("xla", ("off", "on", "plain"), "", STAGE_COMPILE, True, compile_prior_ms=10_000.0)
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    state = start(GraphSpec("fp", "x", "cpu", (xla,), framework="tensorflow", total_steps=12_000), policy)
    cfg = next_config(state, policy)
    ran = []
    while not cfg.committed:
        ran.append(cfg.values["xla"])
        warm = 200_000.0 if cfg.values["xla"] != "off" else 0.0
        cfg = report(state, TrialReport(cfg.trial, [10.0 + warm, 10.0, 10.0]), policy)
    assert [t.values["xla"] for t in state.trials if t.kind not in ("retime", "rebase")] == ["off", "on"]
    assert any("plain" in p and "re-priced before running" in p for p in state.pruned)


# -- a stage's alternatives share one expected saving


def _two_rewrites(total_steps, prior_ms):
    """Two whole-step rewrites that each build a new compiled step (TF's hoist and batch under
    XLA): one region, alternatives of one another."""
    return spec(
        total_steps=total_steps,
        variables=(
            Variable("hoist", ("off", "on"), "", STAGE_STRUCTURE, True, prior_ms, prior_calibrated=True),
            Variable("batch", ("off", "on"), "", STAGE_STRUCTURE, True, prior_ms, prior_calibrated=True),
        ),
    )


def _explore_rewrites(s, policy):
    state = start(s, policy)
    cfg, tried = next_config(state, policy), []
    while not cfg.committed:
        tried.append(dict(cfg.values))
        step = 10.0 - 1 * (cfg.values["hoist"] == "on") - 1.5 * (cfg.values["batch"] == "on")
        cfg = report(state, TrialReport(cfg.trial, [step + 1000.0] + [step] * policy.measure_steps), policy)
    return state, cfg, tried


def test_a_stages_alternatives_must_repay_their_compiles_together_coarse_first():
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0, retime_rounds=0)
    # Expected saving: 10 ms x (1 - 1/2) x 1/2 x ~2000 steps = ~5 s. Each rewrite is priced at
    # 2 s: each alone would pay, but the three alternatives together (6 s) cannot. The one that
    # changes the most (both on) runs first, then one single, and the last one is dropped.
    state, cfg, tried = _explore_rewrites(_two_rewrites(2000, 2000.0), policy)
    assert tried[0] == {"hoist": "off", "batch": "off"}
    assert tried[1] == {"hoist": "on", "batch": "on"}
    assert len(tried) == 3
    shared = [p for p in state.pruned if "with the stage's other alternatives" in p]
    assert len(shared) == 1
    # Dropped for the stage's shared budget, it is not re-priced on its own before the commit.
    assert not state.pruned_candidates
    assert cfg.values == {"hoist": "on", "batch": "on"}
    # A run long enough to repay all three tries all three.
    state, _, tried = _explore_rewrites(_two_rewrites(100_000, 2000.0), policy)
    assert len(tried) == 4 and not state.pruned


def test_candidates_that_compile_nothing_keep_their_order_and_share_no_budget():
    # (the run's cost budget off: each trial's 1 s build in a 50-step run of 10 ms steps would
    # spend it at the first trial, see test_compiler_budget.py; this test is about the order)
    policy = ExplorationPolicy(
        measure_steps=2, max_explore_fraction=1.0, retime_rounds=0, max_explore_cost=0.0
    )
    s = spec(
        total_steps=50,
        variables=(
            Variable("hoist", ("off", "on"), "", STAGE_STRUCTURE),
            Variable("batch", ("off", "on"), "", STAGE_STRUCTURE),
        ),
    )
    _, _, tried = _explore_rewrites(s, policy)
    assert tried[1:] == [
        {"hoist": "off", "batch": "on"},
        {"hoist": "on", "batch": "off"},
        {"hoist": "on", "batch": "on"},
    ]


def test_a_compile_is_planned_only_when_its_expected_saving_repays_it():
    """Between what the best case promises and what a candidate can be expected to gain: a 4 s
    compile against a best case of 5 s (10 ms x 1/2 x 1000 steps) and an expected 2.5 s."""
    s = spec(
        total_steps=1000,
        variables=(Variable("xla", ("off", "on"), "", STAGE_COMPILE, True, 4000.0, prior_calibrated=True),),
    )

    def tried(share):
        policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0, expected_gain_share=share)
        state = start(s, policy)
        cfg = next_config(state, policy)
        while not cfg.committed:
            cfg = report(state, TrialReport(cfg.trial, [10.0, 10.0, 10.0]), policy)
        return [t.values["xla"] for t in state.trials if t.kind not in ("retime", "rebase")], state.pruned

    ran, pruned = tried(ExplorationPolicy().expected_gain_share)
    assert ran == ["off"] and "est. 4000 ms > expected saving 2492 ms" in pruned[0]  # 997 steps left
    assert tried(1.0)[0] == ["off", "on"]


def test_the_whole_step_compile_runs_first_and_a_cell_compile_that_cannot_beat_it_is_skipped():
    """The whole step compiled (subsuming the cell's rewrites) is the coarser choice: it runs
    before the cell compile of the same stage. It wins by more than compiling the cell could
    give (the cell is 6 of the base's 18 ms: at best 15 ms, against the whole step's 9), so the
    cell compile is skipped before it costs its compile. Where the whole step loses, it runs."""
    variables = (
        Variable("A.compile", ("eager", "inductor"), "A", STAGE_COMPILE, True, 1000.0),
        replace(WHOLE, compile_prior_ms=1000.0, subsumes=("A.compile",)),
    )
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)

    def explore(whole_ms):
        state = start(spec(total_steps=100_000, variables=variables), policy)
        cfg, tried = next_config(state, policy), []
        while not cfg.committed:
            v = cfg.values
            tried.append(dict(v))
            ms = whole_ms if v["model.compile"] == "inductor" else 18.0 - 3.0 * (v["A.compile"] == "inductor")
            cfg = report(state, TrialReport(cfg.trial, [ms + 500.0] + [ms] * 2, {"A": 2.0}), policy)
        return state, [t for t in tried if t != tried[0]], cfg

    state, tried, cfg = explore(whole_ms=9.0)
    assert tried[0]["model.compile"] == "inductor"
    assert not any(t["A.compile"] == "inductor" for t in tried)
    assert any("cannot beat the best" in p for p in state.pruned)
    assert cfg.values["model.compile"] == "inductor"
    state, tried, cfg = explore(whole_ms=17.0)
    assert tried[0]["model.compile"] == "inductor"
    assert any(t["A.compile"] == "inductor" for t in tried)
    assert cfg.values["A.compile"] == "inductor" and cfg.values["model.compile"] == "eager"


@pytest.mark.parametrize("rewrite_ms, committed", [(12.0, "rewrite"), (20.0, "plain")])
def test_a_whole_step_compile_nested_in_a_wider_one_is_one_configuration_under_it(rewrite_ms, committed):
    """The rewritten whole step (graph passes, then Inductor) subsumes the plain whole-step
    compile and every region variable: a configuration with both on runs the rewrite and is
    counted as the rewrite alone; the faster of the two is committed (synthetic times)."""
    regions = ("A.hoist", "A.batch", "B.hoist", "A.compile")
    plain = replace(WHOLE, subsumes=regions)
    rewrite = replace(WHOLE, name="model.rewrite", subsumes=regions + ("model.compile",))
    s = spec(total_steps=300_000, variables=spec().variables + (plain, rewrite))
    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    core = CompilerCore(MemoryKV(), policy)
    cfg, tried = core.register(s), []
    while not cfg.committed:
        v = dict(cfg.values)
        tried.append(v)
        if v["model.rewrite"] == "inductor":
            step, warm = rewrite_ms, 3000.0
        elif v["model.compile"] == "inductor":
            step, warm = 15.0, 3000.0
        else:
            step, warm = cost(v)[0], 0.0
        cfg = core.report(s.key, TrialReport(cfg.trial, [step + warm] + [step] * policy.measure_steps))
    assert not any(t["model.rewrite"] == "inductor" and t["model.compile"] == "inductor" for t in tried)
    assert any(t["model.rewrite"] == "inductor" for t in tried)
    on = {"rewrite": ("inductor", "eager"), "plain": ("eager", "inductor")}[committed]
    assert (cfg.values["model.rewrite"], cfg.values["model.compile"]) == on
