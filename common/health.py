"""Health of a registered service: the gRPC health protocol, or ``/healthz`` for HTTP services
(those registered with the label ``protocol=http``)."""

from __future__ import annotations

import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .channel import dial
from .errors import MicrocoError
from .registry import ServiceRecord


def check_health(record: ServiceRecord, timeout: float = 5.0) -> str:
    """ "SERVING", "NOT_SERVING", or "UNREACHABLE". ``timeout`` covers connecting, the mutual TLS
    handshake and the answer: seconds on a loaded machine, so a short one reports a busy, healthy
    service as unreachable."""
    if record.labels.get("protocol") == "http":
        try:
            with urllib.request.urlopen(f"http://{record.address}/healthz", timeout=timeout) as resp:
                return "SERVING" if resp.status == 200 else "NOT_SERVING"
        except OSError:
            return "UNREACHABLE"
    try:
        channel = dial(record.address)
    except MicrocoError:
        return "UNREACHABLE"
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
    except grpc.RpcError:
        return "UNREACHABLE"
    finally:
        channel.close()
