from __future__ import annotations

import functools
import io
import itertools
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa

from microco.api.store.v1 import store_pb2 as pb
from microco.api.store.v1 import store_pb2_grpc as pb_grpc
from microco.common import ServiceClient
from microco.common.errors import DeadlineExceeded, InvalidArgument, MicrocoError, from_rpc_error

from ._files import read_source
from ._load import LoadProgress, file_deadline_s

CHUNK = 4 << 20


# StartRecovery's call metadata for `relax_fault_domains` (the request message has no field for it)
RELAX_METADATA = "microco-relax-fault-domains"


# extent codecs a replica may have (``services.store._layout.CODECS``; the client does not import
# the service's modules)
CODECS = ("zstd", "lz4", "none")


def check_codec(codec: str) -> str:
    if codec not in CODECS:
        raise InvalidArgument(f"unknown extent codec {codec!r}: one of {', '.join(CODECS)}")
    return codec


def parse_partitioning(text: str, default_partitions: int = 8, codec: str = "") -> pb.Partitioning:
    """``col``, ``col:hash``, ``col:hash:16`` or ``col:range:b1,b2,...``, each optionally with
    its replica's extent codec as a suffix, ``col:hash:16@lz4`` (else ``codec``; "": the node's
    default, zstd)."""
    if "@" in text:
        text, codec = text.rsplit("@", 1)
        codec = check_codec(codec.strip())
    elif codec:
        check_codec(codec)
    parts = text.split(":", 2)
    col = parts[0].strip()
    kind = parts[1].strip() if len(parts) > 1 and parts[1].strip() else "hash"
    if not col:
        raise InvalidArgument(f"bad partitioning {text!r}: no column")
    if kind == "hash":
        try:
            n = int(parts[2]) if len(parts) > 2 else default_partitions
        except ValueError:
            raise InvalidArgument(f"bad partition count in {text!r}") from None
        return pb.Partitioning(column=col, kind=pb.PARTITION_KIND_HASH, partitions=n, codec=codec)
    if kind == "range":
        bounds = [b.strip() for b in parts[2].split(",")] if len(parts) > 2 else []
        return pb.Partitioning(column=col, kind=pb.PARTITION_KIND_RANGE, range_bounds=bounds, codec=codec)
    raise InvalidArgument(f"bad partitioning {text!r}: kind must be hash or range")


def _table_dict(t: pb.Table) -> dict[str, Any]:
    kinds = {pb.PARTITION_KIND_HASH: "hash", pb.PARTITION_KIND_RANGE: "range"}
    return {
        "name": t.name,
        "schema": pa.ipc.read_schema(pa.py_buffer(t.arrow_schema)) if t.arrow_schema else None,
        "replicas": [
            {
                "column": r.column,
                "kind": kinds.get(r.kind, "hash"),
                "partitions": r.partitions,
                "bounds": list(r.range_bounds),
                "codec": r.codec or "zstd",
            }
            for r in t.replicas
        ],
        "rows": t.rows,
        "bytes": t.bytes,
        "super_extents": t.super_extents,
        "extents": t.extents,
        "unavailable_extents": t.unavailable_extents,
        "placement": json.loads(t.placement_json) if t.placement_json else None,
    }


def load_file(path: str | Path) -> pa.Table:
    """A file (or a directory or glob of them: ``_files.read_source``) as an Arrow table."""
    schema, batches = read_source(path)
    return pa.Table.from_batches(list(batches), schema=schema)


def iter_file(
    path: str | Path,
    batch_rows: int = 65_536,
    csv_block_bytes: int = 8 << 20,
    schema: pa.Schema | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A file (Parquet, CSV, JSON lines; compressed; a directory or glob of them) as a schema and
    a stream of record batches, read as they are sent: a load holds one batch in client memory,
    not the whole file. With ``schema`` (the table's) every batch is conformed to it
    (``_files.read_source``)."""
    return read_source(path, schema, batch_rows=batch_rows, csv_block_bytes=csv_block_bytes)


def record_batches(
    data: pa.Table | pa.RecordBatch | str | Path | pa.RecordBatchReader | Iterable[pa.RecordBatch],
    schema: pa.Schema | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """What ``StoreClient.append`` takes, as a schema and a lazy stream of record batches (an
    iterable's schema is its first batch's; every batch must have it). A file's rows are read
    with ``schema``'s types (the table's) when it is given."""
    if isinstance(data, (str, Path)):
        return iter_file(data, schema=schema)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    it = iter(data)
    first = next(it, None)
    if first is None:
        raise InvalidArgument("nothing to append: the stream of record batches is empty")
    if isinstance(first, pa.Table):
        raise InvalidArgument("a stream to append yields record batches (Table.to_batches()), not tables")
    if not isinstance(first, pa.RecordBatch):
        raise InvalidArgument(f"a stream to append yields record batches, not {type(first).__name__}")
    return first.schema, itertools.chain([first], it)


def ipc_chunks(
    schema: pa.Schema, batches: Iterator[pa.RecordBatch] | Sequence[pa.RecordBatch]
) -> Iterator[bytes]:
    """An Arrow IPC stream of ``batches`` in pieces of at most ``CHUNK`` bytes, each written as
    its batch arrives (never the whole stream in memory)."""
    sink = io.BytesIO()

    def drain() -> bytes:
        raw = sink.getvalue()
        sink.seek(0)
        sink.truncate(0)
        return raw

    writer = pa.ipc.new_stream(sink, schema)
    pending = drain()
    sent = False
    for b in batches:
        writer.write_batch(b)
        pending += drain()
        while len(pending) >= CHUNK:
            yield pending[:CHUNK]
            pending = pending[CHUNK:]
            sent = True
    writer.close()
    pending += drain()
    while pending or not sent:
        yield pending[:CHUNK]
        pending = pending[CHUNK:]
        sent = True


class PiecesReader(io.RawIOBase):
    """A stream of byte pieces (gRPC messages' payloads) as a readable file, each piece pulled
    when the reader gets to it."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._buf = memoryview(b"")
        self._pieces = pieces

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            nxt = next(self._pieces, None)
            if nxt is None:
                return 0
            self._buf = memoryview(nxt)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class StoreClient(ServiceClient):
    """Typed client of the store coordinator (one method per RPC, keyword ``timeout``)."""

    service_name = "store"

    def __init__(self, channel: grpc.Channel, default_timeout: float = 60.0) -> None:
        super().__init__(channel, default_timeout)
        self._stub = pb_grpc.StoreCoordinatorServiceStub(channel)  # type: ignore[no-untyped-call]
        self.last_plan: dict[str, Any] = {}

    @classmethod
    def from_etcd(cls, kv: Any = None, default_timeout: float = 10.0) -> StoreClient:
        """A client of the leading coordinator found in etcd (``kv``, else the platform's as
        ``find_etcd`` finds it), which follows the leader across a fail-over
        (``ServiceClient``: the call is sent again to the new leader when that cannot do it twice)."""
        client: StoreClient = super().from_etcd(kv, default_timeout)
        return client

    # ---------------------------------------------------------------- tables
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        replicas: Sequence[str | pb.Partitioning],
        *,
        codecs: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Create ``name`` with three partitionings, e.g. ``["o_orderkey", "o_custkey:hash:16",
        "o_orderdate:range:1994-01-01,1996-01-01"]``, and optionally each replica's extent codec
        (``codecs``, e.g. ``["zstd", "lz4", "zstd"]``, or a ``@lz4`` suffix on a partitioning;
        default: zstd for every replica)."""
        if codecs is not None and len(codecs) != len(replicas):
            raise InvalidArgument(f"give one codec per replica ({len(replicas)}), got {len(codecs)}")
        parts = []
        for i, r in enumerate(replicas):
            c = codecs[i] if codecs is not None else ""
            if isinstance(r, str):
                parts.append(parse_partitioning(r, codec=c))
            else:
                if c:
                    r = pb.Partitioning(
                        column=r.column,
                        kind=r.kind,
                        partitions=r.partitions,
                        range_bounds=list(r.range_bounds),
                        codec=check_codec(c),
                    )
                parts.append(r)
        req = pb.CreateTableRequest(name=name, arrow_schema=schema.serialize().to_pybytes(), replicas=parts)
        return _table_dict(self._call(self._stub.CreateTable, req, timeout=timeout, idempotent=False))

    def drop_table(self, name: str, *, timeout: float | None = None) -> None:
        self._call(self._stub.DropTable, pb.DropTableRequest(name=name), timeout=timeout, idempotent=True)

    def grant_read(self, table: str, user: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Let ``user`` (and their jobs) read ``table``: its owner's or an administrator's call.
        Returns the table's grants: ``{"table", "owner", "users"}``."""
        req = pb.TableGrantRequest(table=table, user=user)
        return _grants(self._call(self._stub.GrantTableRead, req, timeout=timeout, idempotent=True))

    def revoke_read(self, table: str, user: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Withdraw ``user``'s grant on ``table`` (also from tickets already handed out)."""
        req = pb.TableGrantRequest(table=table, user=user)
        return _grants(self._call(self._stub.RevokeTableRead, req, timeout=timeout, idempotent=True))

    def table_grants(self, table: str, *, timeout: float | None = None) -> dict[str, Any]:
        req = pb.ListTableGrantsRequest(table=table)
        return _grants(self._call(self._stub.ListTableGrants, req, timeout=timeout, idempotent=True))

    def get_table(
        self, name: str, *, placement: bool = False, timeout: float | None = None
    ) -> dict[str, Any]:
        req = pb.GetTableRequest(name=name, placement=placement)
        return _table_dict(self._call(self._stub.GetTable, req, timeout=timeout, idempotent=True))

    def list_tables(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        resp = self._call(self._stub.ListTables, pb.ListTablesRequest(), timeout=timeout, idempotent=True)
        return [_table_dict(t) for t in resp.tables]

    def nodes(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        resp = self._call(
            self._stub.ListStoreNodes, pb.ListStoreNodesRequest(), timeout=timeout, idempotent=True
        )
        return [
            {
                "name": n.name,
                "address": n.flight_address,
                "fault_domain": n.fault_domain,
                "alive": n.alive,
                "extents": n.extents,
                "bytes": n.bytes,
                "read_by_replica": json.loads(n.read_by_replica_json) if n.read_by_replica_json else {},
            }
            for n in resp.nodes
        ]

    # ---------------------------------------------------------------- data
    def append(
        self,
        name: str,
        data: pa.Table | pa.RecordBatch | str | Path | pa.RecordBatchReader | Iterable[pa.RecordBatch],
        *,
        timeout: float | None = None,
        progress: LoadProgress | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """Append rows; all become visible at once. ``data``: an Arrow table or batch; a Parquet or
        CSV file; or a stream (a ``RecordBatchReader``, or any iterable of record batches, e.g. a
        generator): files and streams are sent batch by batch as they are read, so the client
        holds one batch, and the coordinator one super-extent, never the whole table.

        Without ``timeout`` a file gets ``file_deadline_s`` (grows with its size), anything else
        ``max(default_timeout, 600)`` s. ``progress`` counts the rows sent (a progress bar's hook);
        a load that runs out of time says how far it got.

        Every append carries an idempotency ``token`` (a fresh random one unless given): the
        coordinator records it with the commit, so when the answer is lost with a coordinator
        (its fate unknown: ``Stream removed``, a reset connection) the append is sent again,
        with the same token, to whichever coordinator serves next (a client from
        ``from_etcd``), and one that had committed answers with that commit's result instead
        of appending twice. Give your own ``token`` to make a re-run of the same load (e.g. a
        job restarted) append once; tokens are honoured for a day."""
        # Data that can be read again (a table, a batch, a file) is sent again after a fail-over
        # (refused unread, or cut off with its fate unknown: the token makes that safe); a
        # one-shot stream is not (part of it may be gone).
        again = isinstance(data, (pa.Table, pa.RecordBatch, str, Path))
        token = token or uuid.uuid4().hex
        started = time.monotonic()
        if timeout is None and isinstance(data, (str, Path)):
            timeout = max(self.default_timeout, file_deadline_s(data))
        allowed = timeout or max(self.default_timeout, 600)
        deadline = started + allowed
        # A file is read with the table's types (a CSV's later rows need not fit its first block's).
        table_schema = self.get_table(name)["schema"] if isinstance(data, (str, Path)) else None
        while True:
            try:
                schema, batches = record_batches(data, table_schema)
            except InvalidArgument as exc:  # (a reader parses its first block as it opens)
                raise InvalidArgument(f"{exc}; nothing was appended") from None
            if progress is not None:
                progress.rows = progress.batches = 0  # a resend after a fail-over starts again
                batches = progress.wrap(batches)
            failed: list[BaseException] = []

            def requests(
                schema: pa.Schema = schema,
                batches: Iterator[pa.RecordBatch] = batches,
                failed: list[BaseException] = failed,
            ) -> Iterator[pb.AppendRequest]:
                try:
                    for k, piece in enumerate(ipc_chunks(schema, batches)):
                        if k == 0:
                            yield pb.AppendRequest(table=name, arrow_ipc=piece, idempotency_token=token)
                        else:
                            yield pb.AppendRequest(arrow_ipc=piece)
                except Exception as exc:  # (gRPC would only log it and cancel the call)
                    failed.append(exc)
                    raise

            try:
                resp = self._stub.Append(requests(), timeout=deadline - time.monotonic())
            except grpc.RpcError as exc:
                if failed:  # the data could not be read: nothing was committed
                    sent = f" after {progress.describe()}" if progress is not None else ""
                    if isinstance(failed[0], MicrocoError):
                        raise type(failed[0])(f"{failed[0]}{sent}; nothing was appended") from None
                    raise InvalidArgument(f"reading the rows to append failed{sent}: {failed[0]}") from None
                err = from_rpc_error(exc)
                if again and self._failover(err, True, started, deadline):
                    continue
                if isinstance(err, DeadlineExceeded):
                    sent = f"; {progress.describe()}" if progress is not None else ""
                    raise DeadlineExceeded(
                        f"append to {name} ran out of its {allowed:.0f} s deadline{sent}; nothing was "
                        f"committed (give a longer timeout: `microco store load --timeout S`): {err}"
                    ) from None
                raise err from None
            return {"rows": resp.rows, "bytes": resp.bytes, "super_extents": list(resp.super_extents)}

    def query(self, query: Frame | dict[str, Any] | str, *, timeout: float | None = None) -> pa.Table:
        """Run a query; the plan (kind, replicas, EXPLAIN text) is kept in ``last_plan``."""
        req = pb.QueryRequest(query_json=_query_json(query))
        started = time.monotonic()
        deadline = started + (timeout or max(self.default_timeout, 600))
        while True:
            received = False

            def pieces(responses: Iterator[pb.QueryResponse]) -> Iterator[bytes]:
                nonlocal received
                for k, resp in enumerate(responses):
                    received = True
                    if k == 0:
                        self.last_plan = {
                            "kind": resp.plan_kind,
                            "explain": resp.explain,
                            "replicas": json.loads(resp.replicas_json or "{}"),
                        }
                    self.last_plan["moved_bytes"] = resp.moved_bytes
                    yield resp.arrow_ipc

            try:
                responses = self._stub.Query(req, timeout=deadline - time.monotonic())
                # decoded as the pieces arrive: the result's bytes are never all held beside it
                raw = io.BufferedReader(PiecesReader(pieces(responses)), buffer_size=1 << 20)
                return pa.ipc.open_stream(raw).read_all()
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                # a query only reads: sent again (to the new leader) unless part of it arrived
                if not received and self._failover(err, True, started, deadline):
                    continue
                raise err from None

    def sql(self, sql: str, *, timeout: float | None = None) -> pa.Table:
        """Run a SQL query (SELECT; TPC-H's dialect and DuckDB's functions). The plan (kind:
        partition_local, partial_agg or gather; replicas; EXPLAIN text) is kept in ``last_plan``."""
        return self.query(json.dumps({"sql": sql}), timeout=timeout)

    def explain_sql(self, sql: str, *, timeout: float | None = None) -> str:
        return self.explain(json.dumps({"sql": sql}), timeout=timeout)

    def explain(self, query: Frame | dict[str, Any] | str, *, timeout: float | None = None) -> str:
        req = pb.QueryRequest(query_json=_query_json(query))
        text: str = self._call(self._stub.Explain, req, timeout=timeout, idempotent=True).text
        return text

    def read(
        self,
        table: str,
        where: Sequence[Sequence[Any]] = (),
        columns: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> pa.Table:
        """Read (a filtered projection of) a table straight from the store nodes over Arrow Flight,
        in parallel; the coordinator only plans which node serves what. A node that fails or
        stops answering half-way: the read starts over on a plan without it once the coordinator
        sees it gone (``_read``)."""
        from ._read import read_planned

        return read_planned(
            lambda: self.plan_read_pb(table, where, columns, timeout=timeout),
            lambda plan: pa.ipc.read_schema(pa.py_buffer(plan.arrow_schema)),
        )

    def plan_read_pb(
        self,
        table: str,
        where: Sequence[Sequence[Any]] = (),
        columns: Sequence[str] | None = None,
        *,
        replica: int | None = None,
        timeout: float | None = None,
    ) -> pb.PlanReadResponse:
        """Where (a filtered projection of) a table is read: one Flight endpoint (node address,
        ticket) per node, the schema and the EXPLAIN text; ``replica`` forces the replica read."""
        q: dict[str, Any] = {"table": table, "where": [list(w) for w in where]}
        if columns is not None:
            q["select"] = list(columns)
        if replica is not None:
            q["replica"] = replica
        resp: pb.PlanReadResponse = self._call(
            self._stub.PlanRead,
            pb.QueryRequest(query_json=json.dumps(q, default=str)),
            timeout=timeout,
            idempotent=True,
        )
        return resp

    # ---------------------------------------------------------------- operations
    def recovery(self, *, timeout: float | None = None) -> dict[str, Any]:
        r = self._call(self._stub.GetRecovery, pb.GetRecoveryRequest(), timeout=timeout, idempotent=True)
        return {**json.loads(r.json or "{}"), "unavailable_extents": r.unavailable_extents}

    def start_recovery(
        self, *, relax_fault_domains: bool = False, timeout: float | None = None
    ) -> dict[str, Any]:
        """Run a recovery pass now. ``relax_fault_domains`` (administrators): extents that are
        stuck because every live node outside the other copies' nodes shares a fault domain with
        one of them are rebuilt there anyway (on a node holding no copy of their rows)."""
        method = self._stub.StartRecovery
        if relax_fault_domains:
            method = functools.partial(method, metadata=((RELAX_METADATA, "1"),))
        r = self._call(method, pb.StartRecoveryRequest(), timeout=timeout, idempotent=True)
        return {**json.loads(r.json or "{}"), "unavailable_extents": r.unavailable_extents}

    def recode(
        self, table: str, replica: int, codec: str = "", *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Change replica ``replica`` of ``table`` to extent codec ``codec`` (zstd, lz4, none):
        its extents are rewritten in the background; the answer is the recode's progress
        record. Without ``codec``: the progress of the table's last recode."""
        if codec:
            check_codec(codec)
        if replica not in (0, 1, 2):
            raise InvalidArgument(f"replica must be 0, 1 or 2, got {replica}")
        req = pb.RecodeRequest(table=table, replica=replica, codec=codec)
        res = self._call(self._stub.Recode, req, timeout=timeout, idempotent=not codec)
        out: dict[str, Any] = json.loads(res.json)
        return out

    def scrub(self, *, timeout: float | None = None, report: bool = False) -> list[str] | dict[str, Any]:
        """Verify every extent's checksum (corrupt ones are rebuilt) and delete orphan extent files.
        Returns the corrupt extents, or with ``report=True`` ``{"corrupt", "orphans_deleted",
        "orphan_bytes"}``."""
        r = self._call(self._stub.Scrub, pb.ScrubRequest(), timeout=timeout, idempotent=True)
        if not report:
            return list(r.corrupt)
        return {
            "corrupt": list(r.corrupt),
            "orphans_deleted": list(r.orphans_deleted),
            "orphan_bytes": r.orphan_bytes,
        }

    def table(self, name: str) -> Frame:
        return Frame(self, {"table": name})

    # ---------------------------------------------------------------- wire messages
    # The coordinator's answers as messages, every field kept: for a client that shows all a
    # service reports, fields it does not know yet included (the console).
    def list_tables_pb(self, *, timeout: float | None = None) -> pb.ListTablesResponse:
        req = pb.ListTablesRequest()
        resp: pb.ListTablesResponse = self._call(self._stub.ListTables, req, timeout=timeout, idempotent=True)
        return resp

    def nodes_pb(self, *, timeout: float | None = None) -> pb.ListStoreNodesResponse:
        req = pb.ListStoreNodesRequest()
        resp: pb.ListStoreNodesResponse = self._call(
            self._stub.ListStoreNodes, req, timeout=timeout, idempotent=True
        )
        return resp

    def get_table_pb(self, name: str, *, placement: bool = False, timeout: float | None = None) -> pb.Table:
        req = pb.GetTableRequest(name=name, placement=placement)
        table: pb.Table = self._call(self._stub.GetTable, req, timeout=timeout, idempotent=True)
        return table

    def recovery_pb(self, *, timeout: float | None = None) -> pb.RecoveryStatus:
        req = pb.GetRecoveryRequest()
        status: pb.RecoveryStatus = self._call(self._stub.GetRecovery, req, timeout=timeout, idempotent=True)
        return status

    def start_recovery_pb(self, *, timeout: float | None = None) -> pb.RecoveryStatus:
        req = pb.StartRecoveryRequest()
        status: pb.RecoveryStatus = self._call(
            self._stub.StartRecovery, req, timeout=timeout, idempotent=True
        )
        return status

    def explain_pb(
        self, query: Frame | dict[str, Any] | str, *, timeout: float | None = None
    ) -> pb.ExplainResponse:
        req = pb.QueryRequest(query_json=_query_json(query))
        resp: pb.ExplainResponse = self._call(self._stub.Explain, req, timeout=timeout, idempotent=True)
        return resp

    def query_pb(
        self, query: Frame | dict[str, Any] | str, *, timeout: float | None = None
    ) -> Iterator[pb.QueryResponse]:
        """The ``Query`` stream's messages (the first carries the plan; their ``arrow_ipc`` parts
        make one Arrow IPC stream). Errors come as ``MicrocoError``s; not retried."""
        req = pb.QueryRequest(query_json=_query_json(query))
        try:
            yield from self._stub.Query(req, timeout=timeout or max(self.default_timeout, 600))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


def _grants(g: pb.TableGrants) -> dict[str, Any]:
    return {"table": g.table, "owner": g.owner, "users": list(g.users)}


def _query_json(query: Frame | dict[str, Any] | str) -> str:
    if isinstance(query, Frame):
        return json.dumps(query.spec, default=str)
    if isinstance(query, dict):
        return json.dumps(query, default=str)
    return query


class Frame:
    """An immutable query builder; each method returns a new Frame. ``collect()`` runs it."""

    def __init__(self, client: StoreClient | None, spec: dict[str, Any]) -> None:
        self.client = client
        self.spec = spec

    def _with(self, **changes: Any) -> Frame:
        return Frame(self.client, {**self.spec, **changes})

    def filter(self, column: str, op: str, value: Any) -> Frame:
        """Keep rows with ``column <op> value``; ``op`` is one of = != < <= > >= in."""
        return self._with(where=[*self.spec.get("where", []), [column, op, value]])

    def select(self, *columns: str) -> Frame:
        return self._with(select=list(columns))

    def join(self, other: Frame, left_on: str, right_on: str) -> Frame:
        """Inner equi-join with another table's frame (its filters and selection come along)."""
        j = {"table": other.spec["table"], "left_on": left_on, "right_on": right_on}
        for k in ("where", "select", "replica"):
            if k in other.spec:
                j[k] = other.spec[k]
        return self._with(join=j)

    def group_by(self, *columns: str) -> Frame:
        return self._with(group_by=list(columns))

    def agg(self, **named: tuple[str, str]) -> Frame:
        """``agg(total=("sum", "price"), n=("count", "*"))``: sum, count, min, max, mean."""
        return self._with(
            aggs=[*self.spec.get("aggs", []), *[[fn, col, name] for name, (fn, col) in named.items()]]
        )

    def order_by(self, column: str, descending: bool = False) -> Frame:
        return self._with(
            order_by=[*self.spec.get("order_by", []), [column, "desc" if descending else "asc"]]
        )

    def limit(self, n: int) -> Frame:
        return self._with(limit=n)

    def on_replica(self, replica: int) -> Frame:
        """Force the replica (to compare plans; the planner otherwise picks the matching one)."""
        return self._with(replica=replica)

    def collect(self) -> pa.Table:
        if self.client is None:
            raise InvalidArgument("this frame has no client")
        return self.client.query(self)

    def explain(self) -> str:
        if self.client is None:
            raise InvalidArgument("this frame has no client")
        return self.client.explain(self)

    def to_json(self) -> str:
        return json.dumps(self.spec, default=str)
