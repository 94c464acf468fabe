"""Arrow Flight SQL on the store coordinator: ADBC (``adbc-driver-flightsql``), JDBC/ODBC Flight
SQL drivers, DuckDB or pandas through ADBC list the tables and run SQL (docs/store.md, Flight SQL).

The Flight service is served with grpcio, not ``pyarrow.flight``: pyarrow's server hands a call
neither the TLS peer's certificate nor any other transport identity, and the caller here must be
the one of the client certificate (mutual TLS with the platform CA, as every gRPC service), so
the same table-read authorisation applies as on the coordinator's ``Query`` RPC
(``StoreServicer._check_read``, services/store/_authz.py). pyarrow only encodes the Arrow IPC
messages the Flight data carries. The protocol's messages are ``microco.api.flight.v1``
(package ``arrow.flight.protocol`` and ``.sql``: Flight's and Flight SQL's names and numbers).

Served: ``CommandStatementQuery`` and prepared statements
(``CreatePreparedStatement``/``ClosePreparedStatement``, ``CommandPreparedStatementQuery``: what
ADBC's ``cursor.execute`` sends), with bound parameters (``?`` or ``$n``: a ``DoPut`` of the
values, one row per execution, answered with a handle that carries them; ``_sqlparams``),
``CommandGetCatalogs``, ``CommandGetDbSchemas``,
``CommandGetTables`` (``include_schema`` too), ``CommandGetTableTypes``, ``CommandGetSqlInfo``.
Read-only: updates, ingestion, transactions and Substrait are refused with a clear error.

A query runs when its FlightInfo is asked for (the FlightInfo carries the result's schema); the
result waits for the ticket's ``DoGet`` (at most ``RESULTS`` of them, ``RESULT_TTL_S``), and a
ticket whose result is gone runs its SQL again, checked again, as the caller who presents it."""

from __future__ import annotations

import fnmatch
import itertools
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pyarrow as pa
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

import microco
from microco.api.flight.v1 import flight_pb2 as fpb
from microco.api.flight.v1 import flight_pb2_grpc as fpb_grpc
from microco.api.flight.v1 import flight_sql_pb2 as spb
from microco.common import identity
from microco.common.errors import InvalidArgument, MicrocoError, NotFound, Unimplemented
from microco.services.runtime.auth import caller
from microco.services.runtime.server import HANDSHAKE_TIMEOUT_S, ErrorAndMetricsInterceptor

from ._sqlparams import Nanos, bind

log = logging.getLogger(__name__)


class Int32(int):
    """An SqlInfo value sent as Flight SQL's ``int32_bitmask`` (an enum or a bitmask)."""


CATALOG = "microco"
DB_SCHEMA = "store"
TABLE_TYPE = "TABLE"
PARAM_ROWS = 100  # executions one DoPut of bound parameters may ask for (one query each)
PARAM_BYTES = 1 << 20
_BOUND = b"\x00microco-bound\x00"  # a prepared statement's handle with its parameters (``_bound``)
RESULTS = 32  # query results held for their DoGet
RESULT_TTL_S = 300.0
RESULT_BYTES = 2 << 30  # and at most this much of them (Arrow bytes)
BATCH_BYTES = 2 << 20  # a FlightData message stays well under gRPC's usual 4 MiB receive limit
_URL = "type.googleapis.com/"

# CommandGetSqlInfo: the SqlInfo codes answered (Flight SQL's numbering) and the union it returns
# server name, version, Arrow version, read-only, SQL, Substrait; transactions (an int32 enum: none);
# cancel
SQL_INFO: dict[int, str | bool | Int32] = {
    0: "Instalytics store (microco)",
    1: microco.__version__,
    2: pa.__version__,
    3: True,
    4: True,
    5: False,
    8: Int32(0),
    9: False,
}
_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", pa.utf8()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.utf8())),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
    ]
)
SQL_INFO_SCHEMA = pa.schema(
    [pa.field("info_name", pa.uint32(), False), pa.field("value", _INFO_VALUE, False)]
)
CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), False),
        pa.field("table_type", pa.utf8(), False),
    ]
)
TABLES_SCHEMA_WITH_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), False)])


def pack(msg: Message) -> bytes:
    """``msg`` in a ``google.protobuf.Any``, serialised (a Flight SQL command, ticket or result)."""
    a = any_pb2.Any()
    a.Pack(msg)
    return a.SerializeToString()


def unpack(raw: bytes, what: str) -> Message:
    """The Flight SQL message in the serialised ``Any`` ``raw`` (``InvalidArgument`` for anything
    else, ``Unimplemented`` for a Flight SQL command this endpoint does not serve)."""
    a = any_pb2.Any()
    try:
        a.ParseFromString(raw)
    except DecodeError:
        raise InvalidArgument(f"{what} is not a Flight SQL command (a google.protobuf.Any)") from None
    name = a.type_url.removeprefix(_URL)
    pkg, _, short = name.rpartition(".")
    served = pkg == spb.DESCRIPTOR.package and short in spb.DESCRIPTOR.message_types_by_name
    cls = getattr(spb, short) if served else None
    if cls is None:
        if pkg == spb.DESCRIPTOR.package:
            raise Unimplemented(f"Flight SQL {short} is not supported: this endpoint is read-only SQL")
        raise InvalidArgument(f"{what} is not a Flight SQL command: {a.type_url[:120]!r}")
    msg = cls()
    if not a.Unpack(msg):
        raise InvalidArgument(f"malformed {short}")
    return msg  # type: ignore[no-any-return]


def _like(pattern: str | None, name: str) -> bool:
    """SQL LIKE (``%``, ``_``; Flight SQL's filter patterns), case-sensitive."""
    if not pattern:
        return True
    glob = "".join(
        "*" if c == "%" else "?" if c == "_" else "[" + c + "]" if c in "*?[" else c for c in pattern
    )
    return fnmatch.fnmatchcase(name, glob)


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded: a Flight stream carries no dictionary deltas here."""
    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.itercolumns()]
    return pa.Table.from_arrays(
        cols,
        schema=pa.schema(
            [
                pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type, f.nullable)
                for f in table.schema
            ]
        ),
    )


def flight_data(table: pa.Table) -> Iterator[fpb.FlightData]:
    """``table`` as Flight's data messages: its schema, then record batches of about
    ``BATCH_BYTES`` each."""
    table = _plain(table)
    per_row = table.nbytes / table.num_rows if table.num_rows else 1
    rows = max(1, int(BATCH_BYTES / max(per_row, 1)))
    yield _data(table.schema.serialize())
    for batch in table.to_batches(max_chunksize=rows):  # one batch serialised at a time
        yield _data(batch.serialize())


def _data(message: pa.Buffer) -> fpb.FlightData:
    m = pa.ipc.read_message(message)
    return fpb.FlightData(
        data_header=m.metadata.to_pybytes(), data_body=m.body.to_pybytes() if m.body is not None else b""
    )


class _Results:
    """Query results waiting for their ticket's DoGet: bounded and expiring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, str, pa.Table]] = OrderedDict()

    def put(self, who: str, table: pa.Table) -> str:
        key = uuid.uuid4().hex
        with self._lock:
            self._items[key] = (time.monotonic() + RESULT_TTL_S, who, table)
            # the oldest go first (their tickets then run the query again); the newest always stays
            while len(self._items) > 1 and (
                len(self._items) > RESULTS or sum(t.nbytes for _, _, t in self._items.values()) > RESULT_BYTES
            ):
                self._items.popitem(last=False)
        return key

    def take(self, key: str, who: str) -> pa.Table | None:
        now = time.monotonic()
        with self._lock:
            for k in [k for k, (exp, _, _) in self._items.items() if exp < now]:
                del self._items[k]
            item = self._items.get(key)
            if item is None or item[1] != who:  # another caller's result is not theirs to take
                return None
            del self._items[key]
            return item[2]


class FlightSqlServicer(fpb_grpc.FlightServiceServicer):
    """Flight SQL over the coordinator's ``StoreServicer`` (its core, authorisation and SQL)."""

    def __init__(self, store: Any) -> None:
        self.store = store  # the StoreServicer: .core, .owners, ._check_read
        self.results = _Results()

    # ---------------------------------------------------------------- helpers
    def _tables(self, context: Any) -> list[str]:
        who = caller(context)
        return [n for n in self.store.core.catalog.table_names() if self.store.owners.may_read(who, n)]

    def _run(self, context: Any, sql: str) -> pa.Table:
        if not sql.strip():
            raise InvalidArgument("empty SQL query")
        self.store._check_read(context, sql, None)
        # a client that goes away (or passes its deadline) ends the query, its tasks cancelled
        # on their nodes, as the store's own gRPC endpoint does (``StoreCore._with_retries``)
        table, plan = self.store.core.sql(sql, getattr(context, "add_callback", None))
        log.info("flight sql query (%s) by %s: %d rows", plan.kind, caller(context).name, table.num_rows)
        return table  # type: ignore[no-any-return]

    def _info(
        self, descriptor: fpb.FlightDescriptor, schema: pa.Schema, ticket: bytes, rows: int = -1
    ) -> fpb.FlightInfo:
        return fpb.FlightInfo(
            schema=schema.serialize().to_pybytes(),
            flight_descriptor=descriptor,
            endpoint=[fpb.FlightEndpoint(ticket=fpb.Ticket(ticket=ticket))],
            total_records=rows,
            total_bytes=-1,
        )

    def _bound_schema(self, sql: str) -> pa.Schema | None:
        """The schema of ``sql``'s answer as DuckDB binds it over empty tables of the schemas of
        the tables it reads (nothing is read); None when it does not bind so (a placeholder not
        bound yet, an error its run will report). What ``CreatePreparedStatement`` answers as the
        statement's ``dataset_schema`` and ``GetSchema`` of a statement: held out (session 39),
        ADBC's ``adbc_execute_schema`` was refused ("Database server did not provide schema for
        prepared statement"), and ``GetSchema`` ran the whole query and kept its result for a
        ticket nobody would present. Only the output's names and types are taken from the bound
        statement, and an empty table of them made: the statement itself never runs here."""
        import duckdb

        from ._authz import sql_tables
        from ._sql import duck

        core = self.store.core
        try:
            names = sql_tables(core.catalog.table_names(), sql)  # (the store's parse: one SELECT)
            statements = duckdb.extract_statements(sql)  # (DuckDB's parse: nothing runs)
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                return None
            con = duck()
        except (duckdb.Error, MicrocoError):
            return None
        try:
            for n in names:
                con.register(n, core.table(n).schema.empty_table())
            rel = con.sql(sql)  # bound, not run: a SELECT's relation runs when fetched
            cols = ", ".join(
                f'NULL::{t} AS "{c.replace(chr(34), chr(34) * 2)}"'
                for c, t in zip(rel.columns, rel.types, strict=True)
            )
            return _plain(con.sql(f"SELECT {cols} LIMIT 0").to_arrow_table()).schema
        except (duckdb.Error, MicrocoError):
            return None
        finally:
            con.close()

    def _run_all(self, context: Any, sqls: list[str]) -> pa.Table:
        """One statement, or one per row of bound parameters, their results one after another."""
        tables = [self._run(context, q) for q in sqls]
        if len(tables) == 1:
            return tables[0]
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise InvalidArgument(
                f"the executions of the bound rows give results of different types: {e}"
            ) from None

    def _statement(
        self, context: Any, descriptor: fpb.FlightDescriptor, sql: str | list[str]
    ) -> fpb.FlightInfo:
        sqls = [sql] if isinstance(sql, str) else sql
        table = self._run_all(context, sqls)
        key = self.results.put(caller(context).name, table)
        handle = json.dumps({"result": key, "sql": sqls}).encode()
        ticket = pack(spb.TicketStatementQuery(statement_handle=handle))
        return self._info(descriptor, _plain(table.slice(0, 0)).schema, ticket, table.num_rows)

    def _metadata(self, context: Any, cmd: Message) -> pa.Table:
        """The result of a catalog command (the caller sees the tables they may read)."""
        if isinstance(cmd, spb.CommandGetCatalogs):
            return pa.table({"catalog_name": [CATALOG]}, schema=CATALOGS_SCHEMA)
        if isinstance(cmd, spb.CommandGetDbSchemas):
            ok = (not cmd.HasField("catalog") or cmd.catalog == CATALOG) and _like(
                cmd.db_schema_filter_pattern if cmd.HasField("db_schema_filter_pattern") else None, DB_SCHEMA
            )
            return pa.table(
                {"catalog_name": [CATALOG] * ok, "db_schema_name": [DB_SCHEMA] * ok}, schema=DB_SCHEMAS_SCHEMA
            )
        if isinstance(cmd, spb.CommandGetTableTypes):
            return pa.table({"table_type": [TABLE_TYPE]}, schema=TABLE_TYPES_SCHEMA)
        if isinstance(cmd, spb.CommandGetTables):
            ok = (
                (not cmd.HasField("catalog") or cmd.catalog == CATALOG)
                and _like(
                    cmd.db_schema_filter_pattern if cmd.HasField("db_schema_filter_pattern") else None,
                    DB_SCHEMA,
                )
                and (not cmd.table_types or TABLE_TYPE in cmd.table_types)
            )
            pattern = cmd.table_name_filter_pattern if cmd.HasField("table_name_filter_pattern") else None
            names = [n for n in self._tables(context) if ok and _like(pattern, n)]
            cols: dict[str, list[Any]] = {
                "catalog_name": [CATALOG] * len(names),
                "db_schema_name": [DB_SCHEMA] * len(names),
                "table_name": names,
                "table_type": [TABLE_TYPE] * len(names),
            }
            if not cmd.include_schema:
                return pa.table(cols, schema=TABLES_SCHEMA)
            cols["table_schema"] = [
                _plain(self.store.core.table(n).schema.empty_table()).schema.serialize().to_pybytes()
                for n in names
            ]
            return pa.table(cols, schema=TABLES_SCHEMA_WITH_SCHEMA)
        if isinstance(cmd, spb.CommandGetSqlInfo):
            codes = [c for c in (cmd.info or sorted(SQL_INFO)) if c in SQL_INFO]
            tags = {str: 0, bool: 1, Int32: 3}
            children: list[list[Any]] = [[], [], [], [], [], []]
            types, offsets = [], []
            for c in codes:
                v = SQL_INFO[c]
                tag = tags[type(v)]
                types.append(tag)
                offsets.append(len(children[tag]))
                children[tag].append(int(v) if isinstance(v, Int32) else v)
            arrays = [pa.array(vals, type=f.type) for vals, f in zip(children, _INFO_VALUE, strict=True)]
            value = pa.UnionArray.from_dense(
                pa.array(types, pa.int8()),
                pa.array(offsets, pa.int32()),
                arrays,
                [f.name for f in _INFO_VALUE],
            )
            return pa.Table.from_arrays([pa.array(codes, pa.uint32()), value], schema=SQL_INFO_SCHEMA)
        raise Unimplemented(f"Flight SQL {type(cmd).__name__} is not supported here")

    # ---------------------------------------------------------------- Flight methods
    def GetFlightInfo(self, request, context):
        if request.type != fpb.FlightDescriptor.CMD:
            raise InvalidArgument("this is a Flight SQL endpoint: a descriptor is a Flight SQL command")
        cmd = unpack(request.cmd, "the flight descriptor")
        if isinstance(cmd, spb.CommandStatementQuery):
            if cmd.HasField("transaction_id"):
                raise Unimplemented("transactions are not supported: the store is read-only over Flight SQL")
            return self._statement(context, request, cmd.query)
        if isinstance(cmd, spb.CommandPreparedStatementQuery):
            return self._statement(context, request, _prepared_sqls(cmd.prepared_statement_handle))
        table = self._metadata(context, cmd)  # checks the command before a ticket is handed out
        return self._info(request, table.schema, request.cmd, table.num_rows)

    def GetSchema(self, request, context):
        if request.type == fpb.FlightDescriptor.CMD:
            cmd = unpack(request.cmd, "the flight descriptor")
            sqls: str | list[str] | None = None
            if isinstance(cmd, spb.CommandStatementQuery):
                sqls = cmd.query
            elif isinstance(cmd, spb.CommandPreparedStatementQuery):
                sqls = _prepared_sqls(cmd.prepared_statement_handle)
            if sqls is not None:
                sqls = [sqls] if isinstance(sqls, str) else sqls
                for q in sqls:
                    if not q.strip():
                        raise InvalidArgument("empty SQL query")
                    self.store._check_read(context, q, None)
                schema = self._bound_schema(sqls[0])
                if schema is None:  # (run it, keeping no result: its error, or its schema)
                    schema = _plain(self._run_all(context, sqls).slice(0, 0)).schema
                return fpb.SchemaResult(schema=schema.serialize().to_pybytes())
        info = self.GetFlightInfo(request, context)
        return fpb.SchemaResult(schema=info.schema)

    def DoGet(self, request, context):
        cmd = unpack(request.ticket, "the ticket")
        if isinstance(cmd, spb.TicketStatementQuery):
            try:
                handle = json.loads(cmd.statement_handle)
                key, sql = str(handle["result"]), handle["sql"]
                sqls = [str(q) for q in sql] if isinstance(sql, list) else [str(sql)]
            except (ValueError, KeyError, TypeError):
                raise InvalidArgument("malformed statement ticket") from None
            table = self.results.take(key, caller(context).name)
            if table is None:  # expired, or asked for by another caller: run again, as them
                table = self._run_all(context, sqls)
        else:
            table = self._metadata(context, cmd)
        yield from flight_data(table)

    def DoAction(self, request, context):
        if request.type == "CreatePreparedStatement":
            req = unpack(request.body, "the action body")
            if not isinstance(req, spb.ActionCreatePreparedStatementRequest):
                raise InvalidArgument("CreatePreparedStatement takes an ActionCreatePreparedStatementRequest")
            if req.HasField("transaction_id"):
                raise Unimplemented("transactions are not supported: the store is read-only over Flight SQL")
            if not req.query.strip():
                raise InvalidArgument("empty SQL query")
            self.store._check_read(context, req.query, None)  # refuse early; checked again when run
            # The handle is the statement itself: nothing is kept, so nothing leaks when a client
            # never closes it; it runs (and is authorised) when executed, as its caller.
            res = spb.ActionCreatePreparedStatementResult(prepared_statement_handle=req.query.encode())
            schema = self._bound_schema(req.query)
            if schema is not None:
                res.dataset_schema = schema.serialize().to_pybytes()
            yield fpb.Result(body=pack(res))
        elif request.type == "ClosePreparedStatement":
            unpack(request.body, "the action body")
        else:
            raise Unimplemented(f"Flight SQL action {request.type[:80]!r} is not supported")

    def ListActions(self, request, context):
        for name in ("CreatePreparedStatement", "ClosePreparedStatement"):
            yield fpb.ActionType(type=name, description=f"Flight SQL {name}")

    def DoPut(self, request_iterator, context):
        """Bound parameters of a prepared query: the values (an Arrow stream, one row per
        execution) are put in a new handle, sent back for the client to execute with (Flight
        SQL's stateless prepared statements: nothing is kept here)."""
        messages = iter(request_iterator)
        first = next(messages, None)
        if first is None or not first.HasField("flight_descriptor") or not first.flight_descriptor.cmd:
            raise InvalidArgument("a Flight SQL DoPut starts with its command's descriptor")
        cmd = unpack(first.flight_descriptor.cmd, "the DoPut descriptor")
        if not isinstance(cmd, spb.CommandPreparedStatementQuery):
            raise Unimplemented(
                f"Flight SQL DoPut of {type(cmd).__name__} (updates, ingestion) is not supported: the "
                "store is read-only over Flight SQL; load tables with `microco store load`"
            )
        sql, _ = _unbound(cmd.prepared_statement_handle)
        params = _read_stream(first, messages)
        if params.num_rows > PARAM_ROWS:
            raise InvalidArgument(
                f"at most {PARAM_ROWS} rows of parameters at once ({params.num_rows} bound)"
            )
        for row in _rows(params):
            bind(sql, row)  # the count and the types checked now, not at execution
        res = spb.DoPutPreparedStatementResult(prepared_statement_handle=_bound(sql, params))
        yield fpb.PutResult(app_metadata=res.SerializeToString())  # (not in an Any: as ADBC reads it)


def _bound(sql: str, params: pa.Table) -> bytes:
    """A prepared statement's handle carrying its bound parameters."""
    text = sql.encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, params.schema) as w:
        w.write_table(params)
    return _BOUND + len(text).to_bytes(4, "little") + text + sink.getvalue().to_pybytes()


def _unbound(handle: bytes) -> tuple[str, pa.Table | None]:
    """A handle's statement and its bound parameters (None: none bound)."""
    try:
        if not handle.startswith(_BOUND):
            return handle.decode(), None
        at = len(_BOUND)
        n = int.from_bytes(handle[at : at + 4], "little")
        sql = handle[at + 4 : at + 4 + n].decode()
        params = pa.ipc.open_stream(pa.py_buffer(handle[at + 4 + n :])).read_all()
        return sql, params
    except (UnicodeDecodeError, pa.ArrowInvalid):
        raise NotFound("unknown prepared statement handle") from None


def _prepared_sqls(handle: bytes) -> str | list[str]:
    """What a prepared statement's handle executes: its statement, or one per bound row."""
    sql, params = _unbound(handle)
    if params is None:
        return sql
    if params.num_rows > PARAM_ROWS:  # (a handle is the client's to send: checked again here)
        raise InvalidArgument(f"at most {PARAM_ROWS} rows of parameters at once ({params.num_rows} bound)")
    return [bind(sql, row) for row in _rows(params)]


def _values(c: pa.ChunkedArray) -> list[Any]:
    """A parameter column's values for ``bind``. A timestamp of nanoseconds (pandas' kind) as its
    exact text: Python's datetime holds none, and without pandas pyarrow refuses to make one
    (held out, session 42: every execution with such a parameter failed, "Nanosecond resolution
    temporal type ... is not safely convertible")."""
    if pa.types.is_timestamp(c.type) and c.type.unit == "ns":
        zoned = c.type.tz is not None
        return [None if s is None else Nanos(s, zoned) for s in c.cast(pa.string()).to_pylist()]
    if pa.types.is_duration(c.type) and c.type.unit == "ns":  # (pandas' timedeltas)
        try:
            return c.cast(pa.duration("us")).to_pylist()
        except pa.ArrowInvalid:
            raise InvalidArgument(
                "a duration parameter holds nanoseconds: the store's SQL keeps an interval to microseconds"
            ) from None
    if pa.types.is_time64(c.type) and c.type.unit == "ns":  # (Polars' times): SQL's TIME is microseconds
        try:
            return c.cast(pa.time64("us")).to_pylist()
        except pa.ArrowInvalid:
            raise InvalidArgument(
                "a time parameter holds nanoseconds: the store's SQL keeps a time to microseconds"
            ) from None
    return c.to_pylist()


def _rows(params: pa.Table) -> list[list[Any]]:
    cols = [_values(c) for c in params.itercolumns()]
    return [[c[i] for c in cols] for i in range(params.num_rows)]


def _read_stream(first: fpb.FlightData, rest: Iterator[fpb.FlightData]) -> pa.Table:
    """The Arrow stream of a DoPut's data messages (the first carries the schema), at most
    ``PARAM_BYTES``."""
    size = 0
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    for m in itertools.chain([first], rest):
        if not m.data_header:
            continue
        size += len(m.data_header) + len(m.data_body)
        if size > PARAM_BYTES:
            raise InvalidArgument(f"bound parameters over {PARAM_BYTES} bytes")
        try:
            msg = pa.ipc.read_message(_ipc_frame(m.data_header, m.data_body))
            if schema is None:
                schema = pa.ipc.read_schema(msg)
            else:
                batches.append(pa.ipc.read_record_batch(msg, schema))
        except (pa.ArrowInvalid, OSError) as e:
            raise InvalidArgument(f"bound parameters are not an Arrow stream: {e}") from None
    if schema is None:
        raise InvalidArgument("no bound parameters were sent")
    return pa.Table.from_batches(batches, schema=schema)


def _ipc_frame(header: bytes, body: bytes) -> pa.Buffer:
    """One encapsulated IPC message (continuation, length, flatbuffer padded to 8, body)."""
    pad = -len(header) % 8
    return pa.py_buffer(
        b"\xff\xff\xff\xff" + (len(header) + pad).to_bytes(4, "little") + header + b"\x00" * pad + body
    )


class FlightSqlServer:
    """The Flight SQL endpoint's own gRPC server (mutual TLS with the platform CA as the
    coordinator, plaintext in insecure mode)."""

    def __init__(self, store: Any, host: str, port: int = 0, ident: identity.Identity | None = None) -> None:
        workers = 32  # every Flight call streams: a few callers' open streams must not take them all
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flightsql"),
            interceptors=[ErrorAndMetricsInterceptor("store-flightsql", workers)],
            options=[("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000))],
        )
        fpb_grpc.add_FlightServiceServicer_to_server(FlightSqlServicer(store), self.server)
        self.secure = ident is not None
        if ident is None:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        else:
            creds = identity.server_credentials(ident)
            self.port = self.server.add_secure_port(f"{host}:{port}", creds)  # type: ignore[arg-type]
        if not self.port:
            raise MicrocoError(f"Flight SQL: cannot bind {host}:{port}")

    def start(self) -> FlightSqlServer:
        self.server.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait()
