"""The coordinator's core: catalog, placement, appends, query execution and recovery, over a
``Transport`` to the store nodes. The same core runs in the service (Arrow Flight to node
processes) and in-process (``LocalTransport``: node stores called directly, for unit tests)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    Future,
    InvalidStateError,
    ThreadPoolExecutor,
    wait,
)
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from microco.common.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MicrocoError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from microco.common.kv import KV

from . import _exec
from ._cancel import TaskCancelled
from ._catalog import ROOT, VERSION, Catalog, SuperExtent, TableInfo
from ._hedge import Fragment, HedgePolicy, Rates, shape, weight
from ._layout import CODECS, ExtentMeta, assign_partitions, bucketed_extents, new_extent_id, sorted_column
from ._limits import check_name, short
from ._liveness import NodeWatch, Probes, Watched, nodes_used
from ._nodestore import CorruptExtent, NodeStore
from ._partition import PartitionSpec
from ._placement import NodeInfo, place_super_extent
from ._plancache import LRU
from ._planner import BY_PARTITION_MIN_BYTES, JOIN_BUILD_BYTES, Plan, plan_query
from ._query import Agg, Query
from ._recovery import plan_recovery
from ._residency import TIMEOUT_S as RESIDENCY_TIMEOUT_S
from ._residency import Residency
from ._threads import CallThreads

log = logging.getLogger(__name__)

# seconds a node a query found unreachable is left out of the next queries' plans (its extents
# read degraded): about a store node's registration lease (``--lease-ttl-s``, 5 s by default),
# after which a node that really died is gone from the registry anyway
SUSPECT_S = 10.0
# An append places a super-extent over the nodes live at that instant, and the layout it picks is
# the table's for as long as the live nodes stay the same: a node whose lease lapsed for a moment
# (a loaded machine) left a table's replicas on one node each for its life (measured: `orders`
# on 4 of 6 nodes, docs/store.md). So a node live within the last ``RETURNING_S``, not live now,
# that still answers on its address (``PROBE_S``: a killed or paused node does not) is waited
# for, at most ``RETURN_WAIT_S`` and once per append, before anything is placed without it.
RETURNING_S = 30.0
RETURN_WAIT_S = 10.0
PROBE_S = 1.0
# seconds a node has to say what it read, for the status of the nodes (``nodes``): status is
# asked often (the console) and must not wait on a node that stopped answering
STATUS_TIMEOUT_S = 5.0
# Cancelling a losing attempt's tasks (``StoreCore._cancel_losers``): each node's cancel is one
# action, given ``CANCEL_TIMEOUT_S`` to answer; one that does not (a paused node) is asked again
# every ``CANCEL_RETRY_S``, for at most ``CANCEL_GIVE_UP_S`` (one that refuses at once and is no
# longer registered is dead: given up). On threads of their own (``CANCEL_THREADS``), never the
# queries'.
CANCEL_TIMEOUT_S = 1.0
CANCEL_RETRY_S = 0.5
CANCEL_GIVE_UP_S = 30.0
CANCEL_THREADS = 8
# A warm-up of a hedge's reads (``StoreCore._warm``) is one ``warm`` action per node read from,
# each call given this deadline (the node decodes a share's extents: seconds at most; a call
# that outlives the run is cancelled with the losers, on a thread of its own meanwhile)
WARM_TIMEOUT_S = 60.0


def _read_sides(x: Any) -> Iterator[dict[str, Any]]:
    """Each part of a task that reads extents (a dict with ``sources``, its columns ``read``),
    wherever it sits in the task (an input of its SQL, a side of a join, a map's side)."""
    if isinstance(x, dict):
        if isinstance(x.get("sources"), list):
            yield x
        for k, v in x.items():
            if k != "sources":
                yield from _read_sides(v)
    elif isinstance(x, list):
        for v in x:
            yield from _read_sides(v)


NODES_SEEN = ROOT + "nodes/"
RECODE = ROOT + "recode/"  # recode/<table>: progress of that table's last recode (``StoreCore.recode``)


class Transport(Protocol):
    """How the coordinator reaches store nodes."""

    def live_nodes(self) -> list[NodeInfo]: ...

    def put_extent(
        self, node: NodeInfo, table: str, extent_id: str, rows: pa.Table, buckets: list, codec: str = ""
    ) -> dict: ...

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table: ...

    def run_task_stream(
        self, node: NodeInfo, task: dict[str, Any]
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]: ...

    def action(
        self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """A node's action (``timeout``: seconds, else the transport's default deadline)."""

    def abandon(self, node: NodeInfo) -> None:
        """Give up the calls in progress to ``node``, which left the cluster (``_liveness``)."""


class NodeFailure(MicrocoError):
    """A store node failed a call (unreachable, or it reported an error)."""

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"store node {node}: {cause}")
        self.node, self.cause = node, cause


class Superseded(Exception):  # (a signal between a query's attempts, not an error)
    """Another attempt of the same query answered (``_QueryRun``): this one stops waiting."""


USED = "this plan answered first and its answer was used"


class _QueryRun:
    """One query's attempts (``StoreCore._with_retries``): the first plan, its retries after a
    node failure, and the hedges started while one of them waits on a straggling node.

    ``tasks``: the tasks the attempts started, by (node, task): an attempt's task identical to
    one another attempt started (the surviving nodes' fragments in a plan made without a lost or
    straggling node) takes that one's result, running or done, instead of running again; a
    task's submission and end times (``started``, ``ended``) are what the hedging policy reads.
    The answer taken is one attempt's whole result (``offer``: the first to answer), never parts
    of two plans; ``stop`` is completed (with ``Superseded``) when it is taken, which wakes every
    other attempt's wait (``StoreCore._await``) and ends it."""

    def __init__(self, attempt: Any) -> None:
        self.attempt = attempt  # attempt(exclude, _Attempt) -> (table, plan)
        self.tasks: dict[tuple[str, str], Future[Any]] = {}
        self.started: dict[Future[Any], float] = {}
        self.ended: dict[Future[Any], float] = {}
        self.lock = threading.Lock()
        self.exclude: set[str] = set()  # the nodes the current (not hedged) attempt is planned without
        self.hedged: set[str] = set()  # at most one hedge per node per query
        self.hedges: list[dict[str, Any]] = []  # what each hedge was, and what came of it
        self.hedge_done: list[Future[bool]] = []  # each hedge's end: True when its answer was taken
        self.stop: Future[None] = Future()
        self.answer: Any = None
        self.winner = ""
        # every task call the attempts made: its future -> (node, task id); the winner's calls
        # (``kept``: its own and those it shared) are not cancelled, the rest are once the run
        # ends (``StoreCore._cancel_losers``); ``swept``: after that, a call is cancelled as it
        # is made (a losing hedge still starting its stage)
        self.calls: dict[Future[Any], tuple[NodeInfo, str]] = {}
        self.kept: set[Future[Any]] = set()
        self.swept = False
        self.rated: set[Future[Any]] = set()  # calls whose time is counted in ``StoreCore.rates``
        self.gone = False  # the caller went away (``abandon``)
        # the warm-ups of a hedge's reads (``StoreCore._warm``): at most one per node per query,
        # what each was, and its ``warm`` calls by the node it was for (cancelled when that node
        # answers a probe again)
        self.warmed: set[str] = set()
        self.warms: list[dict[str, Any]] = []
        self.warm_calls: dict[str, list[Future[Any]]] = {}
        self.warm_marks: dict[str, tuple[Any, int]] = {}  # node -> (its probes, answered then)

    def track(self, f: Future[Any]) -> None:
        """Record when task ``f`` was submitted and (by callback) when it ends."""
        self.started.setdefault(f, time.monotonic())
        f.add_done_callback(lambda done: self.ended.setdefault(done, time.monotonic()))

    def offer(
        self, answer: Any, who: str, rec: dict[str, Any] | None = None, att: _Attempt | None = None
    ) -> bool:
        """Take ``answer`` (an attempt's whole result) unless another was taken; stop the others.
        ``rec``: the hedge it is the answer of, marked used before any other attempt wakes;
        ``att``: the attempt that answered (its calls are kept, the others' cancelled)."""
        with self.lock:
            if self.answer is not None or self.gone:
                return False
            self.answer, self.winner = answer, who
            if att is not None:
                self.kept = set(att.futs)
            if rec is not None:
                rec["outcome"] = USED
        with contextlib.suppress(InvalidStateError):
            self.stop.set_exception(Superseded())
        return True

    def abandon(self) -> None:
        """The query's caller went away: the attempts stop waiting (``Superseded``, with no
        answer taken) and the run ends, its calls cancelled (``StoreCore._cancel_losers``)."""
        with self.lock:
            if self.answer is not None or self.stop.done():
                return
            self.gone = True
        with contextlib.suppress(InvalidStateError):
            self.stop.set_exception(Superseded())

    def wait_hedges(self) -> bool:
        """Wait for the hedges started (none: at once): was one's answer taken?"""
        with self.lock:
            pending = list(self.hedge_done)
        for f in pending:
            f.result()
        return self.answer is not None


@dataclass
class _Attempt:
    """One attempt of a query run: a hedge's attempt does not hedge again. ``futs``: the task
    calls it waits on (its own, and those it shares with another attempt)."""

    run: _QueryRun
    hedge: bool = False
    futs: set[Future[Any]] = field(default_factory=set)
    # a warm-up (``StoreCore._warm``): the nodes whose hedge's reads it warms, and its record; such
    # an attempt plans as the hedge would, asks the nodes of its first stage to decode what that
    # stage reads, and ends (``_Warmed``) without running a task
    warm: frozenset[str] = frozenset()
    warm_rec: dict[str, Any] | None = None


class _Warmed(Exception):
    """A warm-up attempt's end: its first stage's reads were sent to be warmed, nothing run."""


@dataclass
class AppendResult:
    rows: int
    super_extents: list[int]
    bytes: int


def _append_result(rec: dict[str, Any]) -> AppendResult:
    return AppendResult(int(rec["rows"]), [int(i) for i in rec["super_extents"]], int(rec["bytes"]))


def conform(table: pa.Table, schema: pa.Schema, specs: Sequence[PartitionSpec], name: str) -> pa.Table:
    """``table`` with the table's column order and types, or a clear ``InvalidArgument``."""
    table = _exec.to_plain_strings(table)
    have = set(table.schema.names)
    for s in specs:
        if s.column not in have:
            raise InvalidArgument(
                f"partitioning column {s.column!r} of table {name!r} is missing from the data"
            )
    missing = [c for c in schema.names if c not in have]
    extra = [c for c in table.schema.names if c not in schema.names]
    if missing or extra:
        raise InvalidArgument(
            f"schema mismatch for table {name!r}: missing columns {missing}, unexpected columns {extra}"
        )
    cols = []
    for f in schema:
        col = table.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidArgument(
                    f"schema mismatch for table {name!r}: column {f.name!r} is {table.schema.field(f.name).type}, "
                    f"the table has {f.type} ({exc})"
                ) from None
        if not f.nullable and col.null_count:
            raise InvalidArgument(f"column {f.name!r} of table {name!r} does not allow nulls")
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def data_bytes(written: dict[str, Any]) -> int:
    """An extent's Arrow bytes (uncompressed, what reading it produces: the catalog's ``bytes``,
    which the planner's estimates use), from a node's answer to a write or rebuild, whose
    ``bytes`` is the file's size (``ExtentMeta.file_bytes``)."""
    return sum(int(b[3]) for b in written["buckets"]) if written.get("buckets") else int(written["bytes"])


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Pieces of one stream (each conformed to the table's schema) as one table, zero-copy."""
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def colocated_homes(specs: Sequence[PartitionSpec]) -> list[str | None]:
    """Which replicas are placed co-located (see ``place_super_extent``): the first replica of
    each partition function, so that every table's replica partitioned by, say, hash mod 8 of its
    key puts partition p on the same node as every other table's."""
    seen: set[str] = set()
    out: list[str | None] = []
    for s in specs:
        key = s.function_key()
        out.append(None if key in seen else key)
        seen.add(key)
    return out


SORT_EXTENTS = False


class StoreCore:
    def __init__(
        self,
        kv: KV,
        transport: Transport,
        super_extent_rows: int = 4_000_000,
        recovery_rate_bytes: float = 200e6,
        gc_min_age_s: float = 1800.0,
        sql_plan_cache: int = 256,
        model_plan_cache: int = 256,
        sql_semi_join_bytes: float | None = None,
    ) -> None:
        self.kv = kv
        # a gathered table at least this big is semi-joined to its smaller filtered partners
        # (``_sql.SEMI_JOIN_MIN_BYTES`` when None; 0 or less: never)
        self.sql_semi_join_bytes = sql_semi_join_bytes
        # subqueries keyed to a co-partitioned partition column ([NOT] EXISTS, [NOT] IN, scalar)
        # run per partition (``_sql._subqueries``); False: such queries gather (A/B benchmark)
        self.sql_subquery_pushdown = True
        # staged SQL plans (``_sql._staged``): parts of a query that split run as sub-plans
        self.sql_staging = True
        # SQL repartition exchanges (``_sql``): True always where one applies, False never (the
        # gather: A/B), None by cost; a gather estimated under ``sql_exchange_bytes`` is kept
        # (None: ``_sql.EXCHANGE_MIN_BYTES``)
        self.sql_exchange: bool | None = None
        self.sql_exchange_bytes: float | None = None
        # a group-by on the partition column aggregates each partition alone on its node
        # (``_exec._by_partition``); False: the node's partitions together (A/B benchmark)
        self.agg_by_partition = True
        # ... when a node's sources reach this many bytes (``_planner.BY_PARTITION_MIN_BYTES``)
        self.agg_by_partition_min_bytes = BY_PARTITION_MIN_BYTES
        # what a shuffle join's reducer holds of its build side at once (``_planner``)
        self.join_build_bytes = JOIN_BUILD_BYTES
        # appends write each replica's sub-buckets sorted on its partition column
        # (``_layout.sort_order``; the catalog's ``ExtentMeta.sorted``), so a matched group-by
        # on it aggregates runs (``_runs``); a rebuilt extent keeps its own layout either way.
        # ``SORT_EXTENTS``: off, the measured gain not shown over the runs' spread (docs/store.md,
        # "Sorted replicas and runs of equal keys")
        self.sort_extents = SORT_EXTENTS
        self.catalog = Catalog(kv)
        self.transport = transport
        self.super_extent_rows = super_extent_rows
        self.recovery_rate_bytes = recovery_rate_bytes
        self.gc_min_age_s = gc_min_age_s
        self._recovery_lock = threading.Lock()
        self._recode_lock = threading.Lock()  # one recode at a time
        # threads made as work needs them: node status, appends, recovery (a query's task calls
        # run on threads of their own since 2026-12-04, ``_start``: an abandoned call waiting on a
        # node that stopped answering holds no thread of this pool; 32 until 2026-12-03)
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="store-core")
        self._seen: dict[str, Any] = {}  # NODES_SEEN as last read or written here (live_nodes)
        self._last_live: dict[str, float] = {}  # node -> when (monotonic) live_nodes last had it
        self.return_wait_s = RETURN_WAIT_S
        # nodes a query found unreachable, by name: when (monotonic). Left out of the next queries'
        # plans for ``suspect_s`` (a node that died stays registered until its lease runs out:
        # each query planned on it meanwhile would call it, fail and run again without it)
        self._suspects: dict[str, float] = {}
        self._suspects_lock = threading.Lock()
        self.suspect_s = SUSPECT_S
        # the nodes queries wait on, against the registry while they wait (a node that stops
        # answering without a reset is dropped from it when its lease runs out)
        self.node_watch = NodeWatch(self._live_names, getattr(self.transport, "abandon", None))
        # SQL plans by normalised text, each with the catalog version it was made on (_plancache)
        self.sql_plans: LRU[Any] = LRU(sql_plan_cache)
        # JSON-model plans by (query, live nodes, settings), each with its catalog token (``plan``)
        self.model_plans: LRU[tuple[bytes, Plan]] = LRU(model_plan_cache)
        # what of each table's extents is in memory on their nodes, for the planner
        # (``_residency``): table name -> (when asked, monotonic; the answers). None (the
        # default since 2026-12-04: it cost each plan its asks and changed no choice where
        # measured, docs/store.md "Replicas in memory"): not asked, plans without it; on:
        # ``_residency.MAX_AGE_S`` (``--residency-max-age-s 1``)
        self.residency_max_age_s: float | None = None
        self.residency_timeout_s = RESIDENCY_TIMEOUT_S
        self._residency: dict[str, tuple[float, Residency]] = {}
        self._residency_lock = threading.Lock()
        self.residency_asks = 0  # fan-outs made (each asks every live node once)
        # when a node's fragments straggle behind their siblings', the query is planned again
        # without it and the first plan to answer is used (``_hedge``); None: never (A/B setting)
        self.hedge: HedgePolicy | None = HedgePolicy()
        # seconds per byte of the fragments that ended here, by shape: what a stage whose
        # fragments all run on one node is expected to take (``_hedge.Rates``)
        self.rates = Rates()
        # the cancels of losing attempts' tasks (``_cancel_losers``), sent on threads of their own;
        # ``cancels``: what each node answered (newest last, a few hundred kept)
        self._canceller = ThreadPoolExecutor(CANCEL_THREADS, thread_name_prefix="store-cancel")
        # the threads of the calls to nodes (``_start``): one per call in flight, kept once idle
        self._calls = CallThreads("store-call")
        self.cancels: list[dict[str, Any]] = []
        # the liveness probes of nodes whose fragments run long (``_probe_stage``), each on a
        # thread of its own, never the calls' or the pool's: a probe of a node that stopped
        # answering waits out its short deadline there
        self._probe_threads = CallThreads("store-probe")

    # ------------------------------------------------------------------ nodes
    def live_nodes(self) -> list[NodeInfo]:
        return self._noted(self.transport.live_nodes())

    def version_and_live_nodes(self, version: bool = True) -> tuple[bytes | None, list[NodeInfo]]:
        """The catalog's version token (None when ``version`` is False, or none is written yet)
        and the live nodes: what a query's plan starts from. In one read of etcd where the
        transport's registry shares the catalog's store (``live_nodes_with``), at one revision:
        two round trips were ~2 ms of a small query's ~15-25 ms (issue 19, session 32)."""
        both = getattr(self.transport, "live_nodes_with", None)
        if version and both is not None and getattr(self.transport, "kv", None) is self.kv:
            nodes, (token,) = both([VERSION])
            return token, self._noted(nodes)
        token = self.catalog.version() if version else None  # (read first: see ``plan``)
        return token, self.live_nodes()

    def _noted(self, nodes: list[NodeInfo]) -> list[NodeInfo]:
        now = time.monotonic()
        for n in nodes:
            self._last_live[n.name] = now
        # what this process last read or wrote of the nodes seen: etcd is read again (and written)
        # only when a live node is not in it as it is now, not on every query
        if any(
            self._seen.get(NODES_SEEN + n.name) != {"domain": n.domain, "address": n.address} for n in nodes
        ):
            seen = dict(self.kv.get_prefix_json(NODES_SEEN))
            for n in nodes:
                rec = {"domain": n.domain, "address": n.address}
                if seen.get(NODES_SEEN + n.name) != rec:
                    self.kv.put_json(NODES_SEEN + n.name, rec)
                    seen[NODES_SEEN + n.name] = rec
            self._seen = seen
        return nodes

    def domains(self) -> dict[str, str]:
        return {k[len(NODES_SEEN) :]: v["domain"] for k, v in self.kv.get_prefix_json(NODES_SEEN)}

    def nodes(self) -> list[dict[str, Any]]:
        live = {n.name: n for n in self.live_nodes()}
        held: dict[str, list[int]] = {}
        for name in self.catalog.table_names():
            for e in self.catalog.table(name).extents():
                h = held.setdefault(e.node, [0, 0])
                h[0] += 1
                h[1] += e.stored_bytes
        reads: dict[str, dict[str, list[int]]] = {}

        def ask(info: NodeInfo) -> dict[str, list[int]]:
            return self.transport.action(info, "reads", {}, timeout=STATUS_TIMEOUT_S).get(
                "read_by_replica", {}
            )

        # at once and briefly: a node that stopped answering within its lease held this (the
        # console's store page, ``microco store nodes``) for the action's 120 s deadline
        asked = {n: self._pool.submit(ask, info) for n, info in live.items()}
        for n, f in asked.items():
            try:
                reads[n] = f.result()
            except Exception as exc:  # noqa: BLE001 - a node that cannot say shows none
                log.warning("reads of %s: %s", n, exc)
        out = []
        for name, v in sorted(self.kv.get_prefix_json(NODES_SEEN)):
            n = name[len(NODES_SEEN) :]
            node = live.get(n)
            out.append(
                {
                    "name": n,
                    "address": node.address if node else v.get("address", ""),
                    "fault_domain": v["domain"],
                    "alive": node is not None,
                    "extents": held.get(n, [0, 0])[0],
                    "bytes": held.get(n, [0, 0])[1],
                    # table -> Arrow bytes read per replica here since the node started
                    "read_by_replica": reads.get(n, {}),
                }
            )
        return out

    def residency(self, tables: Sequence[str], live: Sequence[NodeInfo]) -> Residency | None:
        """What of ``tables``' extents is in memory on ``live`` nodes (``_residency``): the answers
        kept for a table are reused for ``residency_max_age_s``; the tables whose answers are
        older are asked of every live node at once, in parallel, waiting at most
        ``residency_timeout_s`` (a node not answering by then is left unknown). None when
        residency is off (``residency_max_age_s`` None) or there is nothing to ask."""
        if self.residency_max_age_s is None or not tables or not live:
            return None
        names = sorted({t.lower() for t in tables})  # kept by the name as SQL folds it
        now = time.monotonic()
        with self._residency_lock:
            kept = {t: self._residency.get(t) for t in names}
        stale = [t for t, hit in kept.items() if hit is None or now - hit[0] >= self.residency_max_age_s]
        asked = None
        if stale:
            self.residency_asks += 1
            known = {n.lower(): n for n in self.catalog.table_names()}  # a node's directory: as created
            ask = {known.get(t, t): t for t in stale}
            fresh = {t: Residency() for t in stale}
            calls = {
                # each call bounded too: a node that stopped answering holds no pool thread long
                n.name: self._pool.submit(
                    self.transport.action, n, "residency", {"tables": list(ask)}, self.residency_timeout_s
                )
                for n in live
            }
            deadline = now + self.residency_timeout_s
            for name, call in calls.items():
                for snap in fresh.values():
                    snap.asked += 1
                try:
                    answer = call.result(timeout=max(deadline - time.monotonic(), 0.0))
                except Exception as exc:  # noqa: BLE001 - a node that cannot say is unknown
                    log.debug("residency of %s: %s", name, exc)
                    continue
                for real, t in ask.items():
                    part = {"tables": {real: answer.get("tables", {}).get(real, {})}}
                    if "cache_bytes" in answer:
                        part["cache_bytes"] = answer["cache_bytes"]
                    fresh[t].merge(part, name)
                    fresh[t].nodes += 1
            done = time.monotonic()
            asked = done - now
            with self._residency_lock:
                for t, snap in fresh.items():
                    kept[t] = self._residency[t] = (done, snap)
        out = Residency()
        for hit in kept.values():
            assert hit is not None
            out.extents.update(hit[1].extents)
            out.groups.update(hit[1].groups)
            out.cache_bytes.update(hit[1].cache_bytes)
            out.nodes = max(out.nodes, hit[1].nodes)
            out.asked = max(out.asked, hit[1].asked)
        out.ask_s = asked
        return out

    # ------------------------------------------------------------------ tables
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        specs: Sequence[PartitionSpec],
        codecs: Sequence[str] | None = None,
    ) -> TableInfo:
        """Create a table with three partitionings and, optionally, each replica's extent codec
        (``codecs``: zstd, lz4 or none each; "" or None: the writing node's default)."""
        for f in schema:  # (before ``empty_table``, which a union type fails)
            if why := _exec.sql_type_refusal(f.type):
                raise InvalidArgument(f"column {f.name!r} cannot be stored: {why}")
        schema = _exec.to_plain_strings(schema.empty_table()).schema.remove_metadata()
        self.catalog.create_table(name, schema, list(specs), list(codecs) if codecs is not None else None)
        return self.catalog.table(name)

    def drop_table(self, name: str) -> None:
        info = self.catalog.drop_table(name)
        for n in self.transport.live_nodes():
            try:
                self.transport.action(n, "drop_table", {"table": info.name})
            except Exception as exc:  # noqa: BLE001 - a node's leftover files are orphans, not data
                log.warning("drop on %s: %s", n.name, exc)

    def table(self, name: str) -> TableInfo:
        return self.catalog.table(name)

    def tables(self) -> list[TableInfo]:
        return [self.catalog.table(n) for n in self.catalog.table_names()]

    # ------------------------------------------------------------------ append
    def append(self, name: str, data: pa.Table) -> AppendResult:
        """Append rows: every super-extent is written to all three replicas on disjoint node groups,
        then all are committed in one etcd transaction. A node that fails mid-append is excluded
        and the super-extent re-placed; nothing is visible until the commit. The whole table is
        checked against the schema before anything is written."""
        info = self.catalog.table(name)
        data = conform(data, info.schema, info.specs, name)
        if data.num_rows:
            # compute partitions (and so validate range bounds against the data) before any write
            assign_partitions(data.slice(0, 1), info.specs)
        return self.append_batches(name, [data])

    def append_batches(
        self, name: str, batches: Iterable[pa.RecordBatch | pa.Table], token: str = ""
    ) -> AppendResult:
        """Append a stream of rows, holding at most one super-extent of them: each super-extent is
        written to the nodes as soon as its rows have arrived, and all are committed in one etcd
        transaction at the end (the commit point: nothing is visible before, all rows after). If
        the stream fails or a piece does not fit the schema, nothing is committed; the super-extents
        already written are orphans, deleted by garbage collection (``collect_garbage``).

        ``token`` (a client's idempotency token): an append already committed with it is answered
        with that commit's result, reading nothing; the commit records it (``Catalog``), so of two
        sends of one append (one cut off with a coordinator, sent again to the next) one commits."""
        t0 = time.perf_counter()
        info = self.catalog.table(name)
        if token and (done := self.catalog.committed_append(name, token)) is not None:
            log.info("append %s: token %s was committed already; nothing appended", name, token)
            return _append_result(done)
        supers: list[SuperExtent] = []
        pending: list[pa.Table] = []
        held = 0
        total = 0
        waited: set[str] = set()  # nodes this append has waited for (``_placement_nodes``)

        def flush(rows: pa.Table) -> None:
            sid = self.catalog.reserve_super_extents(name, 1)
            supers.append(self._write_super_extent(info, sid, rows, waited))

        for piece in batches:
            t = pa.Table.from_batches([piece]) if isinstance(piece, pa.RecordBatch) else piece
            if not t.num_rows:
                continue
            t = conform(t, info.schema, info.specs, name)  # each piece checked as it arrives
            if not supers and not pending:
                assign_partitions(t.slice(0, 1), info.specs)
            pending.append(t)
            held += t.num_rows
            total += t.num_rows
            while held >= self.super_extent_rows:
                rows = _concat(pending)
                flush(rows.slice(0, self.super_extent_rows))
                rest = rows.slice(self.super_extent_rows)
                pending, held = ([rest] if rest.num_rows else []), rest.num_rows
        if held:
            flush(_concat(pending))
        if not supers:
            return AppendResult(0, [], 0)
        nbytes = sum(e.stored_bytes for s in supers for e in s.extents)
        mine = {"rows": total, "bytes": nbytes, "super_extents": [s.id for s in supers]}
        done = self.catalog.commit_super_extents(name, supers, token, mine)
        if done is not None:  # an earlier send of this append committed meanwhile
            log.info(
                "append %s: token %s committed by another send; this one's extents are orphans", name, token
            )
            return _append_result(done)
        log.info(
            "append %s: %d rows, %d extent bytes in %.2fs",
            name,
            total,
            nbytes,
            time.perf_counter() - t0,
        )
        return AppendResult(total, [s.id for s in supers], nbytes)

    def _placement_nodes(self, waited: set[str]) -> list[NodeInfo]:
        """The live nodes to place a super-extent over, once the nodes live a moment ago and not
        now have had ``return_wait_s`` to come back (``RETURNING_S``; each waited for once per
        append: ``waited``)."""
        nodes = self.live_nodes()
        now = time.monotonic()
        live = {n.name for n in nodes}
        returning = {
            n
            for n, at in self._last_live.items()
            if n not in live and n not in waited and now - at < RETURNING_S
        }
        waited |= returning
        returning = {n for n in returning if self._answers(n)}
        if not returning:
            return nodes
        log.warning(
            "append: waiting up to %.0fs for %s to come back before placing",
            self.return_wait_s,
            sorted(returning),
        )
        until = now + self.return_wait_s
        while time.monotonic() < until:
            time.sleep(0.2)
            nodes = self.live_nodes()
            if returning <= {n.name for n in nodes}:
                break
        return nodes

    def _answers(self, name: str) -> bool:
        """Does a node not registered now still answer on its last address (its lease lapsed,
        the process lives), within ``PROBE_S``?"""
        seen = self._seen.get(NODES_SEEN + name) or {}
        if not seen.get("address"):
            return False
        node = NodeInfo(name, seen.get("domain", ""), seen["address"])
        try:
            self.transport.action(node, "reads", {}, timeout=PROBE_S)
        except Exception:  # noqa: BLE001 - refused, reset or silent: not coming back soon
            return False
        return True

    def _write_super_extent(
        self, info: TableInfo, sid: int, rows: pa.Table, waited: set[str] | None = None
    ) -> SuperExtent:
        t0 = time.perf_counter()
        extents = bucketed_extents(rows, info.specs, sort=self.sort_extents)
        log.info(
            "super-extent %s/%d: %d rows bucketed in %.2fs",
            info.name,
            sid,
            rows.num_rows,
            time.perf_counter() - t0,
        )
        excluded: set[str] = set()
        last: Exception | None = None
        for attempt in range(4):
            if attempt == 0:
                nodes = self._placement_nodes(waited if waited is not None else set())
            else:
                nodes = self.live_nodes()
            nodes = [n for n in nodes if n.name not in excluded]
            try:
                placement = place_super_extent(
                    nodes, sid, [s.count for s in info.specs], colocated_homes(info.specs)
                )
            except FailedPrecondition as exc:
                if last is None:
                    raise
                # Too few nodes are left once those that failed are set aside: the error is why
                # they failed (a full disk), not that too few are live (session 40: it said
                # "need live store nodes in at least 3 fault domains" of nodes that were up).
                raise _append_failed(info.name, excluded, last, str(exc)) from exc
            by_name = {n.name: n for n in nodes}
            jobs = []
            for (r, p), (ext_rows, index) in extents.items():
                node = by_name[placement[(r, p)]]
                eid = new_extent_id(sid, r, p)
                jobs.append((r, p, node, eid, ext_rows, index))
            futures = [
                (
                    j,
                    self._pool.submit(
                        self.transport.put_extent, j[2], info.name, j[3], j[4], j[5], info.codecs[j[0]]
                    ),
                )
                for j in jobs
            ]
            # a node that stops answering is given up when its lease runs out (not at the
            # write's deadline) and the super-extent re-placed without it, as after a failure
            lost = self._await([(j[2].name, f) for j, f in futures], {j[2].name: j[2] for j in jobs}, False)
            metas, failed = [], set()
            for (r, p, node, eid, ext_rows, _), fut in futures:
                if node.name in lost and not fut.done():
                    failed.add(node.name)
                    last = Unavailable(f"{node.name} left the cluster during the append")
                    continue
                try:
                    res = fut.result()
                    metas.append(
                        ExtentMeta(
                            eid,
                            sid,
                            r,
                            p,
                            node.name,
                            ext_rows.num_rows,
                            data_bytes(res),
                            res["checksum"],
                            res["buckets"],
                            file_bytes=res["bytes"],
                            codec=res.get("codec", ""),
                            sorted=sorted_column(info.specs[r], ext_rows.schema) if self.sort_extents else "",
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - any failure excludes the node and retries
                    failed.add(node.name)
                    last = exc
            if not failed:
                log.info(
                    "super-extent %s/%d: %d extents written in %.2fs",
                    info.name,
                    sid,
                    len(metas),
                    time.perf_counter() - t0,
                )
                return SuperExtent(info.name, sid, rows.num_rows, metas)
            log.warning(
                "append to %s: nodes %s failed (%s); re-placing super-extent %d", info.name, failed, last, sid
            )
            excluded |= failed
            for m in metas:  # best effort: the orphans are never referenced anyway
                try:
                    self.transport.action(by_name[m.node], "delete", {"table": info.name, "extent": m.id})
                except Exception:  # noqa: BLE001, S110 - best-effort clean-up of a half-written extent
                    pass
        raise _append_failed(info.name, excluded, last, "")

    # ------------------------------------------------------------------ queries
    def plan(self, q: Query, exclude: set[str] = frozenset(), qid: str | None = None) -> Plan:  # type: ignore[assignment]
        """The plan of ``q`` on the live nodes but ``exclude``: reused from ``model_plans`` when
        the same query was planned on the same catalog version (its token, read before anything
        the plan is made from, so a plan is never tagged newer than its records) and the same live
        nodes, else planned from the table records (and kept). A hit reads the token and the node
        registry; a miss the table's record and super-extents besides."""
        token, live = self.version_and_live_nodes(self.model_plans.size > 0)
        live = [n for n in live if n.name not in exclude]
        nodes = {n.name: n for n in live}
        env = tuple((n.name, n.address, n.domain) for n in sorted(live, key=lambda x: x.name))
        names = [q.table] + ([q.join.table] if q.join else [])
        resident = self.residency(names, live)
        key = (
            repr(q),
            env,
            self.agg_by_partition,
            self.agg_by_partition_min_bytes,
            self.join_build_bytes,
            resident.signature() if resident is not None else None,
        )
        hit = self.model_plans.get(key) if token is not None else None
        if hit is not None and hit[0] == token:
            plan = hit[1].reused(qid or "q", nodes)
            if resident is not None:
                plan.explain = [x for x in plan.explain if not x.startswith("residency: ")]
                plan.explain.append(resident.describe())
            return plan
        tables = {}
        for n in names:
            tables[n] = self.catalog.table(n)
        plan = plan_query(
            q,
            tables,
            [n.name for n in live],
            {n.name: n.address for n in live},
            qid or "q",
            by_partition=self.agg_by_partition,
            by_partition_min_bytes=self.agg_by_partition_min_bytes,
            join_build_bytes=self.join_build_bytes,
            resident=resident,
        )
        if resident is not None:
            plan.explain.append(resident.describe())
        plan.nodes = nodes
        if token is not None:
            self.model_plans.put(key, (token, plan.reused(plan.qid, {})))
        return plan

    def explain(self, q: Query) -> str:
        return self.plan(q).explain_text()

    def query(self, q: Query, gone: Any = None) -> tuple[pa.Table, Plan]:
        # the query's attempts share their tasks by (node, task) (``_QueryRun``): a task of a
        # retry or hedge identical to one of another attempt's on a node still up (the surviving
        # nodes' partitions after a node loss) takes that one's result, running or done

        def attempt(exclude: set[str], att: _Attempt) -> tuple[pa.Table, Plan]:
            t0 = time.perf_counter()
            plan = self.plan(q, exclude, qid=uuid.uuid4().hex[:12])
            plan.timings = {"plan": time.perf_counter() - t0}
            return self._execute(plan, att), plan

        return self._with_retries(attempt, gone)

    def sql(self, text: str, gone: Any = None) -> tuple[pa.Table, Any]:
        """Run a SQL query (see ``_sql``): returns the result and its plan (kind, explain, replicas).
        ``gone``: registers a callback for when the caller goes away (``_with_retries``)."""
        from . import _sql

        # as ``query``'s: a retry's or hedge's task identical to one of another attempt's on a
        # node still up takes that one's result (the surviving partitions are not run again)

        def attempt(exclude: set[str], att: _Attempt) -> tuple[pa.Table, Any]:
            t0 = time.perf_counter()
            plan = _sql.build(self, text, exclude)
            out = self._run_sql_plan(plan, plan.nodes, t0, att)
            if plan.names is not None and len(plan.names) == out.num_columns:
                out = out.rename_columns(plan.names)  # DuckDB's names of the text as written
            return out, plan

        return self._with_retries(attempt, gone)

    def _run_sql_plan(
        self,
        plan: Any,
        nodes: dict[str, Any],
        t0: float,
        att: _Attempt | None = None,
    ) -> pa.Table:
        """Run a built SQL plan: its sub-plans first (``staged``: each distributed on its own,
        its result an input of the coordinator's SQL), then its fragments and the merge; its
        seconds per phase go to ``plan.timings``. ``att``: the attempt of the query it is, whose
        run holds the tasks of the query's other attempts (``_run_stage``; a streamed merge's are
        not shared: a stream is read once)."""
        from . import _sql

        earlier = att.run.tasks if att is not None else None

        t_plan = time.perf_counter()
        staged: dict[str, pa.Table] = {}
        if plan.stages:  # independent of each other: run side by side
            with ThreadPoolExecutor(len(plan.stages), thread_name_prefix="sql-stage") as pool:
                futures = {
                    name: pool.submit(self._run_sql_plan, sub, nodes, time.perf_counter(), att)
                    for name, sub in plan.stages
                }
                staged = {name: f.result() for name, f in futures.items()}
        t1 = time.perf_counter()
        tasks: list[tuple[int, tuple[str, dict[str, Any]]]] = list(enumerate(plan.tasks))
        if plan.exchange:
            # a repartition exchange: the maps hash-split each node's rows into buckets kept on
            # it; the reducers (the plan's tasks) pull theirs. A fresh query id each run (the plan
            # may be cached, and a retry's buckets are not the failed attempt's)
            qid = uuid.uuid4().hex[:12]
            try:
                plan.moved_bytes = self._run_exchange(plan, qid, nodes, att)
                tasks = [(i, (n, {**t, "qid": qid})) for i, (n, t) in tasks]
                t_x = time.perf_counter()
                out = self._run_sql_tasks(plan, tasks, nodes, earlier, att, staged)
            finally:
                suspects = self.suspected()
                for n in sorted({n for n, _ in plan.exchange} | {n for n, _ in plan.tasks}):
                    if n in nodes and n not in suspects:
                        try:
                            self._pool.submit(self._drop_shuffle, nodes[n], qid)
                        except RuntimeError:
                            break
            t2 = time.perf_counter()
            plan.timings = {
                "plan": t_plan - t0,
                **({"stages": t1 - t_plan} if plan.stages else {}),
                "exchange maps": t_x - t1,
                "reducers and merge": t2 - t_x,
            }
            return out
        firsts: dict[int, pa.Table] = {}
        if plan.semi:
            # semi-joins: the key tables first, then the big tables filtered by their keys
            ids = _sql.semi_first(plan)
            firsts = dict(
                zip(ids, self._run_stage([plan.tasks[i] for i in ids], nodes, earlier, att), strict=True)
            )
            tasks, notes = _sql.keyed_tasks(plan, firsts)
            plan.explain.extend(notes)
        t_first = time.perf_counter() - t1
        if plan.streams_merge:
            # big inputs stream into the merge batch by batch, never gathered whole
            run = dict(
                zip(
                    (i for i, _ in tasks),
                    self._run_stage_streams([t for _, t in tasks], nodes, att),
                    strict=True,
                )
            )
            streams = [
                run[i] if i in run else (firsts[i].schema, iter(firsts[i].to_batches()))
                for i in range(len(plan.tasks))
            ]
            t2 = time.perf_counter()
            node = [_exec.fragment_timings(schema.empty_table()) for schema, _ in streams]
            out = _sql.finish_sql_streams(plan, streams, staged)
        else:
            got = dict(
                zip(
                    (i for i, _ in tasks),
                    self._run_stage([t for _, t in tasks], nodes, earlier, att),
                    strict=True,
                )
            )
            outs = [got[i] if i in got else firsts[i] for i in range(len(plan.tasks))]
            t2 = time.perf_counter()
            node = [_exec.fragment_timings(o) for o in outs]
            out = _sql.finish_sql(plan, outs, staged)
        plan.timings = {
            "plan": t_plan - t0,
            **({"stages": t1 - t_plan} if plan.stages else {}),
            **({"first stage": t_first} if plan.semi else {}),
            "fragments": t2 - t1,
            "slowest fragment read": max((n.get("read", 0.0) for n in node), default=0.0),
            "slowest fragment run": max((n.get("run", 0.0) for n in node), default=0.0),
            "merge": time.perf_counter() - t2,
        }
        return out

    def _run_exchange(self, plan: Any, qid: str, nodes: dict[str, NodeInfo], att: _Attempt | None) -> int:
        """An exchange's maps (``plan.exchange``) under query id ``qid``; returns the bytes of the
        buckets that go to a reducer on another node (bucket i is the i-th reducer's)."""
        maps = [(n, {**t, "qid": qid}) for n, t in plan.exchange]
        outs = self._run_stage(maps, nodes, None, att)
        reducers = [n for n, _ in plan.tasks]
        moved = 0
        for (mapper, _), out in zip(maps, outs, strict=True):
            for i, b in zip(out.column("bucket").to_pylist(), out.column("bytes").to_pylist(), strict=True):
                if reducers[i % len(reducers)] != mapper:
                    moved += b
        return moved

    def _run_sql_tasks(
        self,
        plan: Any,
        tasks: list[tuple[int, tuple[str, dict[str, Any]]]],
        nodes: dict[str, NodeInfo],
        earlier: Any,
        att: _Attempt | None,
        staged: dict[str, pa.Table],
    ) -> pa.Table:
        """A plan's fragments (or an exchange's reducers) run, their outputs merged."""
        from . import _sql

        if plan.streams_merge:
            streams = self._run_stage_streams([t for _, t in tasks], nodes, att)
            return _sql.finish_sql_streams(plan, streams, staged)
        outs = self._run_stage([t for _, t in tasks], nodes, earlier, att)
        return _sql.finish_sql(plan, outs, staged)

    def explain_sql(self, text: str) -> Any:
        from . import _sql

        return _sql.build(self, text)

    def _live_names(self) -> set[str]:
        return {n.name for n in self.transport.live_nodes()}

    def suspected(self) -> set[str]:
        """The nodes a query found unreachable in the last ``suspect_s`` seconds."""
        now = time.monotonic()
        with self._suspects_lock:
            for name, since in list(self._suspects.items()):
                if now - since >= self.suspect_s:
                    self._suspects.pop(name, None)
            return set(self._suspects)

    def _with_retries(self, attempt: Any, gone: Any = None) -> Any:
        """Run ``attempt(excluded nodes, _Attempt)``; a node failure is handled (corrupt or
        missing extent marked for rebuild and read degraded, unreachable node excluded, and left
        out of the next queries' plans for ``suspect_s``) and the query re-planned. Nodes found
        unreachable by recent queries are left out from the start; if the query cannot be
        planned without them, it is planned with them.

        While an attempt waits on a node whose fragments straggle (``hedge``'s policy, checked
        in ``_await``), a hedge is started beside it: the same ``attempt`` planned without that
        node, in its own thread (``_hedge``). The first of them to answer is taken whole
        (``_QueryRun.offer``) and the other stops waiting; an attempt that fails while a hedge
        runs waits for the hedge before it is retried.

        ``gone(callback)``: registers ``callback`` to be called when the query's caller goes away
        (the gRPC handler's ``context.add_callback``, also called when the call ends normally:
        then the answer is taken and it does nothing); the query then ends (``Cancelled``) and
        its tasks are cancelled on their nodes."""
        run = _QueryRun(attempt)
        if gone is not None:
            gone(run.abandon)
        try:
            return self._attempts(run)
        finally:
            # whatever ended the run (an answer, a failure, the caller gone), the tasks of its
            # attempts that did not answer are cancelled on their nodes
            self._cancel_losers(run)

    def _attempts(self, run: _QueryRun) -> Any:
        attempt = run.attempt
        suspects = self.suspected()
        exclude: set[str] = set(suspects)
        last: Exception | None = None
        for _attempt in range(4):
            run.exclude = set(exclude)
            att = _Attempt(run)
            try:
                out = attempt(exclude, att)
            except Superseded:
                if run.gone:
                    raise Cancelled("the query's caller went away") from None
                return self._answered(run)
            except Unavailable:
                if run.wait_hedges():  # a hedge answered (planned without what failed here)
                    return self._answered(run)
                if not suspects & exclude:
                    raise
                exclude -= suspects  # (not plannable without them: try them)
                suspects = set()
                continue
            except NodeFailure as exc:
                if run.wait_hedges():
                    return self._answered(run)
                if isinstance(exc.cause, InvalidArgument):
                    raise exc.cause from None  # the query's own error (e.g. SQL), not the node's
                last = exc
                if isinstance(exc.cause, CorruptExtent) or "corrupt extent" in str(exc.cause):
                    self._mark_corrupt(str(exc.cause), "corrupt extent ")
                elif isinstance(exc.cause, (NotFound,)) or "has no extent" in str(exc.cause):
                    # A node lost a file the catalog still lists (e.g. restarted on an empty disk):
                    # read it degraded and rebuild it. If instead the catalog moved on (a rebuild
                    # replaced the extent), the old id is gone from it and this changes nothing.
                    self._mark_corrupt(str(exc.cause), "has no extent ")
                else:
                    exclude.add(exc.node)
                    if isinstance(exc.cause, Unavailable):
                        with self._suspects_lock:
                            self._suspects[exc.node] = time.monotonic()
                log.warning("query retry after %s", exc)
                continue
            run.offer(out, "first", att=att)
            return self._answered(run)
        raise Unavailable(f"query failed after retries: {last}")

    def _answered(self, run: _QueryRun) -> Any:
        """The answer ``run`` took, its plan's EXPLAIN saying what each hedge was and which plan's
        answer was used (``hedges``, the same as dicts)."""
        table, plan = run.answer
        with run.lock:
            hedges = [dict(h) for h in run.hedges]
            warms = [dict(w) for w in run.warms]
        for h in hedges:
            if h.get("outcome") == "running":
                h["outcome"] = "not used: the first plan answered first"
        plan.hedges = hedges
        plan.warms = warms
        for w in warms:
            if w["outcome"] == "warming":
                w["outcome"] = "not needed: the first plan answered"
            witness = f" while {w['witness']} answered" if w.get("witness") else ""
            on = (
                f"{w['extents']} extent reads of {w['bytes'] / 1e6:.0f} MB, on {', '.join(w['on']) or 'none'}"
            )
            if w.get("decoded"):
                on += f"; {w['decoded'] / 1e6:.0f} MB decoded"
            plan.explain.append(
                f"warm: {', '.join(w['nodes'])} had not answered a liveness probe for {w['waited_s']:.2f} s"
                f"{witness}, {w['after_s']:.2f} s into a stage: the reads of a plan without it decoded "
                f"ahead of a hedge ({on}); {w['outcome']}"
            )
        for h in hedges:
            them = "it" if len(h["nodes"]) == 1 else "them"
            if h.get("expected_from") == "probe" and h.get("probe_rule") == "unanswered":
                witness = (
                    f" while {h['witness']} answered in {h['witness_s']:.2f} s" if h.get("witness") else ""
                )
                plan.explain.append(
                    f"hedge: {', '.join(h['nodes'])} had not answered a liveness probe for "
                    f"{h['silent_s']:.2f} s{witness} ({h['probes_missed']} decided missed) "
                    f"{h['after_s']:.2f} s into a stage: planned again without {them}, run on the "
                    f"other replicas; {h['outcome']}"
                )
                continue
            if h.get("expected_from") == "probe":
                witness = f", while {h['witness']} answered" if h.get("witness") else ""
                plan.explain.append(
                    f"hedge: {', '.join(h['nodes'])} missed {h['probes_missed']} liveness probes in a "
                    f"row ({h['silent_s']:.2f} s without an answer{witness}) {h['after_s']:.2f} s into "
                    f"a stage: planned again without {them}, run on the other replicas; {h['outcome']}"
                )
                continue
            basis = (
                f"whose other nodes took {h['siblings_median_s']:.2f} s (median"
                if h.get("expected_from") != "history"
                else f"on it alone, expected to take {h['siblings_median_s']:.2f} s (its bytes at the "
                "seconds per byte its shape's fragments took here lately"
            )
            plan.explain.append(
                f"hedge: {', '.join(h['nodes'])} still ran {h['after_s']:.2f} s into a stage {basis}; "
                f"hedged past {h['bar_s']:.2f} s): planned again without {them}, run on the other "
                f"replicas; {h['outcome']}"
            )
        if run.winner == "hedge":
            # a plan without them answered before they did: left out of the next queries' plans
            # for ``suspect_s``, as a node found unreachable (each would be hedged again meanwhile)
            now = time.monotonic()
            with self._suspects_lock:
                for n in run.hedged:
                    self._suspects[n] = now
        if hedges:
            used = "the hedge's" if run.winner == "hedge" else "the first plan's"
            plan.explain.append(f"hedge: answer used: {used} (one plan's whole answer)")
        return table, plan

    def _hedge(
        self,
        att: _Attempt,
        late: dict[str, tuple[float, float, float, bool]],
        probe: dict[str, tuple[int, float, str | None]] | None = None,
        unanswered: dict[str, float] | None = None,
    ) -> None:
        """Start a hedge of the nodes of ``late`` (straggling in ``att``'s stage: each with how
        long its fragment ran, its bar and what its like fragments gave): the query planned again
        without them, in its own thread, its answer offered to the run (``_QueryRun.offer``).
        At most one per node per query; none once the run has its answer. ``probe``: the nodes
        stopped answering their liveness probes (``_probe_stage``: each with the probes missed
        in a row, the seconds since the first of them, the round's witness), not a bar;
        ``unanswered``: those hedged for a probe unanswered ``hedge_after_s`` while the witness
        was prompt (each with the witness's seconds to answer; ``probe`` then holds the misses
        decided so far and the seconds the probe has waited)."""
        run = att.run
        with run.lock:
            new = set(late) - run.hedged
            if not new or run.answer is not None:
                return
            run.hedged |= new
            exclude = set(run.exclude) | run.hedged
            rec: dict[str, Any] = {
                "nodes": sorted(new),
                "after_s": round(max(late[n][0] for n in new), 4),
                "siblings_median_s": round(max(late[n][2] for n in new), 4),
                "bar_s": round(max(late[n][1] for n in new), 4),
                # what the expected time came from: the stage's fragments on other nodes, or
                # (a stage on one node) earlier fragments of the same shape (``_hedge.Rates``)
                "expected_from": "history" if all(late[n][3] for n in new) else "siblings",
                "outcome": "running",
            }
            if probe:
                # not a bar: the node missed its liveness probes (``_liveness.Probes``)
                rec["expected_from"] = "probe"
                rec["probes_missed"] = max(probe[n][0] for n in new)
                rec["silent_s"] = round(max(probe[n][1] for n in new), 4)
                rec["witness"] = next((probe[n][2] for n in sorted(new) if probe[n][2]), None)
                if unanswered:
                    # before the round was decided a miss: ``HedgePolicy.unanswered``
                    rec["probe_rule"] = "unanswered"
                    rec["witness_s"] = round(max(unanswered.get(n, 0.0) for n in new), 4)
            run.hedges.append(rec)
            for w in run.warms:
                if set(w["nodes"]) & new and w["outcome"] == "warming":
                    w["outcome"] = "the hedge followed"
            done: Future[bool] = Future()
            run.hedge_done.append(done)
        log.warning(
            "query: hedging %s (straggling %.2fs, bar %.2fs)", sorted(new), rec["after_s"], rec["bar_s"]
        )

        hatt = _Attempt(run, hedge=True)

        def go() -> None:
            try:
                out = run.attempt(exclude, hatt)
            except Superseded:
                with run.lock:
                    rec["outcome"] = "stopped: the first plan answered first"
                done.set_result(False)
                return
            except Exception as exc:  # noqa: BLE001 - a hedge that fails leaves the first plan to answer
                with run.lock:
                    rec["outcome"] = f"failed ({short(f'{type(exc).__name__}: {exc}', 200)}): not used"
                log.warning("query: hedge of %s failed: %s", rec["nodes"], exc)
                done.set_result(False)
                return
            used = run.offer(out, "hedge", rec, hatt)
            if not used:
                with run.lock:
                    rec["outcome"] = "not used: the first plan answered first"
            done.set_result(used)

        threading.Thread(target=go, name="store-hedge", daemon=True).start()

    def _mark_corrupt(self, message: str, marker: str) -> None:
        # "corrupt extent <table>/<extent> on node <n>: ..." or "node <n> has no extent <table>/<extent>"
        try:
            ref = message.split(marker, 1)[1].split(" ", 1)[0].rstrip(":.")
            table, eid = ref.split("/", 1)
        except (IndexError, ValueError):
            return
        for s in self.catalog.table(table).super_extents:
            if s.find(eid):
                self.catalog.mark_extent(table, s.id, eid, "corrupt")
                log.warning("extent %s/%s marked corrupt", table, eid)

    def _start(
        self,
        fn: Any,
        node: str,
        task: dict[str, Any],
        nodes: dict[str, NodeInfo],
        att: _Attempt | None,
        orphan: Any = None,
    ) -> Future[Any]:
        """``fn(node, task)``, a call to a node, on a thread of its own (not the core's pool; one
        idle from an earlier call, ``_threads.CallThreads``): a call abandoned (``_abandon``)
        leaves no pool thread waiting on a node that stopped answering. Within a query (``att``) the task is given an id (``tid``), by which the node
        cancels it when its attempt loses (``_cancel_losers``). The future is running from the
        start (``cancel`` does nothing); a result that comes after the call was abandoned goes
        to ``orphan`` (a stream to close), else is dropped."""
        f: Future[Any] = Future()
        f.set_running_or_notify_cancel()
        if att is not None and node in nodes:
            tid = uuid.uuid4().hex[:24]
            task = {**task, "tid": tid}
            with att.run.lock:
                att.run.calls[f] = (nodes[node], tid)
                late = att.run.swept
            if late:  # the run has ended: a losing attempt still starting its stage
                self._abandon(f)
                self._send_cancel(nodes[node], [tid])
                return f

        def go() -> None:
            try:
                out = fn(node, task)
            except BaseException as exc:  # noqa: BLE001 - the call's error is its future's
                with contextlib.suppress(InvalidStateError):
                    f.set_exception(exc)
                return
            try:
                f.set_result(out)
            except InvalidStateError:
                if orphan is not None:
                    orphan(out)

        self._calls.run(go)  # (a thread idle from an earlier call, or a new one: ``_threads``)
        return f

    @staticmethod
    def _abandon(f: Future[Any]) -> None:
        """Stop waiting on a call: its future fails now (``TaskCancelled``); what the call's
        thread gets later is dropped."""
        with contextlib.suppress(InvalidStateError):
            f.set_exception(TaskCancelled("the call's attempt lost: abandoned"))

    def _cancel_losers(self, run: _QueryRun) -> None:
        """The run ended: every call of its attempts that the answer did not use (not ``kept``)
        and that is still running is abandoned here and cancelled on its node (``_cancel``;
        one action per node, sent off this thread). A call that ended needs nothing."""
        by_node: dict[str, tuple[NodeInfo, list[str]]] = {}
        with run.lock:
            run.swept = True
            losers = [(f, c) for f, c in run.calls.items() if f not in run.kept and not f.done()]
        for f, (node, tid) in losers:
            self._abandon(f)
            by_node.setdefault(node.name, (node, []))[1].append(tid)
        for node, tids in by_node.values():
            self._send_cancel(node, tids)

    def _send_cancel(self, node: NodeInfo, tids: list[str]) -> None:
        try:
            self._canceller.submit(self._cancel_on, node, tids)
        except RuntimeError:  # (the core is closing)
            pass

    def _cancel_on(self, node: NodeInfo, tids: list[str]) -> None:
        """Ask ``node`` to cancel tasks ``tids``; asked again while it does not answer (a paused
        node answers once it runs again), for at most ``CANCEL_GIVE_UP_S``."""
        t0 = time.monotonic()
        while True:
            asked = time.monotonic()
            try:
                got = self.transport.action(node, "cancel", {"tasks": tids}, timeout=CANCEL_TIMEOUT_S)
                rec: dict[str, Any] = {"node": node.name, "tasks": list(tids), **got}
                break
            except Exception as exc:  # noqa: BLE001 - a node that does not answer: asked again
                # (also once its lease has run out: a paused node that runs again serves the
                # calls queued for it, the loser's task among them, before it registers again;
                # one that refused at once and is not registered is gone, its tasks with it)
                refused = time.monotonic() - asked < CANCEL_TIMEOUT_S / 2
                gone = refused and node.name not in self._live_names()
                if gone or time.monotonic() - t0 >= CANCEL_GIVE_UP_S:
                    rec = {"node": node.name, "tasks": list(tids), "error": short(str(exc), 200)}
                    break
                time.sleep(CANCEL_RETRY_S)
        with self._suspects_lock:
            self.cancels.append(rec)
            del self.cancels[:-256]
        log.info("query: cancel of %d task(s) on %s: %s", len(tids), node.name, rec)

    def _run_stage(
        self,
        tasks: list[tuple[str, dict[str, Any]]],
        nodes: dict[str, NodeInfo],
        earlier: dict[tuple[str, str], Future[pa.Table]] | None = None,
        att: _Attempt | None = None,
    ) -> list[pa.Table]:
        """Run ``tasks`` at once; the first to fail raises at once (the query's retry need not
        wait for the others). ``earlier``: the tasks another attempt of the same query started,
        by (node, task): one of them that has not failed is reused, and the ones started here
        are added. ``att``: the query's attempt this stage is of (its tasks' times kept for the
        hedging policy; ``_await``)."""

        def one(node: str, task: dict[str, Any]) -> pa.Table:
            if node not in nodes:
                raise NodeFailure(node, Unavailable("not live"))
            try:
                return self.transport.run_task(nodes[node], task)
            except NodeFailure:
                raise
            except Exception as exc:
                raise NodeFailure(node, exc) from exc

        if att is not None and att.warm:
            self._send_warms(tasks, nodes, earlier, att)
        futs = []
        for n, t in tasks:
            key = (n, json.dumps(t, sort_keys=True, default=str)) if earlier is not None else None
            f = earlier.get(key) if earlier is not None and key is not None else None
            if f is None or (f.done() and f.exception() is not None):
                f = self._start(one, n, t, nodes, att)
                if earlier is not None and key is not None:
                    earlier[key] = f
            if att is not None:
                att.run.track(f)
                att.futs.add(f)
            futs.append(f)
        self._wait_stage(futs, tasks, nodes, att)
        return [f.result() for f in futs]

    def _wait_stage(
        self,
        futs: list[Future[Any]],
        tasks: list[tuple[str, dict[str, Any]]],
        nodes: dict[str, NodeInfo],
        att: _Attempt | None = None,
    ) -> None:
        """Wait for a stage's tasks; the first to fail raises at once (not after the tasks listed
        before it), and so does a node the tasks use leaving the cluster meanwhile (its lease
        ran out: ``_liveness``), which would otherwise hold the stage until its calls' deadline;
        another attempt of the query answering raises ``Superseded`` (``att``)."""
        lost = self._await(
            [(n, f) for (n, _), f in zip(tasks, futs, strict=True)],
            {n: nodes.get(n) for n in nodes_used(tasks)},
            att=att,
            tasks=[t for _, t in tasks],
            peers=nodes,
        )
        if lost:
            node = min(lost)
            raise NodeFailure(node, Unavailable(f"{node} left the cluster during the query"))
        for f in futs:
            if f.done() and (exc := f.exception()) is not None:
                raise exc

    def _await(
        self,
        futs: list[tuple[str, Future[Any]]],
        used: dict[str, Any],
        first_failure: bool = True,
        att: _Attempt | None = None,
        tasks: list[dict[str, Any]] | None = None,
        peers: dict[str, NodeInfo] | None = None,
    ) -> set[str]:
        """Wait for calls to nodes (``futs``: each call's node and future) while watching the
        nodes they use (``used``: name -> NodeInfo; ``_liveness``) against the registry: until
        all are done, or one failed (``first_failure``), or a node of ``used`` left the cluster
        (its lease ran out: dead, paused or cut off, which would hold its calls to their
        deadline). Returns the nodes that left while calls were waiting: with ``first_failure``
        the wait ends at the first; without, it goes on for the calls to the other nodes.

        ``att``: the query's attempt the calls are a stage of: the wait ends with ``Superseded``
        once another attempt's answer is taken, and (unless ``att`` is itself a hedge) a node
        whose calls straggle behind the others' (``hedge``'s policy, given each call's task:
        ``tasks``) is hedged (``_hedge``), and so is one that stops answering the liveness
        probes sent while its calls run long (``_probe_stage``; ``peers``: the live nodes, of
        which one not probed witnesses each round)."""
        node_of = {f: n for n, f in futs}
        pending: set[Future[Any]] = set(node_of)
        hedging = att is not None and not att.hedge and self.hedge is not None and tasks is not None
        # each call's node, future, and what the hedging policy compares it by (``_hedge``)
        calls = (
            [(n, f, shape(t), weight(t)) for (n, f), t in zip(futs, tasks, strict=True)]
            if hedging and tasks is not None
            else []
        )
        # with an attempt: woken by each call's end (to compare the nodes' times) and by ``stop``
        when = (FIRST_COMPLETED if att is not None else FIRST_EXCEPTION) if first_failure else ALL_COMPLETED
        stop: set[Future[Any]] = {att.run.stop} if att is not None else set()
        if att is not None and tasks is not None and self.hedge is not None:
            # each fragment that ends well is one more measure of its shape's seconds per byte
            # (``_hedge.Rates``: what a stage on one node is expected to take)
            for (_, f), t in zip(futs, tasks, strict=True):
                self._rate_when_done(att.run, f, shape(t), weight(t))
        began = time.monotonic()
        # the nodes whose fragments run long are asked whether they are there (``_probe_stage``)
        pol = self.hedge
        probes = (
            Probes(self._probe, self._probe_threads.run, pol.probe_every_s, pol.probe_timeout_s)
            if hedging and pol is not None and pol.probe_misses > 0
            else None
        )
        with self.node_watch.register(used, start=False) as watched:
            while pending:
                timeout = self.node_watch.poll_s
                if hedging:
                    assert att is not None
                    due = self._stragglers(att, calls)
                    if due is not None:
                        timeout = min(timeout, max(due, 0.01))
                    if probes is not None:
                        due = self._probe_stage(att, calls, probes, peers or {})
                        if due is not None:
                            timeout = min(timeout, max(due, 0.01))
                done, rest = wait(pending | stop, timeout=timeout, return_when=when)
                if att is not None and att.run.stop.done():
                    raise Superseded()
                pending = rest - stop
                # (calls that end within one poll never start the watch's thread)
                if pending and time.monotonic() - began >= self.node_watch.poll_s:
                    self.node_watch.start()
                if watched.lost:
                    if first_failure:
                        return set(watched.lost)
                    pending = {f for f in pending if node_of[f] not in watched.lost}
                if first_failure and any(f.exception() is not None for f in done):
                    return set()
            # (every call ended: with ``first_failure``, a node that left after it served no one)
            return set() if first_failure else set(watched.lost)

    def _rate_when_done(self, run: _QueryRun, f: Future[Any], kind: str, w: float) -> None:
        with run.lock:
            if f in run.rated:
                return
            run.rated.add(f)

        def done(f: Future[Any]) -> None:
            if f.exception() is None and f in run.started:
                self.rates.add(kind, w, run.ended.get(f, time.monotonic()) - run.started[f])

        f.add_done_callback(done)

    def _stragglers(self, att: _Attempt, calls: list[tuple[str, Future[Any], str, float]]) -> float | None:
        """Compare a stage's fragments (``calls``: each one's node, future, ``_hedge.shape`` and
        ``_hedge.weight``) and hedge the nodes whose fragments straggle (``hedge``'s policy;
        nodes not hedged yet in the query). Returns the seconds until the next fragment still
        running would straggle, if the policy can tell."""
        assert self.hedge is not None
        run, now = att.run, time.monotonic()
        frags = []
        for node, f, kind, w in calls:
            start = run.started.get(f, now)
            if f.done():
                if f.exception() is not None:  # (a failure is the retry's business)
                    continue
                frags.append(Fragment(node, kind, w, run.ended.get(f, now) - start, True))
            else:
                frags.append(Fragment(node, kind, w, now - start, False))
        bars = self.hedge.bars(frags, self.rates.expect)
        if not bars:
            return None
        with run.lock:
            skip = run.hedged | run.exclude
        # node -> (ran, bar, expected, expected from history: no like fragment on another node)
        late: dict[str, tuple[float, float, float, bool]] = {}
        rest = []
        for i, (bar, expect) in bars.items():
            fr = frags[i]
            if fr.node in skip:
                continue
            if fr.seconds >= bar:
                if fr.node not in late or fr.seconds > late[fr.node][0]:
                    alone = not any(o.shape == fr.shape and o.node != fr.node for o in frags)
                    late[fr.node] = (fr.seconds, bar, expect, alone)
            else:
                rest.append(bar - fr.seconds)
        if late:
            self._hedge(att, late)
        return min(rest) if rest else None

    def _probe_stage(
        self,
        att: _Attempt,
        calls: list[tuple[str, Future[Any], str, float]],
        probes: Probes,
        peers: dict[str, NodeInfo],
    ) -> float | None:
        """Ask the nodes whose fragments of this stage have run past the policy's
        ``probe_after_s`` whether they are there (``_liveness.Probes``: a round every
        ``probe_every_s``, the fragments' task ids, a witness among the other live nodes), and
        hedge at once a node that missed ``probe_misses`` in a row (``_hedge``). Returns the
        seconds until there is something to do (a round to send or decide, a fragment to start
        probing)."""
        assert self.hedge is not None
        pol, run, now = self.hedge, att.run, time.monotonic()
        with run.lock:
            skip = run.hedged | run.exclude
            ids = {f: run.calls.get(f) for _, f, _, _ in calls}
        ask: dict[str, tuple[NodeInfo, list[str]]] = {}
        ran: dict[str, float] = {}
        soon: list[float] = []
        for node, f, _, _ in calls:
            call = ids.get(f)
            if f.done() or node in skip or call is None:
                continue
            took = now - run.started.get(f, now)
            if not pol.probe(took):
                soon.append(pol.probe_after_s - took)
                continue
            ask.setdefault(node, (call[0], []))[1].append(call[1])
            ran[node] = max(ran.get(node, 0.0), took)
        witnesses = sorted((n, info) for n, info in peers.items() if n not in skip and n not in ask)
        probes.tick(now, ask, witnesses)
        misses = probes.misses(now)
        silent = {n: m for n, m in misses.items() if n in ask and pol.silent(m[0])}
        if silent:
            self._hedge(att, {n: (ran[n], ran[n], 0.0, False) for n in silent}, probe=silent)
        waiting = probes.waiting(now)
        # a node whose probe has gone unanswered ``hedge_after_s`` while the round's witness was
        # prompt: hedged at once, before its round is decided a miss (``HedgePolicy.unanswered``)
        quiet = {
            n: (misses.get(n, (0,))[0], waited, w)
            for n, (waited, took, w) in waiting.items()
            if n in ask and n not in silent and n not in skip and pol.unanswered(waited, took)
        }
        if quiet:
            self._hedge(
                att,
                {n: (ran[n], ran[n], 0.0, False) for n in quiet},
                probe=quiet,
                unanswered={n: waiting[n][1] for n in quiet},
            )
        # a node whose probe goes unanswered while the witness answered (or that missed one), not
        # yet silent: its hedge's reads warmed ahead of the hedge (``_warm``)
        suspect: dict[str, tuple[float, str | None]] = {}
        for n, (waited, took, w) in waiting.items():
            if n not in ask or n in silent or n in quiet:
                continue
            if pol.warm(waited, took):
                suspect[n] = (waited, w)
            if took <= pol.prompt_s and (ahead := pol.due(waited)) is not None:
                soon.append(ahead)  # (the wait looks again as the probe passes the next threshold)
        for n, (m, since, w) in misses.items():
            if (
                n in ask
                and n not in set(silent) | set(quiet)
                and m >= 1
                and pol.warm(max(since, pol.probe_timeout_s), 0.0)
            ):
                suspect.setdefault(n, (since, w))
        if suspect:
            self._warm(att, suspect, ran, probes)
        # ... and cancelled once the node answers a probe in time after all (alive, not silent)
        back = []
        with run.lock:
            for n in sorted(run.warm_calls):
                if n not in ask or n in run.hedged:
                    continue
                seen, count = run.warm_marks.get(n, (None, 0))
                if probes.answered.get(n, 0) > (count if seen is probes else 0):
                    back.append(n)
        if back:
            self._unwarm(run, back)
        due = probes.next_due()
        out = soon + ([due - now] if due is not None else [])
        return min(out) if out else None

    def _warm(
        self,
        att: _Attempt,
        suspect: dict[str, tuple[float, str | None]],
        ran: dict[str, float],
        probes: Probes,
    ) -> None:
        """Warm the reads of the hedge the nodes of ``suspect`` would get (each with how long its
        probe has gone unanswered and the round's witness, which answered: not yet enough to be
        hedged, ``_hedge.HedgePolicy.warm``): the query planned without them,
        as the hedge would be, in a thread of its own, whose first stage asks the nodes it reads
        from to decode those extents' columns (``_send_warms``) and runs nothing. At most one per
        node per query; none once the run has its answer or the node was hedged."""
        run = att.run
        with run.lock:
            new = set(suspect) - run.warmed - run.hedged
            if not new or run.answer is not None:
                return
            run.warmed |= new
            for n in new:  # (its probes answered so far: one more cancels the warm-up)
                run.warm_marks[n] = (probes, probes.answered.get(n, 0))
            exclude = set(run.exclude) | run.hedged | new
            rec: dict[str, Any] = {
                "nodes": sorted(new),
                "after_s": round(max(ran.get(n, 0.0) for n in new), 4),
                "waited_s": round(max(suspect[n][0] for n in new), 4),
                "witness": next((suspect[n][1] for n in sorted(new) if suspect[n][1]), None),
                "on": [],
                "extents": 0,
                "bytes": 0,
                "outcome": "warming",
            }
            run.warms.append(rec)
        log.info("query: warming the reads of a hedge of %s (a missed probe)", sorted(new))
        watt = _Attempt(run, hedge=True, warm=frozenset(new), warm_rec=rec)

        def go() -> None:
            outcome = None
            try:
                run.attempt(exclude, watt)
                outcome = "nothing warmed: the plan ran no stage"
            except _Warmed:
                return
            except Superseded:
                outcome = "nothing warmed: the query had answered"
            except Exception as exc:  # noqa: BLE001 - a warm-up that cannot be planned warms nothing
                outcome = f"nothing warmed ({short(f'{type(exc).__name__}: {exc}', 200)})"
            with run.lock:
                if rec["outcome"] == "warming":
                    rec["outcome"] = outcome

        threading.Thread(target=go, name="store-warm", daemon=True).start()

    def _send_warms(
        self,
        tasks: list[tuple[str, dict[str, Any]]],
        nodes: dict[str, NodeInfo],
        earlier: dict[tuple[str, str], Future[Any]] | None,
        att: _Attempt,
    ) -> None:
        """A warm-up attempt's first stage (``_warm``): each node the stage's new tasks read from
        (a task identical to one already running or done is not: it would be shared, not run)
        is asked to decode those reads into its cache (its ``warm`` action, a call of the run:
        cancelled with the losers when the run ends, or when the node warmed for answers a probe
        again: ``_unwarm``). Raises ``_Warmed``: nothing is run."""
        run, rec = att.run, att.warm_rec
        reads: dict[str, list[dict[str, Any]]] = {}
        seen: set[tuple[str, str]] = set()
        planned = 0
        for n, t in tasks:
            if earlier is not None:
                f = earlier.get((n, json.dumps(t, sort_keys=True, default=str)))
                if f is not None and not (f.done() and f.exception() is not None):
                    continue
            for side in _read_sides(t):
                cols = side.get("read")
                for src in side["sources"]:
                    if (
                        not isinstance(src, dict)
                        or src.get("rows") is not None
                        or src.get("node") not in nodes
                    ):
                        continue
                    r = {
                        "table": src.get("table"),
                        "extent": src.get("extent"),
                        "bucket": src.get("bucket"),
                        "columns": list(cols) if cols is not None else None,
                        "checksum": src.get("checksum"),
                    }
                    key = (str(src["node"]), json.dumps(r, sort_keys=True, default=str))
                    if key in seen:
                        continue
                    seen.add(key)
                    reads.setdefault(str(src["node"]), []).append(r)
                    planned += int(src.get("bytes") or 0)

        def call(node: str, body: dict[str, Any]) -> Any:
            return self.transport.action(nodes[node], "warm", body, timeout=WARM_TIMEOUT_S)

        futs = [self._start(call, n, {"reads": rs}, nodes, att) for n, rs in sorted(reads.items())]

        def decoded(f: Future[Any]) -> None:  # (what the nodes say they decoded, for EXPLAIN)
            if rec is not None and not f.cancelled() and f.exception() is None:
                with run.lock:
                    rec["decoded"] = rec.get("decoded", 0) + int((f.result() or {}).get("bytes") or 0)

        for f in futs:
            f.add_done_callback(decoded)
        with run.lock:
            for n in att.warm:
                run.warm_calls.setdefault(n, []).extend(futs)
            if rec is not None:
                rec["on"] = sorted(set(rec["on"]) | set(reads))
                rec["extents"] += sum(len(rs) for rs in reads.values())
                rec["bytes"] += planned
                if rec["outcome"] == "warming" and not reads:
                    rec["outcome"] = "nothing to warm: the plan without it reads nothing new"
        raise _Warmed()

    def _unwarm(self, run: _QueryRun, back: list[str]) -> None:
        """The nodes ``back`` answered a probe again: their warm-ups' calls still running are
        abandoned and cancelled on the nodes doing them."""
        by_node: dict[str, tuple[NodeInfo, list[str]]] = {}
        with run.lock:
            futs = [f for n in back for f in run.warm_calls.pop(n, [])]
            for rec in run.warms:
                if set(rec["nodes"]) & set(back) and rec["outcome"] == "warming":
                    rec["outcome"] = f"cancelled: {', '.join(back)} answered a probe again"
            calls = [(f, run.calls.get(f)) for f in futs if not f.done()]
        for f, call in calls:
            self._abandon(f)
            if call is not None:
                by_node.setdefault(call[0].name, (call[0], []))[1].append(call[1])
        for node, tids in by_node.values():
            self._send_cancel(node, tids)

    def _probe(self, node: NodeInfo, tids: list[str], timeout: float) -> bool:
        """One liveness probe of ``node`` (its ``probe`` action, about tasks ``tids``) with its
        own deadline: True when the node answered, anything (an error of its own included: it
        is there), False when it could not be reached or the deadline passed."""
        try:
            self.transport.action(node, "probe", {"tasks": tids}, timeout=timeout)
        except (Unavailable, DeadlineExceeded):
            return False
        except Exception:  # noqa: BLE001 - the node answered, with an error (e.g. an older node)
            return True
        return True

    def _run_stage_streams(
        self,
        tasks: list[tuple[str, dict[str, Any]]],
        nodes: dict[str, NodeInfo],
        att: _Attempt | None = None,
    ) -> list[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
        """``_run_stage``, each task's result as its schema (once the task has run: all run at
        once) and a stream of its batches, consumed later one batch at a time; a node's error,
        at the start or half-way through its stream, is a ``NodeFailure`` (so the query retries)."""

        def guarded(node: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            # read later, while the node is watched: one that leaves has its stream cancelled
            watched: Watched | None = None
            try:
                watched = self.node_watch.register({node: nodes.get(node)})
                yield from batches
            except NodeFailure:
                raise
            except Exception as exc:
                if watched is not None and watched.lost:
                    raise NodeFailure(node, Unavailable(f"{node} left the cluster during the query")) from exc
                raise NodeFailure(node, exc) from exc
            finally:
                if watched is not None:
                    watched.close()

        def one(node: str, task: dict[str, Any]) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
            if node not in nodes:
                raise NodeFailure(node, Unavailable("not live"))
            try:
                schema, batches = self.transport.run_task_stream(nodes[node], task)
            except NodeFailure:
                raise
            except Exception as exc:
                raise NodeFailure(node, exc) from exc
            return schema, guarded(node, batches)

        def orphan(out: tuple[pa.Schema, Iterator[pa.RecordBatch]]) -> None:
            close = getattr(out[1], "close", None)  # (a stream whose call was abandoned)
            if close is not None:
                close()

        if att is not None and att.warm:
            self._send_warms(tasks, nodes, None, att)
        futs = [self._start(one, n, t, nodes, att, orphan) for n, t in tasks]
        if att is not None:
            for f in futs:
                att.run.track(f)
                att.futs.add(f)
        out = []
        try:
            self._wait_stage(futs, tasks, nodes, att)
            for f in futs:
                out.append(f.result())
        except BaseException:

            def release(f: Future[Any]) -> None:
                if not f.cancelled() and f.exception() is None:  # (abandoned: ``orphan``'s)
                    close = getattr(f.result()[1], "close", None)
                    if close is not None:
                        close()

            for f in futs:  # release the streams that did start (their calls are cancelled),
                if not f.cancel():  # those still starting once they do: not waited for here (a
                    f.add_done_callback(release)  # paused node's would hold this to its lease)
            raise
        return out

    def _execute(self, plan: Plan, att: _Attempt | None = None) -> pa.Table:
        """Run ``plan``; ``att``: the query's attempt it is, whose run holds the tasks of the
        query's other attempts (``_run_stage``), shared for a plan of one stage without a shuffle
        (a shuffle's tasks are the query id's)."""
        # the nodes the plan was made for (no second registry read); one dead since is a failed task
        nodes = plan.nodes or {n.name: n for n in self.transport.live_nodes()}
        earlier = att.run.tasks if att is not None else None
        reuse = earlier if len(plan.stages) == 1 and not plan.shuffle else None
        timings: dict[str, float] = {}
        try:
            outs: list[pa.Table] = []
            for k, stage in enumerate(plan.stages):
                t0 = time.perf_counter()
                # each task's own seconds come back with its result (``_exec.run_task``)
                outs = self._run_stage([(n, {**t, "timings": True}) for n, t in stage], nodes, reuse, att)
                # a stage's wall time (its tasks run at once, their results received here), and
                # its slowest task's own run on its node (the rest: waiting, Flight, the result's IPC)
                timings["fragments" if k == 0 else f"stage {k + 1}"] = time.perf_counter() - t0
                timings["slowest fragment run" if k == 0 else f"stage {k + 1} slowest run"] = max(
                    (_exec.fragment_timings(o).get("run", 0.0) for o in outs), default=0.0
                )
                if plan.shuffle and k == 0 and len(plan.stages) > 1:
                    # map outputs: bytes per bucket; bucket i goes to the (i mod n)-th of the n
                    # reducers (in rounds: sub-bucket i + n * m is reducer i's m-th)
                    reducers = [node for node, _ in plan.stages[1]]
                    for (mapper, _), out in zip(stage, outs, strict=True):
                        for i, b in zip(
                            out.column("bucket").to_pylist(), out.column("bytes").to_pylist(), strict=True
                        ):
                            if reducers[i % len(reducers)] != mapper:
                                plan.moved_bytes += b
        finally:
            if plan.shuffle:
                # not waited for: a node that stopped answering would hold the query to the
                # call's deadline (the buckets taken by the reducers are gone already; a drop
                # that fails leaves the rest on its node, as before)
                suspects = self.suspected()
                for n in sorted({node for stage in plan.stages for node, _ in stage}):
                    if n in nodes and n not in suspects:
                        try:
                            self._pool.submit(self._drop_shuffle, nodes[n], plan.qid)
                        except RuntimeError:  # (the core is closing: its nodes' buckets go with them)
                            break
        t0 = time.perf_counter()
        out = finish(plan.final, outs)
        plan.timings = {**plan.timings, **timings, "merge": time.perf_counter() - t0}
        return out

    def _drop_shuffle(self, node: NodeInfo, qid: str) -> None:
        try:
            self.transport.action(node, "shuffle_drop", {"qid": qid})
        except Exception:  # noqa: BLE001, S110 - a failed drop leaves the query's buckets on the node
            pass

    # ------------------------------------------------------------------ recovery
    def recover(
        self, max_tasks: int | None = None, rate_bytes: float | None = None, relax_domains: bool = False
    ) -> dict[str, Any]:
        """Rebuild lost extents onto live nodes, one at a time, throttled to ``rate_bytes``/s of
        reads so queries keep running; progress is kept in etcd. Returns the summary. With
        ``relax_domains`` (an operator's choice, see ``plan_recovery``) extents no unused fault
        domain can take are rebuilt on a node holding no copy of their rows."""
        if not self._recovery_lock.acquire(blocking=False):
            return self.catalog.recovery()
        try:
            return self._recover(
                max_tasks, self.recovery_rate_bytes if rate_bytes is None else rate_bytes, relax_domains
            )
        finally:
            self._recovery_lock.release()

    def lost_count(self) -> int:
        live = {n.name for n in self.transport.live_nodes()}
        return sum(1 for t in self.tables() for e in t.extents() if e.node not in live or e.state != "ok")

    def _recover(self, max_tasks: int | None, rate: float, relax_domains: bool = False) -> dict[str, Any]:
        live = self.live_nodes()
        tables = self.tables()
        plan = plan_recovery(tables, live, self.domains(), relax_domains=relax_domains)
        by_name = {n.name: n for n in live}
        tinfo = {t.name: t for t in tables}
        tasks = plan.tasks[:max_tasks] if max_tasks else plan.tasks
        if not tasks and not plan.stuck:
            return self.catalog.recovery()  # nothing lost: keep the last recovery's summary
        progress: dict[str, Any] = {
            "state": "running" if tasks else ("stuck" if plan.stuck else "idle"),
            "lost_extents": len(plan.tasks) + len(plan.stuck),
            "rebuilt": 0,
            "bytes_lost": sum(t.bytes_lost for t in tasks),
            "bytes_read": 0,
            "full_scan_bytes": sum(t.full_scan_bytes(tinfo[t.table]) for t in tasks),
            "started": time.time(),
            "seconds": 0.0,
            "stuck": plan.stuck,
            "advice": plan.advice,
            "targets": dict(Counter(t.target for t in tasks)),
            "relaxed": [f"{t.table}/{t.lost.id}" for t in tasks if t.relaxed],
            "errors": [],
        }
        self.catalog.put_recovery(progress)
        t0 = time.perf_counter()
        for task in tasks:
            try:
                replaced, res = self._rewrite_extent(
                    tinfo[task.table],
                    task.super_extent,
                    task.lost,
                    by_name[task.target],
                    task.sources,
                    task.in_place,
                )
            except Exception as exc:  # noqa: BLE001 - recorded; the next pass retries
                progress["errors"].append(f"{task.table}/{task.lost.id}: {exc}")
                continue
            if replaced:
                progress["rebuilt"] += 1
            progress["bytes_read"] += res["bytes_read"]
            elapsed = time.perf_counter() - t0
            progress["seconds"] = elapsed
            self.catalog.put_recovery(progress)
            if rate and rate > 0:
                # Throttle: never read faster than `rate` bytes/s on average, so queries keep their share.
                ahead = progress["bytes_read"] / rate - elapsed
                if ahead > 0:
                    time.sleep(ahead)
        progress["seconds"] = time.perf_counter() - t0
        progress["state"] = "stuck" if plan.stuck else ("done" if not progress["errors"] else "partial")
        progress["bytes_read_per_byte_lost"] = (
            progress["bytes_read"] / progress["bytes_lost"] if progress["bytes_lost"] else None
        )
        self.catalog.put_recovery(progress)
        return progress

    def _rewrite_extent(
        self,
        info: TableInfo,
        sid: int,
        old: ExtentMeta,
        target: NodeInfo,
        sources: list[dict[str, Any]],
        in_place: bool,
    ) -> tuple[bool, dict[str, Any]]:
        """Write a new copy of extent ``old`` on ``target`` from ``sources`` (buckets of another
        replica, for a rebuild; the extent itself, for a recode) with its replica's codec as the
        catalog has it now, then switch the catalog to it (compare-and-swap on the super-extent
        record) and delete the old file when it sits on a live node (``in_place``). The old
        extent stays referenced until the new one is durable and the switch committed: a failure
        at any point leaves the table as it was (the new file an orphan, collected later).
        Returns (switched, the node's answer)."""
        new_id = new_extent_id(sid, old.replica, old.partition)
        req = {
            "table": info.name,
            "extent": old.id,
            "new_extent": new_id,
            "replica": old.replica,
            "partition": old.partition,
            "rows": old.rows,
            "specs": [s.to_json() for s in info.specs],
            "sources": sources,
            "codec": info.codecs[old.replica],  # a rewritten extent has its replica's codec
            "sort": bool(old.sorted),  # and its own layout: sorted within sub-buckets, or not
        }
        res = self.transport.action(target, "rebuild", req)
        meta = ExtentMeta(
            new_id,
            sid,
            old.replica,
            old.partition,
            target.name,
            res["rows"],
            data_bytes(res),
            res["checksum"],
            res["buckets"],
            file_bytes=res["bytes"],
            codec=res.get("codec", ""),
            sorted=str(res.get("sorted", "")),  # a node before session 38 wrote it unsorted
        )
        if self.catalog.replace_extent(info.name, sid, old.id, meta):
            if in_place:
                try:
                    self.transport.action(target, "delete", {"table": info.name, "extent": old.id})
                except Exception:  # noqa: BLE001, S110 - an orphan then, collected later
                    pass
            return True, res
        try:
            self.transport.action(target, "delete", {"table": info.name, "extent": new_id})
        except Exception:  # noqa: BLE001, S110 - an orphan then, collected later
            pass
        return False, res

    # ------------------------------------------------------------------ recode
    def recode(self, name: str, replica: int, codec: str, background: bool = True) -> dict[str, Any]:
        """Change replica ``replica`` of table ``name`` to ``codec``: recorded in the catalog at
        once (appends and rebuilds write it from then on), then each of the replica's extents
        not yet in it is rewritten on its node from its own rows (``_rewrite_extent``, recovery's
        rebuild) and switched in the catalog. In the background unless ``background`` is False;
        returns the progress record (``recode_progress``). Extents on dead nodes are left to
        recovery, which rebuilds them in the new codec; a failed extent is reported and
        rewritten by running the recode again."""
        check_name(name, "table name")
        if codec not in CODECS:
            raise InvalidArgument(f"unknown extent codec {short(codec)}: one of {', '.join(CODECS)}")
        if not self._recode_lock.acquire(blocking=False):
            raise FailedPrecondition(
                "another recode is running (one at a time): wait for it (microco store recode TABLE R)"
            )
        try:
            self.catalog.set_replica_codec(name, replica, codec)
            progress = {
                "state": "running",
                "table": name,
                "replica": replica,
                "codec": codec,
                "extents": 0,
                "recoded": 0,
                "bytes_before": 0,
                "bytes_after": 0,
                "started": time.time(),
                "seconds": 0.0,
                "errors": [],
            }
            self.kv.put_json(RECODE + name, progress)
        except BaseException:
            self._recode_lock.release()
            raise
        if not background:
            return self._recode(name, replica, codec, progress)
        self._pool.submit(self._recode, name, replica, codec, progress)
        return progress

    def recode_progress(self, name: str) -> dict[str, Any]:
        """The progress record of ``name``'s last recode (``idle``: none). A record left
        ``running`` while no recode runs here (its coordinator died or lost the lead) reads as
        ``interrupted``: the extents rewritten so far are switched, the rest are not; running
        the recode again finishes it."""
        got: dict[str, Any] | None = self.kv.get_json(RECODE + name)
        if got and got.get("state") == "running" and not self._recode_lock.locked():
            got["state"] = "interrupted"
        return got or {"state": "idle", "table": name}

    def _recode(self, name: str, replica: int, codec: str, progress: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            info = self.catalog.table(name)
            live = {n.name: n for n in self.live_nodes()}
            todo = [
                (s.id, e) for s in info.super_extents for e in s.replica(replica) if e.written_codec != codec
            ]
            progress["extents"] = len(todo)
            self.kv.put_json(RECODE + name, progress)
            done = 0
            for sid, e in todo:
                node = live.get(e.node)
                if node is None or e.state != "ok":
                    progress["errors"].append(f"{name}/{e.id}: on a dead node or corrupt: left to recovery")
                    continue
                src = {
                    "table": name,
                    "extent": e.id,
                    "node": e.node,
                    "address": node.address,
                    "bucket": None,
                    "bytes": e.bytes,
                    "checksum": e.checksum,
                }
                try:
                    replaced, res = self._rewrite_extent(info, sid, e, node, [src], in_place=True)
                except Exception as exc:  # noqa: BLE001 - reported; running the recode again retries
                    progress["errors"].append(f"{name}/{e.id}: {exc}")
                    continue
                if not replaced:
                    progress["errors"].append(f"{name}/{e.id}: changed meanwhile (rebuilt or dropped)")
                    continue
                progress["recoded"] += 1
                progress["bytes_before"] += e.stored_bytes
                progress["bytes_after"] += int(res["bytes"])
                done += e.bytes
                progress["seconds"] = time.perf_counter() - t0
                self.kv.put_json(RECODE + name, progress)
                rate = self.recovery_rate_bytes
                if rate and rate > 0:  # as recovery: queries keep their share of the disks
                    ahead = done / rate - (time.perf_counter() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            progress["state"] = "done" if not progress["errors"] else "partial"
        except Exception as exc:  # reported in the progress record
            log.exception("recode of %s failed", name)
            progress["state"] = "failed"
            progress["errors"].append(str(exc))
        finally:
            progress["seconds"] = time.perf_counter() - t0
            self.kv.put_json(RECODE + name, progress)
            self._recode_lock.release()
        return progress

    def collect_garbage(self, min_age_s: float | None = None) -> dict[str, Any]:
        """Delete, on every live node, extent files the catalog does not reference there (orphans
        of failed appends or rebuilds, or of a node that came back after its extents were rebuilt
        elsewhere) once older than ``min_age_s`` (so an append or rebuild still in flight keeps
        its uncommitted extents). Returns ``{"deleted": [...], "bytes": n, "errors": [...]}``."""
        min_age_s = self.gc_min_age_s if min_age_s is None else min_age_s
        self.catalog.expire_append_tokens()
        keep: dict[str, dict[str, list[str]]] = {}
        for t in self.tables():
            for e in t.extents():
                keep.setdefault(e.node, {}).setdefault(t.name, []).append(e.id)
        out: dict[str, Any] = {"deleted": [], "bytes": 0, "errors": []}
        for n in self.transport.live_nodes():
            try:
                res = self.transport.action(
                    n, "collect_garbage", {"keep": keep.get(n.name, {}), "min_age_s": min_age_s}
                )
            except Exception as exc:  # noqa: BLE001 - that node keeps its orphans until the next pass
                out["errors"].append(f"{n.name}: {exc}")
                continue
            out["deleted"] += [f"{n.name}:{d}" for d in res.get("deleted", [])]
            out["bytes"] += res.get("bytes", 0)
        return out

    def scrub(self, rate_bytes: float = 0.0) -> list[str]:
        """Re-hash every extent on its node (ignoring any cached verification: bit rot keeps the
        mtime and size) and mark corrupt ones for rebuild; ``rate_bytes`` > 0 throttles the reads
        to that many bytes/s on average, so a scheduled scrub leaves the disks to queries."""
        live = {n.name: n for n in self.live_nodes()}
        bad = []
        done = 0
        t0 = time.perf_counter()
        for t in self.tables():
            for s in t.super_extents:
                for e in s.extents:
                    if e.node not in live or e.state != "ok":
                        continue
                    res = self.transport.action(
                        live[e.node],
                        "verify",
                        {"table": t.name, "extent": e.id, "checksum": e.checksum, "force": True},
                    )
                    if not res.get("ok"):
                        self.catalog.mark_extent(t.name, s.id, e.id, "corrupt")
                        bad.append(f"{t.name}/{e.id}")
                        log.warning(
                            "scrub: extent %s/%s on %s is corrupt: %s", t.name, e.id, e.node, res.get("error")
                        )
                    done += e.stored_bytes
                    if rate_bytes > 0:
                        ahead = done / rate_bytes - (time.perf_counter() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
        return bad


def finish(final: dict[str, Any], outs: Sequence[pa.Table]) -> pa.Table:
    """The coordinator's merge of the last stage's outputs."""
    t = _exec.without_timings(_exec.concat(list(outs)))
    if final["kind"] == "agg":
        keys = final["keys"]
        aggs = [Agg(*a) for a in final["aggs"]]
        if final.get("combine"):
            t = _exec.combine_partials(t, keys, aggs)
        t = _exec.finalize_agg(t, keys, aggs, final.get("int_sums"))
    else:
        t = t.select(final["select"])
    return _exec.order_limit(t, [tuple(o) for o in final.get("order_by", [])], final.get("limit"))


# ---------------------------------------------------------------------- in-process transport
class LocalTransport:
    """Node stores in this process, each with its own data directory: the whole store without
    sockets, for unit tests and the simulator."""

    def __init__(self, root: str, nodes: Sequence[NodeInfo]) -> None:
        from pathlib import Path

        self.root = Path(root)
        self.infos = {n.name: n for n in nodes}
        self.dead: set[str] = set()
        self.stores = {n.name: NodeStore(n.name, self.root / n.name, fetch=self._fetch) for n in nodes}
        for n in nodes:
            self.infos[n.name] = NodeInfo(n.name, n.fault_domain, address=n.name)

    def _store(self, address: str) -> NodeStore:
        if address in self.dead:
            raise Unavailable(f"node {address} is down")
        return self.stores[address]

    def _fetch(self, address: str, req: dict[str, Any]) -> pa.Table:
        s = self._store(address)
        if req["op"] == "read":
            return s.read_request(req)
        return s.shuffle_take(req["qid"], req["tag"], req["bucket"])

    def kill(self, name: str) -> None:
        self.dead.add(name)

    def live_nodes(self) -> list[NodeInfo]:
        return [n for k, n in sorted(self.infos.items()) if k not in self.dead]

    def put_extent(
        self, node: NodeInfo, table: str, extent_id: str, rows: pa.Table, buckets: list, codec: str = ""
    ) -> dict:
        return self._store(node.name).put_extent(table, extent_id, rows, buckets, codec)

    def run_task(self, node: NodeInfo, task: dict[str, Any]) -> pa.Table:
        return self._store(node.name).run(task)

    def run_task_stream(
        self, node: NodeInfo, task: dict[str, Any]
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        reader = self._store(node.name).run_stream(task)
        return reader.schema, iter(reader)

    def action(
        self, node: NodeInfo, name: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        return node_action(self._store(node.name), name, body)

    def abandon(self, node: NodeInfo) -> None:
        """Nothing to give up: an in-process call has no connection to hang on."""


def node_action(store: NodeStore, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """The store node's actions (Flight DoAction), shared by both transports."""
    if name == "rebuild":
        return store.rebuild(body)
    if name == "delete":
        return {"deleted": store.delete(body["table"], body["extent"])}
    if name == "drop_table":
        store.drop_table(body["table"])
        return {}
    if name == "shuffle_drop":
        return {"dropped": store.shuffle_drop(body["qid"])}
    if name == "cancel":
        return store.cancel(body["tasks"])
    if name == "probe":
        return store.probe(body["tasks"])
    if name == "warm":
        return store.warm(body["reads"], body.get("tid"))
    if name == "verify":
        try:
            store.verify(body["table"], body["extent"], body["checksum"], force=bool(body.get("force", True)))
            return {"ok": True}
        except (CorruptExtent, NotFound) as exc:
            return {"ok": False, "error": str(exc)}
    if name == "stats":
        return store.stats()
    if name == "residency":
        return store.residency([str(t) for t in body.get("tables", [])])
    if name == "reads":
        with store._lock:
            return {"read_by_replica": {t: list(v) for t, v in store.read_by_replica.items()}}
    if name == "collect_garbage":
        return store.collect_garbage(body.get("keep", {}), float(body.get("min_age_s", 1800.0)))
    raise FailedPrecondition(f"unknown store node action {short(name)}")


def _append_failed(table: str, failed: set[str], last: Exception | None, more: str) -> MicrocoError:
    """The error of an append whose nodes kept failing: ``ResourceExhausted`` when the last
    failure was a node's full disk (the operator frees or adds room; retrying as is fails
    again), else ``Unavailable``; naming the nodes and the last failure."""
    kind = ResourceExhausted if isinstance(last, ResourceExhausted) else Unavailable
    text = f"append to {table!r} failed: store nodes {', '.join(sorted(failed))} failed ({last})"
    return kind(text + (f"; {more}" if more else ""))
