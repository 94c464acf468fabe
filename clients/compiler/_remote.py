"""The typed client of the compiler service, usable as an :class:`Explorer`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import grpc

from microco.api.compiler.v1 import compiler_pb2 as pb
from microco.api.compiler.v1 import compiler_pb2_grpc as pb_grpc
from microco.clients.compiler.explore.types import Config, GraphSpec, TrialReport
from microco.common import ServiceClient, Unavailable, dial

from .explore import wire


def _dial_own(address: str) -> grpc.Channel:
    """A channel with its own subchannels. gRPC shares subchannels between channels to the same
    target by default, so a "fresh" channel to a restarted service would inherit the dead one's
    reconnect backoff (up to minutes) and keep failing."""
    return dial(address, options=[("grpc.max_reconnect_backoff_ms", 2000)])


class RemoteExplorer(ServiceClient):
    """One method per RPC. Deadlines are short by default: a training step must never wait long
    on the compiler (a lost service only means the current configuration stays in force)."""

    service_name = "compiler"

    def __init__(self, channel: Any, default_timeout: float = 2.0) -> None:
        super().__init__(channel, default_timeout)
        self._stub = pb_grpc.CompilerServiceStub(channel)  # type: ignore[no-untyped-call]
        self._redial: Callable[[], Any] | None = None

    @classmethod
    def from_address(cls, address: str, default_timeout: float = 2.0) -> RemoteExplorer:
        client = cls(_dial_own(address), default_timeout)
        client._redial = lambda: _dial_own(address)
        return client

    @classmethod
    def from_etcd(cls, kv: Any = None, default_timeout: float = 2.0) -> RemoteExplorer:
        """Find the service through etcd (and again after losing it: a restarted service may move).
        ``kv`` None: the platform's etcd as every client finds it (``MICROCO_ETCD``, then the local stack)."""
        if kv is None:
            from microco.common import connect_etcd

            kv = connect_etcd()

        def dial_discovered() -> Any:
            from microco.common.channel import pick_instance

            return _dial_own(pick_instance(kv, cls.service_name, prefer_leader=False).address)

        client = cls(dial_discovered(), default_timeout)
        client._redial = dial_discovered
        return client

    def _reconnect(self) -> None:
        """A fresh channel: an old one backs off for up to minutes after its server died."""
        if self._redial is None:
            return
        old: Any = getattr(self, "_channel")  # noqa: B009 - the base class types it loosely
        channel = self._redial()
        old.close()
        self._channel, self._stub = channel, pb_grpc.CompilerServiceStub(channel)  # type: ignore[no-untyped-call]

    def register(self, spec: GraphSpec, *, timeout: float | None = None) -> Config:
        """Start or resume an exploration. On UNAVAILABLE, re-dials once (rediscovering the service
        through etcd when built with :meth:`from_etcd`): this is how a client that lost the
        service finds it again."""
        req = wire.spec_to_proto(spec)
        # The scheduler's job this process runs as (the node agent sets it): the service keeps it
        # with the graph, which is how the console links a job to its configuration.
        req.job_id = os.environ.get("MICROCO_JOB_ID", "")
        try:
            m = self._call(self._stub.RegisterGraph, req, timeout=timeout, idempotent=True)
        except Unavailable:
            self._reconnect()
            m = self._call(self._stub.RegisterGraph, req, timeout=timeout, idempotent=True)
        return wire.config_from_proto(m)

    def next_config(self, key: str, *, timeout: float | None = None) -> Config:
        m = self._call(self._stub.NextConfig, pb.NextConfigRequest(key=key), timeout=timeout, idempotent=True)
        return wire.config_from_proto(m)

    def report(self, key: str, report: TrialReport, *, timeout: float | None = None) -> Config:
        # Idempotent: the service ignores a report for a trial no longer in flight.
        req = wire.report_to_proto(key, report)
        return wire.config_from_proto(
            self._call(self._stub.ReportTimings, req, timeout=timeout, idempotent=True)
        )

    def get_graph(self, key: str, *, timeout: float | None = None) -> pb.GraphState:
        state: pb.GraphState = self._call(
            self._stub.GetGraph, pb.GetGraphRequest(key=key), timeout=timeout, idempotent=True
        )
        return state

    def list_graphs(self, *, timeout: float | None = None) -> list[pb.GraphState]:
        resp = self._call(self._stub.ListGraphs, pb.ListGraphsRequest(), timeout=timeout, idempotent=True)
        return list(resp.graphs)
