"""The gRPC servicer: a thin adapter from protobuf to :class:`CompilerCore`."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from microco.api.compiler.v1 import compiler_pb2 as pb
from microco.api.compiler.v1 import compiler_pb2_grpc as pb_grpc
from microco.clients.compiler.explore import CompilerCore, ExplorationPolicy, wire
from microco.common import InvalidArgument
from microco.services.runtime.auth import caller
from microco.services.runtime.server import ServiceContext

log = logging.getLogger(__name__)
SERVICE_NAME = "microco.api.compiler.v1.CompilerService"


class CompilerServicer(pb_grpc.CompilerServiceServicer):
    def __init__(self, core: CompilerCore) -> None:
        self.core = core

    def RegisterGraph(self, request: pb.RegisterGraphRequest, context: Any) -> pb.Config:
        try:
            spec = wire.spec_from_proto(request)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        # The job the graph runs in: a job's own certificate names it (a field naming another job
        # is ignored); a user's or a service's process may name one (``$MICROCO_JOB_ID``).
        who = caller(context)
        job_id = who.subject if who.kind == "job" else request.job_id
        cfg = self.core.register(spec, job_id=job_id)
        log.info(
            "graph registered", extra={"key": spec.key, "model": spec.model_name, "committed": cfg.committed}
        )
        return wire.config_to_proto(cfg)

    def NextConfig(self, request: pb.NextConfigRequest, context: Any) -> pb.Config:
        return wire.config_to_proto(self.core.next_config(request.key))

    def ReportTimings(self, request: pb.ReportTimingsRequest, context: Any) -> pb.Config:
        cfg = self.core.report(request.key, wire.report_from_proto(request))
        if cfg.committed:
            log.info("configuration committed", extra={"key": request.key, "values": cfg.values})
        return wire.config_to_proto(cfg)

    def GetGraph(self, request: pb.GetGraphRequest, context: Any) -> pb.GraphState:
        return wire.state_to_proto(self.core.get(request.key))

    def ListGraphs(self, request: pb.ListGraphsRequest, context: Any) -> pb.ListGraphsResponse:
        return pb.ListGraphsResponse(graphs=[wire.state_to_proto(s) for s in self.core.list()])


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
