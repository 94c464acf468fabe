"""The job record: frozen and typed; its JSON round-trips exactly (hypothesis), reads the layout
stored before the record was typed, refuses what is not a record; transitions return new
records; the simulator's jobs, as records, give the live scheduler the simulator's view."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microco.common.errors import InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._record import (
    STATES,
    GrowTrial,
    JobRecord,
    JobSpec,
    OperatorRequest,
    Pending,
    ProfileRef,
    Rank,
    StateChange,
)
from microco.services.scheduler.policy import cluster_view_to_dict, make_policy
from microco.services.scheduler.sim import ClusterSpec, Simulator, TraceJob
from microco.services.scheduler.sim._records import job_records

text = st.text(max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
ids = st.tuples(st.text(min_size=1, max_size=8))
devices = st.lists(st.text(min_size=1, max_size=6), max_size=4).map(tuple)
state = st.sampled_from(STATES)

specs = st.builds(
    JobSpec,
    name=text,
    command=st.lists(text, min_size=1, max_size=4).map(tuple),
    devices=st.integers(1, 64),
    elastic=st.booleans(),
    priority=st.integers(-10, 10),
    user=text,
    tenant=text,
    env=st.dictionaries(text, text, max_size=3),
    workdir=text,
    total_steps=st.integers(0, 10**9),
    model=text,
    max_devices=st.integers(0, 64),
    gpu_share=st.floats(min_value=0.01, max_value=1.0),
)
pendings = st.builds(
    Pending,
    op=st.sampled_from(["suspend", "resume", "resize", "stop"]),
    seq=st.integers(0, 10**6),
    since=floats,
    then=st.sampled_from(["", "suspend", "move"]),
    devices=devices,
    reason=text,
)
trends = st.tuples(floats, floats, floats, floats)  # session 43: a drift's line
fit_blocks = st.tuples(*([floats] * 8))
records = st.builds(
    JobRecord,
    id=st.text(min_size=1, max_size=16),
    spec=specs,
    state=state,
    devices=devices,
    node=text,
    attempt=st.integers(0, 100),
    step=st.integers(0, 10**9),
    checkpoint_step=st.integers(-1, 10**9),
    submitted_at=floats,
    first_step_at=floats,
    finished_at=floats,
    last_change_at=floats,
    minibatch_ms=floats,
    minibatch_ms_alone=floats,
    utilization=st.none() | st.floats(0.0, 1.0),
    attained_service_s=floats,
    packed_with=devices,
    ranks=st.lists(st.builds(Rank, node=text, devices=devices), max_size=3).map(tuple),
    parked=st.booleans(),
    pending=st.none() | pendings,
    cancel_requested=st.booleans(),
    restarts=st.integers(0, 100),
    message=text,
    history=st.lists(st.builds(StateChange, at=floats, state=state, message=text), max_size=4).map(tuple),
    operator=st.none()
    | st.builds(
        OperatorRequest,
        action=st.sampled_from(["suspend", "resume", "migrate", "resize"]),
        devices=devices,
        count=st.integers(0, 8),
        at=floats,
    ),
    held=st.booleans(),
    no_hook=st.booleans(),
    grow_trial=st.none()
    | st.builds(
        GrowTrial,
        from_devices=devices,
        ms_before=st.none() | floats,
        at_step=st.none() | st.integers(0, 10**9),
        trend=st.none() | trends,
    ),
    max_useful_devices=st.none() | st.integers(1, 64),
    settled_ms=st.none() | st.tuples(st.integers(0, 10**9), floats),
    step_at_change=st.integers(0, 10**9),
    timing_mark=st.none() | st.tuples(st.integers(0, 10**9), st.integers(0, 10**9), floats, floats),
    settled_trend=st.none() | trends,
    early_trend=st.none() | trends,
    timing_fit=st.none()
    | st.tuples(
        st.integers(0, 10**9), st.integers(0, 10**9), floats, floats, fit_blocks, fit_blocks, fit_blocks
    ),
    profile=st.none() | st.builds(ProfileRef, key=text, identity=text),
)


@settings(max_examples=30, deadline=None)
@given(records)
def test_the_json_round_trips_exactly(rec: JobRecord) -> None:
    raw = rec.to_json()
    back = JobRecord.from_json(raw)
    assert back == rec
    assert back.to_json() == raw  # canonical: equal records are equal bytes (compare-and-swap)
    assert JobRecord.from_dict(json.loads(raw)) == rec


def test_the_layout_stored_before_the_typed_record_reads_back() -> None:
    # A record as the scheduler wrote it when records were dicts (no optional keys yet).
    old = {
        "id": "train-1a2b3c4d",
        "spec": {
            "name": "train",
            "command": ["python", "train.py"],
            "devices": 2,
            "elastic": False,
            "priority": 0,
            "user": "ann",
            "tenant": "",
            "env": {"LR": "0.1"},
            "workdir": "",
            "total_steps": 100,
            "model": "",
            "max_devices": 0,
            "gpu_share": 1.0,
        },
        "state": "suspended",
        "devices": [],
        "node": "n1",
        "attempt": 2,
        "step": 40,
        "checkpoint_step": 40,
        "submitted_at": 1.0,
        "first_step_at": 2.0,
        "finished_at": 0.0,
        "last_change_at": 9.0,
        "minibatch_ms": 12.0,
        "minibatch_ms_alone": 11.0,
        "utilization": None,
        "attained_service_s": 14.0,
        "packed_with": [],
        "ranks": [],
        "parked": True,
        "pending": None,
        "cancel_requested": False,
        "restarts": 0,
        "message": "suspended at step 40 (parked on n1)",
        "history": [[1.0, "queued", "submitted"], [9.0, "suspended", "suspended at step 40 (parked on n1)"]],
        "settled_ms": [10, 12.0],
        "step_at_change": 10,
    }
    rec = JobRecord.from_dict(old)
    assert rec.spec.env == {"LR": "0.1"} and rec.spec.command == ("python", "train.py")
    assert rec.parked and rec.has_process and rec.settled_ms == (10, 12.0)
    assert rec.history[-1] == StateChange(9.0, "suspended", "suspended at step 40 (parked on n1)")
    assert rec.operator is None and rec.grow_trial is None and rec.profile is None
    new = rec.to_dict()
    assert {k: new[k] for k in old} == old  # every stored field kept as it was


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"id": "x", "spec": {}, "state": "dreaming"}',
        b'{"id": "x", "state": "queued"}',
    ],
)
def test_what_is_not_a_record_is_refused_clearly(raw: bytes) -> None:
    with pytest.raises(InvalidArgument):
        JobRecord.from_json(raw)


def test_a_record_is_frozen_and_transitions_return_new_records() -> None:
    rec = J.new_record(
        J.validate_spec({"command": ["train"], "devices": 1}, None, check_command=False), now=5.0
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.state = J.RUNNING  # type: ignore[misc]
    with pytest.raises(TypeError):
        rec.spec.env["X"] = "1"  # type: ignore[index]
    running = rec.with_state(J.RUNNING, "started", 6.0, devices=("n1/0",), node="n1")
    assert rec.state == J.QUEUED and rec.devices == () and len(rec.history) == 1  # unchanged
    assert running.state == J.RUNNING and running.holding and running.last_change_at == 6.0
    noted = running.noted("resized", 7.0)
    assert noted.state == J.RUNNING and noted.history[-1] == StateChange(7.0, J.RUNNING, "resized")
    assert noted.last_change_at == 6.0  # a note is not a change of state
    assert noted.released().devices == () and noted.released().pending is None


def test_the_simulators_records_give_the_live_scheduler_its_view() -> None:
    """At each of the policy's first decisions, the simulator's jobs as records, stored as the
    live scheduler stores them and read back by its core, show the policy the same cluster."""
    checked: list[float] = []

    class Check:
        name = "check"

        def __init__(self) -> None:
            self.inner = make_policy("gandiva", quantum_s=60.0)

        def decide(self, view):  # type: ignore[no-untyped-def]
            if len(checked) < 6 and view.jobs:
                kv = MemoryKV()
                for node in sorted({d.node for d in view.devices}):
                    devs = [
                        {"id": d.id, "node": d.node, "index": i, "kind": d.kind, "model": d.model}
                        for i, d in enumerate(x for x in view.devices if x.node == node)
                    ]
                    kv.put_json(
                        f"/microco/nodes/{node}", {"name": node, "address": "127.0.0.1:1", "devices": devs}
                    )
                for rec in job_records(sim):
                    kv.put(J.job_key(rec.id), rec.to_json())
                live = SchedulerCore(kv, make_policy("fifo"), check_commands=False).observe(view.now)
                assert cluster_view_to_dict(live) == cluster_view_to_dict(view)
                checked.append(view.now)
            return self.inner.decide(view)

    trace = [
        TraceJob(f"j{i}", 30.0 * i, k, 400.0, model="m", elastic=i == 2)
        for i, k in enumerate([1, 2, 1, 4, 1])
    ]
    sim = Simulator(Check(), trace, ClusterSpec(nodes=2, devices_per_node=2), observe_utilization=False)
    sim.run()
    assert len(checked) == 6
