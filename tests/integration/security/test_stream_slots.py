"""Streaming calls cannot starve a service (session 41).

A gRPC service runs every call on a thread of its pool, and a streaming call holds its thread
for as long as the stream lives. Sixteen streams that a user or a job opened and left open
(``WatchJobs``, a ``PutChunks`` that sends nothing) took every thread: the scheduler answered
no ``ListJobs``, ``SubmitJob`` or health check until they closed (DEADLINE_EXCEEDED after 8 s),
the cache no ``GetStats``. A service now keeps threads for its other calls and limits the
streams one caller holds; a stream past either limit is RESOURCE_EXHAUSTED, saying which."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from _support import issued, put_node
from grpc_health.v1 import health_pb2, health_pb2_grpc

from microco.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from microco.clients.scheduler import spec_to_pb
from microco.common.channel import dial
from microco.common.kv import MemoryKV

pytestmark = pytest.mark.integration


@pytest.fixture
def small_scheduler() -> Iterator[str]:
    """A real scheduler servicer on a runtime of 12 threads (the default has more)."""
    from microco.services.runtime import ServiceRuntime, ServiceSettings
    from microco.services.scheduler._core import SchedulerCore
    from microco.services.scheduler._service import SchedulerServicer
    from microco.services.scheduler.policy import make_policy

    kv = MemoryKV()
    put_node(kv)
    core = SchedulerCore(kv, make_policy("fifo"), check_commands=False)
    rt = ServiceRuntime(ServiceSettings(name="scheduler", metrics_port=-1), max_workers=12)
    rt.add_service(
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
        SchedulerServicer(core, None, "fifo"),
        "microco.api.scheduler.v1.SchedulerService",
    )
    rt.start(register=False)
    try:
        yield rt.address
    finally:
        rt.stop(grace=0)


def _open(addr: str, who: str) -> tuple[Any, str]:
    """``who``'s channel and a job of theirs to watch."""
    channel = dial(addr, identity=issued(who))
    spec = spec_to_pb({"name": "w", "command": ["true"], "devices": 1})
    job = scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitJob(
        scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10
    )
    return channel, job.id


def _watch(channel: Any, job_id: str) -> tuple[Any, str]:
    """A ``WatchJobs`` stream left open once its first answer came (it then holds a thread),
    or the details of its refusal."""
    stream = scheduler_pb2_grpc.SchedulerServiceStub(channel).WatchJobs(
        scheduler_pb2.WatchJobsRequest(job_ids=[job_id]), timeout=30
    )
    try:
        next(stream)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (err.code(), err.details())
        assert "\n" not in (err.details() or "")
        return None, err.details() or ""
    return stream, ""


def test_open_streams_leave_a_service_answering_its_other_calls(small_scheduler):
    addr = small_scheduler
    held: list[Any] = []
    refusals: dict[str, list[str]] = {}
    try:
        for who in ("user:mallory", "user:m1", "user:m2", "user:m3", "user:m4"):
            channel, job_id = _open(addr, who)
            for _ in range(5):
                stream, why = _watch(channel, job_id)
                if stream is None:
                    refusals.setdefault(who, []).append(why)
                    break
                held.append(stream)
        # the first callers are stopped at their own limit, naming them; later ones at the
        # service's, which keeps threads for every other call
        assert any(who in why for who, whys in refusals.items() for why in whys), refusals
        assert "user:m4" in refusals and "user:m4" not in refusals["user:m4"][0], refusals
        assert 0 < len(held) < 12
        alice = dial(addr, identity=issued("user:alice"))
        assert (
            scheduler_pb2_grpc.SchedulerServiceStub(alice).ListJobs(
                scheduler_pb2.ListJobsRequest(), timeout=8
            )
            is not None
        )
        health = health_pb2_grpc.HealthStub(alice).Check(health_pb2.HealthCheckRequest(), timeout=8)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # a closed stream gives its place back
        held.pop(0).cancel()
        channel, job_id = _open(addr, "user:m4")
        deadline = time.monotonic() + 20
        stream, why = _watch(channel, job_id)
        while stream is None and time.monotonic() < deadline:  # the cancel reaches the server
            time.sleep(0.1)
            stream, why = _watch(channel, job_id)
        assert stream is not None, why
        held.append(stream)
    finally:
        for s in held:
            s.cancel()
