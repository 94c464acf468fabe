"""The coordinator's gRPC servicer (a thin adapter over ``StoreCore``), its recovery loop, and the
two process entries: the coordinator and a store node."""

from __future__ import annotations

import argparse
import io
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from prometheus_client import Counter, Gauge

from microco.api.store.v1 import store_pb2 as pb
from microco.api.store.v1 import store_pb2_grpc as pb_grpc
from microco.clients.store import RELAX_METADATA, grant_ticket, ipc_chunks, secure_location
from microco.common.errors import InvalidArgument, PermissionDenied
from microco.common.identity import service_identity
from microco.services.runtime.auth import caller
from microco.services.runtime.server import ServiceContext, run_service

from ._authz import TableOwners, sql_tables
from ._core import StoreCore
from ._flight import NODE_SERVICE, FlightTransport, StoreFlightServer
from ._layout import CODECS, DEFAULT_COMPRESSION, EXTENT_LAYOUT, LAYOUTS
from ._limits import check_keys, load_json
from ._nodestore import CACHE_BYTES, NodeStore
from ._partition import spec_from_pb, spec_to_pb
from ._query import Query
from ._standby import CoordinatorElection

log = logging.getLogger(__name__)

SERVICE = "store"

QUERIES = Counter("microco_store_queries_total", "queries run, by plan kind", ["kind"])
LOST = Gauge("microco_store_unavailable_extents", "extents on dead nodes or corrupt")
REBUILT = Counter("microco_store_extents_rebuilt_total", "extents rebuilt by recovery")


def schema_from_bytes(raw: bytes) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidArgument(f"arrow_schema is not an IPC-serialised schema: {exc}") from None


RESULT_BATCH_ROWS = 65_536  # a query result is serialised this many rows at a time


def parse_request(query_json: str) -> tuple[str | None, Query | None]:
    """``(sql, None)`` for a ``{"sql": "..."}`` request (SQL rides the Query RPC's JSON, so the
    wire protocol is unchanged), else ``(None, the JSON query)``."""
    d = load_json(query_json, "query")
    if isinstance(d, dict) and "sql" in d:
        check_keys(d, {"sql"}, "SQL query")
        if not isinstance(d["sql"], str):
            raise InvalidArgument("'sql' must be a string")
        return d["sql"], None
    return None, Query.from_json(d)


class _MessageStream(io.RawIOBase):
    """The bytes of a client stream's messages as a readable file, pulled as they are read."""

    def __init__(self, first: bytes, rest: Iterator[bytes]) -> None:
        self._buf = memoryview(first)
        self._rest = rest
        self.received = len(first)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            nxt = next(self._rest, None)
            if nxt is None:
                return 0
            self._buf = memoryview(nxt)
            self.received += len(nxt)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _ipc_batches(reader: pa.ipc.RecordBatchStreamReader) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidArgument(f"append body is not a valid Arrow IPC stream: {exc}") from None


class StoreServicer(pb_grpc.StoreCoordinatorServiceServicer):
    def __init__(self, core: StoreCore, recovery: RecoveryLoop | None = None) -> None:
        self.core = core
        self.owners = TableOwners(getattr(core, "kv", None))
        self.recovery = recovery
        self._signer: list[Any] = []  # the identity that signs PlanRead's read tickets, once known

    def _identity(self) -> Any:
        """The coordinator's identity, which signs the read tickets PlanRead hands out (``None``
        in insecure mode)."""
        if not self._signer:
            self._signer.append(service_identity(SERVICE))
        return self._signer[0]

    def _table_pb(self, name: str, placement: bool = False) -> pb.Table:
        t = self.core.table(name)
        live = {n.name for n in self.core.transport.live_nodes()}
        exts = t.extents()
        place = ""
        if placement:
            place = json.dumps(
                {
                    str(s.id): {str(r): {str(e.partition): e.node for e in s.replica(r)} for r in range(3)}
                    for s in t.super_extents
                }
            )
        return pb.Table(
            name=t.name,
            arrow_schema=t.schema.serialize().to_pybytes(),
            replicas=[spec_to_pb(s, c) for s, c in zip(t.specs, t.codecs, strict=True)],
            rows=t.rows,
            bytes=t.stored_bytes,  # on the nodes' disks; the planner's t.bytes is the Arrow data's size
            super_extents=len(t.super_extents),
            extents=len(exts),
            unavailable_extents=sum(1 for e in exts if e.node not in live or e.state != "ok"),
            placement_json=place,
        )

    def CreateTable(self, request, context):
        specs = [spec_from_pb(p) for p in request.replicas]
        codecs = [p.codec for p in request.replicas]
        self.core.create_table(request.name, schema_from_bytes(request.arrow_schema), specs, codecs)
        self.owners.created(caller(context), request.name)
        return self._table_pb(request.name)

    def DropTable(self, request, context):
        self.owners.check(caller(context), request.name, "drop")
        self.core.drop_table(request.name)
        self.owners.dropped(request.name)
        return pb.DropTableResponse()

    def _check_read(self, context: Any, sql: str | None, q: Query | None) -> None:
        """Refuse a query of a table the caller may not read (``_authz``)."""
        who = caller(context)
        if who.trusted:
            return
        if sql is not None:
            tables = sql_tables(self.core.catalog.table_names(), sql)
        else:
            assert q is not None
            tables = [q.table] + ([q.join.table] if q.join else [])
        self.owners.check_read(who, tables)

    def GetTable(self, request, context):
        self.owners.check_read(caller(context), [request.name])
        return self._table_pb(request.name, request.placement)

    def ListTables(self, request, context):
        who = caller(context)
        names = [n for n in self.core.catalog.table_names() if self.owners.may_read(who, n)]
        return pb.ListTablesResponse(tables=[self._table_pb(n) for n in names])

    def ListStoreNodes(self, request, context):
        return pb.ListStoreNodesResponse(
            nodes=[
                pb.StoreNode(
                    name=n["name"],
                    flight_address=n["address"],
                    fault_domain=n["fault_domain"],
                    alive=n["alive"],
                    bytes=n["bytes"],
                    extents=n["extents"],
                    read_by_replica_json=json.dumps(n["read_by_replica"]) if n["read_by_replica"] else "",
                )
                for n in self.core.nodes()
            ]
        )

    def Append(self, request_iterator, context):
        t0 = time.perf_counter()
        requests = iter(request_iterator)
        first = next(requests, None)
        if first is None or not first.table:
            raise InvalidArgument("the first append message must name the table")
        table = first.table
        self.owners.check(caller(context), table, "append to")
        # The Arrow IPC stream is read batch by batch as its messages arrive: the coordinator
        # holds at most one super-extent of rows, written out while the rest is still coming.
        body = _MessageStream(first.arrow_ipc, (r.arrow_ipc for r in requests))
        try:
            # buffered: Arrow asks for whole messages; BufferedReader reads on until it has them
            reader = pa.ipc.open_stream(io.BufferedReader(body, buffer_size=1 << 20))
        except (pa.ArrowInvalid, OSError) as exc:
            raise InvalidArgument(f"append body is not an Arrow IPC stream: {exc}") from None
        res = self.core.append_batches(table, _ipc_batches(reader), first.idempotency_token)
        log.info(
            "append %s: %d bytes of Arrow IPC received and written in %.2fs",
            table,
            body.received,
            time.perf_counter() - t0,
        )
        return pb.AppendResponse(rows=res.rows, bytes=res.bytes, super_extents=res.super_extents)

    def Query(self, request, context):
        sql, q = parse_request(request.query_json)
        self._check_read(context, sql, q)
        # a caller that goes away (cancels, its deadline passes, its connection drops) ends the
        # query, its tasks cancelled on their nodes (``StoreCore._with_retries``)
        gone = getattr(context, "add_callback", None)
        table, plan = self.core.sql(sql, gone) if sql is not None else self.core.query(q, gone)
        QUERIES.labels(plan.kind).inc()
        # the result is serialised as it is sent, a batch at a time (not into one buffer and
        # then a list of its pieces: two more copies of the result)
        pieces = ipc_chunks(table.schema, table.to_batches(max_chunksize=RESULT_BATCH_ROWS))
        piece = next(pieces)
        for k in itertools.count():
            msg = pb.QueryResponse(arrow_ipc=piece)
            if k == 0:
                msg.plan_kind, msg.explain, msg.replicas_json = (
                    plan.kind,
                    plan.explain_text(),
                    json.dumps(plan.replicas),
                )
            after = next(pieces, None)
            if after is None:
                msg.moved_bytes = plan.moved_bytes
                yield msg
                return
            yield msg
            piece = after

    def Explain(self, request, context):
        sql, q = parse_request(request.query_json)
        self._check_read(context, sql, q)
        plan = self.core.explain_sql(sql) if sql is not None else self.core.plan(q)
        return pb.ExplainResponse(
            text=plan.explain_text(), plan_kind=plan.kind, replicas_json=json.dumps(plan.replicas)
        )

    def PlanRead(self, request, context):
        q = Query.from_json(request.query_json)
        if q.aggs or q.join or q.order_by or q.limit is not None:
            raise InvalidArgument(
                "PlanRead takes a scan (filter and projection only); use Query for the rest"
            )
        self._check_read(context, None, q)
        who = caller(context)
        plan = self.core.plan(q)
        addresses = {n.name: n.address for n in self.core.transport.live_nodes()}
        eps = [
            pb.FlightEndpoint(address=addresses[node], ticket=grant_ticket(self._identity(), task, who.name))
            for node, task in plan.stages[0]
            if node in addresses
        ]
        t = self.core.table(q.table)
        cols = plan.final["select"]
        schema = pa.schema([t.schema.field(c) for c in cols])
        return pb.PlanReadResponse(
            endpoints=eps, explain=plan.explain_text(), arrow_schema=schema.serialize().to_pybytes()
        )

    def GetRecovery(self, request, context):
        return pb.RecoveryStatus(
            json=json.dumps(self.core.catalog.recovery()), unavailable_extents=self.core.lost_count()
        )

    def StartRecovery(self, request, context):
        # An operator's `--relax-fault-domains` rides as call metadata (RELAX_METADATA): the
        # request message has no field for it. Administrators and platform services only.
        relax = any(k == RELAX_METADATA and v == "1" for k, v in context.invocation_metadata() or ())
        if relax:
            who = caller(context)
            if not who.trusted:
                raise PermissionDenied(f"{who.name} may not relax the fault-domain rule of recovery")
            log.warning(
                "recovery: %s allowed rebuilt extents to share a fault domain with another copy", who.name
            )
        if self.recovery is not None:
            self.recovery.kick(relax_domains=relax)
        else:
            self.core.recover(relax_domains=relax)
        return self.GetRecovery(request, context)

    def Recode(self, request, context):
        # an empty codec reads the progress (a reader of the table may); a change is its owner's
        if not request.codec:
            self.owners.check_read(caller(context), [request.table])
            self.core.catalog.table_record(request.table)
            return pb.RecoveryStatus(json=json.dumps(self.core.recode_progress(request.table)))
        self.owners.check(caller(context), request.table, "recode")
        progress = self.core.recode(request.table, request.replica, request.codec)
        return pb.RecoveryStatus(json=json.dumps(progress))

    def Scrub(self, request, context):
        # An operator's: it re-reads every byte of every user's tables at full speed, deletes
        # orphans and names what it found (session 42: any user or job could, as often as it
        # liked). The scheduled scrub is throttled and runs in the coordinator itself.
        who = caller(context)
        if not who.trusted:
            raise PermissionDenied(
                f"{who.name} may not scrub the store: it reads every table on every node; "
                "administrators and platform services only"
            )
        bad = self.core.scrub()
        if bad and self.recovery is not None:
            self.recovery.kick()
        gc = self.core.collect_garbage()
        return pb.ScrubResponse(corrupt=bad, orphans_deleted=gc["deleted"], orphan_bytes=gc["bytes"])

    # ------------------------------------------------------------ sharing (docs/security.md)
    def _grants_pb(self, table: str) -> pb.TableGrants:
        return pb.TableGrants(table=table, owner=self.owners.owner(table), users=self.owners.grants(table))

    def GrantTableRead(self, request, context):
        self.core.catalog.table_record(request.table)  # NotFound for a table that is not there
        self.owners.grant(caller(context), request.table, request.user)
        return self._grants_pb(request.table)

    def RevokeTableRead(self, request, context):
        self.core.catalog.table_record(request.table)
        self.owners.revoke(caller(context), request.table, request.user)
        return self._grants_pb(request.table)

    def ListTableGrants(self, request, context):
        self.owners.check_read(caller(context), [request.table])
        self.core.catalog.table_record(request.table)
        return self._grants_pb(request.table)


class RecoveryLoop:
    """Rebuilds lost extents in the background: woken when a store node's registration vanishes
    (its etcd lease expired) and checked every ``interval_s``; waits ``grace_s`` first, so that
    a node restarting quickly is not rebuilt needlessly."""

    def __init__(
        self,
        core: StoreCore,
        kv: Any,
        grace_s: float = 2.0,
        interval_s: float = 5.0,
        gc_interval_s: float = 600.0,
        scrub_interval_s: float = 0.0,
        scrub_rate_bytes: float = 50e6,
    ) -> None:
        self.core, self.kv = core, kv
        # every extent re-hashed every scrub_interval_s (0: only on demand), at most scrub_rate_bytes/s
        self.scrub_interval_s, self.scrub_rate_bytes = scrub_interval_s, scrub_rate_bytes
        self._last_scrub = time.monotonic()
        self._scrubber: threading.Thread | None = None
        self.grace_s, self.interval_s = grace_s, interval_s
        # orphan extent files are collected every gc_interval_s (0: only by Scrub)
        self.gc_interval_s = gc_interval_s
        self._last_gc = time.monotonic()
        self._wake = threading.Event()
        self._relax = False  # the next pass may share fault domains (an operator asked)
        self._stop = threading.Event()
        self._cancel = None
        self._thread = threading.Thread(target=self._run, name="store-recovery", daemon=True)

    def start(self) -> RecoveryLoop:
        from microco.common.registry import SERVICES_PREFIX

        def on_event(ev: Any) -> None:
            if ev.kind == "delete":
                self._wake.set()

        try:
            self._cancel = self.kv.watch_prefix(f"{SERVICES_PREFIX}{NODE_SERVICE}/", on_event)
        except Exception as exc:  # noqa: BLE001 - the periodic check still runs
            log.warning("cannot watch store nodes: %s", exc)
        self._thread.start()
        return self

    def kick(self, relax_domains: bool = False) -> None:
        """Run a pass now; ``relax_domains``: that pass may rebuild extents no unused fault domain
        can take on a node that holds no copy of their rows (see ``plan_recovery``)."""
        if relax_domains:
            self._relax = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._cancel:
            self._cancel()
        self._thread.join(timeout=5)

    def _scrub(self) -> None:
        try:
            bad = self.core.scrub(rate_bytes=self.scrub_rate_bytes)
        except Exception:
            log.exception("scheduled scrub failed")
            return
        if bad:
            log.warning("scheduled scrub: %d corrupt extents marked for rebuild: %s", len(bad), bad[:10])
            self.kick()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            if self._stop.is_set():
                return
            woke = self._wake.is_set()
            self._wake.clear()
            if self.gc_interval_s and time.monotonic() - self._last_gc >= self.gc_interval_s:
                self._last_gc = time.monotonic()
                try:
                    self.core.collect_garbage()
                except Exception:
                    log.exception("orphan collection failed")
            if (
                self.scrub_interval_s
                and time.monotonic() - self._last_scrub >= self.scrub_interval_s
                and not (self._scrubber and self._scrubber.is_alive())
            ):
                # its own thread: a throttled scrub of a large store takes hours; rebuilds go on
                self._last_scrub = time.monotonic()
                self._scrubber = threading.Thread(target=self._scrub, name="store-scrub", daemon=True)
                self._scrubber.start()
            try:
                lost = self.core.lost_count()
                LOST.set(lost)
                if not lost:
                    continue
                if woke and self.grace_s:
                    time.sleep(self.grace_s)
                relax, self._relax = self._relax, False
                progress = self.core.recover(relax_domains=relax)
                REBUILT.inc(progress.get("rebuilt", 0))
                LOST.set(self.core.lost_count())
            except Exception:
                log.exception("recovery pass failed")


# ------------------------------------------------------------------------------ processes
def _sql_memory_arg(g: Any) -> None:
    """``--sql-memory-mb``, on the coordinator and on every node."""
    g.add_argument(
        "--sql-memory-mb",
        type=float,
        default=SQL_MEMORY_MB,
        help="DuckDB's memory here, MiB (SQL merges and fragments; beyond it, spill files under the "
        "data directory's sql-spill/); 0: DuckDB's default, 80%% of the machine's memory",
    )


def _coordinator_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("store coordinator")
    g.add_argument("--super-extent-rows", type=int, default=4_000_000, help="rows per super-extent")
    g.add_argument(
        "--recovery-rate-mb", type=float, default=200.0, help="recovery read throttle, MB/s (0: none)"
    )
    g.add_argument(
        "--recovery-grace-s", type=float, default=2.0, help="wait after a node vanishes before rebuilding"
    )
    g.add_argument(
        "--recovery-interval-s", type=float, default=5.0, help="how often to look for lost extents"
    )
    g.add_argument(
        "--gc-interval-s",
        type=float,
        default=600.0,
        help="how often to delete orphan extent files on the nodes (0: only on scrub)",
    )
    g.add_argument(
        "--scrub-interval-s",
        type=float,
        default=86400.0,
        help="re-hash every extent this often, whatever its cached verification (0: only on demand)",
    )
    g.add_argument(
        "--scrub-rate-mb", type=float, default=50.0, help="scheduled scrub read throttle, MB/s (0: none)"
    )
    g.add_argument(
        "--gc-min-age-s",
        type=float,
        default=1800.0,
        help="an unreferenced extent file is deleted only once this old (appends in flight keep theirs)",
    )
    g.add_argument(
        "--sql-plan-cache",
        type=int,
        default=256,
        help="SQL plans kept for reuse by the same text on the same catalog version (0: none)",
    )
    g.add_argument(
        "--model-plan-cache",
        type=int,
        default=256,
        help="JSON-model query plans kept for reuse by the same query on the same catalog version "
        "and live nodes (0: none)",
    )
    _sql_memory_arg(g)
    g.add_argument(
        "--residency-max-age-s",
        type=float,
        default=-1.0,
        help="the planner asks the nodes what of a table's extents is in memory (page cache, extent "
        "cache) when its last answer is older than this, to prefer replicas in memory (negative, the "
        "default: never; it cost every plan its asks and changed no choice where measured: "
        "docs/store.md 'Replicas in memory'; 1 asks at most once a second)",
    )
    g.add_argument(
        "--no-hedge",
        action="store_true",
        help="never hedge a query's straggling node (by default, once a node's fragments run well "
        "past the other nodes' of their stage, the query is planned again without it and the first "
        "plan to answer is used: docs/store.md, 'Hedged fragments')",
    )
    g.add_argument(
        "--sort-extents",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="appends write each replica's sub-buckets sorted on its partition column, so a "
        "group-by on it aggregates runs of equal keys (default: off; docs/store.md, 'Sorted "
        "replicas and runs of equal keys')",
    )
    g.add_argument(
        "--sql-semi-join-mb",
        type=float,
        default=32.0,
        help="a table a SQL gather reads, estimated at least this big, is read after the smaller "
        "filtered tables it is inner-joined to and filtered by their keys at its nodes (0: never)",
    )
    g.add_argument(
        "--flight-sql-port",
        type=int,
        default=0,
        help="Arrow Flight SQL endpoint's port (0: a free one; -1: none); registered as label flight_sql",
    )


SQL_MEMORY_MB = 2048.0  # DuckDB's memory in a store process (a gather merge at SF 10 reached ~6 GB)


def _configure_sql(ctx: ServiceContext) -> None:
    from . import _sql

    _sql.configure(ctx.args.sql_memory_mb or None, ctx.settings.resolved_data_dir() / "sql-spill")


def _setup_coordinator(ctx: ServiceContext) -> None:
    a = ctx.args
    _configure_sql(ctx)
    transport = FlightTransport(ctx.kv)
    core = StoreCore(
        ctx.kv,
        transport,
        super_extent_rows=a.super_extent_rows,
        recovery_rate_bytes=a.recovery_rate_mb * 1e6,
        gc_min_age_s=a.gc_min_age_s,
        sql_plan_cache=a.sql_plan_cache,
        model_plan_cache=a.model_plan_cache,
        sql_semi_join_bytes=a.sql_semi_join_mb * 1e6,
    )
    core.residency_max_age_s = a.residency_max_age_s if a.residency_max_age_s >= 0 else None
    if a.no_hedge:
        core.hedge = None
    if a.sort_extents is not None:
        core.sort_extents = a.sort_extents
    servicer = StoreServicer(core)

    def start_recovery() -> RecoveryLoop:
        """The leader's recovery loop (a fresh one each time this coordinator is elected)."""
        servicer.recovery = RecoveryLoop(
            core,
            ctx.kv,
            grace_s=a.recovery_grace_s,
            interval_s=a.recovery_interval_s,
            gc_interval_s=a.gc_interval_s,
            scrub_interval_s=a.scrub_interval_s,
            scrub_rate_bytes=a.scrub_rate_mb * 1e6,
        ).start()
        return servicer.recovery

    # One coordinator acts (serves the API, runs recovery); the others stand by (``_standby``).
    election = CoordinatorElection(
        ctx.kv, ctx.settings.instance_id, ctx.settings.lease_ttl_s, start_recovery, ctx.runtime
    )
    ctx.runtime.add_service(
        pb_grpc.add_StoreCoordinatorServiceServicer_to_server,
        election.guard(servicer),
        "microco.api.store.v1.StoreCoordinatorService",
    )
    ctx.runtime.on_stop(transport.close)
    ctx.runtime.on_stop(election.stop)
    ctx.runtime.settings = replace(ctx.runtime.settings, max_message_bytes=64 << 20)
    # (a standby answers Flight SQL too: reads only, planned from the catalog in etcd; the
    # servicer unguarded by the election, as the guard is for the coordinator's gRPC API)
    _start_flight_sql(ctx, servicer)
    election.start()  # last: its callbacks change the settings' role label from other threads


def _start_flight_sql(ctx: ServiceContext, servicer: StoreServicer) -> None:
    """The Flight SQL endpoint (``_flightsql``): its own port, the coordinator's credentials,
    discoverable as the coordinator registration's ``flight_sql`` label."""
    if ctx.args.flight_sql_port < 0:
        return
    from ._flightsql import FlightSqlServer

    s = ctx.runtime.settings
    fsql = FlightSqlServer(servicer, s.host, ctx.args.flight_sql_port, service_identity(SERVICE)).start()
    address = secure_location(f"{s.advertised}:{fsql.port}", fsql.secure)
    ctx.runtime.settings = replace(s, labels={**s.labels, "flight_sql": address})
    ctx.runtime.on_stop(fsql.stop)
    log.info("store flight sql", extra={"flight_sql": address})


def _node_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("store node")
    g.add_argument(
        "--fault-domain", default="", help="fault domain label (rack, host...); default: the node name"
    )
    g.add_argument("--flight-port", type=int, default=0, help="Arrow Flight port; 0 picks a free one")
    g.add_argument(
        "--extent-compression",
        choices=CODECS,
        default=DEFAULT_COMPRESSION,
        help="codec of the extents this node writes (extents written with another stay readable)",
    )
    g.add_argument(
        "--extent-layout",
        type=int,
        choices=LAYOUTS,
        default=EXTENT_LAYOUT,
        help="layout of the extent files this node writes: 2 column-major (a read of some columns "
        "reads only theirs), 1 batch-major (what nodes wrote before; for nodes of an older version "
        "reading this data directory). Extents of either layout stay readable",
    )
    _sql_memory_arg(g)
    g.add_argument(
        "--extent-cache-mb",
        type=float,
        default=CACHE_BYTES / (1 << 20),
        help="decompressed extent batches kept in memory between queries, MiB (LRU)",
    )


def _setup_node(ctx: ServiceContext) -> None:
    s = ctx.settings
    # The node's name is its identity in the catalog (its data directory survives restarts):
    # --instance-id when given (as `microco up` does), else --node.
    name = getattr(ctx.args, "instance_id", "") or s.node
    store = NodeStore(
        name,
        s.resolved_data_dir(),
        compression=ctx.args.extent_compression,
        layout=ctx.args.extent_layout,
        cache_bytes=int(ctx.args.extent_cache_mb * (1 << 20)),
    )
    _configure_sql(ctx)  # DuckDB and sqlglot load at start-up, not in the first query

    server = StoreFlightServer(store, f"grpc://{s.host}:{ctx.args.flight_port}", kv=ctx.kv)
    threading.Thread(target=server.serve, name="flight", daemon=True).start()
    labels = {
        **s.labels,
        "flight": secure_location(f"{s.advertised}:{server.port}", server.identity is not None),
        "fault_domain": ctx.args.fault_domain or name,
    }
    ctx.runtime.settings = replace(s, labels=labels, instance_id=name)
    ctx.runtime.on_stop(server.shutdown)
    log.info("store node", extra={"flight": labels["flight"], "data_dir": str(store.data_dir)})


def main_coordinator(argv: list[str] | None = None) -> int:
    return run_service(
        SERVICE,
        "Instalytics store coordinator: catalog, placement, planner, recovery. A store node runs as "
        "`python -m microco.services.store node` (its flags: `... node --help`).",
        _setup_coordinator,
        _coordinator_args,
        argv,
    )


def main_node(argv: list[str] | None = None) -> int:
    return run_service(
        NODE_SERVICE,
        "Instalytics store node: extents on local disk, served over Arrow Flight",
        _setup_node,
        _node_args,
        argv,
    )
