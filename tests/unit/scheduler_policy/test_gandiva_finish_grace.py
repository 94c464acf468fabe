"""gandiva's ``finish_grace_s``: a running job about to finish (its steps to go at its observed
mini-batch time) is not time-sliced out; suspending it would add a suspend/resume round trip
to its completion to free a device that is about to be free anyway."""

from __future__ import annotations

import pytest

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Start,
    Suspend,
    check_decisions,
    make_policy,
)

ONE = (DeviceView("n0g0", "n0"),)


def _holder_and_newcomer(steps_done: int, total_steps: int | None, minibatch_ms: float | None) -> ClusterView:
    """One device held past its quantum by a job with ``total_steps - steps_done`` to go, and a
    newcomer with no service."""
    holder = JobView(
        id="old",
        devices_wanted=1,
        state=JobPhase.RUNNING,
        devices=("n0g0",),
        attained_service_s=500.0,
        last_change_at=0.0,
        minibatch_ms=minibatch_ms,
        minibatch_ms_alone=minibatch_ms,
        steps_done=steps_done,
        total_steps=total_steps,
        utilization=1.0,
    )
    newcomer = JobView(id="new", devices_wanted=1, submitted_at=990.0, last_change_at=990.0)
    return ClusterView(now=1000.0, devices=ONE, jobs=(holder, newcomer))


def _sliced(view: ClusterView, **opts: float) -> bool:
    out = make_policy("gandiva", **opts).decide(view)
    assert check_decisions(view, out) == []
    if not out:
        return False
    assert [type(d) for d in out] == [Suspend, Start] and out[0].job_id == "old"
    return True


def test_a_job_about_to_finish_keeps_its_device() -> None:
    view = _holder_and_newcomer(steps_done=9_800, total_steps=10_000, minibatch_ms=100.0)  # 20 s to go
    assert not _sliced(view, finish_grace_s=60.0)
    assert _sliced(view)  # off by default: the newcomer's first feedback comes first


@pytest.mark.parametrize(
    "steps_done,total_steps,minibatch_ms",
    [
        (9_000, 10_000, 100.0),  # 100 s to go: more than the grace
        (9_800, None, 100.0),  # no known total: no estimate
        (9_800, 10_000, None),  # no observed pace yet
    ],
)
def test_grace_needs_a_known_short_remainder(
    steps_done: int, total_steps: int | None, minibatch_ms: float | None
) -> None:
    assert _sliced(_holder_and_newcomer(steps_done, total_steps, minibatch_ms), finish_grace_s=60.0)


def test_grace_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="finish_grace_s"):
        make_policy("gandiva", finish_grace_s=-1.0)
