"""The search scenario as the Gandiva paper measured it (issue 23): time until a
configuration reaching the target quality has finished training, for ASHA's stopping form
under every policy and ASHA's promotion form (the stronger searcher on a plain cluster)."""

from __future__ import annotations

import math

import pytest

from microco.services.scheduler.policy import make_policy
from microco.services.scheduler.sim import (
    AshaPromotion,
    asha_rungs,
    hp_search_trace,
    run_asha_promotion,
    run_hp_search,
    target_loss,
)

SMALL = dict(gpus=3, per_node=3, n_configs=9, eta=3, min_fraction=1 / 9, duration_s=900.0, seed=2)


def test_target_is_a_quantile_of_the_final_losses() -> None:
    _, final = hp_search_trace(81, seed=0)
    t = target_loss(final, 0.05)
    assert 4 <= sum(1 for v in final.values() if v <= t) <= 5
    assert target_loss(final, 1.0) == max(final.values())
    with pytest.raises(ValueError):
        target_loss(final, 0.0)


@pytest.mark.parametrize("name", ["fifo", "gandiva"])
def test_stopping_form_reports_time_to_target(name: str) -> None:
    r = run_hp_search(make_policy(name), **SMALL)
    d = r.to_dict()
    assert math.isfinite(r.time_to_target_s) and d["time_to_target_s"] == round(r.time_to_target_s, 3)
    # a configuration reaching the target trained in full no sooner than its training takes
    assert r.time_to_target_s >= SMALL["duration_s"]
    assert r.time_to_target_s <= r.time_to_finish_s


def test_promotion_form_promotes_the_best_third_of_each_rung() -> None:
    _, final = hp_search_trace(9, seed=2)
    rungs = asha_rungs(3, 1 / 9)
    s = AshaPromotion(final, rungs, 3, seed=2)
    cfgs = sorted(final)
    promoted = []
    for c in cfgs:
        promoted += s.on_segment_end(AshaPromotion.segment_id(c, 0), 0.0)
    # 9 results at rung 0: the best 3 by their rung-0 loss, each once
    best3 = sorted(cfgs, key=lambda c: s.loss[c][0])[:3]
    assert sorted(promoted) == sorted((c, 1) for c in best3)
    assert s.on_segment_end(AshaPromotion.segment_id(cfgs[0], len(rungs)), 5.0) == []
    assert s.trained == {cfgs[0]: 5.0}


def test_promotion_form_on_fifo_trains_the_survivors_in_full() -> None:
    r = run_asha_promotion(make_policy("fifo"), **SMALL)
    d = r.to_dict()
    # 9 first segments, 3 promoted to rung 1's segment, 1 to the last one
    assert r.segments == 9 + 3 + 1 and r.trained_in_full == 1
    assert r.sim.decisions_refused == 0
    assert d["searcher"] == "asha-promotion"
    # every configuration's first feedback comes within its first segment's reach
    assert r.avg_time_to_first_feedback_s < SMALL["duration_s"]
    if math.isfinite(r.time_to_target_s):
        assert r.time_to_target_s >= SMALL["duration_s"]
