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


def test_redis_with_a_password_refuses_anyone_without_it(tmp_path, monkeypatch):
    import redis

    from microco.common.hotstate import ENV_REDIS_PASSWORD, connect_redis
    from microco.services.stack import RedisServer

    server = RedisServer(tmp_path / "redis", password="pw-for-the-test").start()
    try:
        assert "pw-for-the-test" not in " ".join(server.command())  # never on the command line
        anonymous = redis.Redis.from_url(server.url, socket_timeout=5)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("k", "v")
        monkeypatch.setenv(ENV_REDIS_PASSWORD, "pw-for-the-test")
        client = connect_redis(server.url)
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        server.stop()
    assert "--protected-mode" in (cmd := server.command()) and cmd[cmd.index("--protected-mode") + 1] == "yes"


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
