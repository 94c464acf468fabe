"""gandiva time-slices packs (session 3): a device shared by packed jobs is one time-slice
participant, so a waiting job gets a device within a bounded time even when every device
holds a pack (before, packed jobs held their device until introspection undid the pack,
and arrivals starved)."""

from __future__ import annotations

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Pack,
    Resume,
    Suspend,
    check_decisions,
    make_policy,
)
from microco.services.scheduler.sim import ClusterSpec, PerfModel, TraceJob, default_traces_dir, simulate

R, Q, S, P = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED, JobPhase.PACKED
DEVS = (DeviceView("n0g0", "n0"), DeviceView("n0g1", "n0"))


def _all_packed(now: float, waiter: JobView) -> ClusterView:
    """Two devices, each shared by a kept pack (packed progress 2 x 100/110 > 1); the newest
    member of each pack changed at t=100, so the packs' quantum (60 s) ends at t=160."""

    def m(jid: str, dev: str, other: str, service: float, changed: float) -> JobView:
        return JobView(
            id=jid,
            devices_wanted=1,
            state=P,
            devices=(dev,),
            utilization=0.5,
            minibatch_ms=110.0,
            minibatch_ms_alone=100.0,
            packed_with=(other,),
            attained_service_s=service,
            last_change_at=changed,
        )

    return ClusterView(
        now=now,
        devices=DEVS,
        jobs=(
            m("a", "n0g0", "b", 500.0, 0.0),
            m("b", "n0g0", "a", 90.0, 100.0),
            m("c", "n0g1", "d", 300.0, 0.0),
            m("d", "n0g1", "c", 90.0, 100.0),
            waiter,
        ),
    )


def test_waiting_job_swaps_in_for_the_most_served_pack_member() -> None:
    # w was time-sliced out after running alone (observed = alone): no pack cooldown
    w = JobView(
        id="w",
        devices_wanted=1,
        state=S,
        utilization=0.4,
        submitted_at=150.0,
        attained_service_s=10.0,
        minibatch_ms=100.0,
        minibatch_ms_alone=100.0,
    )
    view = _all_packed(200.0, w)
    out = make_policy("gandiva").decide(view)
    # a (500 s of service) yields; w shares n0g0 with b (busy 0.5 + 0.4 fits one device)
    assert [(type(d), d.job_id) for d in out] == [(Suspend, "a"), (Pack, "w")]
    assert out[1].devices == ("n0g0",) and out[1].with_jobs == ("b",)
    assert check_decisions(view, out) == []


def test_whole_pack_yields_to_a_job_that_cannot_share() -> None:
    # w keeps a device busy alone: no pack fits it, so the pack whose members have had
    # the most service gives up its device, like one time-sliced job
    w = JobView(
        id="w", devices_wanted=1, state=S, utilization=1.0, submitted_at=150.0, attained_service_s=10.0
    )
    view = _all_packed(200.0, w)
    out = make_policy("gandiva").decide(view)
    assert {(type(d), d.job_id) for d in out[:2]} == {(Suspend, "a"), (Suspend, "b")}
    assert out[2] == Resume("w", ("n0g0",), out[2].reason)
    assert check_decisions(view, out) == []


def test_trial_arrival_swaps_in_and_pack_quantum_counts_from_its_newest_member() -> None:
    w = JobView(id="w", devices_wanted=1, state=Q, submitted_at=150.0)
    trial = make_policy("gandiva", pack_unprofiled=True)
    # before the packs' quantum is over (newest member changed at 100): nobody yields...
    early = _all_packed(50.0, w)  # a changed at 0: its own quantum would end at 60
    assert trial.decide(early) == []
    # ...and the policy asks to be woken when it is
    assert abs(trial.wakeup_at(early) - 160.0) < 1e-3
    view = _all_packed(160.0, w)
    out = trial.decide(view)
    assert [(type(d), d.job_id) for d in out] == [(Suspend, "a"), (Pack, "w")]
    assert "time-slice" in out[1].reason
    assert check_decisions(view, out) == []
    # the old behaviour (packs never time-sliced) leaves the arrival waiting
    assert make_policy("gandiva", pack_unprofiled=True, slice_packs=False).decide(view) == []
    assert make_policy("gandiva", enable_time_slicing=False).decide(view) == []


def test_pack_members_yield_only_to_less_served_or_higher_priority_jobs() -> None:
    w = JobView(
        id="w",
        devices_wanted=1,
        state=S,
        utilization=0.4,
        attained_service_s=1000.0,
        minibatch_ms=100.0,
        minibatch_ms_alone=100.0,
    )
    assert make_policy("gandiva").decide(_all_packed(200.0, w)) == []
    hi = JobView(**{**w.__dict__, "priority": 1})
    out = make_policy("gandiva").decide(_all_packed(200.0, hi))
    assert [type(d) for d in out] == [Suspend, Pack]


def test_job_time_sliced_out_of_a_kept_pack_may_pack_again_at_once() -> None:
    # a ran at 100/110 of its speed alone in its pack: not the loser of a bad pack
    # (that one runs below half its speed), so no pack cooldown
    one = (DeviceView("n0g0", "n0"),)
    holder = JobView(
        id="h", devices_wanted=1, state=R, devices=("n0g0",), utilization=0.4, last_change_at=190
    )
    a = JobView(
        id="a",
        devices_wanted=1,
        state=S,
        utilization=0.5,
        minibatch_ms=110.0,
        minibatch_ms_alone=100.0,
        last_change_at=200.0,
        attained_service_s=500.0,
    )
    out = make_policy("gandiva").decide(ClusterView(210.0, one, (holder, a)))
    assert [type(d) for d in out] == [Pack]
    slow = JobView(**{**a.__dict__, "minibatch_ms": 250.0})  # below half speed: cooling
    assert make_policy("gandiva").decide(ClusterView(210.0, one, (holder, slow))) == []


def _perf() -> PerfModel:
    p = default_traces_dir() / "gavel_throughputs.json"
    return PerfModel.from_gavel(p) if p.exists() else PerfModel.uniform()


def test_arrival_gets_a_device_within_a_quantum_while_every_device_holds_a_pack() -> None:
    """Simulator, 2 devices: four long half-device jobs pack two by two; then jobs arrive
    that fill a device (cannot pack) or that could share one. Each starts within one
    quantum plus the switch costs, where before it waited for a long job to end."""
    model = "ResNet-18 (batch size 64)"
    trace = [
        TraceJob(
            job_id=f"long{i}",
            submit_time=float(i),
            devices=1,
            duration_s=50_000.0,
            model=model,
            gpu_share=0.5,
        )
        for i in range(4)
    ] + [
        TraceJob(job_id="full", submit_time=1_000.0, devices=1, duration_s=300.0, model=model, gpu_share=1.0),
        TraceJob(job_id="half", submit_time=2_000.0, devices=1, duration_s=300.0, model=model, gpu_share=0.5),
    ]
    cluster = ClusterSpec(nodes=1, devices_per_node=2)
    bound = 60.0 + 30.0  # quantum + generous switch costs (session-1 profile: <= 11 s a switch)
    res = simulate(make_policy("gandiva"), trace, cluster, perf=_perf(), check_invariants=True)
    assert res.packs >= 2
    for jid in ("full", "half"):
        rec = res.per_job[jid]
        assert rec["first_feedback"] is not None and rec["first_feedback"] - rec["submit"] <= bound, (
            jid,
            rec,
        )
        assert rec["finished"] is not None
    old = simulate(make_policy("gandiva", slice_packs=False), trace, cluster, perf=_perf())
    assert old.per_job["full"]["first_feedback"] - 1_000.0 > bound  # what the change fixes
