"""Flight fuzzing (issue 16): generated requests for a store node's Arrow Flight server (JSON
tickets of every op, node actions, ``DoPut`` extent descriptors, ``get_flight_info``
descriptors) sent as the coordinator, which every other caller is refused before (the attack
suite), and generated Flight SQL commands, tickets and actions for the coordinator's Flight SQL
endpoint (``FlightService`` over grpcio). Every answer is a result or the caller's error: a
microco error type (``InvalidArgument``, ``NotFound``...) or a clean gRPC status, never a Python
exception leaking through (``KeyError: ...``), INTERNAL or UNKNOWN. The same examples every run
(``derandomize``); each finding is kept as a case in ``FOUND`` below."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from _support import issued
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rpc_fuzz import CLEAN_FAILURES, message

from microco.api.flight.v1 import flight_pb2 as fpb
from microco.api.flight.v1 import flight_pb2_grpc as fpb_grpc
from microco.api.flight.v1 import flight_sql_pb2 as spb
from microco.clients.store import flight_client
from microco.common import errors
from microco.common.channel import dial
from microco.common.kv import MemoryKV

pytestmark = pytest.mark.integration

# What a node may answer with: its own error types (``FlightServerError("<Type>: ...")``).
CLEAN = {
    c.__name__ for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.MicrocoError)
}
CLEAN |= {"CorruptExtent"}
CLEAN -= {"Internal", "MicrocoError"}

NAMES = ["t", "e0", "", "../t", "/tmp", "t/../../x", ".", "q1", "x" * 300, "\x00", "é"]
FIELDS = [
    "op", "table", "extent", "bucket", "buckets", "columns", "checksum", "qid", "tag", "inputs", "sql",
    "left", "right", "post", "where", "specs", "replica", "sources", "rows", "keep", "min_age_s",
    "force", "grant", "source", "node", "address", "group_by", "aggs", "limit", "order_by",
]  # fmt: skip
OPS = ["read", "fragment", "map", "reduce", "sql", "shuffle_take"]
ACTIONS = ["rebuild", "delete", "drop_table", "shuffle_drop", "verify", "stats", "collect_garbage"]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 2, 2**31, -(2**63), 2**64, 10**30]),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(NAMES),
    st.text(max_size=12),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4),
    ),
    max_leaves=12,
)


def body(**fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object with some of the known fields (any values) and the ``fixed`` ones."""
    return st.builds(
        lambda some, more: {**some, **more},
        st.dictionaries(st.sampled_from(FIELDS), values, max_size=6),
        st.fixed_dictionaries(fixed),
    )


tickets = body(op=st.sampled_from(OPS) | st.text(max_size=6))
action_bodies = body()
put_commands = body(table=st.sampled_from(NAMES) | values, extent=st.sampled_from(NAMES) | values)
info_commands = body()
raw_bytes = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"[]", b"null", b"1", b'"x"', b"[" * 40]))


def encode(obj: Any) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


def clean(exc: flight.FlightError) -> bool:
    if isinstance(exc, flight.FlightInternalError):
        return False
    if isinstance(exc, (flight.FlightUnauthorizedError, flight.FlightUnavailableError)):
        return True
    m = re.match(r"\s*(\w+):", str(exc))
    return m is not None and m.group(1) in CLEAN


def answered(run: Any, what: Any) -> None:
    """``run()`` either works or fails with a node's own error type."""
    try:
        run()
    except flight.FlightError as exc:
        assert clean(exc), f"{what!r}: {type(exc).__name__} {str(exc)[:300]}"


FUZZ = settings(
    max_examples=int(os.environ.get("MICROCO_FUZZ_EXAMPLES", "25")),  # more for a longer search
    deadline=None,
    derandomize=True,  # the same examples every run: a failure is reproducible, never flaky
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A store node in this process (catalog on a MemoryKV, so list_flights and get_flight_info
    answer), one extent ``t/e0`` on it, and a client as the coordinator."""
    from microco.services.store._flight import StoreFlightServer
    from microco.services.store._nodestore import NodeStore

    server = StoreFlightServer(NodeStore("fz", tmp_path_factory.mktemp("fz") / "node"), kv=MemoryKV())
    threading.Thread(target=server.serve, daemon=True).start()
    client = flight_client(f"127.0.0.1:{server.port}", issued("service:store"))
    put(
        client,
        {"table": "t", "extent": "e0", "buckets": [[0, 0, 2]]},
        pa.table({"a": [1, 2], "b": ["x", "y"]}),
    )
    yield client
    client.close()
    server.shutdown()


def put(client: Any, command: Any, table: pa.Table) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(encode(command)), table.schema)
    writer.write_table(table)
    writer.done_writing()
    reader.read()
    writer.close()


@FUZZ
@given(ticket=tickets | raw_bytes)
def _fuzz_tickets(client: Any, ticket: Any) -> None:
    answered(lambda: client.do_get(flight.Ticket(encode(ticket))).read_all(), ticket)


@FUZZ
@given(name=st.sampled_from(ACTIONS) | st.text(max_size=8), payload=action_bodies | raw_bytes)
def _fuzz_actions(client: Any, name: str, payload: Any) -> None:
    answered(lambda: list(client.do_action(flight.Action(name, encode(payload)))), (name, payload))


@FUZZ
@given(command=put_commands | raw_bytes)
def _fuzz_puts(client: Any, command: Any) -> None:
    answered(lambda: put(client, command, pa.table({"a": [3]})), command)


@FUZZ
@given(command=info_commands | raw_bytes, path=st.lists(st.sampled_from(NAMES), max_size=3))
def _fuzz_infos(client: Any, command: Any, path: list[str]) -> None:
    answered(lambda: client.get_flight_info(flight.FlightDescriptor.for_command(encode(command))), command)
    answered(lambda: client.get_flight_info(flight.FlightDescriptor.for_path(*path)), path)
    answered(lambda: list(client.list_flights()), "list_flights")


@pytest.mark.parametrize(
    "fuzz", [_fuzz_tickets, _fuzz_actions, _fuzz_puts, _fuzz_infos], ids=lambda f: f.__name__
)
def test_store_node_flight_requests_get_clean_answers(node, fuzz):
    fuzz(node)


# What the fuzz found (each was a Python exception, UNKNOWN, from the node): kept as cases.
FOUND = [
    ("put", {"table": "t", "extent": "e1", "buckets": [[0, 1]]}, "a bucket is"),  # IndexError
    ("put", {"table": "t", "extent": "e1", "buckets": [[0, 0, 5]]}, "do not add up"),  # rows lost
    ("ticket", {"op": "fragment", "table": None, "extent": None, "left": None}, "'left' must be"),
    ("ticket", {"op": "fragment", "left": {"sources": 5}}, "malformed fragment task"),  # AttributeError
    ("ticket", {"op": "map", "side": {}, "key": ["a"], "n": 10**30, "qid": "q", "tag": "L"}, "'n' must be"),
    ("action", ("collect_garbage", {"keep": None}), "'keep' must be"),  # AttributeError
    ("action", ("collect_garbage", {"keep": {"t": 5}, "min_age_s": 0}), "malformed .collect_garbage"),
]


@pytest.mark.parametrize(("kind", "request_", "says"), FOUND)
def test_what_the_flight_fuzz_found_is_the_callers_error(node, kind, request_, says):
    run = {
        "put": lambda: put(node, request_, pa.table({"a": [3]})),
        "ticket": lambda: node.do_get(flight.Ticket(encode(request_))).read_all(),
        "action": lambda: list(node.do_action(flight.Action(request_[0], encode(request_[1])))),
    }[kind]
    with pytest.raises(flight.FlightServerError, match=f"InvalidArgument: .*{says}"):
        run()


# --------------------------------------------------------------------------- Flight SQL

SQL_COMMANDS = [
    m for name, m in spb.DESCRIPTOR.message_types_by_name.items() if not name.startswith("SqlInfo")
]
QUERIES = ["select 1", "select * from t", "select", "drop table t", "select * from missing", ";;", "x" * 300]


def packed(desc: Any) -> st.SearchStrategy[bytes]:
    """A Flight SQL message of type ``desc`` in a ``google.protobuf.Any`` (as clients send)."""
    from microco.services.store._flightsql import pack

    def with_query(m: Any, q: str) -> bytes:
        if "query" in m.DESCRIPTOR.fields_by_name and not m.query:
            m.query = q
        return pack(m)

    return st.builds(with_query, message(desc), st.sampled_from(QUERIES))


commands = st.one_of(*(packed(m) for m in SQL_COMMANDS)) | raw_bytes


@pytest.fixture(scope="module")
def flight_sql(platform: dict[str, Any]) -> Iterator[Any]:
    from microco.services.store._flightsql import FlightSqlServer

    server = FlightSqlServer(platform["store_servicer"], "127.0.0.1", 0, issued("service:store")).start()
    channel = dial(f"127.0.0.1:{server.port}", identity=issued("user:fuzz-admin", admin=True))
    yield fpb_grpc.FlightServiceStub(channel)
    channel.close()
    server.stop(0)


def rpc(run: Any, what: Any) -> None:
    try:
        out = run()
        if hasattr(out, "__next__"):
            for n, _ in enumerate(out):
                if n >= 3:
                    out.cancel()
                    break
    except grpc.RpcError as err:
        code = err.code()
        if code == grpc.StatusCode.CANCELLED:
            return
        assert code in CLEAN_FAILURES and code != grpc.StatusCode.DEADLINE_EXCEEDED, (
            f"{what!r}: {code.name} {err.details()}"
        )


@FUZZ
@given(cmd=commands, path=st.lists(st.sampled_from(NAMES), max_size=2), kind=st.sampled_from([0, 1, 2, 7]))
def _fuzz_sql_infos(stub: Any, cmd: bytes, path: list[str], kind: int) -> None:
    desc = fpb.FlightDescriptor(type=kind, cmd=cmd, path=path)  # type: ignore[arg-type]
    rpc(lambda: stub.GetFlightInfo(desc, timeout=20), desc)
    rpc(lambda: stub.GetSchema(desc, timeout=20), desc)


@FUZZ
@given(ticket=commands)
def _fuzz_sql_tickets(stub: Any, ticket: bytes) -> None:
    rpc(lambda: stub.DoGet(fpb.Ticket(ticket=ticket), timeout=20), ticket)


@FUZZ
@given(
    name=st.sampled_from(["CreatePreparedStatement", "ClosePreparedStatement", "CancelQuery"])
    | st.text(max_size=8),
    payload=commands,
)
def _fuzz_sql_actions(stub: Any, name: str, payload: bytes) -> None:
    rpc(lambda: stub.DoAction(fpb.Action(type=name, body=payload), timeout=20), (name, payload))
    rpc(
        lambda: stub.DoPut(
            iter([fpb.FlightData(flight_descriptor=fpb.FlightDescriptor(cmd=payload))]), timeout=20
        ),
        name,
    )


@pytest.mark.parametrize(
    "fuzz", [_fuzz_sql_infos, _fuzz_sql_tickets, _fuzz_sql_actions], ids=lambda f: f.__name__
)
def test_flight_sql_requests_get_clean_answers(flight_sql, fuzz):
    fuzz(flight_sql)
