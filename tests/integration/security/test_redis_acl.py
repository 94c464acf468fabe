"""Redis authorises per identity (issue 16): the stack's Redis has an ACL user for each kind of
client (common/redis_acl.py); each reaches its own keys with its own commands, none may run
another's commands, FLUSHALL or CONFIG, and the administrator (the default user) still may."""

from __future__ import annotations

import pytest
import redis

from microco.common import hotstate
from microco.common.redis_acl import ENV_REDIS_USER, ROLES, role_password, service_redis_env
from microco.services.stack import RedisServer

pytestmark = pytest.mark.integration

ADMIN = "admin-pw-for-the-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = RedisServer(tmp_path_factory.mktemp("redis-acl") / "redis", password=ADMIN).start()
    yield srv
    srv.stop()


def as_role(server, monkeypatch, role: str):
    monkeypatch.setenv(hotstate.ENV_REDIS_PASSWORD, role_password(ADMIN, role) if role else ADMIN)
    monkeypatch.setenv(ENV_REDIS_USER, role)
    return hotstate.connect_redis(server.url)


def refused(call) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


def test_each_redis_identity_runs_only_its_own_commands_on_its_own_keys(server, monkeypatch):
    cache = as_role(server, monkeypatch, "cache")
    cache.sadd("microco:cache:dir:ab", "cache-0")
    cache.set("microco:cache:server:cache-0:status", "{}", ex=60)
    assert cache.smembers("microco:cache:dir:ab") == {b"cache-0"}
    refused(lambda: cache.rpush("microco:console:series:x", "1"))  # the console's keys
    refused(lambda: cache.get("other:key"))

    job = as_role(server, monkeypatch, "job")
    assert job.smembers("microco:cache:dir:ab") == {b"cache-0"}  # a loader reads the directory
    refused(lambda: job.sadd("microco:cache:dir:ab", "forged"))  # ...and cannot change it
    refused(lambda: job.delete("microco:cache:dir:ab"))
    refused(lambda: job.get("microco:cache:server:cache-0:status"))

    console = as_role(server, monkeypatch, "console")
    console.rpush("microco:console:series:x", "1")
    assert console.lrange("microco:console:series:x", 0, -1) == [b"1"]
    refused(lambda: console.smembers("microco:cache:dir:ab"))
    refused(lambda: console.sadd("microco:cache:dir:ab", "forged"))

    for client in (cache, job, console):
        refused(client.flushall)
        refused(lambda c=client: c.config_get("requirepass"))
        refused(lambda c=client: c.keys("*"))
        refused(lambda c=client: c.acl_list())
    # a role's password is not another's, nor the administrator's
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(
            server.url,
            username="cache",
            password=role_password(ADMIN, "job"),
            **hotstate.redis_tls_options(server.url),
        ).ping()
    admin = as_role(server, monkeypatch, "")
    assert admin.smembers("microco:cache:dir:ab") == {b"cache-0"}
    assert admin.config_get("maxmemory")  # the administrator keeps everything


def test_only_redis_clients_get_a_redis_user():
    assert service_redis_env(ADMIN, "cache") == ("cache", role_password(ADMIN, "cache"))
    assert service_redis_env(ADMIN, "agent")[0] == "job"  # handed on to its jobs
    assert service_redis_env(ADMIN, "scheduler") == ("", "")
    assert len({role_password(ADMIN, r) for r in ROLES} | {ADMIN}) == len(ROLES) + 1


def test_each_container_gets_its_own_redis_user(tmp_path):
    """Compose and Kubernetes: the ``pki`` job gives Redis the users' definitions and each Redis
    client container its own user's password, never the administrator's."""
    from microco.services.stack.__main__ import make_pki

    make_pki(tmp_path / "pki", ["cache", "agent", "console", "scheduler"], [], tmp_path / "c")
    admin = (tmp_path / "pki" / "redis.password").read_text().strip()
    users = (tmp_path / "c" / "redis" / "redis-users.conf").read_text()
    assert users.count("\nuser ") + users.startswith("user ") == len(ROLES) and "flushall" not in users
    for name, role in (("cache", "cache"), ("agent", "job"), ("console", "console")):
        assert (tmp_path / "c" / name / "redis.password").read_text().strip() == role_password(admin, role)
    assert not (tmp_path / "c" / "scheduler" / "redis.password").exists()
