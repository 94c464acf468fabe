"""The attacks of issue 16, each tried as an anonymous client (no certificate), as another user
and as another job, against real servers in this process on free ports (mutual TLS as the
platform runs them): every one is refused with UNAUTHENTICATED or PERMISSION_DENIED (or the
TLS handshake fails), and what the owner, the job itself, the scheduler or the coordinator may
do still works."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from _support import issued

from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
from microco.api.cache.v1 import cache_pb2, cache_pb2_grpc
from microco.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from microco.clients.scheduler import spec_to_pb
from microco.clients.store import StoreClient, flight_client
from microco.common.channel import dial
from microco.common.errors import AlreadyExists, MicrocoError, PermissionDenied
from microco.common.identity import SERVICE_NAME, CertificateAuthority
from microco.common.kv import MemoryKV

pytestmark = pytest.mark.integration

DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def refused(call: Any, *args: Any, **kw: Any) -> grpc.RpcError:
    """``call`` fails PERMISSION_DENIED/UNAUTHENTICATED with a one-line message."""
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, timeout=10, **kw)
        if hasattr(result, "__iter__") and not hasattr(result, "ByteSize"):
            list(result)
    err = info.value
    assert err.code() in DENIED, (err.code(), err.details())
    assert err.details() and "\n" not in err.details()
    return err


# --------------------------------------------------------------------------- the servers


def sched(platform: dict[str, Any], who: str, admin: bool = False) -> Any:
    return scheduler_pb2_grpc.SchedulerServiceStub(dial(platform["scheduler"], identity=issued(who, admin)))


def submit(platform: dict[str, Any], who: str, **spec: Any) -> scheduler_pb2.Job:
    full = {"name": "t", "command": ["true"], "devices": 1, **spec}
    return sched(platform, who).SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec_to_pb(full)), timeout=10)


# --------------------------------------------------------------------------- anonymous


def test_anonymous_and_foreign_clients_are_refused_at_the_handshake(platform, tmp_path):
    address = platform["scheduler"]
    req = scheduler_pb2.ListJobsRequest()
    # plaintext to a TLS port
    with grpc.insecure_channel(address) as ch:
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerServiceStub(ch).ListJobs(req, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # TLS that trusts the CA but presents no certificate
    ca_pem = issued("user:x").ca_pem
    opts = [("grpc.ssl_target_name_override", SERVICE_NAME)]
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(ca_pem), options=opts) as ch:
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerServiceStub(ch).ListJobs(req, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # a certificate from another CA naming an administrator
    forged = CertificateAuthority.create().issue("user:root", admin=True)
    with dial(address, identity=forged) as ch:
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerServiceStub(ch).ListJobs(req, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_user_certificate_cannot_serve(platform):
    """Only service certificates carry the name clients check the server against."""
    from microco.services.runtime import ServiceRuntime, ServiceSettings

    rt = ServiceRuntime(ServiceSettings(name="impostor", metrics_port=-1), identity=issued("user:mallory"))
    rt.start(register=False)
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with dial(rt.address) as ch, pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        rt.stop(grace=0)


# --------------------------------------------------------------------------- jobs


def test_the_owner_of_a_job_is_the_caller_never_a_request_field(platform):
    job = submit(platform, "user:alice")
    assert job.spec.owner.user == "alice"
    err = refused(
        sched(platform, "user:alice").SubmitJob,
        scheduler_pb2.SubmitJobRequest(
            spec=spec_to_pb({"name": "t", "command": ["true"], "devices": 1, "user": "bob"})
        ),
    )
    assert "bob" in err.details()
    # a platform service (the console) submits for the person signed in to it
    job = sched(platform, "service:console").SubmitJob(
        scheduler_pb2.SubmitJobRequest(
            spec=spec_to_pb({"name": "t", "command": ["true"], "devices": 1, "user": "carol"})
        ),
        timeout=10,
    )
    assert job.spec.owner.user == "carol"


def test_another_user_or_job_cannot_cancel_control_or_read_a_job(platform):
    job = submit(platform, "user:alice")
    for who in ("user:bob", f"job:{job.id}x", "job:other"):
        s = sched(platform, who)
        refused(s.CancelJob, scheduler_pb2.CancelJobRequest(job_id=job.id))
        refused(s.ControlJob, scheduler_pb2.ControlJobRequest(job_id=job.id, action="suspend"))
        refused(s.GetJob, scheduler_pb2.GetJobRequest(job_id=job.id))
    refused(sched(platform, "job:other").SubmitJob, scheduler_pb2.SubmitJobRequest(spec=job.spec))
    # the job itself may read itself; its owner and an administrator may cancel it
    assert sched(platform, f"job:{job.id}").GetJob(scheduler_pb2.GetJobRequest(job_id=job.id), timeout=10).id
    assert sched(platform, "user:alice").CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.id), timeout=10)
    other = submit(platform, "user:alice")
    admin = sched(platform, "user:root", admin=True)
    assert admin.CancelJob(scheduler_pb2.CancelJobRequest(job_id=other.id), timeout=10).id == other.id


def test_list_jobs_shows_a_user_their_own_and_never_a_secret(platform):
    job = submit(platform, "user:alice", env={"API_KEY": "s3cr3t", "DB_PASSWORD": "pw", "EPOCHS": "3"})
    listed = sched(platform, "user:bob").ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
    assert job.id not in {j.id for j in listed}
    # asking for another owner's jobs by name does not help
    listed = (
        sched(platform, "user:bob").ListJobs(scheduler_pb2.ListJobsRequest(owner="alice"), timeout=10).jobs
    )
    assert listed == []
    for who, admin in (("user:alice", False), ("user:root", True), ("service:console", False)):
        jobs = {
            j.id: j
            for j in sched(platform, who, admin).ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
        }
        env = dict(jobs[job.id].spec.env)
        assert env == {"API_KEY": "<redacted>", "DB_PASSWORD": "<redacted>", "EPOCHS": "3"}, who
        assert "s3cr3t" not in str(jobs[job.id])
    # the owner still reads the full record of their own job
    full = sched(platform, "user:alice").GetJob(scheduler_pb2.GetJobRequest(job_id=job.id), timeout=10)
    assert full.spec.env["API_KEY"] == "s3cr3t"


def test_a_jobs_secrets_reach_only_its_owner_and_the_job_itself(platform):
    """GetJob gives secret-looking environment values to the job's owner and the job alone: the
    console reads jobs as ``service:console`` and showed them on its job page to any of its
    tokens (session 42); an administrator acts on the job without them. WatchJobs, a list
    call, redacts them for everyone as ListJobs does."""
    job = submit(platform, "user:alice", env={"API_KEY": "s3cr3t", "EPOCHS": "3"})
    request = scheduler_pb2.GetJobRequest(job_id=job.id)
    for who, admin in (("service:console", False), ("user:root", True)):
        got = sched(platform, who, admin).GetJob(request, timeout=10)
        assert dict(got.spec.env) == {"API_KEY": "<redacted>", "EPOCHS": "3"}, who
        assert "s3cr3t" not in str(got)
    for who in ("user:alice", f"job:{job.id}"):
        assert sched(platform, who).GetJob(request, timeout=10).spec.env["API_KEY"] == "s3cr3t", who
    for who, admin in (("user:alice", False), ("service:console", False), ("user:root", True)):
        stream = sched(platform, who, admin).WatchJobs(
            scheduler_pb2.WatchJobsRequest(job_ids=[job.id]), timeout=60
        )
        first = next(iter(stream))
        stream.cancel()
        assert first.job.id == job.id
        assert dict(first.job.spec.env) == {"API_KEY": "<redacted>", "EPOCHS": "3"}, who


def test_watch_jobs_streams_only_what_the_caller_may_see(platform):
    theirs = submit(platform, "user:erin")
    mine = submit(platform, "user:dave")  # later: streamed after theirs, were theirs visible
    stream = sched(platform, "user:dave").WatchJobs(scheduler_pb2.WatchJobsRequest(), timeout=60)
    seen = []
    for ev in stream:
        seen.append(ev.job.id)
        if ev.job.id == mine.id:
            stream.cancel()
            break
    assert mine.id in seen and theirs.id not in seen


# --------------------------------------------------------------------------- the node agent


def test_only_the_scheduler_starts_or_signals_processes_on_an_agent(platform):
    address = platform["agent_address"]
    start = agent_pb2.StartProcessRequest(job_id="pwn", command=["id"], device_ids=["sec-node/0"])
    for who, admin in (
        ("user:mallory", False),
        ("user:root", True),
        ("job:j-1", False),
        ("service:cache", False),
    ):
        stub = agent_pb2_grpc.NodeAgentServiceStub(dial(address, identity=issued(who, admin)))
        err = refused(stub.StartProcess, start)
        assert "service:scheduler" in err.details()
        refused(
            stub.ControlProcess, agent_pb2.ControlProcessRequest(job_id="pwn", control=agent_pb2.CONTROL_STOP)
        )
        refused(stub.StopProcess, agent_pb2.StopProcessRequest(job_id="pwn"))
        refused(stub.CollectGarbage, agent_pb2.CollectGarbageRequest())
    assert platform["agent"].procs.list() == []  # nothing ran
    # the scheduler may (a command that does not exist: refused by the agent itself, not by authorisation)
    stub = agent_pb2_grpc.NodeAgentServiceStub(dial(address, identity=issued("service:scheduler")))
    with pytest.raises(grpc.RpcError) as info:
        stub.StartProcess(
            agent_pb2.StartProcessRequest(job_id="ok", command=["/no/such/cmd"], device_ids=["sec-node/0"]),
            timeout=10,
        )
    assert info.value.code() not in DENIED


def test_another_user_cannot_read_a_jobs_log(platform):
    job = submit(platform, "user:alice")
    stub = agent_pb2_grpc.NodeAgentServiceStub(dial(platform["agent_address"], identity=issued("user:bob")))
    refused(stub.ReadLog, agent_pb2.ReadLogRequest(job_id=job.id))
    stub = agent_pb2_grpc.NodeAgentServiceStub(dial(platform["agent_address"], identity=issued("job:other")))
    refused(stub.ReadLog, agent_pb2.ReadLogRequest(job_id=job.id))


def test_a_node_agent_lists_to_a_user_their_own_jobs_processes_only(platform, tmp_path):
    """ListProcesses shows a user their jobs' processes and a job its own, as ListJobs does:
    every caller read every job's id, status message, steps and memory (session 42)."""
    from microco.services.agent import NodeAgent
    from microco.services.agent._service import NodeAgentServicer
    from microco.services.runtime import ServiceRuntime, ServiceSettings

    agent = NodeAgent(platform["kv"], "sec-ps", str(tmp_path / "agent"), virtual_devices=2, preload=[])
    rt = ServiceRuntime(ServiceSettings(name="agent", metrics_port=-1))
    rt.add_service(agent_pb2_grpc.add_NodeAgentServiceServicer_to_server, NodeAgentServicer(agent), "agent")
    rt.start(register=False)
    try:
        alice, bob = submit(platform, "user:alice"), submit(platform, "user:bob")
        for i, job in enumerate((alice, bob)):
            agent.procs.start(job.id, ["sleep", "60"], {}, [f"sec-ps/{i}"])

        def listed(who: str, admin: bool = False) -> set[str]:
            stub = agent_pb2_grpc.NodeAgentServiceStub(dial(rt.address, identity=issued(who, admin)))
            procs = stub.ListProcesses(agent_pb2.ListProcessesRequest(), timeout=10).processes
            return {p.job_id for p in procs}

        assert listed("user:alice") == {alice.id}
        assert listed(f"job:{bob.id}") == {bob.id}
        assert listed("user:mallory") == set()
        assert listed("job:other") == set()
        assert listed("service:scheduler") == listed("user:root", admin=True) == {alice.id, bob.id}
    finally:
        agent.procs.shutdown()
        rt.stop(grace=0)


def test_a_job_never_gets_the_agents_credentials():
    from microco.services.agent._procs import job_environment

    base = {"MICROCO_CREDENTIALS": "/agent.pem", "MICROCO_CA_DIR": "/pki", "PATH": "/bin"}
    env = job_environment(base, {}, {"MICROCO_CREDENTIALS_PEM": "the job's own"})
    assert "MICROCO_CREDENTIALS" not in env and "MICROCO_CA_DIR" not in env
    assert env["MICROCO_CREDENTIALS_PEM"] == "the job's own"


def test_the_scheduler_issues_a_job_credentials_scoped_to_its_id():
    from microco.common.identity import ENV_CREDENTIALS_PEM, Identity, job_credentials_env

    ident = Identity.from_pem(job_credentials_env("j-42")[ENV_CREDENTIALS_PEM].encode())
    assert ident.name == "job:j-42" and not ident.admin


# --------------------------------------------------------------------------- the cache


def test_cache_reports_only_for_jobs_the_caller_owns(platform):
    job = submit(platform, "user:alice")

    def report(who: str, job_id: str, **kw: Any) -> Any:
        stub = cache_pb2_grpc.CacheServiceStub(dial(platform["cache"], identity=issued(who)))
        req = cache_pb2.ReportProgressRequest(job_id=job_id, dataset="imagenet", epoch=0, **kw)
        return stub.ReportProgress, req

    for who in ("user:bob", "job:other"):
        call, req = report(who, job.id, dataset_bytes=1, finished=True)
        refused(call, req)
    call, req = report(f"job:{job.id}", job.id, dataset_bytes=1 << 20)
    call(req, timeout=10)
    call, req = report(f"job:{job.id}", f"{job.id}/rank1", dataset_bytes=1 << 20)  # one of its ranks
    call(req, timeout=10)
    call, req = report("job:other", f"{job.id}/rank1", finished=True)
    refused(call, req)
    call, req = report("user:alice", job.id, finished=True)
    call(req, timeout=10)
    # a job the scheduler does not know belongs to whoever reports for it first
    call, req = report("user:carol", "local-run-1", dataset_bytes=10)
    call(req, timeout=10)
    call, req = report("user:bob", "local-run-1", finished=True)
    refused(call, req)


# --------------------------------------------------------------------------- store tables


def test_a_user_drops_and_appends_to_their_own_tables_only(platform):
    def client(who: str, admin: bool = False) -> StoreClient:
        return StoreClient(dial(platform["store"], identity=issued(who, admin)))

    schema = pa.schema([("a", pa.int64())])
    replicas = ["a:hash:2", "a:hash:2", "a:hash:2"]
    client("user:alice").create_table("alice_t", schema, replicas)
    job = submit(platform, "user:alice")
    client(f"job:{job.id}").create_table("alice_job_t", schema, replicas)  # a job creates for its owner
    for who in ("user:bob", "job:other"):
        for call in (
            lambda c: c.drop_table("alice_t"),
            lambda c: c.append("alice_t", pa.table({"a": [1]})),
            lambda c: c.drop_table("alice_job_t"),
        ):
            with pytest.raises(PermissionDenied, match="user 'alice'"):
                call(client(who))
    client("user:alice").drop_table("alice_job_t")
    client("user:root", admin=True).drop_table("alice_t")
    assert client("user:root", admin=True).list_tables() == []


def test_only_administrators_and_services_scrub_the_store(platform):
    """A scrub re-reads every byte of every user's tables, unthrottled, deletes orphans and names
    what it found: an operator's call (session 42: any user or job could run it)."""
    for who in ("user:bob", "job:other"):
        client = StoreClient(dial(platform["store"], identity=issued(who)))
        with pytest.raises(PermissionDenied, match="may not scrub the store"):
            client.scrub()
    for who, admin in (("user:root", True), ("service:console", False)):
        assert StoreClient(dial(platform["store"], identity=issued(who, admin))).scrub() == []


def test_a_table_named_like_another_in_another_case_is_refused(platform):
    """SQL names a table without regard to case and reads the first match: bob's ``SHADOWED``
    beside alice's ``shadowed`` took the name in her own queries (refused hers, or with a grant
    answered them with his rows). Such a name is refused (session 42)."""

    def client(who: str, admin: bool = False) -> StoreClient:
        return StoreClient(dial(platform["store"], identity=issued(who, admin)))

    schema = pa.schema([("a", pa.int64())])
    replicas = ["a:hash:2", "a:hash:2", "a:hash:2"]
    client("user:alice").create_table("shadowed", schema, replicas)
    for name in ("SHADOWED", "Shadowed"):
        with pytest.raises(AlreadyExists, match="without regard to case"):
            client("user:bob").create_table(name, schema, replicas)
    admin = client("user:root", admin=True)
    assert [t["name"] for t in admin.list_tables() if t["name"].lower() == "shadowed"] == ["shadowed"]
    # alice's SQL names her own table (the planner then finds no nodes)
    with pytest.raises(MicrocoError) as info:
        client("user:alice").explain_sql("SELECT count(*) FROM shadowed")
    assert not isinstance(info.value, PermissionDenied)
    admin.drop_table("shadowed")


# --------------------------------------------------------------------------- store nodes


@pytest.fixture(scope="module")
def store_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    import threading

    from microco.services.store._flight import StoreFlightServer
    from microco.services.store._nodestore import NodeStore

    data = tmp_path_factory.mktemp("node")
    server = StoreFlightServer(NodeStore("n1", data / "node"))
    threading.Thread(target=server.serve, daemon=True).start()
    yield server, data
    server.shutdown()


def _action(client: Any, name: str, body: dict[str, Any]) -> list[Any]:
    return list(client.do_action(flight.Action(name, json.dumps(body).encode())))


def test_store_node_actions_only_from_the_coordinator(store_node, tmp_path):
    server, data = store_node
    address = f"127.0.0.1:{server.port}"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    for who, admin in (
        ("user:mallory", False),
        ("user:root", True),
        ("job:j-1", False),
        ("service:store-node", False),
    ):
        client = flight_client(address, issued(who, admin))
        try:
            with pytest.raises(flight.FlightUnauthorizedError, match="only service:store may"):
                _action(client, "drop_table", {"table": str(victim)})
            desc = flight.FlightDescriptor.for_command(
                json.dumps({"table": "t", "extent": "e", "buckets": []})
            )
            with pytest.raises(flight.FlightUnauthorizedError):
                writer, _ = client.do_put(desc, pa.schema([("a", pa.int64())]))
                writer.write_table(pa.table({"a": [1]}))
                writer.close()
            if who != "service:store-node":
                with pytest.raises(flight.FlightUnauthorizedError):
                    client.do_get(
                        flight.Ticket(json.dumps({"op": "sql", "inputs": {}, "sql": "select 1"}))
                    ).read_all()
        finally:
            client.close()
    # the coordinator's drop_table with a path is refused by the path check
    client = flight_client(address, issued("service:store"))
    try:
        with pytest.raises(flight.FlightError, match="bad name"):
            _action(client, "drop_table", {"table": str(victim)})
    finally:
        client.close()
    assert (victim / "precious").exists()


def test_store_node_refuses_clients_without_credentials(store_node):
    server, _ = store_node
    plain = flight.FlightClient(f"grpc://127.0.0.1:{server.port}")
    with pytest.raises(flight.FlightError):
        _action(plain, "stats", {})
    plain.close()
    ca_pem = issued("user:x").ca_pem
    no_cert = flight.FlightClient(
        f"grpc+tls://127.0.0.1:{server.port}", tls_root_certs=ca_pem, override_hostname=SERVICE_NAME
    )
    with pytest.raises(flight.FlightError):
        _action(no_cert, "stats", {})
    no_cert.close()


def test_a_forged_flight_proof_is_refused(tmp_path):
    """The headers naming the caller must be signed with the key of a certificate of the CA."""
    from microco.clients.store._flight_tls import CERT_HEADER, PROOF_HEADER, _Proof, verify_headers
    from microco.common.errors import Unauthenticated

    me = issued("user:mallory")
    store = issued("service:store")
    good = _Proof(me).headers()
    assert verify_headers(me.ca_pem, good) == ("user:mallory", False)
    # the coordinator's certificate with mallory's signature
    forged = {CERT_HEADER: _Proof(store).headers()[CERT_HEADER], PROOF_HEADER: good[PROOF_HEADER]}
    with pytest.raises(Unauthenticated):
        verify_headers(me.ca_pem, forged)
    # a certificate of another CA
    other = CertificateAuthority.create().issue("service:store")
    with pytest.raises(Unauthenticated):
        verify_headers(me.ca_pem, _Proof(other).headers())
    with pytest.raises(Unauthenticated):
        verify_headers(me.ca_pem, {})
    shutil.rmtree(tmp_path, ignore_errors=True)


# --------------------------------------------------------------------------- reading tables


def test_a_user_reads_their_own_tables_and_platform_tables_only(platform):
    def client(who: str, admin: bool = False) -> StoreClient:
        return StoreClient(dial(platform["store"], identity=issued(who, admin)))

    schema = pa.schema([("a", pa.int64())])
    replicas = ["a:hash:2", "a:hash:2", "a:hash:2"]
    client("user:alice").create_table("alice_r", schema, replicas)
    client("service:console").create_table("shared_r", schema, replicas)  # a platform table
    job = submit(platform, "user:alice")
    for who in ("user:bob", "job:other"):
        c = client(who)
        for call in (
            lambda c: c.query({"table": "alice_r"}),
            lambda c: c.query(
                {"table": "shared_r", "join": {"table": "alice_r", "left_on": "a", "right_on": "a"}}
            ),
            lambda c: c.sql("SELECT count(*) FROM shared_r JOIN ALICE_R USING (a)"),
            lambda c: c.explain_sql("SELECT * FROM alice_r"),
            lambda c: c.read("alice_r"),
            lambda c: c.get_table("alice_r"),
        ):
            with pytest.raises(PermissionDenied, match="may not read table 'alice_r'.*user 'alice'"):
                call(c)
        assert [t["name"] for t in c.list_tables()] == ["shared_r"]
    # the owner, the owner's job and an administrator may (the planner then finds no nodes)
    for who, admin in (("user:alice", False), (f"job:{job.id}", False), ("user:root", True)):
        c = client(who, admin)
        assert {t["name"] for t in c.list_tables()} >= {"alice_r", "shared_r"}
        assert c.get_table("alice_r")
        with pytest.raises(MicrocoError) as info:
            c.query({"table": "alice_r"})
        assert not isinstance(info.value, PermissionDenied)
    admin = client("user:root", admin=True)
    admin.drop_table("alice_r")
    admin.drop_table("shared_r")


def test_store_nodes_serve_extents_only_with_a_grant_for_the_caller(store_node):
    """A read ticket is the coordinator's grant, signed for one caller: without one, with one
    made for another caller, signed by someone else, or altered, a node refuses it."""
    from microco.clients.store import grant_ticket

    server, _ = store_node
    address = f"127.0.0.1:{server.port}"
    task = {"op": "read", "table": "t", "extent": "e1", "bucket": None, "columns": None, "checksum": None}

    def get(who: str, ticket: bytes) -> Exception:
        client = flight_client(address, issued(who))
        try:
            with pytest.raises(flight.FlightError) as info:
                client.do_get(flight.Ticket(ticket)).read_all()
            return info.value
        finally:
            client.close()

    store = issued("service:store")
    denied = flight.FlightUnauthorizedError
    assert isinstance(get("user:mallory", json.dumps(task).encode()), denied)
    assert isinstance(get("user:mallory", grant_ticket(store, task, "user:alice")), denied)
    assert isinstance(get("user:mallory", grant_ticket(issued("user:mallory"), task, "user:mallory")), denied)
    forged = CertificateAuthority.create().issue("service:store")
    assert isinstance(get("user:mallory", grant_ticket(forged, task, "user:mallory")), denied)
    altered = json.loads(grant_ticket(store, task, "user:mallory"))
    altered["table"] = "other"
    assert isinstance(get("user:mallory", json.dumps(altered).encode()), denied)
    fragment = {"op": "fragment", "table": "t", "extents": []}
    assert isinstance(get("job:j-1", json.dumps(fragment).encode()), denied)
    # with the coordinator's grant for this caller the node serves it (here: no such extent)
    err = get("user:mallory", grant_ticket(store, task, "user:mallory"))
    assert not isinstance(err, denied), err
    err = get("service:store", json.dumps(task).encode())  # the store's services need none
    assert not isinstance(err, denied), err


def test_a_node_hands_out_flight_endpoints_only_for_readable_tables(tmp_path):
    import threading

    from microco.services.store._authz import OWNERS
    from microco.services.store._flight import StoreFlightServer
    from microco.services.store._nodestore import NodeStore

    kv = MemoryKV()
    server = StoreFlightServer(NodeStore("n2", tmp_path / "node"), kv=kv)
    threading.Thread(target=server.serve, daemon=True).start()
    kv.put(OWNERS + "alice_f", b"alice")
    try:
        client = flight_client(f"127.0.0.1:{server.port}", issued("user:bob"))
        with pytest.raises(flight.FlightUnauthorizedError, match="may not read table"):
            client.get_flight_info(flight.FlightDescriptor.for_path("alice_f"))
        client.close()
    finally:
        server.shutdown()


def test_an_owner_shares_a_table_with_another_user_and_withdraws_it(platform, capsys):
    """``GrantTableRead``: the owner (or an administrator) lets another user, and that user's
    jobs, read a table; nobody else may grant; every read path follows the grant and its
    withdrawal."""
    from microco.common.errors import FailedPrecondition, InvalidArgument, NotFound

    def client(who: str, admin: bool = False) -> StoreClient:
        return StoreClient(dial(platform["store"], identity=issued(who, admin)))

    schema = pa.schema([("a", pa.int64())])
    replicas = ["a:hash:2", "a:hash:2", "a:hash:2"]
    alice, bob, carol = client("user:alice"), client("user:bob"), client("user:carol")
    admin = client("user:root", admin=True)
    alice.create_table("alice_s", schema, replicas)
    client("service:console").create_table("platform_s", schema, replicas)
    bob_job = submit(platform, "user:bob")
    reads = (
        lambda c: c.get_table("alice_s"),
        lambda c: c.sql("SELECT count(*) FROM alice_s"),
        lambda c: c.read("alice_s"),
        lambda c: c.table_grants("alice_s"),
    )

    def may_read(c: StoreClient) -> bool:
        for call in reads:
            try:
                call(c)
            except PermissionDenied:
                return False
            except MicrocoError:
                pass  # past the check: the planner then finds no store nodes
        return "alice_s" in {t["name"] for t in c.list_tables()}

    for who in ("user:bob", "user:carol", f"job:{bob_job.id}"):
        with pytest.raises(PermissionDenied, match="may not share table 'alice_s'.*user 'alice'"):
            client(who).grant_read("alice_s", "bob")
    assert not may_read(bob)
    assert alice.grant_read("alice_s", "bob") == {"table": "alice_s", "owner": "alice", "users": ["bob"]}
    assert may_read(bob) and may_read(client(f"job:{bob_job.id}"))  # bob's jobs too
    assert not may_read(carol)
    with pytest.raises(PermissionDenied):  # reading is not sharing
        bob.grant_read("alice_s", "carol")
    with pytest.raises(PermissionDenied):
        bob.append("alice_s", pa.table({"a": [1]}))
    assert admin.grant_read("alice_s", "user:carol")["users"] == ["bob", "carol"]
    assert may_read(carol)
    for bad, err in (
        (lambda: alice.grant_read("alice_s", "job:j-1"), InvalidArgument),
        (lambda: alice.grant_read("alice_s", "b/o b"), InvalidArgument),
        (lambda: alice.grant_read("alice_s", "alice"), InvalidArgument),
        (lambda: alice.grant_read("no_such_table", "bob"), NotFound),
        (lambda: admin.grant_read("platform_s", "bob"), FailedPrecondition),
    ):
        with pytest.raises(err):
            bad()
    assert alice.revoke_read("alice_s", "bob")["users"] == ["carol"]
    assert not may_read(bob) and not may_read(client(f"job:{bob_job.id}"))
    # the CLI, as this process's administrator
    from microco.cli import main

    for argv, line in (
        (["grant", "alice_s", "erin"], "owner user alice; shared with: carol, erin"),
        (["revoke", "alice_s", "user:erin"], "shared with: carol"),
        (["grants", "alice_s"], "table alice_s: owner user alice; shared with: carol"),
    ):
        assert main(["store", "--coordinator", platform["store"], *argv]) == 0
        assert line in capsys.readouterr().out
    # a table dropped and made again by someone else does not inherit the grants
    alice.drop_table("alice_s")
    client("user:dave").create_table("alice_s", schema, replicas)
    assert not may_read(carol)
    admin.drop_table("alice_s")
    admin.drop_table("platform_s")


def test_a_store_node_follows_grants_and_their_withdrawal(tmp_path):
    """A node's ``get_flight_info`` hands a grantee endpoints; a read ticket stops working
    once the grant is withdrawn, though its signature is still good."""
    import threading

    from microco.clients.store import grant_ticket
    from microco.services.runtime.auth import Caller
    from microco.services.store._authz import OWNERS, TableOwners
    from microco.services.store._flight import StoreFlightServer
    from microco.services.store._nodestore import NodeStore

    kv = MemoryKV()
    server = StoreFlightServer(NodeStore("n3", tmp_path / "node"), kv=kv)
    threading.Thread(target=server.serve, daemon=True).start()
    kv.put(OWNERS + "alice_g", b"alice")
    owners = TableOwners(kv)
    task = {
        "op": "read",
        "table": "alice_g",
        "extent": "e1",
        "bucket": None,
        "columns": None,
        "checksum": None,
    }
    ticket = grant_ticket(issued("service:store"), task, "user:bob")
    client = flight_client(f"127.0.0.1:{server.port}", issued("user:bob"))

    def get() -> Exception:
        with pytest.raises(flight.FlightError) as info:
            client.do_get(flight.Ticket(ticket)).read_all()
        return info.value

    try:
        owners.grant(Caller("user:alice"), "alice_g", "bob")
        with pytest.raises(flight.FlightError) as info:  # past the check: no such table in the catalog
            client.get_flight_info(flight.FlightDescriptor.for_path("alice_g"))
        assert not isinstance(info.value, flight.FlightUnauthorizedError), info.value
        assert not isinstance(get(), flight.FlightUnauthorizedError)  # no such extent here
        owners.revoke(Caller("user:alice"), "alice_g", "bob")
        err = get()
        assert isinstance(err, flight.FlightUnauthorizedError) and "may no longer read" in str(err), err
        with pytest.raises(flight.FlightUnauthorizedError, match="may not read table"):
            client.get_flight_info(flight.FlightDescriptor.for_path("alice_g"))
    finally:
        client.close()
        server.shutdown()


# --------------------------------------------------------------------------- cache inserts


def test_cache_inserts_under_another_users_dataset_name_are_refused(platform):
    from microco.clients.cache import digest

    def put(who: str, dataset: str, data: bytes) -> Any:
        stub = cache_pb2_grpc.CacheServiceStub(dial(platform["cache"], identity=issued(who)))
        msgs = [cache_pb2.ChunkData(digest=digest(data), data=data, dataset=dataset, last=True)]
        return stub.PutChunks, iter(msgs)

    job = submit(platform, "user:alice")
    mine, theirs = b"alice's chunk " * 100, b"alice's other chunk " * 100
    call, msgs = put(f"job:{job.id}", "alice-ds", mine)  # a job of alice's names it first
    assert call(msgs, timeout=10).stored == [digest(mine)]
    call, msgs = put("user:alice", "alice-ds", theirs)  # alice herself: the same owner
    assert call(msgs, timeout=10).stored == [digest(theirs)]
    junk = b"junk " * 1000
    for who in ("user:bob", "job:other"):
        call, msgs = put(who, "alice-ds", junk)
        err = refused(call, msgs)
        assert "alice-ds" in err.details() and "user:alice" in err.details()
        # the dataset's own bytes (verified against their digest) are still welcome from anyone
        call, msgs = put(who, "alice-ds", mine)
        assert call(msgs, timeout=10).present == [digest(mine)]
        # and identical bytes under a name of one's own share the cached copy
        call, msgs = put(who, f"{who}-ds", mine)
        assert call(msgs, timeout=10).present == [digest(mine)]
    # a Lookup by another does not teach the server that junk belongs to alice's dataset
    stub = cache_pb2_grpc.CacheServiceStub(dial(platform["cache"], identity=issued("user:bob")))
    stub.Lookup(cache_pb2.LookupRequest(digests=[digest(junk)], dataset="alice-ds"), timeout=10)
    call, msgs = put("user:bob", "alice-ds", junk)
    refused(call, msgs)
    # a platform service may insert under any name
    call, msgs = put("service:cache", "alice-ds", junk)
    assert call(msgs, timeout=10).stored == [digest(junk)]


# --------------------------------------------------------------------------- revocation


def test_a_revoked_certificate_is_refused_and_new_credentials_work(platform, etcd_kv, etcd_endpoint):
    """`microco user revoke` puts the name on etcd's deny-list; a server following it refuses
    that name's certificates issued until then, on every call (UNAUTHENTICATED), and accepts
    the same name's credentials issued afterwards."""
    import os
    import time

    from microco.cli import main
    from microco.common import identity
    from microco.services.runtime.auth import Revocations

    revocations = Revocations(etcd_kv, interval_s=3600).start()
    old_eve, old_job = issued("user:revoked-eve"), issued("job:revoked-job")
    bystander = issued("user:revoked-bystander")
    try:
        ok = scheduler_pb2.ListJobsRequest()
        stub = scheduler_pb2_grpc.SchedulerServiceStub(dial(platform["scheduler"], identity=old_eve))
        stub.ListJobs(ok, timeout=10)
        assert main(["user", "revoke", "revoked-eve", "--etcd", etcd_endpoint]) == 0
        assert main(["user", "revoke", "job:revoked-job", "--etcd", etcd_endpoint]) == 0
        deadline = time.monotonic() + 30
        while not identity.revoked("job:revoked-job", old_job.cert_pem) and time.monotonic() < deadline:
            time.sleep(0.05)  # the watch delivers the deny-list
        err = refused(stub.ListJobs, ok)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "revoked" in err.details()
        for addr, ident in ((platform["cache"], old_job), (platform["cache"], old_eve)):
            cache = cache_pb2_grpc.CacheServiceStub(dial(addr, identity=ident))
            refused(cache.GetStats, cache_pb2.GetStatsRequest())  # a call that checks nobody else
        # a Flight proof of a revoked certificate is refused too
        from microco.clients.store._flight_tls import _Proof, verify_headers

        with pytest.raises(Exception, match="revoked"):
            verify_headers(old_eve.ca_pem, _Proof(old_eve).headers())
        # others are untouched; eve's credentials issued after the revocation work
        scheduler_pb2_grpc.SchedulerServiceStub(dial(platform["scheduler"], identity=bystander)).ListJobs(
            ok, timeout=10
        )
        time.sleep(1.1)  # certificates carry whole seconds: one issued in the same second is refused too
        new_eve = CertificateAuthority.load(os.environ[identity.ENV_CA_DIR]).issue("user:revoked-eve")
        scheduler_pb2_grpc.SchedulerServiceStub(dial(platform["scheduler"], identity=new_eve)).ListJobs(
            ok, timeout=10
        )
    finally:
        revocations.stop()
        identity.set_revoked({})


def test_a_stream_opened_before_a_revocation_ends_with_it(platform):
    """A certificate revoked while one of its streams is open: the stream ends at its next
    message (UNAUTHENTICATED), as a new call would be refused. It went on for as long as it
    lived: a stolen key's ``WatchJobs`` kept delivering its owner's jobs (session 42)."""
    import time

    from microco.common import identity

    job = submit(platform, "user:stream-eve")
    stub = scheduler_pb2_grpc.SchedulerServiceStub(
        dial(platform["scheduler"], identity=issued("user:stream-eve"))
    )
    events = iter(stub.WatchJobs(scheduler_pb2.WatchJobsRequest(job_ids=[job.id]), timeout=30))
    assert next(events).job.id == job.id
    before = dict(identity._revoked)
    try:
        identity.set_revoked({**before, "user:stream-eve": time.time()})
        sched(platform, "user:root", admin=True).CancelJob(
            scheduler_pb2.CancelJobRequest(job_id=job.id), timeout=10
        )  # a change of her job: the stream's next message
        with pytest.raises(grpc.RpcError) as info:
            for _ in events:
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
        assert "revoked" in info.value.details()
    finally:
        identity.set_revoked(before)


def test_a_jobs_credentials_work_until_it_ends_and_are_refused_after(platform):
    """A job's certificate acts as the job while it has not ended; in the tick in which it ends
    the scheduler puts ``job:<id>`` on the deny-list, which every service follows: the same
    certificate is then refused (UNAUTHENTICATED, saying the job has ended) by the scheduler and
    the cache alike, and by a store node's Flight check, while another job's still works."""
    import time

    from microco.common import identity
    from microco.services.runtime import auth

    core = platform["core"]
    revocations = auth.Revocations(platform["kv"], interval_s=3600).start()
    try:
        job, other = submit(platform, "user:alice"), submit(platform, "user:alice")
        core.tick()
        creds = issued(f"job:{job.id}")
        mine = scheduler_pb2_grpc.SchedulerServiceStub(dial(platform["scheduler"], identity=creds))
        cache = cache_pb2_grpc.CacheServiceStub(dial(platform["cache"], identity=creds))
        assert not core.get(job.id).terminal
        assert mine.GetJob(scheduler_pb2.GetJobRequest(job_id=job.id), timeout=10).id == job.id
        cache.GetStats(cache_pb2.GetStatsRequest(), timeout=10)
        core.cancel(job.id)
        deadline = time.monotonic() + 30
        while not identity.revoked(f"job:{job.id}", creds.cert_pem) and time.monotonic() < deadline:
            core.tick()  # the job ends, and the garbage collection of that tick revokes it
            time.sleep(0.05)
        assert core.get(job.id).terminal
        err = refused(mine.GetJob, scheduler_pb2.GetJobRequest(job_id=job.id))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert f"job:{job.id} has ended" in err.details()
        assert "has ended" in refused(cache.GetStats, cache_pb2.GetStatsRequest()).details()
        from microco.clients.store._flight_tls import _Proof, verify_headers

        with pytest.raises(Exception, match="revoked"):  # and by the store nodes' Flight servers
            verify_headers(creds.ca_pem, _Proof(creds).headers())
        theirs = sched(platform, f"job:{other.id}")  # a job still alive is untouched
        assert theirs.GetJob(scheduler_pb2.GetJobRequest(job_id=other.id), timeout=10).id == other.id
        assert auth.revoke_ended_jobs(platform["kv"], {job.id}) == []  # written once
    finally:
        revocations.stop()
        identity.set_revoked({})
        auth._ended_jobs = frozenset()
        core.cancel(other.id)


def test_malformed_store_node_requests_get_invalid_argument_naming_the_field(store_node):
    """Found by a hand probe as the coordinator (issue 16's fuzzing of Flight): tickets and
    actions without their fields, or with fields of the wrong type, were answered with a
    Python ``KeyError``; each is now the caller's error, saying which field."""
    server, _ = store_node
    client = flight_client(f"127.0.0.1:{server.port}", issued("service:store"))
    try:
        for ticket, field in (
            ({"op": "sql"}, "has no '"),
            ({"op": "read"}, "'table'"),
            ({"op": "read", "table": "t", "extent": 5}, "'extent'"),
        ):
            with pytest.raises(flight.FlightError, match=f"InvalidArgument: .*{field}"):
                client.do_get(flight.Ticket(json.dumps(ticket))).read_all()
        for name, body, field in (
            ("rebuild", {}, "'specs'"),
            ("delete", {}, "'table'"),
            ("verify", {"table": 5, "extent": "e", "checksum": "c"}, "'table' must be a str"),
        ):
            with pytest.raises(flight.FlightError, match=f"InvalidArgument: .*{field}"):
                _action(client, name, body)
    finally:
        client.close()


def test_a_user_cannot_poison_another_users_tuned_configuration(platform):
    """Session 40: the compiler kept one exploration per graph for everyone and took timings for
    any key from anyone, so a user could commit a slow configuration for another user's model
    (and etcd let every user write the records). Each user (their jobs too) now explores in a
    scope of their own; services and administrators in the shared one."""
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.compiler.explore.types import GraphSpec, TrialReport, Variable
    from microco.common.errors import NotFound

    def explorer(who: str, admin: bool = False) -> RemoteExplorer:
        return RemoteExplorer(dial(platform["compiler"], identity=issued(who, admin)))

    spec = GraphSpec("public-model", "(8, 3, 32, 32)", "cpu", (Variable("layout", ("a", "b")),), "resnet")
    alice, bob, admin = explorer("user:alice"), explorer("user:bob"), explorer("user:root", admin=True)
    a = alice.register(spec)
    b = bob.register(spec)  # the same public model: a scope of bob's own
    shared = admin.register(spec)
    assert len({a.key, b.key, shared.key}) == 3
    for call in (
        lambda: bob.report(a.key, TrialReport(a.trial, [0.001] * 5)),  # a fake, fast timing
        lambda: bob.next_config(a.key),
        lambda: bob.report(shared.key, TrialReport(shared.trial, [0.001] * 5)),
    ):
        with pytest.raises(PermissionDenied):
            call()
    with pytest.raises((PermissionDenied, NotFound)):
        bob.get_graph(a.key)
    assert bob.get_graph(shared.key).key == shared.key  # the shared scope reads
    listed = {g.key for g in bob.list_graphs()}
    assert a.key not in listed and {b.key, shared.key} <= listed
    alice.report(a.key, TrialReport(a.trial, [2.0] * 5))  # her own: taken
    assert {g.key for g in admin.list_graphs()} >= {a.key, b.key, shared.key}
