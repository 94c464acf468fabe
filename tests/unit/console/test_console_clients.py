"""The console on the typed clients: the Gateway hands out each system's client on the instance
discovery picks (the leader first), with the console's deadline and attempts, and the views map
through the clients' shared code (the job spec mapping) rather than building requests by hand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from microco.api.scheduler.v1 import scheduler_pb2
from microco.clients.scheduler import SchedulerClient, spec_from_pb, spec_to_pb
from microco.common import ServiceClient
from microco.common.errors import InvalidArgument, Unavailable
from microco.common.kv import MemoryKV
from microco.common.registry import ServiceRecord
from microco.services.console import ConsoleConfig
from microco.services.console import _views as views
from microco.services.console._gateway import ATTEMPTS, SYSTEMS, Gateway
from microco.services.console._models import JobSubmit
from microco.services.console._series import SeriesStore

pytestmark = pytest.mark.skipif(
    not SYSTEMS["scheduler"].in_build(), reason="the scheduler is not part of this build"
)


@pytest.fixture
def gw() -> Iterator[Gateway]:
    gateway = Gateway(ConsoleConfig(profile="dev"), MemoryKV(), use_redis=False)
    yield gateway
    gateway.close()


def _register(kv: MemoryKV, instance: str, address: str, role: str = "") -> ServiceRecord:
    record = ServiceRecord("scheduler", instance, address, labels={"role": role} if role else {})
    kv.put(record.key, record.to_json())
    return record


def test_the_scheduler_client_is_on_the_leader_with_the_consoles_deadline_and_attempts(gw: Gateway) -> None:
    kv = gw.kv
    assert isinstance(kv, MemoryKV)
    _register(kv, "a", "127.0.0.1:1", role="follower")
    leader = _register(kv, "b", "127.0.0.1:2", role="leader")
    client = gw.scheduler()
    assert isinstance(client, SchedulerClient)
    assert gw.record("scheduler") == leader
    assert client.attempts == ATTEMPTS and client.default_timeout == gw.config.rpc_timeout_s
    assert gw.scheduler() is client  # one client per instance, on the shared channel
    # failover: discovery runs at every call, so the new leader is used as soon as it registers
    kv.delete(leader.key)
    new_leader = _register(kv, "c", "127.0.0.1:3", role="leader")
    assert gw.record("scheduler") == new_leader
    assert gw.scheduler() is not client


def test_no_registered_instance_is_unavailable_with_the_reason(gw: Gateway) -> None:
    with pytest.raises(Unavailable, match="no live instance is registered"):
        gw.scheduler()


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_an_idempotent_call_is_tried_attempts_times_through_common_call_with_retry() -> None:
    calls: list[float] = []

    def method(request: Any, timeout: float) -> Any:
        calls.append(timeout)
        raise _Unavailable()

    client = ServiceClient(channel=None, default_timeout=5.0)  # type: ignore[arg-type]
    client.attempts = 2
    with pytest.raises(Unavailable):
        client._call(method, object(), timeout=None, idempotent=True)
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(Unavailable):
        client._call(method, object(), timeout=None, idempotent=False)
    assert len(calls) == 1


class _FakeScheduler:
    """Stands in for the SchedulerClient: records what the views ask."""

    def __init__(self) -> None:
        self.submitted: list[scheduler_pb2.JobSpec] = []
        self.listed: list[tuple[list[str], str]] = []

    def submit(self, spec: scheduler_pb2.JobSpec) -> scheduler_pb2.Job:
        self.submitted.append(spec)
        return scheduler_pb2.Job(id="j-1", spec=spec, state=scheduler_pb2.JOB_STATE_QUEUED)

    def list(self, states: list[str] = [], owner: str = "") -> list[scheduler_pb2.Job]:  # noqa: B006
        self.listed.append((list(states), owner))
        return []


@pytest.fixture
def fake(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> _FakeScheduler:
    f = _FakeScheduler()
    monkeypatch.setattr(gw, "scheduler", lambda: f)
    monkeypatch.setattr(gw, "availability", lambda name: (True, ""))
    return f


def test_a_submitted_job_reaches_the_wire_through_the_shared_spec_mapping(
    gw: Gateway, fake: _FakeScheduler
) -> None:
    body = JobSubmit(
        name="mnist",
        command=["python", "train.py"],
        devices=1,
        elastic=True,
        priority=3,
        user="ada",
        env={"A": "1"},
        workdir="/w",
        total_steps=100,
        model="lenet",
        max_devices=2,
        gpu_share=0.5,
    ).model_dump()
    job = views.submit_job(gw, body)
    assert job["id"] == "j-1"
    (spec,) = fake.submitted
    assert spec == spec_to_pb(body)
    on_wire = spec_from_pb(spec)
    assert {k: on_wire[k] for k in body} == body  # every field of the REST body arrived


@pytest.mark.parametrize(
    ("given", "asked"),
    [
        ([], []),
        (["running"], ["running"]),
        (["JOB_STATE_PACKED", "Queued"], ["packed", "queued"]),
        (["unspecified", "failed"], ["failed"]),
    ],
)
def test_state_filters_reach_the_client_by_their_names(
    gw: Gateway, fake: _FakeScheduler, given: list[str], asked: list[str]
) -> None:
    out = views.list_jobs(gw, SeriesStore(None), given, owner="ada")
    assert out["available"] is True
    assert fake.listed == [(asked, "ada")]


def test_a_filter_naming_no_state_a_job_can_be_in_matches_no_job(gw: Gateway, fake: _FakeScheduler) -> None:
    assert views.list_jobs(gw, SeriesStore(None), ["unspecified"])["jobs"] == []
    assert fake.listed == []  # not "every job", which an empty filter would ask for


def test_an_unknown_state_is_a_clear_error(gw: Gateway, fake: _FakeScheduler) -> None:
    with pytest.raises(InvalidArgument, match="unknown job state 'sleepy'; expected one of queued"):
        views.list_jobs(gw, SeriesStore(None), ["sleepy"])
