"""The policy contract: registry, conversion helpers, decision checker, and ``fifo``."""

from __future__ import annotations

import pytest

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Pack,
    PolicyError,
    Resume,
    Start,
    Suspend,
    available_policies,
    check_decisions,
    cluster_view_from_dicts,
    cluster_view_to_dict,
    decision_from_dict,
    decision_to_dict,
    make_policy,
)


def devices(nodes: int, per_node: int) -> tuple[DeviceView, ...]:
    return tuple(
        DeviceView(id=f"n{n}g{g}", node=f"n{n}", kind="gpu", model="v100")
        for n in range(nodes)
        for g in range(per_node)
    )


def job(jid: str, k: int = 1, t: float = 0.0, **kw) -> JobView:
    return JobView(id=jid, devices_wanted=k, submitted_at=t, **kw)


def test_registry_lists_and_rejects() -> None:
    assert "fifo" in available_policies()
    p = make_policy("fifo")
    assert p.name == "fifo"
    with pytest.raises(PolicyError, match="unknown policy"):
        make_policy("nope")
    with pytest.raises(PolicyError, match="no option"):
        make_policy("fifo", quantum_s=3)


@pytest.mark.parametrize(
    "option,value,need",
    [
        ("quantum_s", "60", "a number"),
        ("quantum_s", True, "a number"),
        ("max_jobs_per_device", 2.5, "a whole number"),
        ("enable_packing", 1, "true or false"),
        ("slice_order", 3, "a string"),
    ],
)
def test_option_values_must_have_their_fields_type(option: str, value: object, need: str) -> None:
    # options arrive from JSON (the scheduler's --policy-config) and the command line
    with pytest.raises(PolicyError, match=f"option {option} of policy 'gandiva' must be {need}"):
        make_policy("gandiva", **{option: value})
    assert make_policy("gandiva", quantum_s=30).config.quantum_s == 30  # an int is a number


def test_fifo_starts_in_arrival_order_exclusive() -> None:
    view = ClusterView(
        now=10.0,
        devices=devices(1, 2),
        jobs=(job("b", t=2), job("a", t=1), job("c", t=3)),
    )
    out = make_policy("fifo").decide(view)
    assert [type(d) for d in out] == [Start, Start]
    assert [d.job_id for d in out] == ["a", "b"]
    assert len({d.devices[0] for d in out}) == 2
    assert check_decisions(view, out) == []


def test_fifo_never_preempts_and_keeps_running_jobs() -> None:
    view = ClusterView(
        now=10.0,
        devices=devices(1, 2),
        jobs=(
            job("a", t=5, state=JobPhase.RUNNING, devices=("n0g0",)),
            job("b", t=5, state=JobPhase.RUNNING, devices=("n0g1",)),
            job("c", t=0),
        ),
    )
    assert make_policy("fifo").decide(view) == []


def test_fifo_backfill_vs_strict() -> None:
    view = ClusterView(
        now=0.0,
        devices=devices(1, 4),
        jobs=(
            job("r", state=JobPhase.RUNNING, devices=("n0g0", "n0g1")),
            job("big", k=4, t=1),
            job("small", k=1, t=2),
        ),
    )
    assert [d.job_id for d in make_policy("fifo").decide(view)] == ["small"]
    assert make_policy("fifo", backfill=False).decide(view) == []


def test_fifo_consolidates_multi_device_job_on_one_node() -> None:
    view = ClusterView(
        now=0.0,
        devices=devices(2, 4),
        jobs=(
            job("r", k=1, state=JobPhase.RUNNING, devices=("n0g0",)),
            job("m", k=4, t=1),
        ),
    )
    (d,) = make_policy("fifo").decide(view)
    assert {x[:2] for x in d.devices} == {"n1"}


def test_fifo_resumes_suspended_jobs() -> None:
    view = ClusterView(now=0.0, devices=devices(1, 1), jobs=(job("s", state=JobPhase.SUSPENDED),))
    (d,) = make_policy("fifo").decide(view)
    assert isinstance(d, Resume)


def test_fifo_skips_jobs_larger_than_cluster() -> None:
    view = ClusterView(now=0.0, devices=devices(1, 2), jobs=(job("huge", k=3), job("x", t=1)))
    assert [d.job_id for d in make_policy("fifo").decide(view)] == ["x"]


def test_view_round_trip_and_job_order_independent() -> None:
    devs = [{"id": "g0", "node": "n0"}, {"id": "g1", "node": "n0", "model": "k80"}]
    jobs = [
        {"id": "b", "devices_wanted": 1, "state": "running", "devices": ["g0"], "extra": 1},
        {"id": "a", "devices_wanted": 1, "submitted_at": 3},
    ]
    v1 = cluster_view_from_dicts(5, devs, jobs)
    v2 = cluster_view_from_dicts(5, devs, list(reversed(jobs)))
    assert v1 == v2
    assert v1.jobs[1].state is JobPhase.RUNNING and v1.jobs[1].devices == ("g0",)
    d = cluster_view_to_dict(v1)
    assert cluster_view_from_dicts(d["now"], d["devices"], d["jobs"]) == v1
    with pytest.raises(PolicyError):
        cluster_view_from_dicts(0, devs, [{"id": "x"}])


def test_decision_round_trip() -> None:
    for dec in (Start("a", ("g0",), "r"), Suspend("b"), Pack("c", ("g1",), ("d",), "x")):
        assert decision_from_dict(decision_to_dict(dec)) == dec
    with pytest.raises(PolicyError):
        decision_from_dict({"kind": "explode", "job_id": "a"})


def test_check_decisions_catches_conflicts() -> None:
    view = ClusterView(
        now=0.0,
        devices=devices(1, 2),
        jobs=(job("r", state=JobPhase.RUNNING, devices=("n0g0",)), job("q"), job("q2")),
    )
    assert check_decisions(view, [Start("q", ("n0g0",))])  # held by r
    assert check_decisions(view, [Start("q", ("n0g1",)), Start("q2", ("n0g1",))])
    assert check_decisions(view, [Suspend("r"), Start("q", ("n0g0",))]) == []
    assert check_decisions(view, [Resume("q", ("n0g1",))])  # q is queued, not suspended
    assert check_decisions(view, [Pack("q", ("n0g0",), ("r",))]) == []
    assert check_decisions(view, [Start("ghost", ("n0g1",))])


def test_fifo_deterministic() -> None:
    jobs = tuple(job(f"j{i}", k=1 + i % 3, t=i % 5) for i in range(30))
    view = ClusterView(now=0.0, devices=devices(3, 4), jobs=jobs)
    a = make_policy("fifo").decide(view)
    b = make_policy("fifo").decide(ClusterView(now=0.0, devices=view.devices, jobs=tuple(reversed(jobs))))
    assert a == b
    assert check_decisions(view, a) == []
