"""The insecure development flag (the only way to plaintext) and the stack's Redis password."""

from __future__ import annotations

import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from microco.common import identity

pytestmark = pytest.mark.integration


def test_insecure_flag_serves_plaintext_and_says_so(monkeypatch, caplog):
    from microco.services.runtime import ServiceRuntime, ServiceSettings
    from microco.services.runtime.auth import INSECURE, caller

    monkeypatch.setenv(identity.ENV_INSECURE, "1")
    monkeypatch.setattr(identity, "_warned", False)
    seen = []

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(caller(context))
        return b""

    def add(handler, server):
        rpc = grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=bytes, response_serializer=bytes
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Who", {"Who": rpc}),))

    with caplog.at_level(logging.WARNING):
        rt = ServiceRuntime(ServiceSettings(name="devflag", metrics_port=-1))
        rt.add_service(add, who, "test.Who")
        rt.start(register=False)
    try:
        with grpc.insecure_channel(rt.address) as ch:
            ch.unary_unary("/test.Who/Who")(b"", timeout=10)
    finally:
        rt.stop(grace=0)
    assert seen == [INSECURE] and INSECURE.trusted
    text = caplog.text
    assert "INSECURE MODE" in text and "WITHOUT TLS" in text


def test_secure_by_default_plaintext_is_refused(monkeypatch):
    from microco.services.runtime import ServiceRuntime, ServiceSettings

    monkeypatch.delenv(identity.ENV_INSECURE, raising=False)
    rt = ServiceRuntime(ServiceSettings(name="secure", metrics_port=-1)).start(register=False)
    try:
        assert rt.identity is not None and rt.identity.name == "service:secure"
        with grpc.insecure_channel(rt.address) as ch, pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        rt.stop(grace=0)


def test_redis_serves_mutual_tls_and_the_password_only(tmp_path, monkeypatch):
    """The stack's Redis: redis-server on a private unix socket, a TLS front on the port. A
    client without a certificate (or in plaintext) is refused in the handshake; one with a
    certificate of another CA too; the platform's certificate without the password gets no
    data; with both it works, and `microco status` reports Redis SERVING over TLS."""
    import os
    import signal
    import socket
    import ssl
    import time
    from pathlib import Path

    import redis

    from microco.cli._platform import _redis_row
    from microco.common.hotstate import ENV_REDIS_PASSWORD, connect_redis, redis_tls_options
    from microco.common.identity import CertificateAuthority
    from microco.services.stack import RedisServer

    server = RedisServer(tmp_path / "redis", password="pw-for-the-test").start()
    try:
        assert server.url.startswith("rediss://")
        assert "pw-for-the-test" not in " ".join(server.command())  # never on the command line
        assert server.socket_path.parent.stat().st_mode & 0o077 == 0  # the socket: the owner's only
        refused = (redis.ConnectionError, ssl.SSLError, OSError)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kw = {"password": "pw-for-the-test", "socket_timeout": 5, "retry": Retry(NoBackoff(), 0)}
        with pytest.raises(refused):  # TLS, no client certificate
            redis.Redis.from_url(server.url, ssl_cert_reqs="none", **kw).ping()
        with socket.create_connection((server.host, server.port), timeout=10) as plain:  # plaintext
            plain.sendall(b"*1\r\n$4\r\nPING\r\n")
            assert b"PONG" not in plain.recv(100)  # closed without an answer
        other = CertificateAuthority.create().issue("user:root", admin=True)
        monkeypatch.setattr(identity, "_used", other)
        with pytest.raises(refused):  # a certificate of another CA
            redis.Redis.from_url(
                server.url, **{**kw, **redis_tls_options(server.url), "ssl_cert_reqs": "none"}
            ).ping()
        monkeypatch.setattr(identity, "_used", None)
        monkeypatch.delenv(ENV_REDIS_PASSWORD, raising=False)
        no_password = redis.Redis.from_url(server.url, socket_timeout=5, **redis_tls_options(server.url))
        with pytest.raises(redis.AuthenticationError):
            no_password.set("k", "v")
        monkeypatch.setenv(ENV_REDIS_PASSWORD, "pw-for-the-test")
        client = connect_redis(server.url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        home = tmp_path / "home"
        (home / "pki").mkdir(parents=True)
        (home / "pki" / "redis.password").write_text("pw-for-the-test\n")
        assert _redis_row(server.url, home)["health"] == "SERVING"
        (home / "pki" / "redis.password").write_text("wrong\n")
        assert _redis_row(server.url, home)["health"] == "UNREACHABLE"
        # the supervisor's one process: redis-server dies with its front (SIGKILL leaves no orphan)
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        assert len(children) == 1
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(10)

        def running() -> bool:  # a zombie (dead, not yet reaped by its new parent) is not
            try:
                return Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        deadline = time.monotonic() + 30
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(), "redis-server outlived its TLS front"
    finally:
        server.stop()
    cmd = server.command()
    assert "--protected-mode" in cmd and cmd[cmd.index("--protected-mode") + 1] == "yes"
    assert cmd[cmd.index("--port") + 1] == "0" and "--unixsocket" in cmd  # no TCP port of its own


def test_etcd_refuses_clients_without_the_platforms_certificate(etcd_endpoint, monkeypatch):
    from microco.common.errors import Unavailable
    from microco.common.identity import CertificateAuthority
    from microco.common.kv import EtcdKV

    EtcdKV(etcd_endpoint, timeout=5).close()  # the tests' administrator is let in
    monkeypatch.setattr(identity, "_used", CertificateAuthority.create().issue("user:root", admin=True))
    with pytest.raises(Unavailable):
        EtcdKV(etcd_endpoint, timeout=2)  # a certificate of another CA
    monkeypatch.setattr(identity, "_used", None)
    monkeypatch.setenv(identity.ENV_INSECURE, "1")
    with pytest.raises(Unavailable):
        EtcdKV(etcd_endpoint, timeout=2)  # plaintext


def test_the_redis_tls_front_forwards_bytes_faithfully_and_refuses_what_it_must(tmp_path):
    """The TLS front alone, before an echo server on a unix socket: three clients at once each
    get 1 MiB back byte for byte (back-pressure both ways); a client without a certificate gets
    nothing; with the server away a client's connection is closed."""
    import asyncio
    import os
    import ssl

    from microco.common.identity import CertificateAuthority
    from microco.services.stack import free_port
    from microco.services.stack._redis_tls import serve, server_context

    ca = CertificateAuthority.create()
    files = {}
    for name, ident in (
        ("server", ca.issue("service:redis", hosts=("127.0.0.1",))),
        ("client", ca.issue("service:cache")),
    ):
        for part in ("cert", "key"):
            files[f"{name}-{part}"] = tmp_path / f"{name}-{part}.pem"
            files[f"{name}-{part}"].write_bytes(getattr(ident, f"{part}_pem"))
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    sock, port = tmp_path / "echo.sock", free_port()
    good = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    good.load_cert_chain(files["client-cert"], files["client-key"])
    no_cert = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1 << 16):
            w.write(data)
            await w.drain()
        w.close()

    async def round_trip(size: int) -> bool:
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=good, server_hostname="127.0.0.1")
        payload = os.urandom(size)

        async def send() -> None:
            w.write(payload)
            await w.drain()

        sender = asyncio.ensure_future(send())
        got = bytearray()
        while len(got) < size and (chunk := await r.read(1 << 20)):
            got += chunk
        await sender
        w.close()
        return bytes(got) == payload

    async def answered(ctx: ssl.SSLContext) -> bytes:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
            w.write(b"PING\r\n")
            await w.drain()
            return await asyncio.wait_for(r.read(10), 10)
        except (ssl.SSLError, ConnectionError):
            return b""

    async def main() -> None:
        unix = await asyncio.start_unix_server(echo, str(sock))
        stop = asyncio.Event()
        ctx = server_context(str(files["server-cert"]), str(files["server-key"]), str(tmp_path / "ca.pem"))
        front = asyncio.ensure_future(serve("127.0.0.1", port, str(sock), ctx, stop))
        for _ in range(200):
            if await answered(good):
                break
            await asyncio.sleep(0.05)
        assert all(await asyncio.gather(*(round_trip(1 << 20) for _ in range(3))))
        assert await answered(no_cert) == b""
        unix.close()
        await unix.wait_closed()
        sock.unlink(missing_ok=True)
        assert await answered(good) == b""  # nothing behind it: closed, no answer
        stop.set()
        await front

    asyncio.run(main())
