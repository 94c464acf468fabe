"""gandiva (session 7): a measured, kept pack takes more members while their busy
fractions fit one device (up to ``max_jobs_per_device``), and a multi-device job goes on
one node (spread only with ``allow_spread`` or when no node could ever hold it)."""

from __future__ import annotations

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Pack,
    Resume,
    Start,
    Suspend,
    check_decisions,
    make_policy,
)

R, Q, S, P = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED, JobPhase.PACKED
ONE = (DeviceView("n0g0", "n0"),)


def _pair_and_waiter(*, measured: bool = True, waiter_busy: float = 0.3) -> ClusterView:
    """Two fractional jobs packed on one device (busy 0.25 each; mini-batch times measured
    or not, mid-quantum) and a suspended one-device job of busy ``waiter_busy``."""
    ms = {"minibatch_ms": 105.0, "minibatch_ms_alone": 100.0} if measured else {}

    def member(jid: str) -> JobView:
        return JobView(
            id=jid,
            devices_wanted=1,
            state=P,
            devices=("n0g0",),
            gpu_share=0.5,
            utilization=0.25,
            last_change_at=990.0,
            attained_service_s=50.0,
            **ms,
        )

    waiter = JobView(
        id="c",
        devices_wanted=1,
        state=S,
        gpu_share=0.5,
        utilization=waiter_busy,
        last_change_at=0.0,
        attained_service_s=10.0,
        minibatch_ms=100.0,
        minibatch_ms_alone=100.0,
    )
    return ClusterView(now=1000.0, devices=ONE, jobs=(member("a"), member("b"), waiter))


def test_a_kept_pack_takes_a_third_job_whose_busy_fraction_fits() -> None:
    view = _pair_and_waiter()
    out = make_policy("gandiva").decide(view)
    assert out == [Pack("c", ("n0g0",), ("a", "b"), out[0].reason)]
    assert check_decisions(view, out) == []


def test_a_pack_grows_only_within_the_share_rule_the_job_cap_and_once_measured() -> None:
    # 0.25 + 0.25 + 0.6 > 1: no room (and the pack's quantum is not over: nothing at all)
    assert make_policy("gandiva").decide(_pair_and_waiter(waiter_busy=0.6)) == []
    # pairs only, as before session 7
    assert make_policy("gandiva", max_jobs_per_device=2).decide(_pair_and_waiter()) == []
    # introspection has not judged the pair yet: it does not grow
    assert make_policy("gandiva").decide(_pair_and_waiter(measured=False)) == []


def _two_nodes_half_free() -> ClusterView:
    """Two nodes of two devices, one device free on each (its other device held by a
    one-device job whose quantum is over), and a 2-device job waiting."""
    devs = tuple(DeviceView(f"n{n}g{g}", f"n{n}") for n in range(2) for g in range(2))
    jobs = (
        JobView(
            id="a", devices_wanted=1, state=R, devices=("n0g0",), last_change_at=0.0, attained_service_s=900.0
        ),
        JobView(
            id="b", devices_wanted=1, state=R, devices=("n1g0",), last_change_at=0.0, attained_service_s=500.0
        ),
        JobView(id="w", devices_wanted=2, state=Q, submitted_at=990.0),
    )
    return ClusterView(now=1000.0, devices=devs, jobs=jobs)


def test_a_multi_device_job_takes_one_node_freed_by_time_slicing_rather_than_spreading() -> None:
    view = _two_nodes_half_free()
    out = make_policy("gandiva", enable_migration=False).decide(view)
    # the most-served job yields, and w gets that whole node
    assert out == [Suspend("a", out[0].reason), Start("w", ("n0g0", "n0g1"), out[1].reason)]
    assert check_decisions(view, out) == []
    # with allow_spread, the free devices are used across nodes at once (the behaviour
    # before session 7)
    out = make_policy("gandiva", enable_migration=False, allow_spread=True).decide(view)
    assert len(out) == 1 and isinstance(out[0], Start) and set(out[0].devices) == {"n0g1", "n1g1"}


def test_a_job_larger_than_every_node_is_spread() -> None:
    devs = tuple(DeviceView(f"n{n}g0", f"n{n}") for n in range(3))
    view = ClusterView(now=5.0, devices=devs, jobs=(JobView(id="w", devices_wanted=2, state=S),))
    out = make_policy("gandiva").decide(view)
    assert len(out) == 1 and isinstance(out[0], Resume) and len(set(out[0].devices)) == 2
