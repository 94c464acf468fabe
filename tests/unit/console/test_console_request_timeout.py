"""The console's HTTP port closes a connection whose request does not arrive whole in time
(session 41's held-out round). It is the one port of a deployment published outside it
(Kubernetes' NetworkPolicy lets the world reach it), and uvicorn waits for a request's headers
for ever: connections that sent part of a request, or nothing, stayed open (40 s and counting),
each a file descriptor, so a few thousand of them, from anyone, without a token, would leave the
console none for its users. A request must now arrive within ``REQUEST_TIMEOUT_S``; a request
being answered, and a connection kept alive between requests (uvicorn's own 5 s), are as before."""

from __future__ import annotations

import socket
import time

from microco.common.kv import MemoryKV
from microco.services.console._config import ConsoleConfig
from microco.services.console._limits import REQUEST_TIMEOUT_S
from microco.services.console._server import ConsoleServer


def _closed(s: socket.socket) -> bool:
    """Whether the server closes ``s`` (an open one raises this side's 30 s timeout instead)."""
    try:
        data = s.recv(4096)
        while data and not data.endswith(b"}"):  # the rest of an answer
            data = s.recv(4096)
        return s.recv(4096) == b"" if data else True
    except ConnectionResetError:
        return True


def _answer(s: socket.socket) -> bytes:
    """One whole HTTP answer: its headers, then the body their Content-Length gives (a recv may
    return the headers alone; the body left behind was read as the next request's answer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        ),
        0,
    )
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_request_that_does_not_arrive_in_time_is_closed():
    assert 0 < REQUEST_TIMEOUT_S <= 30
    server = ConsoleServer(
        ConsoleConfig(http_port=0), MemoryKV(), register=False, request_timeout_s=1.0
    ).start_background()
    addr = ("127.0.0.1", server.port)
    try:
        nothing = socket.create_connection(addr, timeout=30)
        partial = socket.create_connection(addr, timeout=30)
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: console\r\n")  # and no end of headers
        body = socket.create_connection(addr, timeout=30)
        body.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: console\r\nContent-Length: 1000\r\n\r\n{")
        for s in (nothing, partial, body):
            assert _closed(s)
            s.close()
        # a byte at a time, never done: closed while it trickles
        with socket.create_connection(addr, timeout=30) as trickle:
            cut = False
            for c in b"GET /healthz HTTP/1.1\r\nHost: console\r\nX-Slow: " + b"a" * 400:
                try:
                    trickle.sendall(bytes([c]))
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                    break
                time.sleep(0.05)
            assert cut or _closed(trickle)
        # a whole request is answered, and the connection kept for the next one
        with socket.create_connection(addr, timeout=30) as s:
            for _ in range(2):
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: console\r\n\r\n")
                answer = _answer(s)
                assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        server.stop()
