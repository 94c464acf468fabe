"""Prometheus metrics shared by every service. Metric objects are module-level (one registry per
process); services add their own beside these with the ``microco_<system>_`` prefix."""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

RPC_REQUESTS = Counter(
    "microco_rpc_requests_total",
    "gRPC calls served, by method and status code",
    ["service", "method", "code"],
)
RPC_LATENCY = Histogram(
    "microco_rpc_latency_seconds",
    "gRPC call latency",
    ["service", "method"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
RPC_IN_FLIGHT = Gauge("microco_rpc_in_flight", "gRPC calls in progress", ["service"])
SERVICE_UP = Gauge("microco_service_up", "1 while the service is serving", ["service", "instance"])


def serve_metrics(host: str, port: int) -> tuple[object, int]:
    """Start the /metrics HTTP endpoint; returns (server, bound port)."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server, server.server_port
