"""Issue 18: honest decisions. A configuration is committed only when an interleaved A/B
against the baseline shows it faster (one-sided sign test over paired steps), and the speedup
stored and shown is that interleaved ratio, not a ratio of two trials' minima. Synthetic
timings only: nothing here reads a clock."""

from __future__ import annotations

import itertools

import pytest

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

POLICY = ExplorationPolicy(measure_steps=2, retime_rounds=3, retime_steps=3)


def test_sign_test():
    assert _core.sign_test([(10, 8)] * 6) == (6, 6, pytest.approx(1 / 64))
    assert _core.sign_test([(10, 8)] * 5 + [(8, 10)]) == (5, 6, pytest.approx(7 / 64))
    # Ties carry no sign and are dropped.
    assert _core.sign_test([(10, 8)] * 6 + [(9, 9)] * 3) == (6, 6, pytest.approx(1 / 64))
    assert _core.sign_test([]) == (0, 0, 1.0)


def test_pairs_are_blocks_of_the_same_round_step_by_step():
    mk = _core.TrialRecord
    a, b = {"x": "off"}, {"x": "on"}
    trials = [
        mk(0, a, 0, "confirm", steps=[99, 10, 11], done=True),
        mk(1, b, 0, "confirm", steps=[99, 8, 9], done=True),
        mk(2, a, 0, "confirm", steps=[99, 12, 13], done=True),
        mk(3, b, 0, "confirm", steps=[99, 7, 6], done=True),
    ]
    assert _core.paired_steps(trials, a, b) == [(10, 8), (11, 9), (12, 7), (13, 6)]


def _spec():
    return GraphSpec(
        "fp",
        "(4, 8)",
        "cpu",
        (Variable("A.hoist", ("off", "on"), "A", STAGE_STRUCTURE),),
        "m",
        "torch",
        100_000,
    )


def _explore(interleaved):
    """Trials: the baseline at 10 ms, the candidate at 5 ms (its trial's minimum: 2x). Then the
    interleaved blocks: ``interleaved(side, block)`` gives each block's measured steps."""
    state = start(_spec(), POLICY)
    cfg = next_config(state, POLICY)
    blocks = {"off": itertools.count(), "on": itertools.count()}
    while not cfg.committed:
        side = cfg.values["A.hoist"]
        if state.trials[cfg.trial].kind in ("retime", "confirm"):  # interleaved
            steps = [50.0] + interleaved(side, next(blocks[side]))
        else:
            steps = [50.0] + [10.0 if side == "off" else 5.0] * POLICY.measure_steps
        cfg = report(state, TrialReport(cfg.trial, steps), POLICY)
    return state, cfg


def test_a_candidate_faster_in_every_interleaved_pair_is_committed_with_the_interleaved_ratio():
    state, cfg = _explore(lambda side, k: [10.0, 10.0] if side == "off" else [8.0, 8.0])
    assert cfg.values == {"A.hoist": "on"}
    assert state.interleaved["pairs"] == 6 and state.interleaved["wins"] == 6
    # 10 / 8 from the alternating blocks, not 10 / 5 from the two trials' minima.
    assert state.speedup == pytest.approx(1.25)
    assert state.measured_ms() == (pytest.approx(10.0), pytest.approx(8.0))


def test_a_candidate_that_is_not_consistently_faster_interleaved_is_not_committed():
    # Its trial looked 2x faster; interleaved, it is faster in one block and slower in the next.
    state, cfg = _explore(
        lambda side, k: [10.0, 10.0] if side == "off" else ([8.0, 8.0] if k % 2 else [12.0, 12.0])
    )
    assert cfg.values == {"A.hoist": "off"}  # the baseline
    assert state.speedup == 1.0 and state.interleaved is None
    assert state.confirm_log and not state.confirm_log[-1]["confirmed"]


def test_the_committed_record_and_the_cli_summary_carry_the_interleaved_figures():
    from microco.cli.compiler import summary
    from microco.clients.compiler.explore._store import committed_record

    state, _ = _explore(lambda side, k: [10.0, 10.0] if side == "off" else [8.0, 8.0])
    rec = committed_record(state)
    assert rec["speedup"] == pytest.approx(1.25) and rec["best_ms"] == pytest.approx(8.0)
    row = summary(state)
    assert row["speedup"] == pytest.approx(1.25) and row["speedup_measured"] == "interleaved"
    assert row["speedup_p"] == pytest.approx(1 / 64, abs=1e-4)
