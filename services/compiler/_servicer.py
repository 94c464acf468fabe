"""The gRPC servicer: a thin adapter from protobuf to :class:`CompilerCore`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from microco.api.compiler.v1 import compiler_pb2 as pb
from microco.api.compiler.v1 import compiler_pb2_grpc as pb_grpc
from microco.clients.compiler.explore import CompilerCore, ExplorationPolicy, wire
from microco.common import InvalidArgument, PermissionDenied
from microco.services.runtime.auth import Caller, caller, job_owner
from microco.services.runtime.server import ServiceContext

log = logging.getLogger(__name__)
SERVICE_NAME = "microco.api.compiler.v1.CompilerService"


#: Marks a graph explored for one user: appended to its hardware, so its key (a hash of
#: fingerprint, shapes and hardware) is that user's own. A user's runs (their jobs' too) explore
#: and commit in their own scope; services and administrators in the shared one. Explorations
#: were shared by graph across users, and anyone could report timings for any key: a user could
#: commit a slow configuration for another user's model (session 40).
SCOPE = "|owner="


def scope_of(state: Any) -> str:
    """The user a graph's exploration belongs to; "" for the shared (platform) scope."""
    hardware = state.spec.hardware
    return hardware.rsplit(SCOPE, 1)[1] if SCOPE in hardware else ""


class CompilerServicer(pb_grpc.CompilerServiceServicer):
    def __init__(self, core: CompilerCore) -> None:
        self.core = core

    def _owner(self, who: Caller) -> str | None:
        """The scope the caller explores in: ``None`` (shared) for a trusted caller, else its user
        (a job's owner; a job the scheduler does not know: the job itself)."""
        if who.trusted:
            return None
        if who.kind == "job":
            return job_owner(self.core.kv, who.subject) or who.name
        return who.subject

    def _check(self, who: Caller, key: str, change: bool) -> None:
        """A caller changes only the explorations of its own scope; reads its own and the shared."""
        owner = self._owner(who)
        if owner is None:
            return
        scope = scope_of(self.core.get(key))
        if scope == owner or (not change and not scope):
            return
        raise PermissionDenied(
            f"{who.name} may not {'change' if change else 'read'} graph {key[:16]}: it is "
            + (f"user {scope!r}'s" if scope else "the platform's (explored by a service or an administrator)")
        )

    def RegisterGraph(self, request: pb.RegisterGraphRequest, context: Any) -> pb.Config:
        try:
            spec = wire.spec_from_proto(request)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        # The job the graph runs in: a job's own certificate names it (a field naming another job
        # is ignored); a user's or a service's process may name one (``$MICROCO_JOB_ID``).
        who = caller(context)
        job_id = who.subject if who.kind == "job" else request.job_id
        owner = self._owner(who)
        if owner is not None:
            spec = dataclasses.replace(spec, hardware=spec.hardware + SCOPE + owner)
        cfg = self.core.register(spec, job_id=job_id)
        log.info(
            "graph registered", extra={"key": spec.key, "model": spec.model_name, "committed": cfg.committed}
        )
        return wire.config_to_proto(cfg)

    def NextConfig(self, request: pb.NextConfigRequest, context: Any) -> pb.Config:
        self._check(caller(context), request.key, change=True)
        return wire.config_to_proto(self.core.next_config(request.key))

    def ReportTimings(self, request: pb.ReportTimingsRequest, context: Any) -> pb.Config:
        self._check(caller(context), request.key, change=True)
        cfg = self.core.report(request.key, wire.report_from_proto(request))
        if cfg.committed:
            log.info("configuration committed", extra={"key": request.key, "values": cfg.values})
        return wire.config_to_proto(cfg)

    def GetGraph(self, request: pb.GetGraphRequest, context: Any) -> pb.GraphState:
        self._check(caller(context), request.key, change=False)
        return wire.state_to_proto(self.core.get(request.key))

    def ListGraphs(self, request: pb.ListGraphsRequest, context: Any) -> pb.ListGraphsResponse:
        owner = self._owner(caller(context))
        states = [s for s in self.core.list() if owner is None or scope_of(s) in ("", owner)]
        return pb.ListGraphsResponse(graphs=[wire.state_to_proto(s) for s in states])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measure-steps", type=int, default=5, help="measured mini-batches per trial (after one warm-up)"
    )
    parser.add_argument(
        "--max-explore-fraction",
        type=float,
        default=0.3,
        help="never spend more than this share of a run's steps exploring",
    )
    parser.add_argument(
        "--max-explore-cost",
        type=float,
        default=0.03,
        help="exploration may lose at most this share of a run's time at the baseline's speed "
        "(0: off; clients cut a trial at their own share, 0.03 by default)",
    )


def setup(ctx: ServiceContext) -> None:
    args = ctx.args
    if args.measure_steps < 1:
        raise InvalidArgument("--measure-steps must be at least 1")
    if not 0 < args.max_explore_fraction <= 1:
        raise InvalidArgument("--max-explore-fraction must be in (0, 1]")
    if not 0 <= args.max_explore_cost < 1:
        raise InvalidArgument("--max-explore-cost must be in [0, 1)")
    policy = ExplorationPolicy(
        measure_steps=args.measure_steps,
        max_explore_fraction=args.max_explore_fraction,
        max_explore_cost=args.max_explore_cost,
    )
    core = CompilerCore(ctx.kv, policy)
    ctx.runtime.add_service(
        pb_grpc.add_CompilerServiceServicer_to_server, CompilerServicer(core), SERVICE_NAME
    )
