"""Typed gRPC client of the scheduler service."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from microco.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from microco.common import ServiceClient

from ._spec import spec_to_pb

STATES = {
    "queued": scheduler_pb2.JOB_STATE_QUEUED,
    "running": scheduler_pb2.JOB_STATE_RUNNING,
    "suspended": scheduler_pb2.JOB_STATE_SUSPENDED,
    "packed": scheduler_pb2.JOB_STATE_PACKED,
    "migrating": scheduler_pb2.JOB_STATE_MIGRATING,
    "finished": scheduler_pb2.JOB_STATE_FINISHED,
    "failed": scheduler_pb2.JOB_STATE_FAILED,
    "cancelled": scheduler_pb2.JOB_STATE_CANCELLED,
}
STATE_NAMES: dict[int, str] = {int(v): k for k, v in STATES.items()}


def state_name(value: int) -> str:
    return STATE_NAMES.get(value, "unknown")


def job_to_dict(job: scheduler_pb2.Job) -> dict[str, Any]:
    """A plain dict of a Job message (for printing, JSON and tests)."""
    return {
        "id": job.id,
        "name": job.spec.name,
        "state": state_name(job.state),
        "devices": list(job.device_ids),
        "node": job.node,
        "step": job.step,
        "total_steps": job.spec.total_steps,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "checkpoint_step": job.checkpoint_step,
        "minibatch_ms": job.minibatch_ms,
        "minibatch_ms_alone": job.minibatch_ms_alone,
        "utilization": job.utilization if job.HasField("utilization") else None,
        "packed_with": list(job.packed_with),
        "submitted_at": job.submitted_at,
        "first_step_at": job.first_step_at,
        "finished_at": job.finished_at,
        "attained_service_s": job.attained_service_s,
        "message": job.message,
        "command": list(job.spec.command),
        "devices_wanted": job.spec.devices,
        "elastic": job.spec.elastic,
        "gpu_share": job.spec.gpu_share or 1.0,
        "priority": job.spec.priority,
        "user": job.spec.owner.user,
        "history": [[h.at, state_name(h.state), h.message] for h in job.history],
    }


def make_spec(
    command: Sequence[str],
    *,
    devices: int = 1,
    name: str = "",
    elastic: bool = False,
    priority: int = 0,
    user: str = "",
    tenant: str = "",
    env: dict[str, str] | None = None,
    workdir: str = "",
    total_steps: int = 0,
    model: str = "",
    max_devices: int = 0,
    gpu_share: float = 0.0,
) -> scheduler_pb2.JobSpec:
    """A ``JobSpec`` from keywords: a front end over the one mapping, :func:`spec_to_pb`."""
    return spec_to_pb(
        {
            "name": name,
            "command": list(command),
            "devices": devices,
            "elastic": elastic,
            "priority": priority,
            "user": user,
            "tenant": tenant,
            "env": env or {},
            "workdir": workdir,
            "total_steps": total_steps,
            "model": model,
            "max_devices": max_devices,
            "gpu_share": gpu_share,
        }
    )


class SchedulerClient(ServiceClient):
    """One method per RPC; errors come back as ``microco.common.errors`` types."""

    service_name = "scheduler"

    def __init__(self, channel: Any, default_timeout: float = 10.0) -> None:
        super().__init__(channel, default_timeout)
        # (grpcio's generated stubs carry no annotations)
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[no-untyped-call]

    def submit(self, spec: scheduler_pb2.JobSpec, *, timeout: float | None = None) -> scheduler_pb2.Job:
        # Not idempotent: a retry after a lost reply would submit twice.
        job: scheduler_pb2.Job = self._call(
            self._stub.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spec), timeout=timeout, idempotent=False
        )
        return job

    def get(self, job_id: str, *, timeout: float | None = None, retry: bool = True) -> scheduler_pb2.Job:
        job: scheduler_pb2.Job = self._call(
            self._stub.GetJob,
            scheduler_pb2.GetJobRequest(job_id=job_id),
            timeout=timeout,
            idempotent=True,
            retry=retry,
        )
        return job

    def list(self, states: Sequence[str] = (), owner: str = "", *, timeout: float | None = None) -> list[Any]:
        req = scheduler_pb2.ListJobsRequest(states=[STATES[s] for s in states], owner=owner)
        return list(self._call(self._stub.ListJobs, req, timeout=timeout, idempotent=True).jobs)

    def control(
        self,
        job_id: str,
        action: str,
        devices: Sequence[str] | None = None,
        device_count: int = 0,
        *,
        timeout: float | None = None,
    ) -> scheduler_pb2.Job:
        """An operator's ``suspend`` / ``resume`` / ``migrate`` / ``resize`` of a job."""
        job: scheduler_pb2.Job = self._call(
            self._stub.ControlJob,
            scheduler_pb2.ControlJobRequest(
                job_id=job_id, action=action, devices=list(devices or []), device_count=device_count
            ),
            timeout=timeout,
            idempotent=False,  # a retried command would find its first copy pending
        )
        return job

    def cancel(self, job_id: str, *, timeout: float | None = None) -> scheduler_pb2.Job:
        # Cancellation is idempotent on the server (a flag), so it may be retried.
        job: scheduler_pb2.Job = self._call(
            self._stub.CancelJob,
            scheduler_pb2.CancelJobRequest(job_id=job_id),
            timeout=timeout,
            idempotent=True,
        )
        return job

    def list_nodes(self, *, timeout: float | None = None) -> scheduler_pb2.ListNodesResponse:
        nodes: scheduler_pb2.ListNodesResponse = self._call(
            self._stub.ListNodes, scheduler_pb2.ListNodesRequest(), timeout=timeout, idempotent=True
        )
        return nodes

    def watch(
        self, job_ids: Sequence[str] = (), *, timeout: float | None = None
    ) -> Iterator[scheduler_pb2.JobEvent]:
        """Stream of job changes (current state first); ``timeout`` bounds the whole stream."""
        import grpc

        from microco.common.errors import from_rpc_error

        try:
            yield from self._stub.WatchJobs(
                scheduler_pb2.WatchJobsRequest(job_ids=list(job_ids)), timeout=timeout
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise from_rpc_error(exc) from None

    def watch_call(self, job_ids: Sequence[str] = (), *, timeout: float | None = None) -> Any:
        """The ``WatchJobs`` call itself, for a caller that ends the stream from another thread:
        iterate it for ``JobEvent``s, ``cancel()`` it to stop. Errors while iterating are
        ``grpc.RpcError`` (the stream is not retried: the caller re-opens it)."""
        return self._stub.WatchJobs(scheduler_pb2.WatchJobsRequest(job_ids=list(job_ids)), timeout=timeout)
