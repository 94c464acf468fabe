"""The scheduler's side of the node agents: who is alive (etcd) and how to reach them (gRPC)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
from microco.common import call_with_retry, dial
from microco.common.errors import NotFound, Unavailable, from_rpc_error
from microco.common.kv import KV

log = logging.getLogger(__name__)

# Where each node agent registers its devices, under its lease: ``<prefix><node>``.
NODES_PREFIX = "/microco/nodes/"

CONTROL = {
    "suspend": agent_pb2.CONTROL_SUSPEND,
    "resume": agent_pb2.CONTROL_RESUME,
    "checkpoint": agent_pb2.CONTROL_CHECKPOINT,
    "resize": agent_pb2.CONTROL_RESIZE,
    "stop": agent_pb2.CONTROL_STOP,
}


_READ_LOG_TIMEOUT_S = 120.0  # a whole log, not followed


class AgentDirectory:
    """Live nodes from ``/microco/nodes/`` and a cached channel per agent address."""

    def __init__(self, kv: KV, timeout_s: float = 5.0) -> None:
        self.kv, self.timeout_s = kv, timeout_s
        self._stubs: dict[str, tuple[grpc.Channel, Any]] = {}
        self._lock = threading.Lock()

    def nodes(self) -> dict[str, dict[str, Any]]:
        out = {}
        for key, rec in self.kv.get_prefix_json(NODES_PREFIX):
            out[key[len(NODES_PREFIX) :]] = rec
        return out

    def _stub(self, address: str) -> Any:
        with self._lock:
            if address not in self._stubs:
                ch = dial(address)
                self._stubs[address] = (ch, agent_pb2_grpc.NodeAgentServiceStub(ch))  # type: ignore[no-untyped-call]
            return self._stubs[address][1]

    def list_processes(self, address: str) -> list[agent_pb2.ProcessStatus]:
        stub = self._stub(address)
        resp = call_with_retry(
            stub.ListProcesses,
            agent_pb2.ListProcessesRequest(),
            timeout=self.timeout_s,
            idempotent=True,
            attempts=2,
        )
        return list(resp.processes)

    def start(
        self,
        address: str,
        job_id: str,
        command: list[str],
        env: dict[str, str],
        devices: list[str],
        workdir: str,
        attempt: int,
    ) -> agent_pb2.ProcessStatus:
        req = agent_pb2.StartProcessRequest(
            job_id=job_id, command=command, env=env, device_ids=devices, workdir=workdir, attempt=attempt
        )
        # Idempotent on the agent for the same (job, attempt), so a retry is safe.
        status: agent_pb2.ProcessStatus = call_with_retry(
            self._stub(address).StartProcess, req, timeout=self.timeout_s, idempotent=True
        )
        return status

    def control(self, address: str, job_id: str, action: str, devices: list[str] | None = None) -> Any:
        req = agent_pb2.ControlProcessRequest(
            job_id=job_id, control=CONTROL[action], device_ids=devices or []
        )
        return call_with_retry(
            self._stub(address).ControlProcess, req, timeout=self.timeout_s, idempotent=False
        )

    def stop(self, address: str, job_id: str, grace_s: float = 3.0) -> Any:
        req = agent_pb2.StopProcessRequest(job_id=job_id, grace_seconds=grace_s)
        return call_with_retry(
            self._stub(address).StopProcess, req, timeout=self.timeout_s + grace_s, idempotent=True
        )

    def collect_garbage(
        self, address: str, keep: list[str], keep_logs: Sequence[str] = ()
    ) -> agent_pb2.CollectGarbageResponse:
        req = agent_pb2.CollectGarbageRequest(keep_job_ids=keep, keep_logs_job_ids=list(keep_logs))
        # Idempotent: the same keep set deletes nothing more the second time.
        resp: agent_pb2.CollectGarbageResponse = call_with_retry(
            self._stub(address).CollectGarbage, req, timeout=self.timeout_s, idempotent=True
        )
        return resp

    def read_log(
        self,
        address: str,
        job_id: str,
        *,
        attempt: int = 0,
        tail_lines: int = 0,
        follow: bool = False,
    ) -> Iterator[agent_pb2.LogChunk]:
        """A job's log as the agent at ``address`` keeps it (``ReadLog``), chunk by chunk; a
        failed call raises its ``MicrocoError`` (``NotFound``: no log of the job there)."""
        req = agent_pb2.ReadLogRequest(job_id=job_id, attempt=attempt, tail_lines=tail_lines, follow=follow)
        try:
            yield from self._stub(address).ReadLog(req, timeout=None if follow else _READ_LOG_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def open_log(
        self,
        job_id: str,
        *,
        first_node: str = "",
        attempt: int = 0,
        tail_lines: int = 0,
        follow: bool = False,
    ) -> tuple[str, agent_pb2.LogChunk, Iterator[agent_pb2.LogChunk]]:
        """A job's log from the first node that keeps it, ``first_node`` (where the job last
        ran) asked first: a job that moved left its earlier attempts elsewhere. Returns (node,
        first chunk, the rest). ``NotFound`` when no node keeps one; ``Unavailable``, naming
        them, when some nodes could not be asked and none of the others keeps one."""
        nodes = self.nodes()
        unreachable = []
        for name in sorted(nodes, key=lambda n: (n != first_node, n)):
            stream = self.read_log(
                nodes[name]["address"], job_id, attempt=attempt, tail_lines=tail_lines, follow=follow
            )
            try:
                return name, next(stream), stream
            except NotFound:
                continue
            except Unavailable:
                unreachable.append(name)
        which = f"attempt {attempt} of job" if attempt else "job"
        if unreachable:
            raise Unavailable(
                f"no reachable node keeps a log of {which} {job_id}; unreachable: {', '.join(unreachable)}"
            )
        raise NotFound(
            f"no node keeps a log of {which} {job_id}: a job that never started has none, and an ended "
            "job's logs are deleted after the scheduler's --log-retention-s"
        )

    def close(self) -> None:
        with self._lock:
            for ch, _ in self._stubs.values():
                ch.close()
            self._stubs.clear()
