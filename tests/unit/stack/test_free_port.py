"""``free_port`` hands out ports below the kernel's ephemeral range, so a port it returns is never
one the kernel gives a server binding port 0 (CI, session 37: a store node's Flight server bound
port 0, another test's server then bound the same port from ``free_port`` with SO_REUSEPORT, and
the first server's client was refused)."""

from __future__ import annotations

import socket

from microco.services.stack import _servers


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low = _servers._ephemeral_low()
    for _ in range(20):
        port = _servers.free_port()
        assert port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free when handed out


def test_a_server_on_port_0_never_gets_a_port_free_port_hands_out():
    taken = {_servers.free_port() for _ in range(50)}
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            assert s.getsockname()[1] not in taken


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(_servers, "_ephemeral_low", lambda: 1500)
    port = _servers.free_port()
    assert port >= 1024
