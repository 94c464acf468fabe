"""gandiva: a grow must pay. An elastic job grown onto idle devices is judged, once its
mini-batch time is measured wholly on the new devices, against its throughput before: kept
if steps/s rose by ``grow_keep_ratio``, undone otherwise, and not grown that far again.
Synthetic observations (no timing)."""

from __future__ import annotations

from dataclasses import replace

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Resize,
    check_decisions,
    grow_judgement,
    job_view_from_dict,
    make_policy,
)

R = JobPhase.RUNNING
DEVS = tuple(DeviceView(f"n0/{i}", "n0") for i in range(4))


def grown(settled_ms, *, before_ms=10.0, devices=("n0/0", "n0/1"), **kw) -> JobView:
    return JobView(
        id="e",
        devices_wanted=1,
        elastic=True,
        state=R,
        devices=devices,
        last_change_at=0.0,
        minibatch_ms=settled_ms or before_ms,
        grown_from=("n0/0",),
        minibatch_ms_before_grow=before_ms,
        minibatch_ms_settled=settled_ms,
        **kw,
    )


def decide(job: JobView, **cfg):
    policy = make_policy("gandiva", **{"quantum_s": 1.0, "enable_packing": False, **cfg})
    view = ClusterView(now=100.0, devices=DEVS, jobs=(job,))
    out = policy.decide(view)
    check_decisions(view, out)
    return out


def test_a_grow_that_made_the_job_slower_is_undone():
    # 2 devices, 14.8 ms/step against 10 ms on 1: throughput 0.68x
    (d,) = decide(grown(14.8))
    assert isinstance(d, Resize) and d.devices == ("n0/0",)
    assert "undo grow" in d.reason and "0.68x" in d.reason


def test_a_grow_that_paid_is_kept_and_is_not_judged_before_it_is_measured():
    # 2 devices, 6 ms/step against 10 on 1: 1.67x, kept (and at its cap of 2: nothing more)
    assert decide(grown(6.0)) == []
    # kept, and grown further once there is room under the cap
    (d,) = decide(grown(6.0), grow_max_factor=4)
    assert isinstance(d, Resize) and len(d.devices) == 4 and "grow" in d.reason
    # not yet measured on the new devices: neither undone nor grown further
    assert decide(grown(None)) == []


def test_a_small_gain_below_the_keep_ratio_is_undone():
    (d,) = decide(grown(9.5), grow_keep_ratio=1.2)  # 1.05x < 1.2x
    assert d.devices == ("n0/0",)
    assert decide(grown(9.5), grow_keep_ratio=1.0, grow_max_factor=2) == []


def test_a_job_is_grown_only_once_its_time_at_its_size_is_measured():
    # a grow is judged against the time before it: with none measured yet, there would be
    # nothing to judge it against, and a grow that did not pay would stay (a bug once seen live)
    unmeasured = JobView(
        id="e", devices_wanted=1, elastic=True, state=R, devices=("n0/0",), last_change_at=0.0
    )
    assert decide(unmeasured) == []
    (d,) = decide(replace(unmeasured, minibatch_ms=10.0, minibatch_ms_settled=10.0))
    assert isinstance(d, Resize) and len(d.devices) == 2


def test_a_size_that_did_not_pay_is_not_grown_to_again():
    job = JobView(
        id="e",
        devices_wanted=1,
        elastic=True,
        state=R,
        devices=("n0/0",),
        last_change_at=0.0,
        minibatch_ms=10.0,
        minibatch_ms_settled=10.0,
    )
    (d,) = decide(job)
    assert isinstance(d, Resize) and len(d.devices) == 2  # grows when nothing says otherwise
    assert decide(replace(job, max_useful_devices=2)) == []


def test_the_fields_come_from_a_stored_record():
    v = job_view_from_dict(
        {
            "id": "e",
            "devices_wanted": 1,
            "grown_from": ["n0/0"],
            "minibatch_ms_settled": 5.0,
            "max_useful_devices": 3,
        }
    )
    assert v.grown_from == ("n0/0",) and v.minibatch_ms_settled == 5.0 and v.max_useful_devices == 3


def test_an_undone_grows_reason_shows_sub_millisecond_times_apart():
    # session 41: a CPU-bound loop of 0.69 ms mini-batches, 0.73 ms on 2 devices, read
    # "0.94x the throughput on 1: 0.7 -> 0.7 ms/step" in its history
    (d,) = decide(grown(0.7284, before_ms=0.6875))
    assert "0.94x the throughput on 1: 0.688 -> 0.728 ms/step" in d.reason, d.reason
    (d,) = decide(grown(14.8))
    assert "10 -> 14.8 ms/step" in d.reason, d.reason


# Session 43: a job whose own mini-batch time drifts. Grown at step 1000: the settled mean
# before it is centred at step 500 (20 ms, rising 0.02 ms a step), the first settled mean
# after it at step 1500 (25 ms, rising 0.013 a step). The means read 0.8x, but at the grow's
# step the time was 30 ms before and 18.5 ms after: 1.62x.
DRIFTING = {
    "before_ms": 20.0,
    "grown_at_step": 1000,
    "minibatch_trend_before_grow": (500.0, 20.0, 0.02, 0.002),
    "minibatch_trend_settled": (1500.0, 25.0, 0.013, 0.003),
}


def test_a_grow_is_judged_at_its_step_when_the_time_drifts():
    assert decide(grown(25.0, **DRIFTING)) == []  # kept
    (before, after, how) = grow_judgement(grown(25.0, **DRIFTING), 3.0)
    assert (before, after) == (30.0, 18.5) and "at step 1000" in how
    # the same times with no trend measured: the means, as before (undone)
    (d,) = decide(grown(25.0, before_ms=20.0))
    assert "0.80x" in d.reason and "mean before and after" in d.reason, d.reason


def test_a_grow_that_does_not_pay_at_its_step_is_undone_whichever_way_the_time_drifts():
    # rising: 30 ms before at step 1000, 29 after (1.03x), though the means read 20 -> 36
    up = {**DRIFTING, "minibatch_trend_settled": (1500.0, 36.0, 0.014, 0.003)}
    (d,) = decide(grown(36.0, **up))
    assert "1.03x" in d.reason and "at step 1000" in d.reason, d.reason
    # falling: 30 ms before at step 1000 (falling 0.02 a step from 40 at step 500), 29.5
    # after (1.02x), though the means read 40 -> 19.5, a 2.05x
    down = {
        "before_ms": 40.0,
        "grown_at_step": 1000,
        "minibatch_trend_before_grow": (500.0, 40.0, -0.02, 0.002),
        "minibatch_trend_settled": (1500.0, 19.5, -0.02, 0.003),
    }
    (d,) = decide(grown(19.5, **down))
    assert "1.02x" in d.reason and "at step 1000" in d.reason, d.reason


def test_a_slope_within_its_noise_is_not_taken_for_a_drift():
    # the slopes of DRIFTING with standard errors as large as they are: the means
    noisy = {
        **DRIFTING,
        "minibatch_trend_before_grow": (500.0, 20.0, 0.02, 0.02),
        "minibatch_trend_settled": (1500.0, 25.0, 0.013, 0.013),
    }
    (d,) = decide(grown(25.0, **noisy))
    assert "0.80x" in d.reason and "mean before and after" in d.reason, d.reason
    # before: 1.5 standard errors; after: the other way: no drift
    against = {
        **DRIFTING,
        "minibatch_trend_before_grow": (500.0, 20.0, 0.015, 0.01),
        "minibatch_trend_settled": (1500.0, 25.0, -0.02, 0.001),
    }
    assert "mean before and after" in grow_judgement(grown(25.0, **against), 3.0)[2]
    # before 2 and after 2.5 standard errors, the same way: together, 3.2 (relative to their
    # means): a drift
    together = {
        **DRIFTING,
        "minibatch_trend_before_grow": (500.0, 20.0, 0.02, 0.01),
        "minibatch_trend_settled": (1500.0, 25.0, 0.025, 0.01),
    }
    assert "at step 1000" in grow_judgement(grown(25.0, **together), 3.0)[2]
    # a time that fell steeply before the grow and is flat after it (a job's start-up, its
    # caches warming): not a drift of the job's own; a line through it would have carried the
    # fall on to the grow's step (here 40 -> 20 ms at step 1000, against 19.5 after: 1.03x)
    warm_up = {
        "before_ms": 40.0,
        "grown_at_step": 1000,
        "minibatch_trend_before_grow": (500.0, 40.0, -0.04, 0.002),
        "minibatch_trend_settled": (1500.0, 19.5, 0.0001, 0.003),
    }
    assert grow_judgement(grown(19.5, **warm_up), 3.0) == (40.0, 19.5, "mean before and after")
    # and switched off: the means
    assert decide(grown(25.0, **DRIFTING), grow_trend_z=0.0)[0].devices == ("n0/0",)


def test_the_trend_fields_come_from_a_stored_record():
    v = job_view_from_dict(
        {
            "id": "e",
            "devices_wanted": 1,
            "grown_at_step": 1000.0,
            "minibatch_trend_before_grow": [500, 20, 0.02, 0.002],
            "minibatch_trend_settled": None,
        }
    )
    assert v.grown_at_step == 1000 and v.minibatch_trend_before_grow == (500.0, 20.0, 0.02, 0.002)
    assert v.minibatch_trend_settled is None
