"""A gRPC port closes a connection that has not finished its TLS handshake in time (session
41's held-out round): gRPC's default waited 120 s, so anyone on the host or network (a job: it
needs no certificate to open a socket) held a file descriptor of the service per connection
that sent nothing or part of a ClientHello, 166 new ones a second enough to hold 20,000. The
handshake of a client with credentials works as before."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from microco.common.channel import dial
from microco.services.runtime import ServiceRuntime, ServiceSettings
from microco.services.runtime.server import HANDSHAKE_TIMEOUT_S

pytestmark = pytest.mark.integration


def test_a_connection_that_does_not_finish_its_handshake_is_closed():
    assert 0 < HANDSHAKE_TIMEOUT_S <= 30
    rt = ServiceRuntime(ServiceSettings(name="scheduler", metrics_port=-1), handshake_timeout_s=1.0)
    rt.start(register=False)
    try:
        nothing = socket.create_connection(("127.0.0.1", rt.port), timeout=60)
        partial = socket.create_connection(("127.0.0.1", rt.port), timeout=60)
        partial.sendall(b"\x16\x03\x01\x00\xff\x01")  # the start of a ClientHello, and no more
        for s in (nothing, partial):
            # closed by the server: an open one raises this side's 60 s timeout instead
            try:
                assert s.recv(100) == b""
            except ConnectionResetError:
                pass
            s.close()
        answer = health_pb2_grpc.HealthStub(dial(rt.address)).Check(
            health_pb2.HealthCheckRequest(), timeout=30
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError as err:
        raise AssertionError(err.details()) from None
    finally:
        rt.stop(grace=0)
