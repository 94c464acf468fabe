"""gandiva packs full-device jobs whose observed busy fraction leaves room (JobView's
optional ``utilization``), and its introspection keeps or undoes such packs."""

from __future__ import annotations

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Pack,
    Unpack,
    busy_fraction,
    check_decisions,
    cluster_view_from_dicts,
    cluster_view_to_dict,
    make_policy,
)

R, Q, S, P = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED, JobPhase.PACKED
DEV = (DeviceView("n0g0", "n0"),)


def test_busy_fraction_falls_back_to_the_request() -> None:
    assert JobView(id="a", devices_wanted=1).utilization is None  # backward compatible default
    assert busy_fraction(JobView(id="a", devices_wanted=1)) == 1.0
    assert busy_fraction(JobView(id="a", devices_wanted=1, gpu_share=0.3)) == 0.3
    assert busy_fraction(JobView(id="a", devices_wanted=1, utilization=0.45)) == 0.45
    assert busy_fraction(JobView(id="a", devices_wanted=1, gpu_share=0.5, utilization=0.2)) == 0.2


def test_utilization_round_trips_through_dicts() -> None:
    view = ClusterView(10.0, DEV, (JobView(id="a", devices_wanted=1, utilization=0.5),))
    d = cluster_view_to_dict(view)
    assert d["jobs"][0]["utilization"] == 0.5
    assert cluster_view_from_dicts(d["now"], d["devices"], d["jobs"]) == view


def _waiting_full_job(utilization: float | None) -> ClusterView:
    return ClusterView(
        now=1000.0,
        devices=DEV,
        jobs=(
            # a full-device job observed to keep half its device busy, mid-quantum
            JobView(
                id="a", devices_wanted=1, state=R, devices=("n0g0",), utilization=0.5, last_change_at=990
            ),
            JobView(
                id="b",
                devices_wanted=1,
                state=S,
                utilization=utilization,
                last_change_at=0,
                attained_service_s=100,
                submitted_at=1,
            ),
        ),
    )


def test_full_device_jobs_pack_when_observed_busy_fractions_fit() -> None:
    view = _waiting_full_job(0.4)
    out = make_policy("gandiva").decide(view)
    assert out == [Pack("b", ("n0g0",), ("a",), out[0].reason)]
    assert check_decisions(view, out) == []
    # too busy together: no pack (and a's quantum is not over: no time-slice either)
    assert make_policy("gandiva").decide(_waiting_full_job(0.6)) == []
    # unknown busy fraction: a full-device request is taken to fill its device
    assert make_policy("gandiva").decide(_waiting_full_job(None)) == []
    assert make_policy("gandiva", enable_packing=False).decide(_waiting_full_job(0.4)) == []


def _packed(ms_a: float, ms_b: float) -> ClusterView:
    def j(jid: str, ms: float, other: str) -> JobView:
        return JobView(
            id=jid,
            devices_wanted=1,
            state=P,
            devices=("n0g0",),
            utilization=0.5,
            minibatch_ms=ms,
            minibatch_ms_alone=100.0,
            packed_with=(other,),
            last_change_at=10,
        )

    return ClusterView(now=500.0, devices=DEV, jobs=(j("a", ms_a, "b"), j("b", ms_b, "a")))


def test_pack_of_full_jobs_kept_while_it_beats_time_slicing() -> None:
    # 100/105 + 100/110 = 1.86 devices' worth of progress > 1: keep
    assert make_policy("gandiva").decide(_packed(105.0, 110.0)) == []


def test_pack_of_full_jobs_undone_when_it_loses_to_time_slicing() -> None:
    # 100/300 + 100/250 = 0.73 < 1: time-slicing would do better; the slower one leaves
    view = _packed(300.0, 250.0)
    out = make_policy("gandiva").decide(view)
    assert [(type(d), d.job_id) for d in out] == [(Unpack, "a")]
    assert check_decisions(view, out) == []


def _arrival(state: JobPhase = Q, utilization: float | None = None) -> ClusterView:
    """A never-profiled full-device arrival, no free device, the holder half busy and
    mid-quantum (so no time-slice either)."""
    return ClusterView(
        now=1000.0,
        devices=DEV,
        jobs=(
            JobView(
                id="a", devices_wanted=1, state=R, devices=("n0g0",), utilization=0.5, last_change_at=990
            ),
            JobView(id="b", devices_wanted=1, state=state, utilization=utilization, submitted_at=999),
        ),
    )


def test_pack_unprofiled_tries_a_never_profiled_job_for_introspection_to_judge() -> None:
    # without trial packs (the default before session 3's follow-up) a job never profiled
    # is taken to fill its device, so it waits
    assert make_policy("gandiva", pack_unprofiled=False).decide(_arrival()) == []
    trial = make_policy("gandiva")  # trial packs are the default
    out = trial.decide(_arrival())
    assert out == [Pack("b", ("n0g0",), ("a",), out[0].reason)] and "trial" in out[0].reason
    assert check_decisions(_arrival(), out) == []
    # a job already profiled as filling its device, or one that has run before, is not tried
    assert trial.decide(_arrival(utilization=1.0)) == []
    assert trial.decide(_arrival(state=S)) == []
    # the trial is judged like any pack: undone when packed progress is below time-slicing
    packed = ClusterView(
        now=1100.0,
        devices=DEV,
        jobs=tuple(
            JobView(
                id=i,
                devices_wanted=1,
                state=P,
                devices=("n0g0",),
                utilization=0.5,
                minibatch_ms=200.0,
                minibatch_ms_alone=100.0 if i == "a" else 90.0,
                packed_with=("b",) if i == "a" else ("a",),
                last_change_at=1000.0,
            )
            for i in ("a", "b")
        ),
    )
    assert [type(d) for d in trial.decide(packed)] == [Unpack]
