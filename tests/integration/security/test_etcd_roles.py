"""etcd roles (issue 16): with etcd's authentication on, each certificate's common name is an
etcd user, and its role limits it to its own key prefixes: a job's or a user's certificate
cannot read the job records (their environments) or another service's state, a service only
its own prefixes, a certificate of nobody etcd knows nothing at all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from _support import issued

from microco.common.identity import SERVICE_NAME, channel_credentials

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def etcd_with_roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from microco.common.etcd_roles import EtcdAuth
    from microco.services.stack import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd-roles")).start()
    try:
        auth = EtcdAuth(server.endpoint, issued("service:stack"))
        auth.set_up(["stack", "scheduler", "cache", "store"], ["user:root"])
        auth.close()
        # what `microco user add` and the scheduler do for a user and a job
        auth = EtcdAuth(server.endpoint, issued("service:scheduler"))
        auth.add_identity("user:alice")
        auth.add_identity("user:bob")
        auth.add_identity("job:j-1", owner="alice")
        auth.add_identity("job:j-2", owner="bob")
        auth.close()
        yield server.endpoint
    finally:
        server.stop()


def client(endpoint: str, who: str, admin: bool = False) -> Any:
    import pyetcd

    host, port = endpoint.rsplit(":", 1)
    ident = issued(who, admin)
    ep = pyetcd.Endpoint(
        host,
        int(port),
        secure=True,
        creds=channel_credentials(ident),
        opts=[("grpc.ssl_target_name_override", SERVICE_NAME)],
    )
    return pyetcd.MultiEndpointEtcd3Client(endpoints=[ep], timeout=5)


def denied(c: Any, op: str, key: str) -> bool:
    try:
        if op == "get":
            c.get(key)
        else:
            c.put(key, b"x")
        return False
    except Exception as exc:  # noqa: BLE001 - pyetcd raises its own types for PERMISSION_DENIED
        text = f"{type(exc).__name__} {exc}".lower()
        assert "permission" in text or "denied" in text or "not found" in text, text
        return True


def test_each_identity_reaches_only_its_own_prefixes(etcd_with_roles):
    ep = etcd_with_roles
    root = client(ep, "service:scheduler")
    root.put("/microco/scheduler/jobs/j-1", b'{"spec": {"env": {"API_KEY": "s3cr3t"}}}')
    root.put("/microco/store/catalog/t", b"{}")
    root.put("/microco/services/cache/c-1", b"{}")
    for who in ("user:alice", "job:j-1"):
        c = client(ep, who)
        assert denied(c, "get", "/microco/scheduler/jobs/j-1"), who
        assert denied(c, "get", "/microco/store/catalog/t"), who
        assert denied(c, "put", "/microco/services/cache/c-1"), who  # no posing as a service
        assert denied(c, "put", "/microco/security/revoked/user:alice"), who
        assert denied(c, "get", "/microco/scheduler/phases/j-2"), who  # every job's id and node
        assert c.get("/microco/services/cache/c-1")[0] == b"{}"  # discovery works
    cache = client(ep, "service:cache")
    assert denied(cache, "get", "/microco/store/catalog/t")
    assert denied(cache, "put", "/microco/scheduler/jobs/j-1")
    cache.put("/microco/cache/jobs/x", b"{}")
    assert cache.get("/microco/scheduler/jobs/j-1")[0]  # a job's owner, for its reports
    # a certificate whose name etcd does not know gets nothing; an administrator everything
    assert denied(client(ep, "user:mallory"), "get", "/microco/services/cache/c-1")
    assert client(ep, "user:root", admin=True).get("/microco/store/catalog/t")[0] == b"{}"


def test_a_users_datasets_reach_only_them_their_jobs_admins_and_the_cache(etcd_with_roles, tmp_path):
    """Issue 16: dataset registrations (names, URLs, owners) were readable by every user."""
    from microco.clients.cache import get_dataset, list_datasets, register_dataset
    from microco.common import identity
    from microco.common.errors import MicrocoError, NotFound
    from microco.common.kv import EtcdKV

    ep = etcd_with_roles
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"alice's sample")
    identity.use(issued("user:alice"))  # `microco cache register private DIR` as alice
    try:
        with closing(EtcdKV(ep)) as kv:
            rec, _ = register_dataset(kv, "private", str(data), home=str(tmp_path / "home"))
            assert [r.qualified for r in list_datasets(kv)] == ["alice/private"]
    finally:
        identity.use(None)
    assert rec.owner == "alice" and rec.qualified == "alice/private"
    key = "/microco/cache/datasets/alice/private"
    for who in ("user:bob", "job:j-2"):  # another user, another user's job
        c = client(ep, who)
        assert denied(c, "get", key), who
        assert denied(c, "put", key), who  # nor overwrite it
        assert denied(c, "get", "/microco/cache/datasets/"), who  # nor list them
        c.put("/microco/cache/datasets/bob/ds", b"{}")  # their own
    alices_job = client(ep, "job:j-1")
    assert b"private" in alices_job.get(key)[0]
    assert denied(alices_job, "put", "/microco/cache/datasets/bob/ds")
    for who, admin in (("service:cache", False), ("user:root", True)):
        assert b"private" in client(ep, who, admin).get(key)[0]
    identity.use(issued("user:bob"))  # through the client library: bob's own only
    try:
        with closing(EtcdKV(ep)) as kv:
            with pytest.raises(NotFound):
                get_dataset(kv, "private")  # a bare name is bob's own
            with pytest.raises(MicrocoError, match="(?i)permission"):
                get_dataset(kv, "alice/private")
            with pytest.raises(MicrocoError, match="(?i)permission"):
                list_datasets(kv, everyone=True)
    finally:
        identity.use(None)


def test_an_ended_jobs_etcd_user_is_removed(etcd_with_roles, monkeypatch):
    """The scheduler adds ``job:<id>`` to etcd before starting the job; its garbage
    collection deletes the users of jobs that have ended (or that it does not know)."""
    from microco.common import identity
    from microco.common.etcd_roles import ENV_ETCD_ROLES, add_job_user, remove_job_users
    from microco.common.kv import EtcdKV

    ep = etcd_with_roles
    monkeypatch.setenv(ENV_ETCD_ROLES, "1")
    identity.use(issued("service:scheduler"))
    kv = EtcdKV(ep)
    try:
        add_job_user(kv, "j-live")
        add_job_user(kv, "j-done")
        assert client(ep, "job:j-done").get("/microco/services/cache/c-1") is not None
        assert remove_job_users(kv, {"j-live", "j-1", "j-2"}) == ["job:j-done"]
        assert denied(client(ep, "job:j-done"), "get", "/microco/services/cache/c-1")
        assert client(ep, "job:j-live").get("/microco/services/cache/c-1") is not None
        assert remove_job_users(kv, {"j-live", "j-1", "j-2"}) == []  # nothing left to remove
    finally:
        identity.use(None)
        kv.close()


def test_the_scheduler_removes_job_users_once_a_job_ends(monkeypatch):
    """The tick's garbage collection hands the ids of the jobs still alive to
    ``remove_job_users``, at once when a job ends."""
    from microco.common.kv import MemoryKV
    from microco.services.scheduler import SchedulerCore
    from microco.services.scheduler import _core as core_module
    from microco.services.scheduler.policy import make_policy

    calls: list[set[str]] = []
    monkeypatch.setattr(core_module, "remove_job_users", lambda kv, keep: calls.append(set(keep)) or [])
    kv = MemoryKV()
    kv.put_json(
        "/microco/nodes/n1",
        {
            "name": "n1",
            "address": "127.0.0.1:1",
            "devices": [{"id": "n1/0", "node": "n1", "index": 0, "kind": "virtual", "model": "virtual-cpu"}],
        },
    )
    core = SchedulerCore(kv, make_policy("fifo"), check_commands=False, gc_interval_s=1e9)
    from microco.clients.scheduler import make_spec
    from microco.services.scheduler import spec_from_pb

    job = core.submit(spec_from_pb(make_spec(["true"], devices=1, user="alice")))
    core.tick()
    assert calls and job.id in calls[-1]  # the first collection: the job is alive
    calls.clear()
    core.cancel(job.id)
    core.tick()
    assert core.get(job.id).terminal
    assert calls and job.id not in calls[-1]


def test_requests_beside_changes_to_etcds_users_are_not_refused(etcd_with_roles, monkeypatch):
    """The scheduler adds an etcd user for each job it starts. etcd refuses a request it
    authorised before such a change ("auth: revision in header is old") and applies nothing of
    it: found by the demo's run in CI, where `microco up` failed as its first job was submitted.
    Every request of the platform's etcd client is sent again then, as etcd's own client does:
    a service's reads and writes beside a burst of new job users all succeed."""
    import threading

    from microco.common import identity
    from microco.common.etcd_roles import EtcdAuth
    from microco.common.kv import EtcdKV

    ep = etcd_with_roles
    identity.use(issued("service:cache"))
    kv = EtcdKV(ep)
    auth = EtcdAuth(ep, issued("service:scheduler"))
    done, errors = threading.Event(), []

    def churn() -> None:
        try:
            for i in range(60):
                auth.add_identity(f"job:churn-{i}", owner="alice")
        finally:
            done.set()

    t = threading.Thread(target=churn)
    try:
        t.start()
        n = 0
        while not done.is_set() or n < 20:
            try:
                kv.put(f"/microco/cache/churn/{n % 5}", b"x")
                assert kv.get(f"/microco/cache/churn/{n % 5}") == b"x"
            except Exception as exc:  # noqa: BLE001 - the failure under test
                errors.append(f"{type(exc).__name__}: {exc}")
            n += 1
        assert not errors, errors[:3]
    finally:
        t.join(120)
        auth.close()
        identity.use(None)
        kv.close()


def test_a_refusal_by_etcd_is_permission_denied_not_unavailable(etcd_with_roles):
    """Session 40: a key the caller's role may not touch read "Unavailable etcd at ...", as if
    etcd were down (and callers that retry on Unavailable retried it)."""
    from microco.common import identity
    from microco.common.errors import PermissionDenied
    from microco.common.kv import EtcdKV

    identity.use(issued("user:bob"))
    try:
        with closing(EtcdKV(etcd_with_roles)) as kv:
            for op in (
                lambda: kv.get("/microco/scheduler/jobs/j-1"),
                lambda: kv.put("/microco/store/catalog/t", b"{}"),
                lambda: kv.get_prefix("/microco/scheduler/jobs/"),
            ):
                with pytest.raises(PermissionDenied, match="etcd refused user:bob"):
                    op()
            assert kv.get("/microco/services/cache/none") is None  # what its role reads works
    finally:
        identity.use(None)


def test_users_and_jobs_read_the_compilers_records_but_never_write_them(etcd_with_roles):
    """Session 40: every user and job could write /microco/compiler/ (commit a configuration
    for another user's graph, or delete one); the compiler service writes them, by scope."""
    ep = etcd_with_roles
    client(ep, "service:scheduler").put("/microco/compiler/committed/k", b"{}")
    for who in ("user:alice", "job:j-1"):
        c = client(ep, who)
        assert c.get("/microco/compiler/committed/k")[0] == b"{}", who
        assert denied(c, "put", "/microco/compiler/committed/k"), who
        assert denied(c, "put", "/microco/compiler/explorations/k"), who


def test_a_revoked_certificate_reaches_etcd_no_more(etcd_with_roles):
    """Session 41: `microco user revoke` put the name on the deny-list, which every service
    follows, but etcd knows a certificate by its common name alone and never reads that list:
    a revoked administrator's stolen key still had etcd's ``root`` role, and deleted its own
    entry from the deny-list (every service then accepted it again); a revoked user's key still
    rewrote her dataset registrations (where her jobs read their samples). Revoking a user now
    also deletes their etcd user."""
    from microco.cli import main
    from microco.common import identity
    from microco.common.etcd_roles import EtcdAuth

    ep = etcd_with_roles
    auth = EtcdAuth(ep, issued("user:root", admin=True))
    try:
        auth.add_identity("user:mallory-admin", admin=True)
        auth.add_identity("user:carol")
    finally:
        auth.close()
    old_admin, old_carol = client(ep, "user:mallory-admin", admin=True), client(ep, "user:carol")
    old_carol.put("/microco/cache/datasets/carol/ds", b'{"url": "/data/carol"}')
    identity.use(issued("user:root", admin=True))  # the administrator who revokes them
    try:
        assert main(["user", "revoke", "mallory-admin", "--etcd", ep]) == 0
        assert main(["user", "revoke", "user:carol", "--etcd", ep]) == 0
    finally:
        identity.use(None)
    revoked_key = "/microco/security/revoked/user:mallory-admin"
    assert client(ep, "user:root", admin=True).get(revoked_key)[0]
    # the revoked administrator cannot take itself off the deny-list, nor read anything
    try:
        old_admin.delete(revoked_key)
        undone = True
    except Exception:  # noqa: BLE001 - pyetcd's own type for PERMISSION_DENIED
        undone = False
    assert not undone and client(ep, "user:root", admin=True).get(revoked_key)[0]
    assert denied(old_admin, "get", "/microco/scheduler/jobs/j-1")
    # the revoked user can neither send her jobs to other samples nor read the registry
    assert denied(old_carol, "put", "/microco/cache/datasets/carol/ds")
    assert denied(old_carol, "get", "/microco/services/cache/c-1")
    # someone else is untouched
    assert client(ep, "user:alice").get("/microco/services/cache/c-1") is not None
