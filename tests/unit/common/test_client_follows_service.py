"""A typed client built with ``from_etcd`` follows its service (issue 16: "clients re-resolve a
service after it moves"): after the instance it found goes away and another registers (a
restart on a new port, a standby taking over), the same client object's next call reaches the
new one, and a call that never reached any instance (no connection) is sent again even when it
is not idempotent. Real gRPC servers in this process, over the session's TLS; etcd's registry
in memory (the same ``KV`` interface)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from microco.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from microco.clients.scheduler import SchedulerClient
from microco.common.election import LEADER_PREFIX
from microco.common.errors import Unavailable
from microco.common.identity import server_credentials, service_identity
from microco.common.kv import MemoryKV
from microco.common.registry import ServiceRecord


class Named(scheduler_pb2_grpc.SchedulerServiceServicer):
    """Answers with the instance's name in the job's message."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.submitted = 0

    def GetJob(self, request, context):
        return scheduler_pb2.Job(id=request.job_id, message=self.name)

    def SubmitJob(self, request, context):
        self.submitted += 1
        return scheduler_pb2.Job(id="j-1", message=self.name)


def serve(kv: MemoryKV, name: str):
    servicer = Named(name)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    ident = service_identity("scheduler")
    if ident is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", server_credentials(ident))
    server.start()
    rec = ServiceRecord("scheduler", name, f"127.0.0.1:{port}")
    kv.put(rec.key, rec.to_json())
    return server, servicer, rec


def gone(kv: MemoryKV, server, rec: ServiceRecord) -> None:
    server.stop(0).wait()
    kv.delete(rec.key)


def test_the_same_client_follows_its_service_to_a_new_instance():
    kv = MemoryKV()
    a, _, rec_a = serve(kv, "a")
    client = SchedulerClient.from_etcd(kv, default_timeout=10.0)
    try:
        assert client.get("x").message == "a"
        gone(kv, a, rec_a)
        b, servicer_b, _ = serve(kv, "b")
        try:
            assert client.get("x").message == "b"  # idempotent: found again and sent there
            gone(kv, b, _)
            c, servicer_c, _rec_c = serve(kv, "c")
            try:
                # not idempotent, but the dead instance could not be connected to: never sent
                assert client.submit(scheduler_pb2.JobSpec(name="n")).message == "c"
                assert servicer_c.submitted == 1 and servicer_b.submitted == 0
            finally:
                c.stop(0)
        finally:
            b.stop(0)
    finally:
        client.close()


def test_the_leader_is_chosen_and_nothing_registered_fails_at_once():
    kv = MemoryKV()
    a, _, _ = serve(kv, "a")
    b, _, _ = serve(kv, "b")
    try:
        kv.put(LEADER_PREFIX + "scheduler", b"b")
        with SchedulerClient.from_etcd(kv) as client:
            assert client.get("x").message == "b"
        kv.delete_prefix("/microco/services/")
        with pytest.raises(Unavailable, match="no live 'scheduler'"):
            SchedulerClient.from_etcd(kv)
    finally:
        a.stop(0)
        b.stop(0)
