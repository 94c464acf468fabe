"""A whole-step compile's price holds for the configuration it was found for (issue 18): a cache
probe's hit under the model's own memory format prices a load there, and a cold compile under
any other (tv-mobilenet, session 11: the hit priced a compile over channels_last that ran ~300 s
cold). Pure decisions on costs: no compile, no training."""

from __future__ import annotations

import pytest

from microco.clients.compiler._whole_price import probed_memory_format
from microco.clients.compiler.explore import (
    STAGE_COMPILE,
    STAGE_STRUCTURE,
    ExplorationPolicy,
    GraphSpec,
    TrialReport,
    Variable,
    _core,
    next_config,
    report,
    start,
)

POLICY = ExplorationPolicy(measure_steps=2)
HIT = Variable(
    "model.compile",
    ("eager", "inductor"),
    "",
    STAGE_COMPILE,
    compiles=True,
    compile_prior_ms=2_000.0,  # the probe's hit: a load
    prior_calibrated=True,
    prior_holds_for=("memory_format=contiguous",),
    prior_otherwise_ms=300_000.0,  # a cold compile of this graph
)
FORMAT = Variable("memory_format", ("contiguous", "channels_last"), "", STAGE_STRUCTURE)


def _spec(total_steps):
    return GraphSpec("fp", "(8, 3, 32, 32)", "cpu", (FORMAT, HIT), "m", "torch", total_steps)


def test_the_hit_prices_its_own_configuration_and_a_cold_compile_any_other():
    state = start(_spec(1_000), POLICY)
    contiguous = {"memory_format": "contiguous", "model.compile": "inductor"}
    other = {"memory_format": "channels_last", "model.compile": "inductor"}
    assert _core.compile_estimate(state, [(HIT, "inductor")], contiguous) == 2_000.0
    assert _core.compile_estimate(state, [(HIT, "inductor")], other) == 300_000.0
    # Even once the load was measured (under contiguous), the other format is not priced by it.
    state.compile_costs["model.compile=inductor"] = 1_500.0
    assert _core.compile_estimate(state, [(HIT, "inductor")], contiguous) == 1_500.0
    assert _core.compile_estimate(state, [(HIT, "inductor")], other) == 300_000.0
    # Without a configuration (callers that price the choice alone), the prior as before.
    assert _core.compile_estimate(state, [(HIT, "inductor")]) == 1_500.0
    # Unconditional, or its otherwise price unset (0): the framework's default, calibrated.
    assert Variable("x", ("a", "b")).holds_for(other)
    bare = Variable("c", ("eager", "inductor"), compiles=True, prior_holds_for=("memory_format=contiguous",))
    assert _core.compile_estimate(state, [(bare, "inductor")], other) == pytest.approx(
        _core.DEFAULT_COMPILE_MS["torch"] * _core.calibration(state)
    )


def test_the_conditions_survive_the_json_state_and_old_states_load():
    assert Variable.from_dict(HIT.to_dict()) == HIT
    plain = Variable("model.compile", ("eager", "inductor"), compiles=True)
    assert "prior_holds_for" not in plain.to_dict() and "prior_otherwise_ms" not in plain.to_dict()
    assert Variable.from_dict(plain.to_dict()) == plain


def _explore(state, step_ms):
    """Run the exploration on a synthetic machine: channels_last is faster eager; the compiled
    step saves 10%. Returns every configuration tried."""
    tried = []
    cfg = next_config(state, POLICY)
    for _ in range(50):
        if cfg.committed:
            break
        tried.append(dict(cfg.values))
        ms = step_ms(cfg.values)
        cfg = report(state, TrialReport(cfg.trial, [ms] * (POLICY.measure_steps + 1), {}), POLICY)
    return cfg, tried


def test_after_channels_last_wins_the_whole_step_compile_is_priced_cold_and_pruned():
    def step_ms(v):
        ms = 300.0 if v["memory_format"] == "channels_last" else 400.0
        return ms * (0.9 if v["model.compile"] == "inductor" else 1.0)

    # 1,000 steps of 300 ms: at most ~150 s to save, far below a 300 s cold compile; a 2 s load
    # would have been tried (the session-11 miss).
    cfg, tried = _explore(start(_spec(1_000), POLICY), step_ms)
    assert cfg.values["memory_format"] == "channels_last"
    assert not any(t["model.compile"] == "inductor" and t["memory_format"] == "channels_last" for t in tried)
    # The same hit, probed under the format that won, is a load: tried.
    hit_cl = Variable(**{**HIT.__dict__, "prior_holds_for": ("memory_format=channels_last",)})
    spec = GraphSpec("fp", "(8, 3, 32, 32)", "cpu", (FORMAT, hit_cl), "m", "torch", 1_000)
    _, tried = _explore(start(spec, POLICY), step_ms)
    assert any(t["model.compile"] == "inductor" and t["memory_format"] == "channels_last" for t in tried)


def test_the_probed_memory_format_is_the_models_own():
    torch = pytest.importorskip("torch")
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    assert probed_memory_format(conv) == "contiguous"
    assert probed_memory_format(conv.to(memory_format=torch.channels_last)) == "channels_last"
    assert probed_memory_format(torch.nn.Linear(3, 4)) == "contiguous"
