"""RPC fuzzing (issue 16): random well-typed messages, built by hypothesis from each method's
protobuf descriptor (every field, nested messages, repeated fields and maps, odd strings and
extreme numbers), sent to the scheduler, a node agent, the store coordinator, the compiler, a
cache server and the ``InfoService`` every service serves, over mutual TLS (the ``platform``
fixture) as an administrator. Every answer is a result or a clean status: never INTERNAL or UNKNOWN (an unhandled error), never a
hang."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from _support import issued
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from microco.api.agent.v1 import agent_pb2
from microco.api.cache.v1 import cache_pb2
from microco.api.common.v1 import common_pb2
from microco.api.compiler.v1 import compiler_pb2
from microco.api.scheduler.v1 import scheduler_pb2
from microco.api.store.v1 import store_pb2
from microco.common.channel import dial

pytestmark = pytest.mark.integration

F = d.FieldDescriptor
ODD_STRINGS = [
    "",
    "x" * 300,
    "../../etc/passwd",
    "/",
    "j-1",
    "{}",
    '{"table": "t", "where": [[]]}',
    "\x00",
    "é",
]
INTS = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}


def scalar(f: d.FieldDescriptor) -> st.SearchStrategy[Any]:
    if f.type in INTS:
        lo, hi = INTS[f.type]
        return st.one_of(st.sampled_from([0, 1, -1 if lo < 0 else 2, lo, hi]), st.integers(lo, hi))
    if f.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(width=32 if f.type == F.TYPE_FLOAT else 64)
    if f.type == F.TYPE_BOOL:
        return st.booleans()
    if f.type == F.TYPE_STRING:
        return st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=24))
    if f.type == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if f.type == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-5, 99))
    raise AssertionError(f"no strategy for field {f.full_name}")


def is_map(f: d.FieldDescriptor) -> bool:
    return f.type == F.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def message(desc: d.Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """A message of type ``desc`` with any subset of its fields set."""
    cls = message_factory.GetMessageClass(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if is_map(f):
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            if v.type == F.TYPE_MESSAGE and depth >= 2:
                continue
            vs = message(v.message_type, depth + 1) if v.type == F.TYPE_MESSAGE else scalar(v)
            fields[f.name] = st.dictionaries(scalar(k), vs, max_size=3)
            continue
        if f.type == F.TYPE_MESSAGE:
            if depth >= 2:
                continue
            one = message(f.message_type, depth + 1)
        else:
            one = scalar(f)
        fields[f.name] = st.lists(one, max_size=3) if f.is_repeated else one

    def build(values: dict[str, Any]) -> Any:
        m = cls()
        for name, v in values.items():
            f = desc.fields_by_name[name]
            if f.containing_oneof is not None and m.WhichOneof(f.containing_oneof.name):
                continue  # one member of a oneof at a time
            target = getattr(m, name) if f.type == F.TYPE_MESSAGE or f.is_repeated else None
            if is_map(f):
                for key, val in v.items():
                    if f.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE:
                        target[key].CopyFrom(val)
                    else:
                        target[key] = val
            elif f.is_repeated and f.type == F.TYPE_MESSAGE:
                for item in v:
                    target.add().CopyFrom(item)
            elif f.is_repeated:
                target.extend(v)
            elif f.type == F.TYPE_MESSAGE:
                target.CopyFrom(v)
            else:
                setattr(m, name, v)
        return m

    return st.fixed_dictionaries({}, optional=fields).map(build)


SERVICES = {
    "scheduler": scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"],
    "agent_address": agent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"],
    "store": store_pb2.DESCRIPTOR.services_by_name["StoreCoordinatorService"],
    "cache": cache_pb2.DESCRIPTOR.services_by_name["CacheService"],
    "compiler": compiler_pb2.DESCRIPTOR.services_by_name["CompilerService"],
    "info": common_pb2.DESCRIPTOR.services_by_name["InfoService"],  # every service's; the scheduler's here
}
ADDRESS = {"info": "scheduler"}  # the platform's server that answers a service above
METHODS = [(server, m) for server, svc in SERVICES.items() for m in svc.methods]
CLEAN_FAILURES = set(grpc.StatusCode) - {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@pytest.fixture(scope="module")
def channels(platform: dict[str, Any]) -> dict[str, grpc.Channel]:
    admin = issued("user:fuzz-admin", admin=True)
    return {server: dial(platform[ADDRESS.get(server, server)], identity=admin) for server in SERVICES}


def watches(method: d.MethodDescriptor) -> bool:
    """A call that may wait for news (its deadline ends it)."""
    return method.name.startswith("Watch") or method.name == "ReadLog"


def call(channel: grpc.Channel, method: d.MethodDescriptor, requests: list[Any]) -> None:
    out = message_factory.GetMessageClass(method.output_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = {(False, False): "unary_unary", (False, True): "unary_stream"}
    kind.update({(True, False): "stream_unary", (True, True): "stream_stream"})
    stub = getattr(channel, kind[(method.client_streaming, method.server_streaming)])(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=out.FromString
    )
    watch = watches(method)
    arg = iter(requests) if method.client_streaming else requests[0]
    try:
        result = stub(arg, timeout=0.5 if watch else 20)
        if method.server_streaming:
            for n, _ in enumerate(result):
                if n >= 3:
                    result.cancel()
                    break
    except grpc.RpcError as err:
        code = err.code()
        if watch and code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return
        if code == grpc.StatusCode.CANCELLED:
            return  # our own cancel of a stream
        assert code in CLEAN_FAILURES and code != grpc.StatusCode.DEADLINE_EXCEEDED, (
            f"{path}: {code.name} {err.details()}"
        )


@pytest.mark.parametrize(("server", "method"), METHODS, ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_random_messages_get_clean_answers(channels, server, method):
    @settings(
        max_examples=2 if watches(method) else 5,
        deadline=None,
        derandomize=True,  # the same examples every run: a failure is reproducible, never flaky
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(message(method.input_type), min_size=1, max_size=3))
    def one(requests: list[Any]) -> None:
        call(channels[server], method, requests)

    one()
