"""Issue 18, session 36: the baseline read again after the run's first other trial.

The baseline trial is the run's first, and the first steps of a run read slow for reasons of
their own (torchvision's ResNet-18 on the CPU: its baseline trial 63-94 ms a step where the same
eager step ran 45-53 ms interleaved later; the allocator's first touches of fresh memory). Judged
against that reading, a slower configuration looked as fast as the baseline (and got an A/B it
did not need), and the trials' excess was hidden from the run's exploration budget. Scripted
step times, the run's first six steps 1.4x slower whatever runs; nothing here reads a clock."""

from __future__ import annotations

import pytest

from microco.clients.compiler import ExplorationSession, _session
from microco.clients.compiler.explore import (
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

POLICY = ExplorationPolicy()  # the defaults: 1 + 5 steps a trial, A/Bs of 3 x 3 steps
FIRST = 6  # the run's first steps, slow whatever runs
SLOW = 1.4


def _first_six(i: int) -> float:
    return SLOW if i < FIRST else 1.0


def _spec(steps: int = 300) -> GraphSpec:
    return GraphSpec(
        "rebase",
        "(8, 3, 32, 32)",
        "cpu",
        (Variable("v", ("a", "b", "c"), "", STAGE_STRUCTURE),),
        total_steps=steps,
    )


def _explore(true_ms: dict[str, float], policy: ExplorationPolicy = POLICY, slow=_first_six):
    """The exploration of a 300-step run whose configurations run ``true_ms`` a step, step ``i``
    of the run ``slow(i)`` times that (by default the first ``FIRST``, the baseline trial's,
    ``SLOW`` times)."""
    state = start(_spec(), policy)
    cfg = next_config(state, policy)
    i = 0
    while not cfg.committed:
        steps = []
        for _ in range(cfg.steps):
            steps.append(true_ms[cfg.values["v"]] * slow(i))
            i += 1
        cfg = report(state, TrialReport(cfg.trial, steps), policy)
    return state, cfg


def test_a_configuration_slower_than_the_baseline_is_not_taken_for_a_faster_one():
    """b runs 1.3x the baseline's step but 0.93x its slow first reading: it became the best, and
    the A/B that refuted it cost 18 more steps. Against the baseline read again, it is slower
    (beyond the re-timing margin): rejected on its trial, nothing interleaved. The second reading
    came out faster than the first, so the baseline is read once more after c, and agrees."""
    state, cfg = _explore({"a": 50.0, "b": 65.0, "c": 80.0})
    assert cfg.values == {"v": "a"}
    kinds = [t.kind for t in state.trials]
    assert kinds == ["baseline", "explore", "rebase", "explore", "rebase"]
    assert not state.confirm_log and not state.retime_log
    assert _core.base_step_ms(state) == pytest.approx(50.0)
    assert state.baseline is state.trials[4] and state.best == 4
    assert state.measured_ms() == (pytest.approx(50.0), pytest.approx(50.0))


def test_a_slowness_that_outlasts_the_first_reading_is_read_again_until_it_settles():
    """The first 12 steps 1.4x, the next 6 1.3x (ResNet-18's 5,000-step instance: 80, then 63,
    then 50 ms). c, 1.22x the baseline's true step, reads 6% under the second reading (65 ms)
    and would be the best, the next stages planned on it and an A/B run to refute it; the third
    reading (50 ms) settles it: c rejected on its trial, nothing interleaved."""
    state, cfg = _explore(
        {"a": 50.0, "b": 80.0, "c": 61.0}, slow=lambda i: 1.4 if i < 12 else 1.3 if i < 18 else 1.0
    )
    assert cfg.values == {"v": "a"}
    assert [(t.kind, t.values["v"], t.step_ms) for t in state.trials] == [
        ("baseline", "a", pytest.approx(70.0)),
        ("explore", "b", pytest.approx(112.0)),
        ("rebase", "a", pytest.approx(65.0)),
        ("explore", "c", pytest.approx(61.0)),
        ("rebase", "a", pytest.approx(50.0)),
    ]
    assert not state.confirm_log and not state.retime_log
    # at most ``rebase_reads`` readings after the first: one here, and c is taken for the best
    state, cfg = _explore(
        {"a": 50.0, "b": 80.0, "c": 61.0},
        ExplorationPolicy(rebase_reads=1),
        slow=lambda i: 1.4 if i < 12 else 1.3 if i < 18 else 1.0,
    )
    assert [t.kind for t in state.trials].count("rebase") == 1 and state.confirm_log


def test_a_slow_first_reading_does_not_hide_the_trials_cost_from_the_budget():
    """b costs 80 ms a step over the baseline's true 50 (6 steps, 480 ms: past the run's 3% of
    300 x 50 ms = 450 ms), but only 60 over the slow first reading (360 of a 630 ms budget), and
    c ran. Counted against the baseline read again, the budget is spent and c is not tried."""
    state, cfg = _explore({"a": 50.0, "b": 130.0, "c": 49.0})
    assert cfg.values == {"v": "a"}
    assert _core.explore_excess_ms(state) == pytest.approx(6 * 80.0)
    assert _core.cost_budget_ms(state, POLICY) == pytest.approx(0.03 * 300 * 50.0)
    assert [t.values["v"] for t in state.trials] == ["a", "b", "a"]
    assert any("budget is spent" in p and "'c'" in p for p in state.pruned)


def test_a_truly_faster_configuration_is_still_confirmed_and_committed():
    """The re-measurement changes the reference, not the rule: c, 0.8x the baseline's true step,
    is still the best, confirmed by its A/B against the baseline (read again) and committed."""
    state, cfg = _explore({"a": 50.0, "b": 65.0, "c": 40.0})
    assert cfg.values == {"v": "c"}
    r = state.interleaved
    assert r is not None and r["confirmed"] and r["baseline"] == state.baseline.trial == 4
    assert state.speedup == pytest.approx(50.0 / 40.0)


def test_no_reading_after_an_ab_against_the_baseline():
    """MobileNetV3 at 5,000 steps: the second reading came out 4.6% under the first (noise), the
    channels-last best was confirmed against the baseline interleaved (before the compile stage,
    whose compile runs channels-last), and the baseline was read once more after the next trial:
    six contiguous steps at 1.45x the best's. An A/B's baseline blocks are a later reading
    already: no re-reading after one."""
    v = Variable("v", ("a", "b"), "", STAGE_STRUCTURE)
    compile_v = Variable(
        "model.compile", ("eager", "inductor"), "", 1, compiles=True, compile_prior_ms=1e9, runs_as=("v=b",)
    )
    w = Variable("w", ("x", "y"), "", 2)
    spec = GraphSpec("rebase2", "(8, 3, 32, 32)", "cpu", (v, compile_v, w), total_steps=5000)
    true = {("a", "x"): 50.0, ("b", "x"): 35.0, ("a", "y"): 51.0, ("b", "y"): 34.5}
    state = start(spec, POLICY)
    cfg = next_config(state, POLICY)
    i = 0
    while not cfg.committed:
        steps = []
        for _ in range(cfg.steps):
            steps.append(true[(cfg.values["v"], cfg.values["w"])] * (1.1 if i < FIRST else 1.0))
            i += 1
        cfg = report(state, TrialReport(cfg.trial, steps), POLICY)
    kinds = [t.kind for t in state.trials]
    assert kinds[:4] == ["baseline", "explore", "rebase", "confirm"]
    assert kinds.count("rebase") == 1 and "explore" in kinds[4:]  # (w's trial, after the A/B)
    assert cfg.values["v"] == "b"


def test_the_reading_keeps_or_hands_on_the_best():
    """A best that no longer beats the baseline read again hands the best on to another trial
    that does (here one measured before it that was not 3% faster than it), else to the
    baseline; a best that still beats it stays."""
    spec = _spec()
    state = start(spec, POLICY)
    mk = _core.TrialRecord
    state.trials = [
        mk(0, {"v": "a"}, -1, "baseline", steps=[70.0] * 6, step_ms=70.0, done=True),
        mk(1, {"v": "b"}, 0, "explore", steps=[45.0] * 6, step_ms=45.0, done=True),
        mk(2, {"v": "c"}, 0, "explore", steps=[44.5] * 6, step_ms=44.5, done=True),
    ]
    state.best = 1  # (c was not 3% under b)
    reading = mk(3, {"v": "a"}, 0, "rebase", steps=[46.0] * 6, step_ms=46.0, done=True)
    state.trials.append(reading)
    _core._rebase_best(state, reading, POLICY)
    assert state.best == 2  # c: 44.5 < 46 x 0.97; b: 45 is not
    state.best = 2
    _core._rebase_best(state, reading, POLICY)
    assert state.best == 2
    reading.step_ms = 40.0
    _core._rebase_best(state, reading, POLICY)
    assert state.best == 3


def test_off_it_runs_as_before():
    state, cfg = _explore({"a": 50.0, "b": 65.0, "c": 80.0}, ExplorationPolicy(rebase_reads=0))
    assert "rebase" not in [t.kind for t in state.trials]
    assert state.baseline is state.trials[0]


def test_the_client_counts_the_trials_cost_against_the_baseline_read_again(monkeypatch, scripted_explorer):
    """The client cuts a trial by the same budget: its baseline is the latest reading once the
    explorer runs the baseline again for as many steps, and what the trials cost so far is
    counted again against it (an interleaved block of the baseline, shorter, would change
    nothing)."""
    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    ex = scripted_explorer(6, [{"v": "b"}, {}, {"v": "c"}], {"v": "a"})
    s = ExplorationSession(ex)
    s.register(_spec(300))
    for ms in [70.0] * 6 + [65.0] * 6:  # the slow first reading, then b
        s.record(ms, {}, may_compile=False)
    assert s.base_ms == 70.0 and s.excess_ms == pytest.approx(-30.0)
    for _ in range(6):  # the baseline again
        s.record(50.0, {}, may_compile=False)
    assert s.base_ms == 50.0 and s.excess_ms == pytest.approx(6 * 15.0)
    assert s.cost_budget_ms() == pytest.approx(0.03 * 300 * 50.0)
    assert len(ex.reports) == 3
    # c, 3x the baseline's step: cut once its excess would take the run past 450 ms (90 + 4 x 100;
    # against the first reading, 630 ms, its six steps were never cut: -30 + 6 x 80 = 450)
    for _ in range(3):
        s.record(150.0, {}, may_compile=False)
    assert len(ex.reports) == 3
    s.record(150.0, {}, may_compile=False)
    assert len(ex.reports) == 4 and ex.reports[3].step_ms == [150.0] * 4
