"""A job that runs without the scheduler's hook (``preemptible=False``) cannot be suspended,
moved or resized at a mini-batch boundary: no policy tries to (time-slicing, LAS
preemption, defragmentation, grow)."""

from __future__ import annotations

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Resize,
    Start,
    Suspend,
    check_decisions,
    make_policy,
)

R, Q = JobPhase.RUNNING, JobPhase.QUEUED
ONE = (DeviceView("n0/0", "n0"),)


def view(preemptible: bool, devices=ONE, **running) -> ClusterView:
    holder = JobView(
        id="a",
        devices_wanted=1,
        state=R,
        devices=("n0/0",),
        last_change_at=0.0,
        attained_service_s=500.0,
        preemptible=preemptible,
        **running,
    )
    waiter = JobView(id="b", devices_wanted=1, state=Q, submitted_at=10.0)
    return ClusterView(now=1000.0, devices=devices, jobs=(holder, waiter))


def test_gandiva_time_slices_a_hooked_job_but_not_one_without_the_hook():
    p = make_policy("gandiva", quantum_s=1.0, enable_packing=False)
    out = p.decide(view(True))
    check_decisions(view(True), out)
    assert any(isinstance(d, Suspend) and d.job_id == "a" for d in out)
    assert p.decide(view(False)) == []


def test_las_does_not_preempt_a_job_without_the_hook():
    p = make_policy("las", thresholds_s=(100.0,))
    assert any(isinstance(d, Suspend) for d in p.decide(view(True)))
    assert not any(isinstance(d, Suspend | Start) for d in p.decide(view(False)))


def test_gandiva_does_not_grow_a_job_without_the_hook():
    devs = (DeviceView("n0/0", "n0"), DeviceView("n0/1", "n0"))
    p = make_policy("gandiva", quantum_s=1.0, enable_packing=False)

    def alone(pre):
        return ClusterView(
            now=1000.0,
            devices=devs,
            jobs=(
                JobView(
                    id="a",
                    devices_wanted=1,
                    elastic=True,
                    state=R,
                    devices=("n0/0",),
                    preemptible=pre,
                    minibatch_ms=10.0,
                    minibatch_ms_settled=10.0,
                ),
            ),
        )

    assert any(isinstance(d, Resize) for d in p.decide(alone(True)))
    assert p.decide(alone(False)) == []
