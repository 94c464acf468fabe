"""The query planner: picks the replica whose partitioning matches the query and cuts the query into
tasks for the store nodes. A pure function of (query, catalog, live nodes).

Plan kinds:

- ``scan``: filter/project (and top-k) on each node, concatenated by the coordinator.
- ``agg_global``: aggregates without group-by; partial per node, merged by the coordinator.
- ``agg_local``: group-by on the replica's partition column: every group lives in one partition,
  so each node aggregates its partitions completely and the coordinator only concatenates
  (shuffle-free).
- ``agg_shuffle``: group-by on another column: nodes pre-aggregate, hash-partition the partials
  by the group key and reducers pull their bucket from every node (a real exchange).
- ``agg_one_node``: group-by on another column whose rows read are all on one node (a filter
  pruned the replica to partitions of one node, or the replica lives on one node): that node
  aggregates them completely in one fragment and the coordinator only concatenates (an exchange
  among one node would be a second stage that moves nothing).
- ``join_copart``: both tables have a replica partitioned on the join key by the same function,
  so partition ``p`` joins only partition ``p``; one task per partition, on the node holding most
  of its bytes (node-local when the two tables' partitions are co-located).
- ``join_shuffle``: both sides hash-partitioned on the join key and exchanged.

Extents on dead nodes (or marked corrupt) are read in degraded mode: the partition's rows are
the matching bucket of every extent of another replica of the same super-extent, so the plan's
shape (and its shuffle-freedom) holds during recovery.
"""

from __future__ import annotations

import base64
import decimal
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from microco.common.errors import NotFound, Unavailable

from ._catalog import TableInfo
from ._layout import DEFAULT_COMPRESSION, ExtentMeta, others
from ._partition import partitions_for_predicate
from ._placement import REPLICAS
from ._query import Query
from ._residency import Residency


@dataclass
class Unit:
    """The rows of partition ``partition`` of super-extent ``super_extent`` under one replica."""

    super_extent: int
    partition: int
    sources: list[dict[str, Any]]
    degraded: bool = False

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.sources)


@dataclass
class Plan:
    kind: str
    qid: str
    stages: list[list[tuple[str, dict[str, Any]]]]  # each stage: (node, task) pairs
    final: dict[str, Any]
    explain: list[str] = field(default_factory=list)
    replicas: dict[str, int] = field(default_factory=dict)
    shuffle: bool = False
    # bytes the plan moves between nodes: whole co-partitioned extents read from a peer (known
    # when planning); the shuffle's exchanged buckets are added when it runs
    moved_bytes: int = 0
    cached: bool = False  # reused from the coordinator's plan cache (``StoreCore.plan``)
    nodes: dict[str, Any] = field(default_factory=dict, repr=False)  # what the run calls: name -> NodeInfo
    # seconds per phase of the last run (``StoreCore.query``): plan, fragments (the nodes' tasks,
    # their results received), the slowest fragment's own run, merge; EXPLAIN's ``timings:`` line
    timings: dict[str, float] = field(default_factory=dict)

    # the hedges of stragglers its run started (``StoreCore._with_retries``, ``_hedge``)
    hedges: list[dict[str, Any]] = field(default_factory=list)

    def explain_text(self) -> str:
        lines = self.explain + (
            ["plan cache: reused (same query, catalog version and live nodes)"] if self.cached else []
        )
        if self.timings:
            lines.append("timings: " + ", ".join(f"{k} {v:.4f} s" for k, v in self.timings.items()))
        return "\n".join(lines)

    def reused(self, qid: str, nodes: dict[str, Any]) -> Plan:
        """This (cached) plan for another run: its own query id in every task that names one (a
        shuffle's buckets are kept by it), its own task dicts, bytes moved as planned."""
        stages = [
            [(n, {**t, "qid": qid} if "qid" in t else dict(t)) for n, t in stage] for stage in self.stages
        ]
        return replace(
            self, qid=qid, stages=stages, explain=list(self.explain), cached=True, nodes=nodes, timings={}
        )


def _schema_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _available(e: ExtentMeta, live: set[str]) -> bool:
    return e.state == "ok" and e.node in live


def _source(
    t: TableInfo, e: ExtentMeta, addresses: dict[str, str], bucket: list[int] | None = None
) -> dict[str, Any]:
    size = e.bytes if bucket is None else e.bucket_bytes(others(e.replica)[bucket[0]], bucket[1])
    return {
        "table": t.name,
        "extent": e.id,
        "node": e.node,
        "address": addresses.get(e.node, ""),
        "bucket": bucket,
        "bytes": size,
        "checksum": e.checksum,
        # a whole extent's sub-buckets sorted on this column (a group-by on it aggregates runs)
        **({"sorted": e.sorted} if e.sorted and bucket is None else {}),
    }


def replica_units(
    t: TableInfo, r: int, live: set[str], addresses: dict[str, str], allowed: set[int] | None = None
) -> list[Unit]:
    """Every non-empty (super-extent, partition) unit of replica ``r``, each from its extent or,
    when that extent is unavailable, from the matching buckets of another replica."""
    units = []
    for s in t.super_extents:
        for e in s.replica(r):
            if allowed is not None and e.partition not in allowed:
                continue
            if _available(e, live):
                units.append(Unit(s.id, e.partition, [_source(t, e, addresses)]))
                continue
            sub = None
            for r2 in others(r):
                needed = [x for x in s.replica(r2) if x.bucket_rows(r, e.partition) > 0]
                if all(_available(x, live) for x in needed):
                    pos = others(r2).index(r)
                    sub = [_source(t, x, addresses, [pos, e.partition]) for x in needed]
                    break
            if sub is None:
                raise Unavailable(
                    f"table {t.name!r}: extent {e.id} (replica {r}, partition {e.partition}) and every "
                    "other copy of its rows are unavailable"
                )
            units.append(Unit(s.id, e.partition, sub, degraded=True))
    for u in units:
        for src in u.sources:
            # the unit a source serves (replica r's partition p), whichever extent holds its rows:
            # what lets a client split a read by partition (clients/store/spark.py)
            src["unit"] = [r, u.partition]
    return units


def pruned_partitions(
    t: TableInfo, r: int, where: Iterable[Sequence[Any]]
) -> tuple[set[int] | None, list[str]]:
    spec = t.specs[r]
    allowed: set[int] | None = None
    why = []
    for col, op, value in where:
        if col != spec.column:
            continue
        parts = partitions_for_predicate(spec, t.schema.field(col).type, op, value)
        if parts is None:
            continue
        allowed = parts if allowed is None else allowed & parts
        why.append(f"{col} {op} {value if isinstance(value, decimal.Decimal) else repr(value)}")
    return allowed, why


def _score(t: TableInfo, r: int, q_where: Sequence[Any], group_by: Sequence[str]) -> tuple[float, list[str]]:
    spec = t.specs[r]
    score = 0.0
    reasons = []
    if group_by and spec.column in group_by:
        score += 10
        reasons.append(f"group-by on {spec.column} matches its partitioning: shuffle-free aggregation")
    allowed, why = pruned_partitions(t, r, q_where)
    if allowed is not None:
        frac = 1 - len(allowed) / spec.count
        score += 5 * frac
        reasons.append(f"filter {' and '.join(why)} prunes to {len(allowed)} of {spec.count} partitions")
    return score, reasons


def _nodes_by_bytes(sources: Iterable[dict[str, Any]]) -> list[str]:
    by: dict[str, int] = defaultdict(int)
    for s in sources:
        by[s["node"]] += max(s["bytes"], 1)
    return sorted(by, key=lambda n: (-by[n], n))


def _whole_partitions(units: Iterable[Unit]) -> tuple[dict[str, list[dict[str, Any]]], list[int], int]:
    """The sources of an ``agg_local`` plan by node, each partition whole on one node: a partition
    whose rows lie on several nodes (degraded reads of a lost extent: the matching buckets of
    another replica's extents, on that replica's nodes; or super-extents placed on different
    nodes) goes to the node where the work ends soonest (the bytes it has already, then the
    partition's; more of the partition's bytes local, then the name, breaking ties), which
    reads the rest from its peers. So every group is aggregated once, on one node, and the
    coordinator only concatenates (no merge of partial aggregates of a million groups at one
    process). Returns (sources by node, the partitions read from several nodes, the bytes read
    from peers)."""
    by_part: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for u in units:
        by_part[u.partition].extend(u.sources)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    load: dict[str, int] = defaultdict(int)
    spread = {p for p, srcs in by_part.items() if len({s["node"] for s in srcs}) > 1}
    for p in sorted(set(by_part) - spread):
        node = by_part[p][0]["node"]
        groups[node] += by_part[p]
        load[node] += sum(s["bytes"] for s in by_part[p])
    moved = 0
    for p in sorted(spread, key=lambda p: (-sum(s["bytes"] for s in by_part[p]), p)):
        srcs = by_part[p]
        held: dict[str, int] = defaultdict(int)
        for s in srcs:
            held[s["node"]] += s["bytes"]
        node = min(held, key=lambda n: (load[n], -held[n], n))
        groups[node] += srcs
        total = sum(held.values())
        load[node] += total
        moved += total - held[node]
    return dict(sorted(groups.items())), sorted(spread), moved


def _group_sources(units: Iterable[Unit]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for u in units:
        for s in u.sources:
            out[s["node"]].append(s)
    return dict(sorted(out.items()))


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


# ------------------------------------------------------------------------------- stages
# plan_query = bind -> choose -> fragments. Parsing is Query.from_json (``_query``).


@dataclass
class Bound:
    """``bind``: a validated query resolved against the catalog, with the columns each side
    reads (filter columns included) and keeps (what flows downstream)."""

    q: Query
    a: TableInfo
    b: TableInfo | None
    keep_a: list[str]
    read_a: list[str]
    keep_b: list[str]
    read_b: list[str]
    out_cols: list[str]

    @property
    def is_agg(self) -> bool:
        return bool(self.q.aggs)


def bind(q: Query, tables: dict[str, TableInfo]) -> Bound:
    for name in [q.table] + ([q.join.table] if q.join else []):
        if name not in tables:
            raise NotFound(f"no table {name!r}")
    q.validate({n: t.schema for n, t in tables.items()})
    a = tables[q.table]
    b = tables[q.join.table] if q.join else None
    if q.aggs:
        needed = set(q.group_by) | {x.column for x in q.aggs if x.column != "*"}
        out_cols = list(q.group_by) + [x.name for x in q.aggs]
    else:
        left_cols = list(q.select) if q.select is not None else list(a.schema.names)
        right_cols: list[str] = []
        if q.join and b is not None:
            rc = list(q.join.select) if q.join.select is not None else list(b.schema.names)
            right_cols = [c for c in rc if c != q.join.right_on]
        out_cols = left_cols + right_cols
        needed = set(out_cols)

    def side(t: TableInfo, key: str | None, where: Sequence[Any]) -> tuple[list[str], list[str]]:
        keep = [c for c in t.schema.names if c in needed or c == key]
        read = [c for c in t.schema.names if c in keep or c in {w[0] for w in where}]
        return keep, read

    keep_a, read_a = side(a, q.join.left_on if q.join else None, q.where)
    keep_b, read_b = side(b, q.join.right_on, q.join.where) if q.join and b is not None else ([], [])
    return Bound(q, a, b, keep_a, read_a, keep_b, read_b, out_cols)


# A byte moved between nodes costs about this many bytes read from a local extent: it is read,
# serialised, sent, received and deserialised (loopback Flight ~1 GB/s against ~5 GB/s from the
# page cache; on a real network more). Only the ranking of plans depends on it.
MOVE_WEIGHT = 4.0


# CPU seconds a store node spends decoding one byte of an extent's Arrow data (the catalog's
# ``bytes``: what a read yields) per codec: every column of 64-batch extents of 1M synthetic rows
# (integers, floats, decimals, dates, strings; no benchmark's table), read as a node reads them
# (``open_extent(...).select``, one thread), process CPU, median of 7 interleaved rounds. Measured
# on this host with ``python -m microco.benchmarks.store_codecs`` (2026-12-03 06:29 UTC, load
# average 3.2; docs/store.md, "Codecs per replica"). Re-run it on other hardware and put its
# ``cpu_s_per_byte`` here. Not the disk: an uncompressed extent's bytes are mapped, not decoded.
DECODE_S_PER_BYTE = {"zstd": 1.31e-9, "lz4": 0.60e-9, "none": 0.036e-9}
# The cost unit of ``Cost.total`` is a byte read from an extent of the default codec: its
# decoding is most of a read's time (docs/store.md, "Reading extents at scale factor 10"). A
# byte of another codec costs its decode time in those units (lz4: about half a unit).
UNITS_PER_DECODE_S = 1 / DECODE_S_PER_BYTE[DEFAULT_COMPRESSION]


# Seconds a store node waits per byte of an extent file read from disk (not in the page cache):
# a column subset of column-major extents read as a node reads it (``posix_fadvise`` WILLNEED,
# then the map's pages), cold after evicting the file, less the same read warm, per byte read
# from disk; medians of 5 rounds, zstd and lz4 interleaved. Measured on this host with
# ``python -m microco.benchmarks.store_codecs --disk --rows 4000000 --rounds 5`` (2026-12-04
# 04:46-04:48 UTC: 4.2e-9 (zstd) and 6.4e-9 (lz4) at load average 5-7; 8.8e-9 and 14.6e-9 at
# load 10; docs/store.md, "Replicas in memory"); re-run it on other hardware. Counted with
# decoding in one unit (``Cost.total``): a read whose bytes are on disk waits for them beyond its
# decoding (the measurement is that difference). It ranks replicas that decode alike
# (``resident_pick``); it does not trade decoding for disk across codecs: measured with one reader
# on an idle CPU, it overweighed the disk for six nodes reading at once on two busy cores.
DISK_S_PER_BYTE = 5.0e-9


@dataclass(frozen=True)
class Cost:
    """A plan's estimated work: rows and bytes read from extents (after pruning, needed columns
    only), bytes moved between nodes, and the CPU seconds decoding what is read at the codecs
    of the extents read (``decode_s``; None: not estimated, a read counts its bytes). With the
    nodes' residency (``_residency``): ``disk_bytes`` of the files read from disk (not in the page
    cache) and their seconds (``disk_s``, ``DISK_S_PER_BYTE``), decoding only the columns not held
    decoded in the nodes' extent caches, and ``in_memory`` the share of the files' bytes read
    that is in the page cache (None: residency not known)."""

    rows: int
    bytes_read: int
    bytes_moved: int
    decode_s: float | None = None
    codecs: str = ""  # the codecs read, for EXPLAIN
    disk_bytes: float = 0.0
    disk_s: float = 0.0
    in_memory: float | None = None
    # with residency: CPU seconds decoding what the extent caches do not hold (else ``decode_s``)
    todo_s: float | None = None

    @property
    def read_units(self) -> float:
        return self.bytes_read if self.decode_s is None else self.decode_s * UNITS_PER_DECODE_S

    @property
    def base(self) -> float:
        """The cost without residency: what decides between plans of different shapes (a matched
        replica against a shuffle, pruning), as it did before residency was known."""
        return self.read_units + MOVE_WEIGHT * self.bytes_moved

    @property
    def read_s(self) -> float:
        """Seconds reading: decoding what is not held decoded, and the disk."""
        return (self.decode_s or 0.0) if self.todo_s is None else self.todo_s + self.disk_s

    @property
    def total(self) -> float:
        if self.todo_s is None or self.decode_s is None:
            return self.base
        return self.read_s * UNITS_PER_DECODE_S + MOVE_WEIGHT * self.bytes_moved

    def describe(self) -> str:
        decode = "" if self.decode_s is None else f", ~{self.decode_s:.3g} CPU s decoding ({self.codecs})"
        disk = (
            ""
            if self.in_memory is None
            else f" (~{self.todo_s or 0.0:.3g} s of it not held decoded), {self.in_memory:.0%} in memory, "
            f"{_mb(round(self.disk_bytes))} from disk ~{self.disk_s:.3g} s"
        )
        return f"~{self.rows} rows, {_mb(self.bytes_read)} read{decode}{disk}, {_mb(self.bytes_moved)} moved"

    def plus(self, other: Cost, moved: int) -> Cost:
        """Two sides read together, ``moved`` bytes moved."""
        decode = None if self.decode_s is None or other.decode_s is None else self.decode_s + other.decode_s
        codecs = "; ".join(x for x in (self.codecs, other.codecs) if x)
        mem = self.in_memory if other.in_memory is None else other.in_memory
        if self.in_memory is not None and other.in_memory is not None:
            mem = min(self.in_memory, other.in_memory)
        todo = None
        if self.todo_s is not None or other.todo_s is not None:
            todo = (self.todo_s if self.todo_s is not None else self.decode_s or 0.0) + (
                other.todo_s if other.todo_s is not None else other.decode_s or 0.0
            )
        return Cost(
            self.rows + other.rows,
            self.bytes_read + other.bytes_read,
            moved,
            decode,
            codecs,
            self.disk_bytes + other.disk_bytes,
            self.disk_s + other.disk_s,
            mem,
            todo,
        )


def column_share(t: TableInfo, cols: Sequence[str]) -> float:
    """The share of a table's bytes in ``cols``, from the column types (fixed-width types by
    their width, strings and others as 16 bytes a value): extents hold whole rows, a fragment
    reads only its columns."""

    def width(f: pa.Field) -> float:
        try:
            return max(f.type.bit_width / 8, 1.0)
        except ValueError:
            return 16.0

    total = sum(width(f) for f in t.schema) or 1.0
    return min(1.0, sum(width(t.schema.field(c)) for c in set(cols)) / total)


@dataclass
class Choice:
    """``choose``: the plan kind and replicas, with the cost that decided and the alternatives."""

    kind: str
    replicas: dict[str, int]
    cost: Cost
    reasons: list[str] = field(default_factory=list)
    alternatives: list[tuple[str, dict[str, int], Cost]] = field(default_factory=list)
    # the units each table reads under this choice (after pruning)
    units: dict[str, list[Unit]] = field(default_factory=dict)
    allowed: dict[str, set[int] | None] = field(default_factory=dict)


def _read_cost(t: TableInfo, units: Sequence[Unit], cols: Sequence[str]) -> tuple[int, int]:
    """(rows, bytes) a side reads: its units' bytes times the share of its columns."""
    nbytes = sum(u.bytes for u in units)
    replica_bytes = t.bytes / REPLICAS
    rows = round(t.rows * min(nbytes / replica_bytes, 1.0)) if replica_bytes else 0
    return rows, round(nbytes * column_share(t, cols))


def extent_codec(t: TableInfo, e: ExtentMeta) -> str:
    """The codec a read of ``e`` decodes: its file's as written (records carry it), else its
    replica's in the catalog (the default, zstd, when unset)."""
    return e.codec or t.codec(e.replica)


@dataclass(frozen=True)
class ReadEstimate:
    """What reading a side costs its nodes: CPU seconds decoding, and with residency known the
    file bytes read from disk, their seconds, and the share of the files' bytes read in memory."""

    decode_s: float  # decoding all of it (as without residency)
    codecs: str
    disk_bytes: float = 0.0
    disk_s: float = 0.0
    in_memory: float | None = None
    todo_s: float | None = None  # decoding what the nodes' extent caches do not hold

    @property
    def seconds(self) -> float:
        return (self.decode_s if self.todo_s is None else self.todo_s) + self.disk_s


def read_estimate(
    t: TableInfo, units: Sequence[Unit], cols: Sequence[str], resident: Residency | None = None
) -> ReadEstimate:
    """Decoding what a side reads (each source's bytes of ``cols`` at its extent's codec rate,
    ``DECODE_S_PER_BYTE``) and, with the nodes' ``resident`` answer, reading it from disk: a
    column held decoded in its node's extent cache costs neither; of the others, the file bytes
    not in the page cache cost ``DISK_S_PER_BYTE`` each (a column-major extent's columns' ranges;
    a batch-major one's whole file; a bucket read, degraded, reads its columns whole). An extent
    its node did not report (no answer in time, or written since) costs its decoding only, as
    without residency."""
    shares = {c: column_share(t, [c]) for c in dict.fromkeys(cols)}
    share = column_share(t, cols)
    meta = {e.id: e for e in t.extents()}
    by_codec: dict[str, float] = defaultdict(float)
    todo_s = disk = 0.0
    # a node's extent cache helps a read only if the read's decoded bytes there fit in it: a
    # larger one evicts, least recently used first, what it would find there before it gets to it
    fits: dict[str, bool] = {}
    if resident is not None and resident.cache_bytes:
        on_node: dict[str, float] = defaultdict(float)
        for u in units:
            for src in u.sources:
                on_node[src["node"]] += src["bytes"] * share
        fits = {n: b <= resident.cache_bytes.get(n, 0) for n, b in on_node.items()}
    file_total = file_mem = 0.0
    known = False
    for u in units:
        for src in u.sources:
            e = meta.get(src["extent"])
            codec = extent_codec(t, e) if e is not None else t.codec(0)
            by_codec[codec] += src["bytes"] * share
            whole = src["bytes"] * share * DECODE_S_PER_BYTE[codec]
            r = resident.get(src["extent"]) if resident is not None else None
            if r is None:
                todo_s += whole
                continue
            known = True
            if not fits.get(src["node"], True):
                r = replace(r, decoded={})
            todo = sum(n * (1 - r.decoded.get(c, 0.0)) for c, n in shares.items())
            todo_s += src["bytes"] * todo * DECODE_S_PER_BYTE[codec]
            d = r.disk_bytes(list(shares))
            disk += d
            if r.columns is None:
                size = float(r.size)
            else:
                size = float(sum(r.columns.get(c, (0, 0))[0] for c in shares))
            file_total += size
            file_mem += size * r.file_share(list(shares))
    # summed per codec, as before residency (the same floats: equal replicas tie as they did)
    seconds = sum(n * DECODE_S_PER_BYTE[c] for c, n in by_codec.items())
    codecs = "/".join(sorted(by_codec)) or t.codec(0)
    if not known:
        return ReadEstimate(seconds, codecs)
    mem = file_mem / file_total if file_total else 1.0
    return ReadEstimate(seconds, codecs, disk, disk * DISK_S_PER_BYTE, mem, todo_s)


def decode_estimate(t: TableInfo, units: Sequence[Unit], cols: Sequence[str]) -> tuple[float, str]:
    """CPU seconds decoding what a side reads (each source's bytes of ``cols`` at its extent's
    codec rate, ``DECODE_S_PER_BYTE``), and the codecs read (for EXPLAIN)."""
    est = read_estimate(t, units, cols)
    return est.decode_s, est.codecs


def side_cost(
    t: TableInfo,
    units: Sequence[Unit],
    cols: Sequence[str],
    moved: int = 0,
    resident: Residency | None = None,
) -> Cost:
    """The cost of reading ``units`` of ``t`` (columns ``cols``), decoding included, and the disk
    with the nodes' ``resident`` answer."""
    rows, nbytes = _read_cost(t, units, cols)
    est = read_estimate(t, units, cols, resident)
    return Cost(
        rows,
        nbytes,
        moved,
        est.decode_s,
        f"{t.name} {est.codecs}",
        est.disk_bytes,
        est.disk_s,
        est.in_memory,
        est.todo_s,
    )


def cheapest_replica(
    t: TableInfo,
    where: Sequence[Any],
    cols: Sequence[str],
    live: set[str],
    addresses: dict[str, str],
    resident: Residency | None = None,
) -> tuple[int, Cost, list[Unit], set[int] | None]:
    """The replica cheapest to read ``cols`` of after pruning by ``where`` (its bytes, decoded at
    its codec's rate, and moved; ties: the lower replica), for plans that move what they read
    whatever the replica (SQL's gathered and broadcast tables): ``(replica, cost, units, allowed
    partitions)``. A replica that reads more bytes wins only if its decoding saves more than
    moving those bytes costs (``Cost.total``; with the nodes' ``resident`` answer, the disk too).
    A replica that cannot be read at all (not even degraded) is skipped; if none can, its error
    is raised."""
    options = []
    last: Exception | None = None
    for r in range(REPLICAS):
        allowed, _ = pruned_partitions(t, r, where)
        try:
            units = replica_units(t, r, live, addresses, allowed)
        except Unavailable as exc:
            last = exc
            continue
        c = side_cost(t, units, cols, resident=resident)
        options.append((r, replace(c, bytes_moved=c.bytes_read), units, allowed))
    if not options:
        raise last or Unavailable(f"table {t.name!r} cannot be read")
    return options[resident_pick([o[1] for o in options])]


def resident_pick(costs: Sequence[Cost]) -> int:
    """Which of ``costs`` (one per replica, in replica order) to read: the cheapest without
    residency (``Cost.base``; the first of equals), unless another of the same decoding cost
    (``Cost.base`` within ``COST_TIE``: replicas of one codec) reads for less once what is in
    memory is counted (``Cost.total``) by more than ``COST_TIE``. Residency does not trade
    decoding for disk across codecs: measured at scale factor 10, a zstd replica in memory chosen
    over an lz4 one on disk was slower (docs/store.md, "Replicas in memory")."""
    first = min(range(len(costs)), key=lambda i: (costs[i].base, i))
    b = costs[first]
    near = [i for i, c in enumerate(costs) if c.base <= b.base * (1 + COST_TIE)]
    low = min(near, key=lambda i: (costs[i].total, i))
    return first if b.total <= costs[low].total * (1 + COST_TIE) else low


def _single_kind(bound: Bound, r: int) -> str:
    q = bound.q
    if not q.aggs:
        return "scan"
    if not q.group_by:
        return "agg_global"
    return "agg_local" if bound.a.specs[r].column in q.group_by else "agg_shuffle"


# Estimates this close are a tie: the rows and bytes of replicas of one table differ by how their
# extents happened to split, not by the work a plan does.
COST_TIE = 0.02


def _cheapest(cands: list[Choice], order: Callable[[Choice], Any]) -> Choice:
    """The cheapest candidate without the disk (``Cost.base``: the plans' shapes decide, a
    matched replica stays matched); among those within ``COST_TIE`` of it, one without a shuffle
    (and spread over nodes: ``_tie_rank``), then the lower replica numbers (``order``). Then, among the candidates of the same plan as
    that one (its kind, its pruning: replicas the query does not tell apart), the cheapest with
    the disk (``Cost.total``: the nodes' residency), unless within ``COST_TIE`` of it."""
    floor = min(c.cost.base for c in cands)
    near = [c for c in cands if c.cost.base <= floor * (1 + COST_TIE)]
    best = min(near, key=lambda c: (_tie_rank(c.kind), c.cost.base, order(c)))
    same = [
        c
        for c in cands
        if c.kind == best.kind
        and c.reasons == best.reasons
        and c.cost.base <= best.cost.base * (1 + COST_TIE)
    ]
    if best.cost.in_memory is None or len(same) < 2:
        return best
    low = min(same, key=lambda c: (c.cost.total, order(c)))
    if best.cost.total <= low.cost.total * (1 + COST_TIE):
        low = best
    if all(c.cost.total <= low.cost.total * (1 + COST_TIE) for c in same):
        return low  # residency tells them apart by no more than a tie
    others = ", ".join(
        f"{_replica_text(c.replicas)} ~{_read_s(c.cost):.3g} s ({c.cost.in_memory:.0%} in memory)"
        for c in same
        if c is not low
    )
    low.reasons.append(
        f"reading it ~{_read_s(low.cost):.3g} s ({low.cost.in_memory:.0%} of its files' bytes in memory, "
        f"{_mb(round(low.cost.disk_bytes))} from disk) against {others}: the same plan on each, "
        "the one cheapest to read"
    )
    return low


def _tie_rank(kind: str) -> int:
    """Among plans whose costs tie: one without a shuffle first, and of those one whose work is
    spread over the replica's nodes (a matched ``agg_local``) before one on a single node."""
    return 2 if kind.endswith("shuffle") else 1 if kind == "agg_one_node" else 0


def _read_s(c: Cost) -> float:
    return c.read_s


def _replica_text(replicas: dict[str, int]) -> str:
    return ", ".join(f"{t} replica {r}" for t, r in replicas.items())


def choose(
    bound: Bound, live: set[str], addresses: dict[str, str], resident: Residency | None = None
) -> Choice:
    """Every candidate plan (replica, or replica pair and join strategy) with its estimated cost;
    the cheapest wins (ties: no shuffle, then the lower replica number; ``_cheapest``, where the
    nodes' ``resident`` answer decides among replicas planned alike)."""
    q, a, b = bound.q, bound.a, bound.b
    if q.join is not None and b is not None:
        return _choose_join(bound, live, addresses, resident)
    options = [q.replica] if q.replica is not None else list(range(REPLICAS))
    cands = []
    for r in options:
        allowed, why = pruned_partitions(a, r, q.where)
        units = replica_units(a, r, live, addresses, allowed)
        read = side_cost(a, units, bound.read_a, resident=resident)
        kind = _single_kind(bound, r)
        if kind == "agg_shuffle" and len(_group_sources(units)) <= 1:
            kind = "agg_one_node"
        moved = 0
        if kind == "agg_shuffle":
            # upper bound: every row's group keys and aggregate inputs cross to another node
            # (pre-aggregation only shrinks it); (n-1)/n of them leave their node
            n = max(len(_group_sources(units)), 1)
            moved = round(sum(u.bytes for u in units) * column_share(a, bound.keep_a)) * (n - 1) // n
        reasons = []
        if kind == "agg_local":
            reasons.append(
                f"group-by on {a.specs[r].column} matches its partitioning: shuffle-free aggregation"
            )
        if allowed is not None:
            reasons.append(
                f"filter {' and '.join(why)} prunes to {len(allowed)} of {a.specs[r].count} partitions"
            )
        cands.append(
            Choice(
                kind,
                {a.name: r},
                replace(read, bytes_moved=moved),
                reasons,
                units={a.name: units},
                allowed={a.name: allowed},
            )
        )
    best = _cheapest(cands, lambda c: c.replicas[a.name])
    best.alternatives = [(c.kind, c.replicas, c.cost) for c in cands if c is not best]
    if q.replica is not None:
        best.reasons.insert(0, "replica forced by the query")
    return best


def _choose_join(
    bound: Bound, live: set[str], addresses: dict[str, str], resident: Residency | None = None
) -> Choice:
    q, a, b = bound.q, bound.a, bound.b
    assert q.join is not None and b is not None
    ra_opts = [q.replica] if q.replica is not None else list(range(REPLICAS))
    rb_opts = [q.join.replica] if q.join.replica is not None else list(range(REPLICAS))
    share_a, share_b = column_share(a, bound.read_a), column_share(b, bound.read_b)
    cands: list[Choice] = []
    for ra in ra_opts:
        for rb in rb_opts:
            sa, sb = a.specs[ra], b.specs[rb]
            if not (sa.column == q.join.left_on and sb.column == q.join.right_on and sa.same_function(sb)):
                continue
            allowed_a, _ = pruned_partitions(a, ra, q.where)
            allowed_b, _ = pruned_partitions(b, rb, q.join.where)
            allowed = (
                allowed_a
                if allowed_b is None
                else (allowed_b if allowed_a is None else allowed_a & allowed_b)
            )
            ua = replica_units(a, ra, live, addresses, allowed)
            ub = replica_units(b, rb, live, addresses, allowed)
            moved = sum(
                round(src["bytes"] * (share_a if src["table"] == a.name else share_b))
                for _p, srcs, node in _copart_tasks(ua, ub)
                for src in srcs
                if src["node"] != node
            )
            cands.append(
                Choice(
                    "join_copart",
                    {a.name: ra, b.name: rb},
                    side_cost(a, ua, bound.read_a, resident=resident).plus(
                        side_cost(b, ub, bound.read_b, resident=resident), moved
                    ),
                    units={a.name: ua, b.name: ub},
                    allowed={a.name: allowed, b.name: allowed},
                )
            )

    # the shuffle join on the replicas that read least
    def cheapest(
        t: TableInfo, opts: list[int], where: Sequence[Any], cols: list[str]
    ) -> tuple[int, Any, Any, Cost]:
        options = []
        for r in opts:
            allowed, _ = pruned_partitions(t, r, where)
            units = replica_units(t, r, live, addresses, allowed)
            options.append((r, units, allowed, side_cost(t, units, cols, resident=resident)))
        return options[resident_pick([o[3] for o in options])]

    ra, ua, al_a, cost_a = cheapest(a, ra_opts, q.where, bound.read_a)
    rb, ub, al_b, cost_b = cheapest(b, rb_opts, q.join.where, bound.read_b)
    n = max(len(set(_group_sources(ua)) | set(_group_sources(ub))), 1)
    keep_bytes = sum(u.bytes for u in ua) * column_share(a, bound.keep_a) + sum(
        u.bytes for u in ub
    ) * column_share(b, bound.keep_b)
    cands.append(
        Choice(
            "join_shuffle",
            {a.name: ra, b.name: rb},
            cost_a.plus(cost_b, round(keep_bytes * (n - 1) / n)),
            units={a.name: ua, b.name: ub},
            allowed={a.name: al_a, b.name: al_b},
        )
    )
    best = _cheapest(cands, lambda c: tuple(c.replicas.values()))
    best.alternatives = [(c.kind, c.replicas, c.cost) for c in cands if c is not best]
    return best


def _copart_tasks(ua: Sequence[Unit], ub: Sequence[Unit]) -> list[tuple[int, list[dict[str, Any]], str]]:
    """Per partition present on both sides: (partition, its sources, the node holding most of its bytes)."""
    by_a: dict[int, list[dict[str, Any]]] = defaultdict(list)
    by_b: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for u in ua:
        by_a[u.partition].extend(u.sources)
    for u in ub:
        by_b[u.partition].extend(u.sources)
    out = []
    for p in sorted(set(by_a) & set(by_b)):
        srcs = by_a[p] + by_b[p]
        out.append((p, srcs, _nodes_by_bytes(srcs)[0]))
    return out


# The bytes of a shuffle join's build side (the columns it keeps) one reducer holds at once: a
# reducer whose share is larger takes it in rounds, a sub-bucket at a time (its hash table is
# some 3-5x these bytes in Acero). Scale factor 10's orders⋈lineitem: 2-3 rounds a reducer.
JOIN_BUILD_BYTES = 64 << 20
MAX_ROUNDS = 64


# A node whose sources in a matched plan are under this many bytes (the extents' Arrow bytes)
# aggregates (or joins and aggregates) its partitions in one pass, not one partition at a time:
# a pass per partition bounds the hash tables to one partition's keys, which matters for big
# inputs (SF 1 lineitem by orderkey: 0.91 -> 0.78 s, docs/store.md), while for small ones each
# pass is only one more Acero plan and source to start (SF 0.1, a node's fragment in process:
# 15-30% slower a partition at a time; issue 19, session 32). Either way the groups are
# those of whole partitions, so the answer is the same.
BY_PARTITION_MIN_BYTES = 64 << 20


def plan_query(
    q: Query,
    tables: dict[str, TableInfo],
    live: Iterable[str],
    addresses: dict[str, str],
    qid: str = "q",
    by_partition: bool = True,
    join_build_bytes: int = JOIN_BUILD_BYTES,
    resident: Residency | None = None,
    by_partition_min_bytes: int = BY_PARTITION_MIN_BYTES,
) -> Plan:
    """Plan ``q`` over the committed catalog ``tables`` with the live store nodes ``live``:
    ``bind`` (columns), ``choose`` (replicas and strategy by estimated cost), ``fragments``
    (``by_partition``: an ``agg_local`` fragment aggregates each partition alone;
    ``join_build_bytes``: what a shuffle join's reducer holds of its build side at once)."""
    live = set(live)
    bound = bind(q, tables)
    choice = choose(bound, live, addresses, resident)
    return fragments(
        bound, choice, live, addresses, qid, by_partition, join_build_bytes, by_partition_min_bytes
    )


def _cost_lines(choice: Choice) -> list[str]:
    out = [f"cost: {choice.kind} on replicas {choice.replicas}: {choice.cost.describe()}"]
    for kind, reps, cost in sorted(choice.alternatives, key=lambda x: x[2].total):
        out.append(f"  rather than {kind} on replicas {reps}: {cost.describe()}")
    return out


def fragments(
    bound: Bound,
    choice: Choice,
    live: set[str],
    addresses: dict[str, str],
    qid: str = "q",
    by_partition: bool = True,
    join_build_bytes: int = JOIN_BUILD_BYTES,
    by_partition_min_bytes: int = BY_PARTITION_MIN_BYTES,
) -> Plan:
    """The chosen plan as tasks for the store nodes (and the coordinator's final merge)."""

    def per_partition(srcs: Sequence[dict[str, Any]]) -> bool:
        # (a node's sources under ``by_partition_min_bytes``: one pass over its partitions)
        return by_partition and sum(int(x.get("bytes", 0)) for x in srcs) >= by_partition_min_bytes

    q, a, b = bound.q, bound.a, bound.b
    is_agg = bound.is_agg
    keep_a, read_a, keep_b, read_b = bound.keep_a, bound.read_a, bound.keep_b, bound.read_b
    out_cols = bound.out_cols
    explain: list[str] = []

    def side_spec(
        t: TableInfo, keep: list[str], read: list[str], where: Sequence[Any], sources: list[Any]
    ) -> dict:
        return {
            "sources": sources,
            "where": [list(w) for w in where],
            "read": read,
            "keep": keep,
            "schema": _schema_b64(pa.schema([t.schema.field(c) for c in keep])),
        }

    order = [[c, d] for c, d in q.order_by]
    agg_post = {"agg": {"keys": list(q.group_by), "aggs": [[x.fn, x.column, x.name] for x in q.aggs]}}
    combine_post = {"agg": {**agg_post["agg"], "input": "partial"}}
    rows_post = {"select": out_cols, "order_by": order, "limit": q.limit if (q.limit is not None) else None}
    if q.order_by and q.limit is None:
        rows_post["order_by"], rows_post["limit"] = [], None  # a full sort happens once, at the end
    final_rows = {"kind": "rows", "select": out_cols, "order_by": order, "limit": q.limit}

    def int_sum(x: Any) -> str:
        """The type a 64-bit sum of ``x``'s column has ("int64", "uint64"), "" for another."""
        for t in (a, b):
            if t is not None and x.column in t.schema.names:
                typ = t.schema.field(x.column).type
                if pa.types.is_integer(typ):
                    return "uint64" if pa.types.is_unsigned_integer(typ) else "int64"
                return ""
        return ""

    def final_agg(combine: bool) -> dict[str, Any]:
        return {
            "kind": "agg",
            "combine": combine,
            "keys": list(q.group_by),
            "aggs": [[x.fn, x.column, x.name] for x in q.aggs],
            # (sums of integers: int64 again where a node summed them wide and they fit)
            "int_sums": {x.name: int_sum(x) for x in q.aggs if x.fn == "sum" and int_sum(x)},
            "order_by": order,
            "limit": q.limit,
        }

    # ---------------------------------------------------------------- joins
    if q.join is not None and b is not None:
        ra, rb = choice.replicas[a.name], choice.replicas[b.name]
        ua, ub = choice.units[a.name], choice.units[b.name]
        post = agg_post if is_agg else rows_post
        combine = is_agg and q.join.left_on not in q.group_by
        # the side a node holds whole while the other streams through the join (its hash
        # table's side): the one with fewer bytes of the columns it keeps
        kept_a = sum(u.bytes for u in ua) * column_share(a, keep_a)
        kept_b = sum(u.bytes for u in ub) * column_share(b, keep_b)
        join_spec = {
            "left_on": q.join.left_on,
            "right_on": q.join.right_on,
            "build": "L" if kept_a < kept_b else "R",
        }
        if choice.kind == "join_copart":
            # each partition joins on the node holding most of its bytes; the partitions a node
            # runs form one fragment (rows of different partitions differ in the join key, so the
            # join of the unions is the union of the joins, and a partition stays whole)
            per_node: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
            parts = local = moved = 0
            for _p, srcs, node in _copart_tasks(ua, ub):
                left, right = per_node.setdefault(node, ([], []))
                left += [s for s in srcs if s["table"] == a.name]
                right += [s for s in srcs if s["table"] == b.name]
                remote = sum(s["bytes"] for s in srcs if s["node"] != node)
                moved += remote
                local += remote == 0
                parts += 1
            tasks = [
                (
                    node,
                    {
                        "op": "fragment",
                        "left": side_spec(a, keep_a, read_a, q.where, left),
                        "right": side_spec(b, keep_b, read_b, q.join.where, right),
                        "join": join_spec,
                        "post": post,
                        # joined and aggregated a partition at a time (a scan's top-k stays per node)
                        "by_partition": is_agg and per_partition(left + right),
                    },
                )
                for node, (left, right) in sorted(per_node.items())
            ]
            explain.append(
                f"join {a.name}.{q.join.left_on} = {b.name}.{q.join.right_on}: co-partitioned "
                f"({a.specs[ra].describe()} on replica {ra} of {a.name}, {b.specs[rb].describe()} on replica "
                f"{rb} of {b.name}), so partition p joins only partition p: no shuffle"
            )
            allowed = choice.allowed.get(a.name)
            if allowed is not None:
                explain.append(f"pruning: {len(allowed)} partitions survive")
            explain.append(
                f"{parts} partition joins in {len(tasks)} fragments (one per node); {local} node-local, "
                f"{parts - local} read {_mb(moved)} of co-partitioned extents from a peer (whole extents, "
                "no repartitioning)"
            )
            explain += _cost_lines(choice)
            _degraded_note(explain, list(ua) + list(ub))
            return Plan(
                "join_copart",
                qid,
                [tasks],
                final_agg(combine) if is_agg else final_rows,
                explain,
                {a.name: ra, b.name: rb},
                moved_bytes=moved,
            )
        ga, gb = _group_sources(ua), _group_sources(ub)
        reducers = sorted(set(ga) | set(gb)) or sorted(live)[:1]
        n = len(reducers)
        # a reducer's share of the build side over the bound: its buckets in rounds, a
        # sub-bucket each (bucket i + n * m of n * rounds), the build side of one held at a time
        rounds = min(MAX_ROUNDS, max(1, -(-round(min(kept_a, kept_b)) // (n * max(join_build_bytes, 1)))))
        maps = []
        for tag, t, groups, keep, read, where, key in (
            ("L", a, ga, keep_a, read_a, q.where, q.join.left_on),
            ("R", b, gb, keep_b, read_b, q.join.where, q.join.right_on),
        ):
            if not groups:
                groups = {reducers[0]: []}
            for node, srcs in groups.items():
                maps.append(
                    (
                        node,
                        {
                            "op": "map",
                            "qid": qid,
                            "tag": tag,
                            "side": side_spec(t, keep, read, where, srcs),
                            "key": [key],
                            "n": n * rounds,
                        },
                    )
                )
        peers_l = sorted(ga) or [reducers[0]]
        peers_r = sorted(gb) or [reducers[0]]
        reduces = [
            (
                node,
                {
                    "op": "reduce",
                    "qid": qid,
                    "bucket": i,
                    "reducers": n,
                    "rounds": rounds,
                    "peers": {"L": peers_l, "R": peers_r},
                    "addresses": {p: addresses.get(p, "") for p in set(peers_l) | set(peers_r)},
                    "join": join_spec,
                    "post": post,
                },
            )
            for i, node in enumerate(reducers)
        ]
        copart = any(k == "join_copart" for k, _, _ in choice.alternatives)
        explain.append(
            f"join {a.name}.{q.join.left_on} = {b.name}.{q.join.right_on}: "
            + (
                "a co-partitioned replica pair exists but would move more bytes"
                if copart
                else "no replica pair is partitioned on the join keys by the same function"
            )
            + f" (using {a.name} replica {ra}: {a.specs[ra].describe()}, "
            f"{b.name} replica {rb}: {b.specs[rb].describe()}): shuffle both sides by the join key "
            f"into {n} buckets"
            + (
                f" of {rounds} sub-buckets, joined a sub-bucket at a time (the build side's ~{_mb(round(min(kept_a, kept_b)))} "
                f"over {n} reducers is over {_mb(join_build_bytes)} each)"
                if rounds > 1
                else ""
            )
        )
        explain.append(
            f"shuffle: {sum(u.bytes for u in list(ua) + list(ub)) / 1e6:.2f} MB scanned on {len(set(ga) | set(gb))} nodes, "
            f"{len(maps)} map tasks, {n} reduce tasks"
        )
        explain += _cost_lines(choice)
        _degraded_note(explain, list(ua) + list(ub))
        return Plan(
            "join_shuffle",
            qid,
            [maps, reduces],
            final_agg(combine) if is_agg else final_rows,
            explain,
            {a.name: ra, b.name: rb},
            shuffle=True,
        )

    # ---------------------------------------------------------------- single table
    r = choice.replicas[a.name]
    units = choice.units[a.name]
    allowed = choice.allowed[a.name]
    groups = _group_sources(units)
    head = f"table {a.name}: replica {r} ({a.specs[r].describe()})"
    reasons = choice.reasons
    fallback = ": no replica matches better; the cheapest to read (cost below)"
    explain.append(head + (": " + "; ".join(reasons) if reasons else fallback))
    explain.append(
        f"reads {len(units)} extent units, {sum(u.bytes for u in units) / 1e6:.2f} MB on {len(groups)} nodes"
        + (f" (pruned to partitions {sorted(allowed)})" if allowed is not None else "")
    )
    explain += _cost_lines(choice)
    _degraded_note(explain, units)
    if not groups:
        # an empty table (or everything pruned): one empty fragment keeps the result's schema
        groups = {sorted(live)[0] if live else "": []}

    def fragments_of(post: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [
            (node, {"op": "fragment", "left": side_spec(a, keep_a, read_a, q.where, srcs), "post": post})
            for node, srcs in groups.items()
        ]

    if choice.kind == "scan":
        explain.append(
            f"plan: scan: {len(groups)} fragments (filter, project{', top-k' if q.limit else ''}), concatenated"
        )
        return Plan("scan", qid, [fragments_of(rows_post)], final_rows, explain, {a.name: r})
    if choice.kind == "agg_global":
        explain.append(f"plan: global aggregate: {len(groups)} partial aggregates merged by the coordinator")
        return Plan("agg_global", qid, [fragments_of(agg_post)], final_agg(True), explain, {a.name: r})
    if choice.kind == "agg_local":
        whole, split, moved = _whole_partitions(units)
        moved = round(moved * column_share(a, read_a))  # the columns read cross, not whole rows
        if whole:
            groups = whole
        explain.append(
            f"plan: shuffle-free aggregation: {len(groups)} nodes aggregate whole partitions; "
            "the coordinator only concatenates"
        )
        if split:
            explain.append(
                f"partitions {split} span nodes (degraded reads, or super-extents on different nodes): "
                f"each is aggregated whole on one of them, which reads {_mb(moved)} of the others' "
                "extents (the columns read) from its peers"
            )
        local_tasks: list[tuple[str, dict[str, Any]]] = [
            (node, {**task, "by_partition": per_partition(task["left"]["sources"])})
            for node, task in fragments_of(agg_post)
        ]
        srcs = [src for _, t in local_tasks for src in t["left"]["sources"]]
        if len(q.group_by) == 1:
            on = sum(1 for src in srcs if src.get("sorted") == q.group_by[0])
            if on:
                explain.append(
                    f"{on} of {len(srcs)} extents read are sorted on {q.group_by[0]} within their sub-buckets: "
                    "a node whose extents all are aggregates runs of equal keys (where they are long enough)"
                )
        whole_pass = [n for n, t in local_tasks if by_partition and not t["by_partition"]]
        if whole_pass:
            explain.append(
                f"{len(whole_pass)} of {len(local_tasks)} nodes read under {_mb(by_partition_min_bytes)}: "
                "each aggregates its partitions in one pass (a pass per partition only bounds big hash tables)"
            )
        return Plan(
            "agg_local", qid, [local_tasks], final_agg(False), explain, {a.name: r}, moved_bytes=moved
        )
    if choice.kind == "agg_one_node":
        node = next(iter(groups))
        explain.append(
            f"plan: one-node aggregation: the rows read are all on {node or 'one node'}, which aggregates "
            "them completely (no exchange); the coordinator only concatenates"
        )
        return Plan("agg_one_node", qid, [fragments_of(agg_post)], final_agg(False), explain, {a.name: r})
    reducers = sorted(groups)
    n = len(reducers)
    maps = [
        (
            node,
            {
                "op": "map",
                "qid": qid,
                "tag": "L",
                "side": side_spec(a, keep_a, read_a, q.where, srcs),
                "pre": agg_post,
                "key": list(q.group_by),
                "n": n,
            },
        )
        for node, srcs in groups.items()
    ]
    reduces = [
        (
            node,
            {
                "op": "reduce",
                "qid": qid,
                "bucket": i,
                "peers": {"L": reducers},
                "addresses": {p: addresses.get(p, "") for p in reducers},
                "post": combine_post,
            },
        )
        for i, node in enumerate(reducers)
    ]
    matching = [k for k in range(REPLICAS) if a.specs[k].column in q.group_by]
    explain.append(
        f"plan: shuffle aggregation: group-by {list(q.group_by)} does not match replica {r}'s partitioning; "
        f"{n} nodes pre-aggregate and exchange partials by hash of the group key into {n} reducers"
        + (f" (replica {matching[0]} would avoid the shuffle)" if matching else "")
    )
    return Plan("agg_shuffle", qid, [maps, reduces], final_agg(False), explain, {a.name: r}, shuffle=True)


def _degraded_note(explain: list[str], units: Sequence[Unit]) -> None:
    deg = [u for u in units if u.degraded]
    if deg:
        explain.append(
            f"degraded: {len(deg)} extents are on dead nodes or corrupt; their rows are read from the matching "
            "buckets of another replica's extents"
        )
