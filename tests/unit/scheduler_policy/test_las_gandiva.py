"""``las`` and ``gandiva`` decisions on small hand-built views."""

from __future__ import annotations

import dataclasses
import random

import pytest

from microco.services.scheduler.policy import (
    ClusterView,
    DeviceView,
    JobPhase,
    JobView,
    Migrate,
    Pack,
    PolicyError,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
    check_decisions,
    make_policy,
    packed_progress,
)

R, Q, S, P = JobPhase.RUNNING, JobPhase.QUEUED, JobPhase.SUSPENDED, JobPhase.PACKED


def devices(nodes: int, per_node: int) -> tuple[DeviceView, ...]:
    return tuple(DeviceView(f"n{n}g{g}", f"n{n}") for n in range(nodes) for g in range(per_node))


def job(jid: str, k: int = 1, t: float = 0.0, **kw) -> JobView:
    return JobView(id=jid, devices_wanted=k, submitted_at=t, **kw)


def kinds(ds) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.job_id) for d in ds]


# ------------------------------------------------------------------------------- las
def test_las_preempts_most_attained_for_new_job() -> None:
    view = ClusterView(
        now=1000.0,
        devices=devices(1, 2),
        jobs=(
            job("old", state=R, devices=("n0g0",), attained_service_s=50_000, last_change_at=0),
            job("mid", state=R, devices=("n0g1",), attained_service_s=100, last_change_at=0),
            job("new", t=999),
        ),
    )
    out = make_policy("las").decide(view)
    assert kinds(out) == [("Suspend", "old"), ("Start", "new")]
    assert out[1].devices == ("n0g0",)
    assert check_decisions(view, out) == []


def test_las_respects_min_run_and_same_queue_fifo() -> None:
    base = {"state": R, "devices": ("n0g0",), "attained_service_s": 50_000}
    fresh = ClusterView(
        now=10.0, devices=devices(1, 1), jobs=(job("old", last_change_at=0, **base), job("new", t=9))
    )
    assert make_policy("las").decide(fresh) == []  # ran < min_run_s
    same_q = ClusterView(
        now=1000.0,
        devices=devices(1, 1),
        jobs=(job("a", state=R, devices=("n0g0",), attained_service_s=10), job("b", t=5)),
    )
    assert make_policy("las").decide(same_q) == []  # same queue: first come first served


def test_las_does_not_preempt_when_it_cannot_place() -> None:
    view = ClusterView(
        now=1000.0,
        devices=devices(1, 2),
        jobs=(
            job("old", state=R, devices=("n0g0",), attained_service_s=50_000),
            job("keep", state=R, devices=("n0g1",), attained_service_s=0, t=-1),
            job("big", k=2, t=999, attained_service_s=100),
        ),
    )
    # big (queue 0) ranks after keep (queue 0, earlier), so only one device is reclaimable
    assert make_policy("las").decide(view) == []


def test_las_config_validation() -> None:
    with pytest.raises(PolicyError):
        make_policy("las", thresholds_s=(10.0, 1.0))


# --------------------------------------------------------------------------- gandiva
def test_gandiva_time_slices_after_quantum() -> None:
    jobs = (
        job("a", state=R, devices=("n0g0",), attained_service_s=120, last_change_at=0),
        job("b", state=S, attained_service_s=60, last_change_at=0, t=1),
    )
    early = ClusterView(now=30.0, devices=devices(1, 1), jobs=jobs)
    assert make_policy("gandiva", quantum_s=60).decide(early) == []
    late = ClusterView(now=61.0, devices=devices(1, 1), jobs=jobs)
    out = make_policy("gandiva", quantum_s=60).decide(late)
    assert kinds(out) == [("Suspend", "a"), ("Resume", "b")]
    assert make_policy("gandiva", enable_time_slicing=False).decide(late) == []


def test_gandiva_round_robin_order_ignores_attained_service() -> None:
    jobs = (
        job("a", state=R, devices=("n0g0",), attained_service_s=10, last_change_at=0),
        job("b", state=S, attained_service_s=600, last_change_at=0, t=1),
    )
    late = ClusterView(now=61.0, devices=devices(1, 1), jobs=jobs)
    assert make_policy("gandiva").decide(late) == []  # las order: b has had more
    out = make_policy("gandiva", slice_order="round_robin").decide(late)
    assert kinds(out) == [("Suspend", "a"), ("Resume", "b")]


def test_gandiva_packs_complementary_jobs_and_judges_them() -> None:
    jobs = (
        job("a", state=R, devices=("n0g0",), gpu_share=0.4, last_change_at=0),
        job("b", t=1, gpu_share=0.5),
        job("c", t=2, gpu_share=0.9),
    )
    view = ClusterView(now=5.0, devices=devices(1, 1), jobs=jobs)
    out = make_policy("gandiva").decide(view)
    assert out == [Pack("b", ("n0g0",), ("a",), out[0].reason)]
    assert check_decisions(view, out) == []
    assert make_policy("gandiva", enable_packing=False, enable_time_slicing=False).decide(view) == []

    good = ClusterView(
        now=100.0,
        devices=devices(1, 1),
        jobs=(
            job(
                "a", state=P, devices=("n0g0",), minibatch_ms=120, minibatch_ms_alone=100, packed_with=("b",)
            ),
            job(
                "b", state=P, devices=("n0g0",), minibatch_ms=110, minibatch_ms_alone=100, packed_with=("a",)
            ),
        ),
    )
    assert packed_progress(list(good.jobs)) == pytest.approx(100 / 120 + 100 / 110)
    assert make_policy("gandiva").decide(good) == []
    bad = ClusterView(
        now=100.0,
        devices=devices(1, 2),
        jobs=(
            job("a", state=P, devices=("n0g0",), minibatch_ms=250, minibatch_ms_alone=100, last_change_at=1),
            job("b", state=P, devices=("n0g0",), minibatch_ms=180, minibatch_ms_alone=100, last_change_at=2),
            job("x", state=R, devices=("n0g1",), last_change_at=99),
        ),
    )
    assert kinds(make_policy("gandiva").decide(bad)) == [("Unpack", "a")]
    # with a free device the loser migrates away instead of stopping
    roomy = ClusterView(now=100.0, devices=devices(1, 2), jobs=bad.jobs[:2])
    (m,) = make_policy("gandiva").decide(roomy)
    assert isinstance(m, Migrate) and m.job_id == "a" and m.devices == ("n0g1",)
    (u,) = make_policy("gandiva", enable_migration=False).decide(roomy)
    assert isinstance(u, Unpack)


def test_gandiva_does_not_repack_during_cooldown() -> None:
    jobs = (
        job("a", state=R, devices=("n0g0",), gpu_share=0.4, last_change_at=0),
        job("b", state=S, gpu_share=0.4, last_change_at=90, attained_service_s=10**6),
    )
    assert make_policy("gandiva", pack_cooldown_s=600).decide(ClusterView(100.0, devices(1, 1), jobs)) == []
    out = make_policy("gandiva", pack_cooldown_s=600).decide(ClusterView(700.0, devices(1, 1), jobs))
    assert kinds(out) == [("Pack", "b")]


def test_gandiva_consolidates_and_defragments() -> None:
    spread = ClusterView(
        now=10.0,
        devices=devices(2, 2),
        jobs=(job("m", k=2, state=R, devices=("n0g0", "n1g0")),),
    )
    (m,) = make_policy("gandiva").decide(spread)
    assert isinstance(m, Migrate) and len({d[:2] for d in m.devices}) == 1
    assert make_policy("gandiva", enable_migration=False).decide(spread) == []

    frag = ClusterView(
        now=10.0,
        devices=devices(2, 2),
        jobs=(
            job("x", state=R, devices=("n0g0",), last_change_at=9),
            job("y", state=R, devices=("n1g0",), last_change_at=9),
            job("big", k=2, t=5),
        ),
    )
    out = make_policy("gandiva").decide(frag)
    assert kinds(out)[-1] == ("Start", "big")
    assert isinstance(out[0], Migrate)
    assert len({d[:2] for d in out[-1].devices}) == 1
    assert check_decisions(frag, out) == []


def test_gandiva_grow_and_shrink() -> None:
    idle = ClusterView(
        now=100.0,
        devices=devices(1, 4),
        jobs=(
            job(
                "e",
                state=R,
                elastic=True,
                devices=("n0g0",),
                last_change_at=0,
                minibatch_ms=10.0,
                minibatch_ms_settled=10.0,
            ),
        ),
    )
    (g,) = make_policy("gandiva").decide(idle)
    assert isinstance(g, Resize) and len(g.devices) == 2
    assert make_policy("gandiva", enable_grow_shrink=False).decide(idle) == []
    busy = ClusterView(
        now=100.0,
        devices=devices(1, 2),
        jobs=(
            job("e", state=R, elastic=True, devices=("n0g0", "n0g1"), last_change_at=99),
            job("w", t=50),
        ),
    )
    out = make_policy("gandiva").decide(busy)
    assert kinds(out) == [("Resize", "e"), ("Start", "w")]
    assert out[0].devices == ("n0g0",) and out[1].devices == ("n0g1",)
    assert check_decisions(busy, out) == []


@pytest.mark.parametrize("name", ["fifo", "las", "gandiva"])
def test_random_views_give_applicable_deterministic_decisions(name: str) -> None:
    rng = random.Random(7)
    devs = devices(3, 4)
    ids = [d.id for d in devs]
    for trial in range(60):
        free = ids[:]
        rng.shuffle(free)
        jobs = []
        for i in range(rng.randint(1, 14)):
            k = rng.choice([1, 1, 1, 2, 4])
            st = rng.choice([Q, S, R])
            if st is R and len(free) >= k:
                ds, free = tuple(free[:k]), free[k:]
            else:
                st, ds = rng.choice([Q, S]), ()
            jobs.append(
                job(
                    f"j{i}",
                    k=k,
                    t=rng.uniform(0, 100),
                    state=st,
                    devices=ds,
                    attained_service_s=rng.choice([0, 10, 5000, 50000]),
                    last_change_at=rng.uniform(0, 100),
                    gpu_share=rng.choice([0.3, 0.5, 1.0]),
                    elastic=rng.random() < 0.2,
                )
            )
        view = ClusterView(now=200.0, devices=devs, jobs=tuple(jobs))
        a = make_policy(name).decide(view)
        assert check_decisions(view, a) == [], (trial, a)
        assert make_policy(name).decide(view) == a
        assert all(isinstance(d, (Start, Resume, Suspend, Pack, Unpack, Migrate, Resize)) for d in a)


def test_wakeup_at_points_to_the_next_clock_driven_change() -> None:
    jobs = (
        job("a", state=R, devices=("n0g0",), attained_service_s=500, last_change_at=0),
        job("b", state=S, attained_service_s=100, last_change_at=0, t=1),
    )
    g = make_policy("gandiva", quantum_s=60, enable_packing=False)
    assert g.wakeup_at(ClusterView(30.0, devices(1, 1), jobs)) == 60.0  # a's quantum ends
    assert g.wakeup_at(ClusterView(61.0, devices(1, 1), jobs)) is None  # due now: events/decide act
    # a has had less service than b: wake when it overtakes b (100 - 20 device-seconds away)
    behind = (dataclasses.replace(jobs[0], attained_service_s=20.0), jobs[1])
    assert g.wakeup_at(ClusterView(70.0, devices(1, 1), behind)) == pytest.approx(150.0, abs=1e-3)
    assert g.wakeup_at(ClusterView(30.0, devices(1, 1), jobs[:1])) is None  # nobody waits
    las = make_policy("las", thresholds_s=(1000.0,), min_run_s=60)
    assert las.wakeup_at(ClusterView(30.0, devices(1, 1), jobs)) == 60.0
    assert las.wakeup_at(ClusterView(100.0, devices(1, 1), jobs)) == pytest.approx(600.0, abs=1e-3)
    assert make_policy("fifo").time_driven is False


def test_gandiva_priorities_are_strict_classes() -> None:
    # 'fin' (priority 1) has had more service than 'fresh' yet takes its device once the
    # quantum is over; a priority-0 newcomer never takes a priority-1 job's device.
    def view(now: float, waiting: JobView, runner: JobView) -> ClusterView:
        return ClusterView(now=now, devices=devices(1, 1), jobs=(runner, waiting))

    fresh = job("fresh", state=R, devices=("n0g0",), attained_service_s=10, last_change_at=0)
    fin = job("fin", state=S, priority=1, attained_service_s=5_000, last_change_at=0)
    g = make_policy("gandiva")
    assert g.decide(view(30.0, fin, fresh)) == []  # quantum (60 s) not over
    assert g.wakeup_at(view(30.0, fin, fresh)) == pytest.approx(60.0)
    out = g.decide(view(100.0, fin, fresh))
    assert kinds(out) == [("Suspend", "fresh"), ("Resume", "fin")]
    running_fin = job("fin", state=R, priority=1, devices=("n0g0",), attained_service_s=5_000)
    newcomer = job("new", t=50.0)
    assert g.decide(view(10_000.0, newcomer, running_fin)) == []
    assert g.wakeup_at(view(10_000.0, newcomer, running_fin)) is None  # nothing to wait for
    rr = make_policy("gandiva", slice_order="round_robin")
    assert rr.decide(view(10_000.0, newcomer, running_fin)) == []
    assert kinds(rr.decide(view(100.0, fin, fresh))) == [("Suspend", "fresh"), ("Resume", "fin")]


def test_gandiva_cooldown_spares_jobs_time_sliced_out_while_alone() -> None:
    # b last ran alone (observed == alone): it was time-sliced, not unpacked; it may pack now
    alone = (
        job("a", state=R, devices=("n0g0",), gpu_share=0.4, last_change_at=0),
        job(
            "b",
            state=S,
            gpu_share=0.4,
            last_change_at=90,
            attained_service_s=10**6,
            minibatch_ms=100.0,
            minibatch_ms_alone=100.0,
        ),
    )
    out = make_policy("gandiva", pack_cooldown_s=600).decide(ClusterView(100.0, devices(1, 1), alone))
    assert kinds(out) == [("Pack", "b")]
    # b last ran slowed down (it left an interfering pack): it waits out the cooldown
    slowed = (alone[0], dataclasses.replace(alone[1], minibatch_ms=250.0))
    assert make_policy("gandiva", pack_cooldown_s=600).decide(ClusterView(100.0, devices(1, 1), slowed)) == []
    out = make_policy("gandiva", pack_cooldown_s=600).decide(ClusterView(700.0, devices(1, 1), slowed))
    assert kinds(out) == [("Pack", "b")]


def test_gandiva_quantum_end_survives_float_rounding() -> None:
    # last_change_at + quantum_s lands a hair above the clock of the wake-up booked for it:
    # the quantum must count as over, or the mechanism sleeps past it (a missed wake-up)
    last = 2018.9999999999993
    now = 2078.999999999999
    assert now - last < 60.0  # the rounding this guards against
    view = ClusterView(
        now=now,
        devices=devices(1, 1),
        jobs=(
            job("r", state=R, devices=("n0g0",), attained_service_s=135, last_change_at=last),
            job("w", state=S, attained_service_s=130, last_change_at=1000, t=1),
        ),
    )
    assert kinds(make_policy("gandiva").decide(view)) == [("Suspend", "r"), ("Resume", "w")]
