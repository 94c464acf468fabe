"""Arrow Flight: the store node's data-plane server, and the coordinator's transport to it.

Node server:
- ``DoPut`` with a command descriptor ``{"table", "extent", "buckets", "codec"}``: write one extent
  (``codec``: its replica's, "" or absent: the node's ``--extent-compression``); the reply
  metadata is ``{"bytes", "checksum", "buckets", "rows", "codec"}``.
- ``DoGet`` with a JSON ticket: ``{"op": "read", ...}`` an extent or one bucket of it;
  ``fragment`` / ``map`` / ``reduce`` a query task; ``shuffle_take`` a shuffle bucket.
- ``DoAction``: ``rebuild``, ``delete``, ``drop_table``, ``shuffle_drop``, ``cancel`` (query tasks
  by id: ``_cancel``), ``verify``, ``stats``, ``reads``.

Errors cross Flight as ``FlightServerError("<Type>: message")`` and are turned back into the
same microco error on the caller's side."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from microco.clients.store import FLIGHT_OPTIONS as OPTIONS
from microco.clients.store import (
    FlightClients,
    check_grant,
    flight_caller,
    grant_ticket,
    narrow_to_units,
    require_flight_service,
    secure_location,
    server_options,
)
from microco.clients.store import from_flight_error as _from_flight_error
from microco.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    MicrocoError,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from microco.common.identity import Identity, service_identity
from microco.common.kv import KV
from microco.common.registry import ServiceRecord, discover, service_prefix, service_records

from ._cancel import TaskCancelled
from ._limits import check_keys, load_json, short
from ._nodestore import CorruptExtent, NodeStore
from ._placement import NodeInfo

log = logging.getLogger(__name__)

NODE_SERVICE = "store-node"
COORDINATOR = "store"  # the coordinator's service name: service:store
_ERRORS: dict[str, type[MicrocoError]] = {
    "CorruptExtent": CorruptExtent,
    "NotFound": NotFound,
    "InvalidArgument": InvalidArgument,
    "FailedPrecondition": FailedPrecondition,
    "PermissionDenied": PermissionDenied,
    "Unauthenticated": Unauthenticated,
    "TaskCancelled": TaskCancelled,
}


def _raise_flight(exc: BaseException) -> None:
    if isinstance(exc, PermissionDenied):
        raise flight.FlightUnauthorizedError(f"PermissionDenied: {exc}") from exc
    raise flight.FlightServerError(f"{type(exc).__name__}: {exc}") from exc


def from_flight_error(exc: BaseException, where: str) -> MicrocoError:
    return _from_flight_error(exc, where, _ERRORS)


class _Clients(FlightClients):
    """The shared client pool (``clients/store/_flight.py``), knowing the node's own errors."""

    def __init__(self, ident: Identity | None = None) -> None:
        super().__init__(_ERRORS, ident)  # ident: whom this side calls as (None: this process)


_OPTS = OPTIONS
MAX_TICKET_BYTES = 64 << 20  # a task ticket lists its sources: large for big tables, never unbounded


class _Fields(dict[str, Any]):
    """A request's JSON object: a field it lacks is the caller's error (INVALID_ARGUMENT naming
    the field), not a ``KeyError`` from deep in the node's code."""

    what = "request"

    def __missing__(self, key: str) -> Any:
        raise InvalidArgument(f"{self.what} has no {key!r} field")


def _request(
    raw: bytes | str, what: str, fields: dict[str, type | tuple[type, ...]] | None = None
) -> dict[str, Any]:
    """``raw`` as a JSON object, bounded; ``fields``: those it must have, with their types."""
    d = load_json(raw, what, max_bytes=MAX_TICKET_BYTES, max_depth=16)
    if not isinstance(d, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    req = _Fields(d)
    req.what = what
    _check_fields(req, fields or {})
    return req


def _check_fields(req: dict[str, Any], fields: dict[str, type | tuple[type, ...]]) -> None:
    for name, kind in fields.items():
        value = req[name]  # (missing: InvalidArgument)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise InvalidArgument(f"{getattr(req, 'what', 'request')}: {name!r} must be a {want}")


# The fields each ticket op and node action must carry (the rest is checked where it is used).
_TICKET_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "read": {"table": str, "extent": str},
    "shuffle_take": {"qid": str, "tag": str, "bucket": int},
    "sql": {"inputs": dict, "sql": str},
    "fragment": {"left": dict},
    "map": {"side": dict, "key": list, "n": int, "qid": str, "tag": str},
    "reduce": {"qid": str, "bucket": int, "peers": dict},
}
MAX_SHUFFLE_BUCKETS = 1 << 16
# What interpreting a task a node was sent raises when the task is malformed (a field of the
# wrong shape deep inside it): the caller's error, not the node's (found by the Flight fuzz,
# tests/integration/security/test_flight_fuzz.py).
_MALFORMED = (KeyError, TypeError, AttributeError, IndexError, ValueError, pa.ArrowException)


def _interpret(what: str, run: Any) -> Any:
    """``run()``; a request the node cannot interpret (a task or an action body malformed deep
    inside) is ``InvalidArgument``, logged with its traceback so that a coordinator's bug stays
    visible in the node's log."""
    try:
        return run()
    except MicrocoError:
        raise
    except _MALFORMED as exc:
        log.warning("malformed %s", what, exc_info=True)
        raise InvalidArgument(f"malformed {what}: {type(exc).__name__}: {short(str(exc), 200)}") from exc


def _run_task(store: NodeStore, req: dict[str, Any]) -> pa.RecordBatchReader:
    """A query task's rows, as a stream (a SQL fragment's result leaves DuckDB a batch at a time)."""
    if req["op"] == "map" and not 0 < req["n"] <= MAX_SHUFFLE_BUCKETS:
        raise InvalidArgument(f"map task: 'n' must be 1..{MAX_SHUFFLE_BUCKETS}, got {short(req['n'])}")
    return _interpret(f"{req['op']} task", lambda: store.run_stream(req))  # type: ignore[no-any-return]


def _check_buckets(buckets: list[Any], rows: int) -> None:
    """An extent's buckets: ``[partition, sub-bucket, rows]`` each (non-negative integers), whose
    rows add up to the rows sent."""
    for b in buckets:
        if not (
            isinstance(b, list)
            and len(b) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62 for x in b)
        ):
            raise InvalidArgument(
                f"extent descriptor: a bucket is [partition, sub-bucket, rows], got {short(b)}"
            )
    if sum(b[2] for b in buckets) != rows:
        raise InvalidArgument(f"extent descriptor: the buckets' rows do not add up to the {rows} rows sent")


_ACTION_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "rebuild": {"specs": list, "replica": int, "sources": list, "rows": int, "extent": str},
    "delete": {"table": str, "extent": str},
    "drop_table": {"table": str},
    "shuffle_drop": {"qid": str},
    "cancel": {"tasks": list},
    "probe": {"tasks": list},
    "warm": {"reads": list},
    "verify": {"table": str, "extent": str, "checksum": str},
    "collect_garbage": {"keep": dict, "min_age_s": (int, float)},
}


def flight_get(clients: _Clients, address: str, ticket: dict[str, Any]) -> pa.Table:
    return clients.do_get(address, ticket)


class StoreFlightServer(flight.FlightServerBase):
    """A store node's Flight server around its ``NodeStore``.

    With the catalog (``kv``), any node also answers a plain Flight client: ``list_flights`` lists
    the tables, ``get_flight_info`` (descriptor path ``[table]``, or a command
    ``{"table": ..., "replica": r}``) returns one endpoint per extent of one replica, located at
    the node holding it, so the client reads the table from the nodes in parallel."""

    def __init__(self, store: NodeStore, location: str = "grpc://127.0.0.1:0", kv: KV | None = None) -> None:
        own = service_identity(NODE_SERVICE)  # None in insecure mode: plaintext
        super().__init__(secure_location(location, own is not None), **server_options(own))
        self.identity = own
        self.store = store
        self.kv = kv
        self.clients = _Clients(own)
        store.fetch = lambda address, req: flight_get(self.clients, address, req)

    def _catalog(self) -> Any:
        from ._catalog import Catalog

        if self.kv is None:
            raise flight.FlightUnavailableError("this store node has no catalog connection")
        return Catalog(self.kv)

    def _reader(self, context: Any) -> Any:
        """Whether the Flight caller may read a table (the coordinator's rule, services/store/_authz)."""
        from microco.services.runtime.auth import Caller

        from ._authz import TableOwners

        name, admin = flight_caller(context)
        return lambda table: TableOwners(self.kv).may_read(Caller(name, admin), table)

    def list_flights(self, context, criteria):
        try:
            cat = self._catalog()
            may_read = self._reader(context)
            infos = [table_flight_info(cat.table(n), None, {}) for n in cat.table_names() if may_read(n)]
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            _raise_flight(exc)
        yield from infos

    def _described(self, context, descriptor) -> tuple[str, int | None]:
        """The table (checked readable by the caller) and replica a descriptor names."""
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            if len(descriptor.path) != 1:
                raise InvalidArgument("a flight path is one table name")
            name, replica = descriptor.path[0].decode(), None
        else:
            req = _request(descriptor.command, "flight descriptor")
            check_keys(req, {"table", "replica"}, "flight descriptor")
            name, replica = req.get("table"), req.get("replica")
            if replica is not None and replica not in (0, 1, 2):
                raise InvalidArgument(f"replica must be 0, 1 or 2, got {short(replica)}")
        if not self._reader(context)(name):
            raise PermissionDenied(f"{flight_caller(context)[0]} may not read table {short(name)}")
        return name, replica

    def get_schema(self, context, descriptor):
        """The table's schema, for a descriptor as ``get_flight_info`` takes (held out, session 39:
        a plain client's ``get_schema`` met pyarrow's default, a Python traceback). pyarrow turns
        an error raised here into ``Unknown error: <message>. Detail: Python exception:`` and the
        exception's traceback, not into the Flight status it turns ``get_flight_info``'s into; so
        the error is raised bare, here: its text is ``NotFound: no table ...`` as on the other
        calls, the traceback this one frame, nothing of where it arose."""
        err: Exception | None = None
        try:
            name, _ = self._described(context, descriptor)
            return flight.SchemaResult(self._catalog().table(name).schema)
        except Exception as exc:  # noqa: BLE001
            err = flight.FlightServerError(f"{type(exc).__name__}: {exc}")
            if isinstance(exc, PermissionDenied):
                err = flight.FlightUnauthorizedError(f"PermissionDenied: {exc}")
            elif isinstance(exc, flight.FlightError):
                err = type(exc)(str(exc))
        raise err

    def get_flight_info(self, context, descriptor):
        try:
            name, replica = self._described(context, descriptor)
            live = {n.name: n.address for n in _live(self.kv)} if self.kv is not None else {}
            who = flight_caller(context)[0]
            return table_flight_info(
                self._catalog().table(name), replica, live, lambda t: grant_ticket(self.identity, t, who)
            )
        except flight.FlightError:
            raise
        except Exception as exc:  # noqa: BLE001
            _raise_flight(exc)

    def do_put(self, context, descriptor, reader, writer):
        try:
            require_flight_service(context, (COORDINATOR,), "write extents to a store node")
            t0 = time.perf_counter()
            req = _request(
                descriptor.command, "extent descriptor", {"table": str, "extent": str, "buckets": list}
            )
            rows = reader.read_all()
            _check_buckets(req["buckets"], rows.num_rows)
            t1 = time.perf_counter()
            codec = req.get("codec") or ""
            if not isinstance(codec, str):
                raise InvalidArgument("extent descriptor: codec must be a string")
            res = self.store.put_extent(req["table"], req["extent"], rows, req["buckets"], codec)
            log.info(
                "extent %s/%s: %d bytes received in %.2fs, written in %.2fs",
                req["table"],
                req["extent"],
                res["bytes"],
                t1 - t0,
                time.perf_counter() - t1,
            )
            writer.write(pa.py_buffer(json.dumps(res).encode()))
        except Exception as exc:  # noqa: BLE001
            log.warning("do_put failed: %s", exc)
            _raise_flight(exc)

    def do_get(self, context, ticket):
        try:
            req = _request(ticket.ticket, "ticket")
            op = req.get("op")
            # A read and a fragment (a structured scan and filter, what PlanRead hands a client)
            # are any authenticated caller's; SQL, shuffle and reduce tasks the coordinator's
            # and its nodes'.
            if op not in ("read", "fragment"):
                require_flight_service(
                    context, (COORDINATOR, NODE_SERVICE), f"run {short(op)} tasks on a store node"
                )
            else:
                self._check_read_grant(context, req)
            if (
                "tid" in req
                and self.identity is not None
                and flight_caller(context)[0] != f"service:{COORDINATOR}"
            ):
                # a task id names a task the coordinator may cancel (``cancel``): its calls' alone
                req.pop("tid")
            req.pop("grant", None)
            req = narrow_to_units(req)  # (unsigned: it only ever drops granted sources)
            _check_fields(req, _TICKET_FIELDS.get(op, {}) if isinstance(op, str) else {})
            if op == "read":
                t = self.store.read_request(req)
            elif op == "shuffle_take":
                t = self.store.shuffle_take(req["qid"], req["tag"], req["bucket"])
            elif op in ("fragment", "map", "reduce", "sql"):
                t = _run_task(self.store, req)
            else:
                raise InvalidArgument(f"unknown ticket op {short(op)}")
            return flight.RecordBatchStream(t)
        except Exception as exc:
            if not isinstance(
                exc, (CorruptExtent, NotFound, InvalidArgument, PermissionDenied, TaskCancelled)
            ):
                log.exception("do_get failed")
            _raise_flight(exc)

    def _check_read_grant(self, context: Any, req: dict[str, Any]) -> None:
        """Extents are read by the store's services freely, by anyone else with a ticket the
        coordinator (or a node's get_flight_info) signed for them after checking the table, and
        only while they may still read it (a grant withdrawn stops the reads of tickets handed
        out before)."""
        name, _admin = flight_caller(context)
        if not name or self.identity is None:
            return  # plaintext: insecure development mode
        kind, _, who = name.partition(":")
        if kind == "service" and who in (COORDINATOR, NODE_SERVICE):
            return
        check_grant(self.identity.ca_pem, req, name)
        table = req.get("table")
        if self.kv is not None and isinstance(table, str) and not self._reader(context)(table):
            raise PermissionDenied(f"{name} may no longer read table {short(table)}")

    def do_action(self, context, action):
        from ._core import node_action

        try:
            require_flight_service(context, (COORDINATOR,), f"run the store-node action {short(action.type)}")
            body = _request(
                action.body.to_pybytes() or b"{}",
                f"{short(action.type)} action",
                _ACTION_FIELDS.get(action.type),
            )
            res = _interpret(
                f"{short(action.type)} action", lambda: node_action(self.store, action.type, body)
            )
            yield flight.Result(pa.py_buffer(json.dumps(res).encode()))
        except Exception as exc:  # noqa: BLE001
            log.warning("action %s failed: %s", action.type, exc)
            _raise_flight(exc)

    def list_actions(self, context):
        return [
            ("rebuild", "rebuild an extent from peers' buckets"),
            ("delete", ""),
            ("drop_table", ""),
            ("shuffle_drop", ""),
            ("cancel", "stop query tasks by the ids the coordinator gave them (its attempt lost)"),
            ("probe", "which query tasks (by id) run here, for how long, what each has read"),
            ("warm", "decode extents into the node's cache ahead of a hedge's reads (by task id)"),
            ("verify", "check an extent's checksum"),
            ("stats", ""),
            ("reads", "Arrow bytes read per table and replica since the node started"),
            ("residency", "what of the tables' extents is in the page cache and held decoded"),
            ("collect_garbage", "delete unreferenced extent files older than min_age_s"),
        ]


def _live(kv: KV) -> list[NodeInfo]:
    return _nodes(discover(kv, NODE_SERVICE))


def _nodes(records: Sequence[ServiceRecord]) -> list[NodeInfo]:
    out = []
    for rec in records:
        out.append(
            NodeInfo(rec.instance_id, rec.labels.get("fault_domain", ""), rec.labels.get("flight", ""))
        )
    return sorted(out, key=lambda n: n.name)


def table_flight_info(
    t: Any, replica: int | None, live: dict[str, str], sign: Any = None
) -> flight.FlightInfo:
    """A table as a FlightInfo: with ``live`` (node -> Flight address), one endpoint per extent of
    one replica (the requested one, else the first readable without degraded reads); a lost
    extent is served as the matching buckets of another replica's extents, one endpoint each.
    ``sign(ticket) -> bytes``: the ticket as the caller presents it (with its read grant)."""
    from ._planner import replica_units

    desc = flight.FlightDescriptor.for_path(t.name)
    endpoints = []
    if live:
        units = None
        last: Exception | None = None
        for r in [replica] if replica is not None else [0, 1, 2]:
            try:
                got = replica_units(t, r, set(live), live)
            except Unavailable as exc:
                last = exc
                continue
            if units is None or (sum(u.degraded for u in got) < sum(u.degraded for u in units)):
                units = got
            if not any(u.degraded for u in got):
                break
        if units is None:
            raise last or Unavailable(f"table {t.name!r} cannot be read")
        for u in units:
            for src in u.sources:
                ticket = {
                    "op": "read",
                    "table": t.name,
                    "extent": src["extent"],
                    "bucket": src["bucket"],
                    "checksum": src["checksum"],
                }
                raw = sign(ticket) if sign is not None else json.dumps(ticket).encode()
                endpoints.append(flight.FlightEndpoint(raw, [flight.Location(src["address"])]))
    return flight.FlightInfo(t.schema, desc, endpoints, t.rows, t.bytes)


class FlightTransport:
    """The coordinator's transport: live nodes from the etcd registry, calls over Flight."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.clients = _Clients(service_identity(COORDINATOR))  # nodes take writes from it alone

    def live_nodes(self) -> list[NodeInfo]:
        return _live(self.kv)

    def live_nodes_with(self, keys: Sequence[str]) -> tuple[list[NodeInfo], list[bytes | None]]:
        """``live_nodes`` and the values of ``keys`` in the registry's store, read in one request
        (``KV.get_many``): a query's plan reads the catalog's version with the live nodes."""
        prefix = service_prefix(NODE_SERVICE)
        values, (records,) = self.kv.get_many(keys, [prefix])
        return _nodes(service_records(prefix, records)), values

    def put_extent(
        self, node: NodeInfo, table: str, extent_id: str, rows: pa.Table, buckets: list, codec: str = ""
    ) -> dict:
        desc = flight.FlightDescriptor.for_command(
            json.dumps({"table": table, "extent": extent_id, "buckets": buckets, "codec": codec})
        )
        try:
            writer, meta = self.clients.get(node.address).do_put(desc, rows.schema, _OPTS)
            writer.write_table(rows)
            writer.done_writing()
            buf = meta.read()
            writer.close()
        except flight.FlightError as exc:
            self.clients.drop(node.address)
            raise from_flight_error(exc, node.name) from None
        if buf is None:
            raise Unavailable(f"{node.name}: no reply to the extent write")
        return json.loads(buf.to_pybytes())

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        return flight_get(self.clients, node.address, task)

    def run_task_stream(
        self, node: NodeInfo, task: dict[str, Any]
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        return self.clients.do_get_stream(node.address, task)

    def action(
        self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        opts = _OPTS if timeout is None else flight.FlightCallOptions(timeout=timeout)
        try:
            results = list(
                self.clients.get(node.address).do_action(
                    flight.Action(name, json.dumps(body, default=str).encode()), opts
                )
            )
        except flight.FlightError as exc:
            if isinstance(exc, flight.FlightUnavailableError):
                self.clients.drop(node.address)
            raise from_flight_error(exc, node.name) from None
        return json.loads(results[0].body.to_pybytes()) if results else {}

    def abandon(self, node: NodeInfo) -> None:
        """``node`` left the cluster: cancel the streams being read from it (``_liveness``)."""
        self.clients.abort(node.address)

    def close(self) -> None:
        self.clients.close()
