"""The one decision check the live scheduler and the simulator share: every refusal code, and
that a refused decision changes nothing."""

from __future__ import annotations

import pytest

from microco.services.scheduler.policy import (
    JobFacts,
    JobPhase,
    Migrate,
    Pack,
    Refusal,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
    check,
)

DEVICES = {"n1/0", "n1/1", "n2/0", "n2/1"}
HOLDERS = {"n1/0": ["a"], "n1/1": ["b"], "n2/0": [], "n2/1": []}


def _check(d, job):
    return check(d, job, HOLDERS, DEVICES.__contains__)


queued = JobFacts(JobPhase.QUEUED)
suspended = JobFacts(JobPhase.SUSPENDED)
running_a = JobFacts(JobPhase.RUNNING, ("n1/0",))
packed_a = JobFacts(JobPhase.PACKED, ("n1/0",))
elastic_a = JobFacts(JobPhase.RUNNING, ("n1/0",), devices_wanted=1, elastic=True)


@pytest.mark.parametrize(
    ("decision", "job", "code"),
    [
        (Start("x", ("n2/0",)), None, Refusal.UNKNOWN_JOB),
        (Start("x", ("n2/0",)), suspended, Refusal.NOT_WAITING),
        (Resume("x", ("n2/0",)), queued, Refusal.NOT_WAITING),
        (Pack("x", ("n1/0",), ("a",)), running_a, Refusal.NOT_WAITING),
        (Start("x", ()), queued, Refusal.NO_DEVICES),
        (Start("x", ("n2/0", "n2/0")), queued, Refusal.DUPLICATE_DEVICE),
        (Start("x", ("n9/0",)), queued, Refusal.UNKNOWN_DEVICE),
        (Start("x", ("n1/0",)), queued, Refusal.DEVICE_BUSY),
        (Pack("x", ("n2/0",), ("a",)), queued, Refusal.NO_PARTNER),
        (Pack("x", ("n1/1",), ("a",)), queued, Refusal.DEVICE_BUSY),
        (Suspend("a"), queued, Refusal.NOT_RUNNING),
        (Unpack("a"), running_a, Refusal.NOT_PACKED),
        (Migrate("a", ("n2/0", "n2/1")), running_a, Refusal.CHANGES_SIZE),
        (Migrate("a", ("n1/1",)), running_a, Refusal.DEVICE_BUSY),
        (Migrate("x", ("n2/0",)), suspended, Refusal.NOT_RUNNING),
        (Resize("a", ("n1/0", "n2/0")), running_a, Refusal.NOT_ELASTIC),
        (Resize("a", ()), JobFacts(JobPhase.RUNNING, ("n1/0",), 2, True), Refusal.BELOW_REQUEST),
        ("not a decision", queued, Refusal.UNKNOWN_DECISION),
    ],
)
def test_each_refusal_has_its_code_and_a_reason_naming_the_job(decision, job, code):
    got = _check(decision, job)
    assert got is not None and got.code is code
    assert str(got).startswith(code.value + ": ")


@pytest.mark.parametrize(
    ("decision", "job"),
    [
        (Start("x", ("n2/0", "n2/1")), queued),
        (Resume("x", ("n2/0",)), suspended),
        (Pack("x", ("n1/0",), ("a",)), queued),
        (Pack("x", ("n1/0",), ("a",)), suspended),
        (Suspend("a"), running_a),
        (Suspend("a"), packed_a),
        (Unpack("a"), packed_a),
        (Migrate("a", ("n2/0",)), running_a),
        (Migrate("a", ("n1/0",)), running_a),  # its own device is not busy for it
        (Resize("a", ("n1/0", "n2/0")), elastic_a),
    ],
)
def test_what_the_state_allows_passes(decision, job):
    assert _check(decision, job) is None


def test_the_simulator_refuses_through_the_same_check_and_counts_by_code():
    """A policy that proposes what the state forbids: the simulator refuses each proposal with
    the check's code and carries out none of it."""
    from microco.services.scheduler.sim import ClusterSpec, TraceJob, simulate

    class Reckless:
        name = "reckless"

        def decide(self, view):
            out = []
            for j in view.jobs:
                if j.state is JobPhase.QUEUED:
                    out.append(Resume(j.id, (view.devices[0].id,)))  # not suspended
                    out.append(Start(j.id, ("nowhere/9",)))  # no such device
                    out.append(Start(j.id, (view.devices[0].id,)))
                elif j.state is JobPhase.RUNNING:
                    out.append(Resize(j.id, tuple(d.id for d in view.devices)))  # not elastic
                    out.append(Migrate(j.id, tuple(d.id for d in view.devices)))  # changes size
            return out

    trace = [TraceJob("j1", 0.0, 1, 30.0)]
    res = simulate(Reckless(), trace, ClusterSpec.for_gpus(2, 2), check_invariants=True)
    assert res.refusals.get(Refusal.NOT_WAITING.value, 0) >= 1
    assert res.refusals.get(Refusal.UNKNOWN_DEVICE.value, 0) >= 1
    assert res.refusals.get(Refusal.NOT_ELASTIC.value, 0) >= 1
    assert res.refusals.get(Refusal.CHANGES_SIZE.value, 0) >= 1
    assert sum(res.refusals.values()) == res.decisions_refused
    assert res.resizes == 0 and res.migrations == 0
