"""Prometheus metrics shared by every service. Metric objects are module-level (one registry per
process); services add their own beside these with the ``microco_<system>_`` prefix."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_wsgi_app

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


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6  # a host like "::" (prometheus_client's server did the same)


#: A connection to the metrics port that sends no complete request within this many seconds is
#: closed. The port is plain HTTP for any local process (a job's too), and each connection holds
#: a thread: idle ones were held for ever (session 40: 300 idle connections, 300 threads).
IDLE_TIMEOUT_S = 10.0


class _Quiet(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # probes every few seconds would flood the service's log


def health_app(ready: Callable[[], bool]) -> Callable[..., Iterable[bytes]]:
    """The metrics port's WSGI app: ``/metrics`` (Prometheus), ``/healthz`` (liveness: 200 while
    the process answers) and ``/readyz`` (200 while ``ready()``, else 503). Plain HTTP and no
    token, like /metrics: what an orchestrator's probe can reach (the kubelet's gRPC probe
    cannot present the client certificate the gRPC port requires); nothing here is secret."""
    prometheus = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            if ready():
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ready\n"]
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"not ready\n"]
        return prometheus(environ, start_response)  # type: ignore[no-any-return]

    return app


def serve_metrics(
    host: str, port: int, ready: Callable[[], bool] = lambda: True, idle_timeout_s: float = IDLE_TIMEOUT_S
) -> tuple[Any, int]:
    """Start the HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``) in a daemon thread;
    returns (server, bound port). A connection idle for ``idle_timeout_s`` is closed."""
    server_class = _Server6 if ":" in host else _Server
    handler = type("_QuietHandler", (_Quiet,), {"timeout": idle_timeout_s})
    server = make_server(host, port, health_app(ready), server_class, handler_class=handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server, server.server_port
