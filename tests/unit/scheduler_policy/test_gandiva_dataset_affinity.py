"""gandiva's dataset affinity (issue 21): jobs that read one dataset are time-sliced into the
same slices, a job of another dataset yields first, and packs form with a job of the same
dataset; bounded by the slack, and nothing changes for jobs whose dataset is unknown."""

from __future__ import annotations

import random

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
    check_decisions,
    cluster_view_from_dicts,
    make_policy,
)

R, Q, S = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED
DEVS = (DeviceView("g0", "n0"), DeviceView("g1", "n0"))
OFF = {"enable_packing": False, "enable_migration": False, "enable_grow_shrink": False}


def _decide(view: ClusterView, affinity: bool, **cfg: object) -> list:
    out = make_policy("gandiva", quantum_s=60.0, dataset_affinity=affinity, **{**OFF, **cfg}).decide(view)
    assert check_decisions(view, out) == []
    return out


def _kinds(out: list) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.job_id) for d in out]


def test_jobs_of_one_dataset_start_in_the_same_slice() -> None:
    jobs = tuple(
        JobView(id=i, devices_wanted=1, submitted_at=t, dataset=ds)
        for t, (i, ds) in enumerate((("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")))
    )
    view = ClusterView(now=0.0, devices=DEVS, jobs=jobs)
    assert _kinds(_decide(view, False)) == [("Start", "a1"), ("Start", "b1")]
    assert _kinds(_decide(view, True)) == [("Start", "a1"), ("Start", "a2")]


def _slice_view(b2_service: float) -> ClusterView:
    """b1 keeps its device (quantum not over); a1's quantum is over. Waiting: c (no service,
    its own dataset) and b2 (some service, b1's dataset)."""
    return ClusterView(
        now=200.0,
        devices=DEVS,
        jobs=(
            JobView(
                id="a1", devices_wanted=1, state=R, devices=("g0",), attained_service_s=150.0, dataset="a"
            ),
            JobView(
                id="b1",
                devices_wanted=1,
                state=R,
                devices=("g1",),
                attained_service_s=120.0,
                last_change_at=190.0,
                dataset="b",
            ),
            JobView(id="c", devices_wanted=1, state=Q, submitted_at=100.0, dataset="c"),
            JobView(id="b2", devices_wanted=1, state=S, attained_service_s=b2_service, dataset="b"),
        ),
    )


def test_a_waiting_job_of_a_running_jobs_dataset_takes_the_next_slice() -> None:
    view = _slice_view(b2_service=30.0)
    assert _kinds(_decide(view, False)) == [("Suspend", "a1"), ("Start", "c")]
    out = _decide(view, True)
    assert _kinds(out) == [("Suspend", "a1"), ("Resume", "b2")]
    assert isinstance(out[1], Resume) and out[1].devices == ("g0",)


def test_affinity_passes_a_job_only_within_the_slack() -> None:
    # b2 has 61 s more service than c: beyond one quantum (60 s) of slack, c goes first
    view = _slice_view(b2_service=61.0)
    assert _kinds(_decide(view, True)) == [("Suspend", "a1"), ("Start", "c")]
    # a wider slack lets it pass; none keeps Gandiva's order
    assert _kinds(_decide(view, True, affinity_slack_quanta=2.0)) == [("Suspend", "a1"), ("Resume", "b2")]
    assert _kinds(_decide(_slice_view(0.0), True, affinity_slack_quanta=0.0)) == [
        ("Suspend", "a1"),
        ("Resume", "b2"),  # a tie with c on service: the dataset decides
    ]
    assert _kinds(_decide(_slice_view(1.0), True, affinity_slack_quanta=0.0)) == [
        ("Suspend", "a1"),
        ("Start", "c"),
    ]


def test_a_job_of_another_dataset_yields_first() -> None:
    view = ClusterView(
        now=200.0,
        devices=DEVS,
        jobs=(
            JobView(
                id="a1", devices_wanted=1, state=R, devices=("g0",), attained_service_s=200.0, dataset="a"
            ),
            JobView(
                id="b1", devices_wanted=1, state=R, devices=("g1",), attained_service_s=150.0, dataset="b"
            ),
            JobView(id="a2", devices_wanted=1, state=S, attained_service_s=10.0, dataset="a"),
        ),
    )
    assert _kinds(_decide(view, False)) == [("Suspend", "a1"), ("Resume", "a2")]  # most served
    assert _kinds(_decide(view, True)) == [("Suspend", "b1"), ("Resume", "a2")]  # a2 joins a1


def test_slices_alternate_between_the_datasets() -> None:
    """Run the policy over views in turn, as a mechanism would: with affinity, every slice
    holds the two jobs of one dataset (from the start, whatever the arrival order)."""
    names = {"a1": "a", "b1": "b", "a2": "a", "b2": "b"}
    state = {j: {"state": Q, "devices": (), "service": 0.0, "changed": 0.0} for j in names}
    policy = make_policy("gandiva", quantum_s=60.0, dataset_affinity=True, **OFF)
    slices = []
    for now in range(0, 600, 20):
        for s in state.values():  # service accrues while running
            if s["state"] is R:
                s["service"] += 20.0
        view = ClusterView(
            now=float(now),
            devices=DEVS,
            jobs=tuple(
                JobView(
                    id=j,
                    devices_wanted=1,
                    submitted_at=float(i),
                    state=s["state"],
                    devices=s["devices"],
                    attained_service_s=s["service"],
                    last_change_at=s["changed"],
                    dataset=names[j],
                )
                for i, (j, s) in enumerate(state.items())
            ),
        )
        out = policy.decide(view)
        assert check_decisions(view, out) == []
        for d in out:
            s = state[d.job_id]
            if isinstance(d, Suspend):
                s.update(state=S, devices=(), changed=float(now))
            else:
                s.update(state=R, devices=d.devices, changed=float(now))
        running = sorted(j for j, s in state.items() if s["state"] is R)
        if out:
            slices.append(tuple(running))
    assert len(slices) >= 5
    assert all({names[j] for j in sl} in ({"a"}, {"b"}) for sl in slices), slices
    assert slices[0] == ("a1", "a2") and slices[1] == ("b1", "b2")


def test_a_waiting_job_packs_with_a_job_of_its_dataset() -> None:
    view = ClusterView(
        now=500.0,
        devices=DEVS,
        jobs=(
            JobView(id="a", devices_wanted=1, state=R, devices=("g0",), utilization=0.5, dataset="x"),
            JobView(id="b", devices_wanted=1, state=R, devices=("g1",), utilization=0.3, dataset="y"),
            JobView(id="w", devices_wanted=1, state=Q, utilization=0.4, dataset="y"),
        ),
    )
    pack = {"enable_packing": True, "pack_observe_s": 0.0}
    off = _decide(view, False, **pack)
    on = _decide(view, True, **pack)
    assert isinstance(off[0], Pack) and off[0].with_jobs == ("a",)  # the fullest device that fits
    assert isinstance(on[0], Pack) and on[0].with_jobs == ("b",) and on[0].devices == ("g1",)


def test_a_never_profiled_job_tries_a_pack_with_a_job_of_its_dataset() -> None:
    view = ClusterView(
        now=500.0,
        devices=DEVS,
        jobs=(
            JobView(id="a", devices_wanted=1, state=R, devices=("g0",), utilization=0.5, dataset="y"),
            JobView(id="b", devices_wanted=1, state=R, devices=("g1",), utilization=0.3, dataset="x"),
            JobView(id="w", devices_wanted=1, state=Q, dataset="y"),  # assumed to fill a device
        ),
    )
    pack = {"enable_packing": True, "pack_observe_s": 0.0}
    assert _decide(view, False, **pack)[0].with_jobs == ("b",)  # the emptiest
    assert _decide(view, True, **pack)[0].with_jobs == ("a",)


NODES2 = tuple(DeviceView(f"n{n}g{g}", f"n{n}") for n in range(2) for g in range(2))


def test_a_job_goes_to_the_node_where_its_dataset_is_read() -> None:
    """Each node has its own cache: a job joins the node where its dataset's jobs run."""
    view = ClusterView(
        now=10.0,
        devices=NODES2,
        jobs=(
            JobView(id="a1", devices_wanted=1, state=R, devices=("n0g0",), dataset="a"),
            JobView(id="b1", devices_wanted=1, state=R, devices=("n1g0",), dataset="b"),
            JobView(id="b2", devices_wanted=1, state=Q, dataset="b"),
        ),
    )
    assert _decide(view, False)[0].devices == ("n0g1",)  # best fit, ties on the node's name
    assert _decide(view, True)[0].devices == ("n1g1",)


def test_the_job_yielding_is_one_on_the_node_where_the_dataset_is_read() -> None:
    def r(jid: str, dev: str, ds: str, service: float, changed: float = 0.0) -> JobView:
        return JobView(
            id=jid,
            devices_wanted=1,
            state=R,
            devices=(dev,),
            attained_service_s=service,
            last_change_at=changed,
            dataset=ds,
        )

    view = ClusterView(
        now=200.0,
        devices=NODES2,
        jobs=(
            r("x", "n0g0", "a", 300.0),  # quantum over, most served
            r("y", "n0g1", "c", 100.0, changed=190.0),  # keeps its device
            r("z", "n1g0", "d", 200.0),  # quantum over, on the node where b is read
            r("b1", "n1g1", "b", 100.0, changed=190.0),  # keeps its device
            JobView(id="b2", devices_wanted=1, state=S, attained_service_s=10.0, dataset="b"),
        ),
    )
    assert _kinds(_decide(view, False)) == [("Suspend", "x"), ("Resume", "b2")]
    out = _decide(view, True)
    assert _kinds(out) == [("Suspend", "z"), ("Resume", "b2")] and out[1].devices == ("n1g0",)


def _random_view(rng: random.Random, datasets: bool) -> ClusterView:
    devs = [{"id": f"n{n}g{g}", "node": f"n{n}"} for n in range(2) for g in range(2)]
    jobs = []
    free = [d["id"] for d in devs]
    for i in range(rng.randint(2, 9)):
        k = rng.choice((1, 1, 1, 2))
        run = len(free) >= k and rng.random() < 0.5
        jobs.append(
            {
                "id": f"j{i}",
                "devices_wanted": k,
                "state": "running" if run else rng.choice(("queued", "suspended")),
                "devices": [free.pop() for _ in range(k)] if run else [],
                "attained_service_s": rng.choice((0.0, 30.0, 59.0, 90.0, 200.0)),
                "last_change_at": rng.choice((0.0, 100.0, 150.0)),
                "submitted_at": float(i),
                "priority": rng.choice((0, 0, 0, 1)),
                "utilization": rng.choice((None, 0.3, 0.6)),
                "dataset": rng.choice(("a", "b", "c")) if datasets else "",
            }
        )
    return cluster_view_from_dicts(200.0, devs, jobs)


def test_without_datasets_affinity_changes_nothing_and_its_decisions_always_apply() -> None:
    rng = random.Random(21)
    on = make_policy("gandiva", quantum_s=60.0, dataset_affinity=True)
    off = make_policy("gandiva", quantum_s=60.0)
    for _ in range(120):
        view = _random_view(rng, datasets=False)
        assert on.decide(view) == off.decide(view)
        view = _random_view(rng, datasets=True)
        assert check_decisions(view, on.decide(view)) == []


def test_options_are_checked_and_the_dataset_reaches_the_view() -> None:
    with pytest.raises(PolicyError):
        make_policy("gandiva", dataset_affinity="yes")
    with pytest.raises(PolicyError):
        make_policy("gandiva", affinity_slack_quanta=-1.0)
    assert make_policy("gandiva").config.dataset_affinity is False  # type: ignore[attr-defined]
    view = cluster_view_from_dicts(0.0, [], [{"id": "j", "devices_wanted": 1, "dataset": "imagenet"}])
    assert view.jobs[0].dataset == "imagenet"
    assert cluster_view_from_dicts(0.0, [], [{"id": "j", "devices_wanted": 1}]).jobs[0].dataset == ""
    assert isinstance(Start("j", ()), Start)
