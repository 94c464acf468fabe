"""The metrics port (plain HTTP, reachable by any local process: a job's too) closes a
connection that sends no complete request in time: each connection holds a thread, and idle ones
were held for ever (session 40's held-out round). The answers stay as they were."""

from __future__ import annotations

import socket

from microco.services.runtime import metrics


def test_an_idle_connection_to_the_metrics_port_is_closed():
    assert 0 < metrics.IDLE_TIMEOUT_S <= 30
    server, port = metrics.serve_metrics("127.0.0.1", 0, idle_timeout_s=0.5)
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=30)
        idle.sendall(b"GET /metrics HTTP/1.1\r\n")  # and nothing more
        # closed by the server: an open one would raise this side's 30 s timeout instead
        assert idle.recv(100) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.0 200")
    finally:
        server.shutdown()
        server.server_close()
