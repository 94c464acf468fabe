"""The node agent service: gRPC adapter over ``ProcessManager`` plus the node's registration.

The node record ``/microco/nodes/<node>`` (its agent's address and devices) lives under the
agent's lease: when the agent dies the record vanishes within one TTL and the scheduler treats
the node's jobs as lost (they died with the agent, see ``_procs``) and reschedules them from
their last checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
from microco.api.common.v1 import common_pb2
from microco.clients.agent import NODES_PREFIX
from microco.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from microco.common.hotstate import ENV_REDIS_PASSWORD, redis_password
from microco.common.kv import KV, dumps
from microco.common.redis_acl import ENV_REDIS_USER
from microco.services.runtime.auth import Caller, caller, may_access_job, require_job_access
from microco.services.runtime.server import ServiceContext, ServiceRuntime

from ._devices import DeviceInfo, discover_devices
from ._fence import FencedLease
from ._procs import ManagedProcess, ProcessManager, tail_offset
from ._runas import (
    DEFAULT_JOB_UID,
    ENV_RUN_AS,
    JOB_USER_NAME,
    JobUser,
    blocked,
    resolve_run_as,
    warn_if_shared,
)
from ._warm import parse_preload

log = logging.getLogger(__name__)

_LOG_CHUNK = 64 * 1024  # bytes of a job's log per streamed message
_FOLLOW_POLL_S = 0.25  # how often a followed log is checked for more output
# Followed logs each hold one of the server's worker threads for as long as the job runs: at
# most this many at once (the runtime keeps threads for other calls besides: ``StreamSlots``),
# and one user or job at most ``MAX_FOLLOWED_LOGS_PER_CALLER`` of them: four in all, one user's
# four followed logs of their own jobs refused everyone else's (session 42).
MAX_FOLLOWED_LOGS = 16
MAX_FOLLOWED_LOGS_PER_CALLER = 4

_ACTIONS = {
    agent_pb2.CONTROL_SUSPEND: "suspend",
    agent_pb2.CONTROL_RESUME: "resume",
    agent_pb2.CONTROL_CHECKPOINT: "checkpoint",
    agent_pb2.CONTROL_RESIZE: "resize",
    agent_pb2.CONTROL_STOP: "stop",
}


def status_to_proto(st: dict[str, Any]) -> agent_pb2.ProcessStatus:
    return agent_pb2.ProcessStatus(
        job_id=st["job_id"],
        pid=st["pid"],
        attempt=st["attempt"],
        exit_code=st["exit_code"],
        state=agent_pb2.PROCESS_STATE_EXITED if st["exited"] else agent_pb2.PROCESS_STATE_RUNNING,
        device_ids=st["device_ids"],
        job_state=st["job_state"],
        step=st["step"],
        minibatch_ms=st["minibatch_ms"],
        seq_done=st["seq_done"],
        control_seq=st["control_seq"],
        checkpoint_step=st["checkpoint_step"],
        checkpoint_bytes=st["checkpoint_bytes"],
        started_at=st["started_at"],
        first_step_at=st["first_step_at"],
        updated_at=st["updated_at"],
        suspend_ms=st["suspend_ms"],
        resume_ms=st["resume_ms"],
        peak_rss_bytes=st["peak_rss_bytes"],
        message=st["message"],
        restored_from_step=st["restored_from_step"],
        forked=st.get("forked", False),
        utilization=st.get("utilization"),
        timed_steps=st.get("timed_steps", 0),
        timed_ms=st.get("timed_ms", 0.0),
        timed_sq_ms=st.get("timed_sq_ms", 0.0),
    )


def device_to_proto(d: DeviceInfo) -> common_pb2.Device:
    return common_pb2.Device(
        id=d.id, node=d.node, index=d.index, kind=d.kind, model=d.model, memory_bytes=d.memory_bytes
    )


class NodeAgentServicer(agent_pb2_grpc.NodeAgentServiceServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self._followers_lock = threading.Lock()
        self._followers: dict[str, int] = {}  # logs followed now, by caller ("": all of them)

    def _follow(self, who: Caller) -> str:
        """Take a followed log's slot for ``who`` (a user or a job at most
        ``MAX_FOLLOWED_LOGS_PER_CALLER``; a service up to the total); the key to give back."""
        mine = who.name if who.name and not who.is_service() else ""
        with self._followers_lock:
            if self._followers.get("", 0) >= MAX_FOLLOWED_LOGS:
                raise ResourceExhausted(
                    f"{MAX_FOLLOWED_LOGS} logs are already being followed on node {self.agent.node}; "
                    "read without following, or try again later"
                )
            if mine and self._followers.get(mine, 0) >= MAX_FOLLOWED_LOGS_PER_CALLER:
                raise ResourceExhausted(
                    f"{mine} already follows {MAX_FOLLOWED_LOGS_PER_CALLER} logs on node "
                    f"{self.agent.node}, the most one caller may; stop one, or read without following"
                )
            for k in {"", mine}:
                self._followers[k] = self._followers.get(k, 0) + 1
        return mine

    def _unfollow(self, mine: str) -> None:
        with self._followers_lock:
            for k in {"", mine}:
                self._followers[k] -= 1

    def _status(self, proc: ManagedProcess) -> agent_pb2.ProcessStatus:
        return status_to_proto(proc.status())

    def GetNode(self, request: Any, context: grpc.ServicerContext) -> agent_pb2.Node:
        return self.agent.node_proto()

    def StartProcess(self, request: agent_pb2.StartProcessRequest, context: grpc.ServicerContext) -> Any:
        caller(context).require_service("scheduler", what="start processes on a node agent")
        proc = self.agent.procs.start(
            request.job_id,
            list(request.command),
            dict(request.env),
            list(request.device_ids),
            request.workdir,
            request.checkpoint_dir,
            int(request.attempt),
        )
        return self._status(proc)

    def ControlProcess(self, request: agent_pb2.ControlProcessRequest, context: grpc.ServicerContext) -> Any:
        caller(context).require_service("scheduler", what="signal processes on a node agent")
        action = _ACTIONS.get(request.control)
        if action is None:
            raise InvalidArgument(f"unknown control {request.control}")
        return self._status(self.agent.procs.control(request.job_id, action, list(request.device_ids)))

    def StopProcess(self, request: agent_pb2.StopProcessRequest, context: grpc.ServicerContext) -> Any:
        caller(context).require_service("scheduler", what="stop processes on a node agent")
        grace = request.grace_seconds if request.grace_seconds > 0 else 5.0
        return self._status(self.agent.procs.stop(request.job_id, grace))

    def ListProcesses(self, request: Any, context: grpc.ServicerContext) -> agent_pb2.ListProcessesResponse:
        procs = self.agent.procs.list()
        if not (who := caller(context)).trusted:
            # a user's jobs' processes to the user, a job's to the job, as ListJobs (session 42:
            # every user and job read every job's id, status message, steps and memory here)
            procs = [p for p in procs if may_access_job(who, self.agent.kv, p.job_id)]
        return agent_pb2.ListProcessesResponse(processes=[self._status(p) for p in procs])

    def CollectGarbage(
        self, request: agent_pb2.CollectGarbageRequest, context: grpc.ServicerContext
    ) -> agent_pb2.CollectGarbageResponse:
        caller(context).require_service("scheduler", what="collect a node agent's garbage")
        deleted, freed = self.agent.procs.collect_garbage(
            set(request.keep_job_ids), set(request.keep_logs_job_ids)
        )
        return agent_pb2.CollectGarbageResponse(deleted_job_ids=deleted, bytes_freed=freed)

    def ReadLog(self, request: agent_pb2.ReadLogRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        if not (who := caller(context)).trusted:
            require_job_access(who, self.agent.kv, request.job_id, "read the log")
        logs = self.agent.procs.log_files(request.job_id)
        if not logs:
            raise NotFound(f"no log of job {request.job_id!r} on node {self.agent.node}")
        attempt = int(request.attempt) or max(logs)
        path = logs.get(attempt)
        if path is None:
            have = ", ".join(map(str, sorted(logs)))
            raise NotFound(
                f"job {request.job_id!r} has no log of attempt {attempt} on this node (attempts: {have})"
            )
        if request.offset < 0 or request.tail_lines < 0:
            raise InvalidArgument("offset and tail_lines must not be negative")
        mine = self._follow(who) if request.follow else None
        try:
            yield from self._stream_log(request, path, attempt, sorted(logs), context)
        finally:
            if mine is not None:
                self._unfollow(mine)

    def _stream_log(
        self,
        request: agent_pb2.ReadLogRequest,
        path: Path,
        attempt: int,
        attempts: list[int],
        context: grpc.ServicerContext,
    ) -> Iterator[agent_pb2.LogChunk]:
        procs = self.agent.procs
        with open(path, "rb") as f:
            offset = (
                tail_offset(path, int(request.tail_lines)) if request.tail_lines > 0 else int(request.offset)
            )
            f.seek(offset)
            first = True
            while context.is_active():
                # whether the log may still grow is asked before reading, so that what the
                # process wrote before it exited is read after the last check
                growing = request.follow and procs.is_running(request.job_id, attempt)
                data = f.read(_LOG_CHUNK)
                if data or first:
                    yield agent_pb2.LogChunk(
                        attempt=attempt, offset=offset, data=data, attempts=attempts if first else []
                    )
                    offset += len(data)
                    first = False
                    continue
                if not growing:
                    return
                time.sleep(_FOLLOW_POLL_S)


class NodeAgent:
    """One host's agent: devices, processes, and the node record in etcd."""

    def __init__(
        self,
        kv: KV,
        node: str,
        data_dir: str,
        *,
        virtual_devices: int | None = None,
        checkpoint_root: str | None = None,
        lease_ttl_s: int = 10,
        labels: dict[str, str] | None = None,
        instance_id: str = "",
        preload: list[str] | None = None,
        platform_env: dict[str, str] | None = None,
        run_as: JobUser | None = None,
    ) -> None:
        self.kv, self.node, self.lease_ttl_s = kv, node, lease_ttl_s
        self.labels = dict(labels or {})
        self.instance_id = instance_id or f"{node}-{int(time.time() * 1000)}"
        self.devices = discover_devices(node, virtual_devices)
        self.procs = ProcessManager(
            data_dir,
            self.devices,
            checkpoint_root,
            preload=preload,
            platform_env={"MICROCO_NODE": node, **(platform_env or {})},
            run_as=run_as,
        )
        self.address = ""
        # The node record lives under the agent's lease; cut off from etcd, the agent stops
        # its jobs before that lease can expire (fencing, see _fence) and refuses new ones.
        self._leased = FencedLease(kv, self.key, lambda: dumps(self.record()), lease_ttl_s, self._fence_jobs)
        self.procs.gate = self._check_not_fenced
        if self.procs.zygote is not None:
            threading.Thread(target=self._advertise_warm, name="zygote-watch", daemon=True).start()

    def preloaded(self) -> list[str]:
        z = self.procs.zygote
        return list(z.info.get("preloaded", [])) if z is not None and z.ready.is_set() else []

    def _advertise_warm(self) -> None:
        """Once the zygote is warm, say so in the node record (benchmarks and tools wait on it)."""
        z = self.procs.zygote
        assert z is not None
        if z.ready.wait(600) and self.address:
            try:
                self._leased.refresh_value()
            except Exception as exc:  # noqa: BLE001 - advisory only
                log.warning("could not advertise the warm zygote: %s", exc)

    @property
    def key(self) -> str:
        return NODES_PREFIX + self.node

    @property
    def fenced(self) -> bool:
        return self._leased.fenced

    def _check_not_fenced(self) -> None:
        if self._leased.fenced:
            raise Unavailable(
                f"node {self.node} is fenced: it lost its etcd lease, and starts no job until it is "
                "registered again (its jobs may already run elsewhere)"
            )

    def _fence_jobs(self) -> None:
        """Stop every job now (SIGTERM, SIGKILL after a short grace): the scheduler may start
        them elsewhere once the lease expires. Repeated until none is left, so a start that
        passed the gate just before the fence is stopped too."""
        for _ in range(5):
            live = [p for p in self.procs.list() if p.exit_code is None]
            if not live:
                return
            try:
                # all at once, killed before the lease can expire however late the fence came
                self.procs.stop_all(live, self._leased.kill_grace(min(1.0, 0.2 * self.lease_ttl_s)))
            except Exception:
                log.exception("fence: stopping %s", [p.job_id for p in live])
            time.sleep(0.05)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.node,
            "address": self.address,
            "instance_id": self.instance_id,
            "devices": [d.to_dict() for d in self.devices],
            "labels": self.labels,
            "registered_at": time.time(),
            # the id of the lease the record is under: a new one after every fence
            "epoch": self._leased.epoch if hasattr(self, "_leased") else 0,
            "preloaded": self.preloaded(),
        }

    def node_proto(self) -> agent_pb2.Node:
        return agent_pb2.Node(
            name=self.node,
            address=self.address,
            instance_id=self.instance_id,
            devices=[device_to_proto(d) for d in self.devices],
            labels=self.labels,
            preloaded=self.preloaded(),
        )

    def register(self, address: str) -> None:
        """Advertise the node and its devices under a lease kept alive in the background."""
        self.address = address
        self._leased.start()
        log.info("node registered", extra={"node": self.node, "devices": [d.id for d in self.devices]})

    def close(self, stop_jobs: bool = True) -> None:
        self._leased.stop()
        if stop_jobs:
            self.procs.shutdown()

    def attach(self, runtime: ServiceRuntime) -> None:
        runtime.add_service(
            agent_pb2_grpc.add_NodeAgentServiceServicer_to_server,
            NodeAgentServicer(self),
            agent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name,
        )
        runtime.on_stop(self.close)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("node agent")
    g.add_argument(
        "--virtual-devices",
        "--devices",
        dest="virtual_devices",
        type=int,
        default=0,
        help="offer this many virtual devices (a CPU share each) instead of GPUs; "
        "0: the GPUs, or one virtual device per core when there are none",
    )
    g.add_argument(
        "--checkpoint-root",
        default="",
        help="where job checkpoints go (shared by every node for migration); default <data-dir>/checkpoints",
    )
    g.add_argument(
        "--node-lease-ttl-s",
        type=int,
        default=int(os.environ.get("MICROCO_NODE_LEASE_TTL_S", "10")),
        help="TTL of the node's etcd lease (default 10, env MICROCO_NODE_LEASE_TTL_S): the scheduler "
        "declares the node lost (and restarts its jobs elsewhere) this long after its last keep-alive; "
        "the agent stops its own jobs at 3/4 of it without a confirmed keep-alive (fencing). Longer "
        "rides out etcd pauses and a loaded machine; shorter moves a dead host's jobs sooner",
    )
    g.add_argument(
        "--preload",
        default="auto",
        help="modules a warm zygote imports once so Python jobs start by fork in milliseconds "
        "(comma-separated; 'auto': numpy and torch when installed; 'none': start every job by exec)",
    )
    g.add_argument(
        "--run-as",
        default=os.environ.get(ENV_RUN_AS, "auto"),
        help="the user jobs run as, apart from the agent so that a job cannot read the agent's key: "
        f"'auto' (as root: the user {JOB_USER_NAME}, else uid/gid {DEFAULT_JOB_UID}; otherwise the "
        "agent's own user, with a warning), 'self' (the agent's own user), a user name, or uid[:gid] "
        f"(env {ENV_RUN_AS})",
    )


def setup(ctx: ServiceContext) -> None:
    s = ctx.settings
    if ctx.args.virtual_devices < 0:
        raise InvalidArgument("--virtual-devices must be >= 0")
    if ctx.args.node_lease_ttl_s < 1:
        raise InvalidArgument("--node-lease-ttl-s must be at least 1")
    run_as = resolve_run_as(ctx.args.run_as)
    data_dir = s.resolved_data_dir()
    if run_as is not None:
        ckpt = Path(ctx.args.checkpoint_root) if ctx.args.checkpoint_root else data_dir / "checkpoints"
        stop = blocked(run_as, [Path(sys.executable), data_dir, ckpt], [data_dir, ckpt])
        if stop and ctx.args.run_as.strip() == "auto":
            log.warning(
                "cannot run jobs as %s: it may not pass %s (the platform's interpreter %s, the data "
                "directory and the checkpoints must be reachable to it)",
                run_as,
                stop,
                sys.executable,
            )
            run_as = None
        elif stop:
            raise InvalidArgument(f"--run-as {ctx.args.run_as}: {run_as} may not pass {stop}")
    warn_if_shared(run_as, os.environ.get("MICROCO_CREDENTIALS", ""))
    agent = NodeAgent(
        ctx.kv,
        s.node,
        str(data_dir),
        virtual_devices=ctx.args.virtual_devices or None,
        checkpoint_root=ctx.args.checkpoint_root or None,
        lease_ttl_s=ctx.args.node_lease_ttl_s,
        labels=s.labels,
        instance_id=s.instance_id,
        preload=parse_preload(ctx.args.preload),
        platform_env={
            "MICROCO_ETCD": s.etcd,
            "MICROCO_REDIS": s.redis,
            # Redis's job user, in the environment: a job as another user cannot read the file
            ENV_REDIS_PASSWORD: (redis_password() or "") if s.redis else "",
            ENV_REDIS_USER: os.environ.get(ENV_REDIS_USER, ""),
        },
        run_as=run_as,
    )
    agent.attach(ctx.runtime)
    # Register the node once the server is bound (the address includes the chosen port).
    ctx.runtime.on_start(lambda rt: agent.register(rt.address))
