"""Job records, spec validation, conversions and the store side of SchedulerCore (MemoryKV)."""

from __future__ import annotations

import sys
import threading

import pytest

from microco.clients.scheduler import job_to_dict, make_spec
from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound
from microco.common.kv import MemoryKV
from microco.services.scheduler import SchedulerCore, record_to_pb, spec_from_pb, validate_spec
from microco.services.scheduler import _jobs as J
from microco.services.scheduler._record import Rank
from microco.services.scheduler.policy import JobPhase, job_view_from_dict, make_policy

PY = [sys.executable, "-c", "pass"]


def core_with_nodes(n_devices=2):
    kv = MemoryKV()
    if n_devices:
        kv.put_json(
            "/microco/nodes/n1",
            {
                "name": "n1",
                "address": "127.0.0.1:1",
                "devices": [
                    {"id": f"n1/{i}", "node": "n1", "index": i, "kind": "virtual", "model": "virtual-cpu"}
                    for i in range(n_devices)
                ],
            },
        )
    return kv, SchedulerCore(kv, make_policy("fifo"))


@pytest.mark.parametrize(
    "spec,needle",
    [
        ({"command": PY, "devices": 0}, "at least 1"),
        ({"command": PY, "devices": -1}, "at least 1"),
        ({"command": PY, "devices": 3}, "cluster has 2"),
        ({"command": [], "devices": 1}, "command is empty"),
        ({"command": ["/definitely/not/here"], "devices": 1}, "command not found"),
        ({"command": PY, "devices": 1, "total_steps": -5}, "negative"),
        ({"command": PY, "devices": 2, "max_devices": 1}, "max_devices"),
        ({"command": PY, "devices": 1, "gpu_share": 1.5}, "gpu_share must be in"),
        ({"command": PY, "devices": 1, "gpu_share": -0.1}, "gpu_share must be in"),
        ({"command": PY, "devices": 1, "gpu_share": float("nan")}, "gpu_share must be in"),
        ({"command": PY, "devices": 2, "gpu_share": 0.5}, "one-device jobs only"),
        # A ~1 MiB environment could never be started or cancelled (its record did not fit
        # one etcd compare-and-swap): refused at submission, with the limit.
        ({"command": PY, "devices": 1, "env": {"BIG": "x" * (1 << 20)}}, "at most 256 and 65536 bytes"),
        ({"command": PY, "devices": 1, "env": {f"K{i}": "" for i in range(300)}}, "env has 300"),
        ({"command": [*PY, *["a"] * 5000], "devices": 1}, "command has 500"),
        ({"command": PY, "devices": 1, "name": "n" * 1000}, "name is 1000 characters"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(spec, needle):
    with pytest.raises(InvalidArgument, match=needle):
        validate_spec(spec, 2)


def test_spec_round_trip_through_proto():
    pb = make_spec(
        PY,
        devices=2,
        name="A b",
        elastic=True,
        priority=3,
        user="u",
        env={"K": "V"},
        total_steps=10,
        model="m",
        max_devices=4,
    )
    spec = validate_spec(spec_from_pb(pb), 4)
    rec = J.new_record(spec, now=5.0)
    assert rec.id.startswith("a-b-") and rec.state == "queued"
    d = job_to_dict(record_to_pb(rec))
    assert d["state"] == "queued" and d["devices_wanted"] == 2 and d["elastic"] and d["user"] == "u"
    assert d["history"] == [[5.0, "queued", "submitted"]]
    view = job_view_from_dict(J.record_to_view(rec))
    assert view.state is JobPhase.QUEUED and view.devices_wanted == 2 and view.total_steps == 10
    assert view.max_devices == 4 and view.minibatch_ms is None
    assert view.gpu_share == 1.0  # not given: the whole device


def test_fractional_gpu_share_reaches_the_policy_view():
    spec = validate_spec(spec_from_pb(make_spec(PY, devices=1, gpu_share=0.25)), 4)
    rec = J.new_record(spec, now=1.0)
    assert job_to_dict(record_to_pb(rec))["gpu_share"] == 0.25
    assert job_view_from_dict(J.record_to_view(rec)).gpu_share == 0.25


def test_state_names_cover_every_state():
    for s in ("queued", "running", "suspended", "packed", "migrating", "finished", "failed", "cancelled"):
        assert J.state_from_pb(J.state_to_pb(s)) == s
    with pytest.raises(InvalidArgument):
        J.state_from_pb(999)


def test_set_state_keeps_a_bounded_history():
    rec = J.new_record(validate_spec({"command": PY, "devices": 1}, 1), now=0)
    for i in range(120):
        rec = rec.with_state("running" if i % 2 else "suspended", f"m{i}", float(i))
    assert len(rec.history) == 50 and rec.history[-1].message == "m119" and rec.last_change_at == 119


def test_a_change_never_predates_the_previous_one():
    # The leader reads its clock as a tick starts; a job submitted during the tick's node calls is
    # placed in that tick with the earlier reading. Its history must still begin with the queue.
    rec = J.new_record(validate_spec({"command": PY, "devices": 1}, 1), now=100.0)
    rec = rec.with_state("running", "started", 99.5).with_state("finished", "done", 130.0)
    assert [(h.at, h.state) for h in rec.history] == [
        (100.0, "queued"),
        (100.0, "running"),
        (130.0, "finished"),
    ]
    assert rec.last_change_at == 130.0


def test_core_submit_get_list_cancel():
    _, core = core_with_nodes()
    a = core.submit({"command": PY, "devices": 1, "name": "a", "user": "ann"})
    b = core.submit({"command": PY, "devices": 2, "name": "b", "user": "bob"})
    assert core.get(a.id).spec.user == "ann"
    assert [r.id for r in core.list_jobs()] == [a.id, b.id]
    assert [r.id for r in core.list_jobs(owner="bob")] == [b.id]
    assert core.list_jobs(states=["running"]) == []
    r = core.cancel(a.id)
    assert r.cancel_requested and core.cancel(a.id).cancel_requested  # idempotent
    with pytest.raises(NotFound):
        core.get("nope")
    with pytest.raises(NotFound):
        core.cancel("nope")
    with pytest.raises(InvalidArgument):
        core.get("")


def test_submit_without_nodes_says_so():
    _, core = core_with_nodes(0)
    with pytest.raises(FailedPrecondition, match="no node agent"):
        core.submit({"command": PY, "devices": 1})


def test_watch_streams_current_state_then_changes():
    _, core = core_with_nodes()
    a = core.submit({"command": PY, "devices": 1})
    stop = threading.Event()
    seen = []

    first = threading.Event()

    def run():
        for rec in core.watch([a.id], lambda: not stop.is_set(), poll_s=0.05):
            seen.append(rec.cancel_requested)
            first.set()
            if rec.cancel_requested:
                stop.set()

    t = threading.Thread(target=run)
    t.start()
    assert first.wait(30)  # the current state came first (cancelling before it raced the watcher)
    core.cancel(a.id)
    t.join(30)
    assert seen[0] is False and seen[-1] is True
    with pytest.raises(NotFound):
        list(core.watch(["missing"], lambda: False))


def test_retained_job_ids_keep_what_a_resume_or_a_user_needs():
    def rec(i, state, finished_at=0.0):
        return J.JobRecord(i, J.JobSpec(), state=state, finished_at=finished_at, last_change_at=finished_at)

    recs = [
        rec("q", J.QUEUED),
        rec("r", J.RUNNING),
        rec("s", J.SUSPENDED),
        rec("m", J.MIGRATING),
        rec("p", J.PACKED),
        rec("done", J.FINISHED, 100.0),
        rec("gone", J.CANCELLED, 100.0),
        rec("bad-new", J.FAILED, 990.0),
        rec("bad-old", J.FAILED, 100.0),
    ]
    assert J.retained_job_ids(recs, 1000.0, 60.0) == {"q", "r", "s", "m", "p", "bad-new"}
    assert J.retained_job_ids(recs, 1000.0, 0.0) == {"q", "r", "s", "m", "p"}
    # logs: every job that ended within the log retention (living jobs keep all their data anyway)
    assert J.log_job_ids(recs, 1000.0, 901.0) == {"done", "gone", "bad-new", "bad-old"}
    assert J.log_job_ids(recs, 1000.0, 60.0) == {"bad-new"}
    assert J.log_job_ids(recs, 1000.0, 0.0) == set()


def test_placement_groups_devices_by_node_rank0_first_and_spreads_only_if_allowed():
    kv, core = core_with_nodes(2)
    kv.put_json(
        "/microco/nodes/n2",
        {
            "name": "n2",
            "address": "127.0.0.1:2",
            "devices": [{"id": "n2/0", "node": "n2", "index": 0, "kind": "virtual", "model": "virtual-cpu"}],
        },
    )
    core.io.nodes = core.agents.nodes()
    assert core.io.placement(["n1/0", "n1/1"], False) == [("n1", ["n1/0", "n1/1"])]
    with pytest.raises(FailedPrecondition, match="allow_spread"):
        core.io.placement(["n2/0", "n1/1"], False)
    # Rank 0 is the node holding most of the job's devices.
    assert core.io.placement(["n2/0", "n1/1", "n1/0"], True) == [("n1", ["n1/1", "n1/0"]), ("n2", ["n2/0"])]
    with pytest.raises(FailedPrecondition, match="live nodes"):
        core.io.placement(["n9/0"], True)
    rec = J.JobRecord("j", J.JobSpec(), node="n1", ranks=(Rank("n1", ("n1/0",)), Rank("n2", ("n2/0",))))
    assert rec.rank_nodes == ["n1", "n2"]
    assert J.JobRecord("j", J.JobSpec(), node="n1").rank_nodes == ["n1"]


def test_observe_builds_the_policy_view_from_the_records_without_writing():
    kv, core = core_with_nodes(2)
    rec = core.submit({"command": PY, "devices": 1, "name": "a"})
    before = dict(kv.get_prefix(J.JOBS_PREFIX))
    view = core.observe(now=123.0)
    assert view.now == 123.0 and [d.id for d in view.devices] == ["n1/0", "n1/1"]
    assert [j.id for j in view.jobs] == [rec.id] and view.jobs[0].state is JobPhase.QUEUED
    assert dict(kv.get_prefix(J.JOBS_PREFIX)) == before
