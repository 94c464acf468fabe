"""The scheduler service: gRPC adapter over ``SchedulerCore`` plus leader election.

Every instance serves the API (records live in etcd); the elected leader alone runs the
control loop. A standby campaigns continuously and takes over within one lease TTL of the
leader's death; the new leader rebuilds everything from etcd and the agents' process lists,
so running jobs keep running and queued jobs stay queued.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any

import grpc

from microco.api.common.v1 import common_pb2
from microco.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from microco.common.election import LeaderElection
from microco.common.errors import InvalidArgument
from microco.common.kv import KV
from microco.services.runtime.auth import caller
from microco.services.runtime.server import ServiceContext, ServiceRuntime

from . import _authz as A
from . import _jobs as J
from . import _metrics as M
from ._core import SchedulerCore
from .policy import available_policies, make_policy, policy_config_type

log = logging.getLogger(__name__)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self,
        core: SchedulerCore,
        election: LeaderElection | None,
        policy_name: str,
        policy_settings: str = "",
    ) -> None:
        self.core, self.election, self.policy_name = core, election, policy_name
        self.policy_settings = policy_settings

    def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest, context: grpc.ServicerContext) -> Any:
        if not request.HasField("spec"):
            raise InvalidArgument("spec is required")
        return J.record_to_pb(self.core.submit(A.owned_spec(caller(context), J.spec_from_pb(request.spec))))

    def GetJob(self, request: scheduler_pb2.GetJobRequest, context: grpc.ServicerContext) -> Any:
        rec = self.core.get(request.job_id)
        who = caller(context)
        A.check_job(who, rec, "read")
        job = J.record_to_pb(rec)
        return job if A.sees_secrets(who, rec) else A.redact(job)

    def ListJobs(self, request: scheduler_pb2.ListJobsRequest, context: grpc.ServicerContext) -> Any:
        states = [J.state_from_pb(s) for s in request.states]
        who = caller(context)
        recs = [r for r in self.core.list_jobs(states, request.owner) if A.visible(who, r)]
        return scheduler_pb2.ListJobsResponse(jobs=[A.redact(J.record_to_pb(r)) for r in recs])

    def CancelJob(self, request: scheduler_pb2.CancelJobRequest, context: grpc.ServicerContext) -> Any:
        A.check_job(caller(context), self.core.get(request.job_id), "cancel")
        return J.record_to_pb(self.core.cancel(request.job_id))

    def ControlJob(self, request: scheduler_pb2.ControlJobRequest, context: grpc.ServicerContext) -> Any:
        A.check_job(caller(context), self.core.get(request.job_id), "control")
        return J.record_to_pb(
            self.core.control(request.job_id, request.action, list(request.devices), request.device_count)
        )

    def WatchJobs(self, request: scheduler_pb2.WatchJobsRequest, context: grpc.ServicerContext) -> Any:
        who = caller(context)
        for rec in self.core.watch(list(request.job_ids), context.is_active):
            if not A.visible(who, rec):
                continue
            # a list call: secret-looking values redacted for everyone, as ListJobs
            yield scheduler_pb2.JobEvent(job=A.redact(J.record_to_pb(rec)), at=time.time())

    def ListNodes(self, request: Any, context: grpc.ServicerContext) -> Any:
        devices = [
            common_pb2.Device(
                id=d["id"],
                node=d["node"],
                index=d.get("index", 0),
                kind=d.get("kind", ""),
                model=d.get("model", ""),
                memory_bytes=d.get("memory_bytes", 0),
            )
            for d in self.core.cluster_devices()
        ]
        leader = self.election.leader() if self.election else ""
        return scheduler_pb2.ListNodesResponse(
            devices=devices,
            leader=leader or "",
            policy=self.policy_name,
            policy_settings_json=self.policy_settings,
        )


class Scheduler:
    """One scheduler instance: core, election, control loop."""

    def __init__(
        self,
        kv: KV,
        instance_id: str,
        policy: str = "gandiva",
        policy_config: dict[str, Any] | None = None,
        tick_s: float = 0.5,
        lease_ttl_s: int = 5,
        op_wait_s: float = 3.0,
        failed_retention_s: float = 86400.0,
        gc_interval_s: float = 60.0,
        log_retention_s: float = 86400.0,
        hook_grace_s: float = 120.0,
        warm_wait_s: float = 5.0,
    ) -> None:
        self.policy_name = policy
        self.election = LeaderElection(
            kv, "scheduler", instance_id, ttl=lease_ttl_s, on_elected=self._elected, on_lost=self._lost
        )
        config = dict(policy_config or {})
        fields = {f.name for f in dataclasses.fields(policy_config_type(policy))}
        if "allow_spread" in fields:
            # Off unless asked for: a spread job runs one process per node and must support it
            # (``init_distributed`` in the torch hook); see docs/scheduler.md.
            config.setdefault("allow_spread", False)
        chosen = make_policy(policy, **config)
        settings = getattr(chosen, "config", None)
        # What the console shows: every setting in force, defaults included.
        self.policy_settings = ""
        if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
            values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
            self.policy_settings = json.dumps(values, sort_keys=True, default=str)
        self.core = SchedulerCore(
            kv,
            chosen,
            op_wait_s=op_wait_s,
            is_leader=lambda: self.election.is_leader,
            failed_retention_s=failed_retention_s,
            gc_interval_s=gc_interval_s,
            allow_spread=bool(config.get("allow_spread", False)),
            log_retention_s=log_retention_s,
            hook_grace_s=hook_grace_s,
            warm_wait_s=warm_wait_s,
        )
        self.tick_s = tick_s
        self.runtime: ServiceRuntime | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler-loop", daemon=True)

    def _elected(self) -> None:
        log.info("leading: taking over the control loop")
        M.IS_LEADER.set(1)
        self.core._last_tick = None
        self._advertise_role()

    def _lost(self) -> None:
        log.warning("no longer the leader")
        M.IS_LEADER.set(0)
        if not self._stop.is_set():
            self._advertise_role()

    def _advertise_role(self) -> None:
        """``role=leader|standby`` on this instance's registration (the console picks by it),
        read from the election now; kept for a registration made after the election was won."""
        if self.runtime is not None:
            self.runtime.advertise(role="leader" if self.election.is_leader else "standby")

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.election.is_leader:
                try:
                    self.core.tick()
                except Exception:  # one bad tick must not end scheduling
                    log.exception("scheduler tick failed")
            self._stop.wait(self.tick_s)

    def attach(self, runtime: ServiceRuntime) -> None:
        self.runtime = runtime
        self._advertise_role()
        runtime.add_service(
            scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
            SchedulerServicer(self.core, self.election, self.policy_name, self.policy_settings),
            scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
        )
        runtime.on_stop(self.stop)

    def start(self) -> Scheduler:
        self.election.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.election.resign()
        self.core.agents.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("scheduler")
    g.add_argument(
        "--policy", default="gandiva", help=f"scheduling policy, one of {', '.join(available_policies())}"
    )
    g.add_argument(
        "--policy-config",
        default="{}",
        help='policy settings as JSON, e.g. \'{"quantum_s": 10, "enable_packing": false}\', '
        "or a JSON file (@FILE, or FILE)",
    )
    g.add_argument("--tick-s", type=float, default=0.5, help="seconds between control-loop ticks")
    g.add_argument(
        "--op-wait-s",
        type=float,
        default=3.0,
        help="how long a tick waits for a job to reach its mini-batch boundary on suspend/migrate",
    )
    g.add_argument(
        "--failed-retention-s",
        type=float,
        default=86400.0,
        help="keep a failed job's checkpoints and logs on the nodes this long, for inspection "
        "(finished and cancelled jobs' checkpoints are deleted at once)",
    )
    g.add_argument(
        "--log-retention-s",
        type=float,
        default=86400.0,
        help="keep an ended job's logs on the nodes this long (`microco job logs`)",
    )
    g.add_argument(
        "--hook-grace-s",
        type=float,
        default=120.0,
        help="a job whose process has not reported through the scheduler's hook this long after "
        "its start is shown and treated as not preemptible",
    )
    g.add_argument(
        "--cache-warm-wait-s",
        type=float,
        default=5.0,
        help="a job migrated to another node restarts there once that node's cache server "
        "reports its working set warm, or this long after its checkpoint (0: at once)",
    )
    g.add_argument(
        "--gc-interval-s",
        type=float,
        default=60.0,
        help="how often the leader asks the nodes to delete data of jobs that need none "
        "(also at once whenever a job ends)",
    )


def load_policy_config(value: str) -> dict[str, Any]:
    """``--policy-config``: JSON text, or the path of a JSON file (``@path`` or a path that
    exists); a clear error for anything else."""
    text, source = value, "--policy-config"
    path = value.removeprefix("@")
    if value.startswith("@") or (not value.lstrip().startswith("{") and os.path.isfile(path)):
        try:
            with open(path) as f:
                text, source = f.read(), f"policy config file {path}"
        except OSError as exc:
            raise InvalidArgument(f"cannot read policy config file {path}: {exc.strerror or exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{source} is not JSON (nor a file that exists): {exc}") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"{source} must be a JSON object of policy settings")
    return config


def setup(ctx: ServiceContext) -> None:
    args = ctx.args
    if args.policy not in available_policies():
        raise InvalidArgument(f"unknown policy {args.policy!r}; available: {', '.join(available_policies())}")
    config = load_policy_config(args.policy_config)
    if args.tick_s <= 0:
        raise InvalidArgument("--tick-s must be > 0")
    if args.hook_grace_s <= 0:
        raise InvalidArgument("--hook-grace-s must be > 0")
    if args.cache_warm_wait_s < 0:
        raise InvalidArgument("--cache-warm-wait-s must be >= 0")
    if args.failed_retention_s < 0 or args.log_retention_s < 0 or args.gc_interval_s <= 0:
        raise InvalidArgument(
            "--failed-retention-s and --log-retention-s must be >= 0 and --gc-interval-s > 0"
        )
    try:
        sched = Scheduler(
            ctx.kv,
            ctx.settings.instance_id,
            args.policy,
            config,
            args.tick_s,
            ctx.settings.lease_ttl_s,
            args.op_wait_s,
            args.failed_retention_s,
            args.gc_interval_s,
            args.log_retention_s,
            hook_grace_s=args.hook_grace_s,
            warm_wait_s=args.cache_warm_wait_s,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"bad policy config for {args.policy}: {exc}") from None
    sched.attach(ctx.runtime)
    sched.start()
