"""Issue 18: the exploration's trial records (``explore.trial_records``), what the corpus
benchmark's JSON carries per model and explored length: each candidate, its steps, its
interleaved A/B ratio and sign test, its compile seconds and its verdict with the reason.
Synthetic timings only."""

from __future__ import annotations

import itertools
import json

from microco.clients.compiler.explore import (
    STAGE_COMPILE,
    STAGE_STRUCTURE,
    ExplorationPolicy,
    GraphSpec,
    TrialReport,
    Variable,
    next_config,
    report,
    start,
    trial_records,
)

POLICY = ExplorationPolicy(measure_steps=2, retime_rounds=3, retime_steps=3)


def _spec(total=100_000):
    return GraphSpec(
        "fp",
        "(4, 8)",
        "cpu",
        (
            Variable("A.hoist", ("off", "on"), "A", STAGE_STRUCTURE),
            Variable(
                "model.compile",
                ("eager", "inductor"),
                "",
                STAGE_COMPILE,
                compiles=True,
                compile_prior_ms=10_000_000.0,
            ),  # priced out: never repaid
        ),  # fmt: skip
        "m",
        "torch",
        total,
    )


def _explore(interleaved, fail=""):
    state = start(_spec(), POLICY)
    cfg = next_config(state, POLICY)
    blocks = {"off": itertools.count(), "on": itertools.count()}
    while not cfg.committed:
        side = cfg.values["A.hoist"]
        if state.trials[cfg.trial].kind in ("retime", "confirm"):
            steps = [50.0] + interleaved(side, next(blocks[side]))
        else:
            steps = [50.0] + [10.0 if side == "off" else 5.0] * POLICY.measure_steps
        failed = bool(fail) and side == "on"
        cfg = report(
            state, TrialReport(cfg.trial, steps, failed=failed, error=fail if failed else ""), POLICY
        )
    return state


def _by_config(rec):
    return {json.dumps(c["config"], sort_keys=True): c for c in rec["candidates"]}


def test_a_committed_candidate_carries_its_interleaved_ratio_and_confidence():
    rec = trial_records(_explore(lambda side, k: [10.0, 10.0] if side == "off" else [8.0, 8.0]), POLICY)
    json.dumps(rec)  # plain JSON
    c = _by_config(rec)
    on = c[json.dumps({"A.hoist": "on"})]
    assert on["verdict"] == "committed" and rec["committed"] == {"A.hoist": "on"}
    [ab] = on["interleaved"]
    assert ab["against"] == "baseline" and ab["ratio"] == 1.25 and ab["wins"] == 6 and ab["pairs"] == 6
    assert ab["significant"] and ab["p"] == round(1 / 64, 4) and "p=" in on["reason"]
    assert on["interleaved_blocks"] == 3 and on["steps"] == 3 + 3 * 3  # its trial + 3 blocks
    assert c['"baseline"']["verdict"] == "baseline"
    assert sum(x["steps"] for x in rec["candidates"]) == rec["explore_steps"]
    # The whole-step compile never ran: priced out, with the core's reason.
    assert [p["verdict"] for p in rec["pruned"]] == ["priced out"]
    assert "cannot repay" in rec["pruned"][0]["reason"]


def test_a_candidate_not_shown_faster_interleaved_is_not_significant():
    rec = trial_records(
        _explore(lambda side, k: [10.0, 10.0] if side == "off" else ([8.0, 8.0] if k % 2 else [12.0, 12.0])),
        POLICY,
    )
    c = _by_config(rec)
    assert c['"baseline"']["verdict"] == "committed" and rec["committed"] == "baseline"
    on = c[json.dumps({"A.hoist": "on"})]
    assert on["verdict"] == "not significant" and on["interleaved"][0]["significant"] is False
    assert "sign test" in on["reason"]


def test_a_trial_abandoned_at_its_deadline_says_so():
    rec = trial_records(
        _explore(lambda side, k: [10.0, 10.0], fail="CompileDeadline: deadline 57.6 s"), POLICY
    )
    on = _by_config(rec)[json.dumps({"A.hoist": "on"})]
    assert on["verdict"] == "abandoned at deadline" and "57.6" in on["reason"]


def test_a_re_timing_against_the_baseline_is_listed_apart_from_the_confirmation():
    """A re-timing pair that includes the baseline is also the candidate's confirmation: the
    verdict reads the confirmation (with its p), the re-timing is listed with the pair's p."""
    state = _explore(
        lambda side, k: [10.0, 10.0] if side == "off" else ([8.0, 8.0] if k % 2 else [12.0, 12.0])
    )
    # the candidate's trial within the re-timing margin of the baseline: one pair, both logs
    state.retime_log.append(
        {"best": 0, "runner_up": 1, "best_ms": 10.0, "runner_up_ms": 10.2, "winner": 0, "wins": 3,
         "pairs": 6, "p": 0.65, "measure": "thread_cpu", "best_cpu_ms": 8.0, "runner_up_cpu_ms": 8.1}
    )  # fmt: skip
    rec = trial_records(state, POLICY)
    on = _by_config(rec)[json.dumps({"A.hoist": "on"})]
    assert on["verdict"] == "not significant" and "p=None" not in on["reason"]
    kinds = {x["kind"]: x for x in on["interleaved"]}
    assert set(kinds) == {"confirm", "retime"} and kinds["retime"]["p"] == 0.65
    assert kinds["retime"]["ratio"] == round(8.0 / 8.1, 3) and kinds["retime"]["wall_ratio"] == round(
        10.0 / 10.2, 3
    )
    base = _by_config(rec)['"baseline"']["interleaved"]
    assert [x["kind"] for x in base] == ["retime"] and base[0]["p"] == 0.65
