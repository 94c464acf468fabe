"""Where a matched group-by's time goes on its node, in one process (issue 19, sessions 37-38): the
benchmark's TPC-H partitionings cut into extents (``bucketed_extents``), written by a real
``NodeStore`` twice, as appends write them by default (rows in a sub-bucket in the order they
came: ``flat``) and sorted within each sub-bucket on the replica's partition column (``sorted``,
the coordinator's ``--sort-extents``), and each of the benchmark's group-bys run as its matched
fragment over its replica's extents (all partitions, one node; ``NodeStore.run``, the nodes'
own path): over the flat extents, over the sorted ones hashed (``sorted_hash``), and over the
sorted ones with the catalog's flag (``sorted_runs``: aggregated by runs, ``_runs``),
interleaved, medians; the bucketing's seconds and the files' bytes of both layouts; and the rows
per run of a sorted sub-bucket. JSON on stdout. (Session 37's Acero feeds, ``slices`` and
``whole``, and its run prototype stay as functions, no longer timed.)

    python -m microco.benchmarks.store_node_agg ~/.cache/microco/tpch/sf1 [--rounds 9]

``lineitem`` is cut to its first 4M rows (one super-extent, as the store's default)."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.parquet as pq

from microco.services.store import NodeStore, PartitionSpec, bucketed_extents

P = 8
SPECS = {
    "orders": ["o_orderkey:hash:8", "o_custkey:hash:8", "o_orderdate:range:" + ",".join(f"{y}-01-01" for y in range(1993, 1999))],
    "lineitem": ["l_orderkey:hash:8", "l_partkey:hash:8", "l_suppkey:hash:8"],
}  # fmt: skip
# the benchmark's group-bys (benchmarks/store.py): table, key, its matched replica, aggregates
QUERIES = [
    ("orders", "o_custkey", 1, [["sum", "o_totalprice", "total"], ["count", "*", "n"]]),
    ("orders", "o_orderdate", 2, [["count", "*", "n"], ["sum", "o_totalprice", "total"]]),
    ("lineitem", "l_orderkey", 0, [["sum", "l_quantity", "qty"], ["count", "*", "n"]]),
    ("lineitem", "l_partkey", 1, [["sum", "l_extendedprice", "rev"], ["count", "*", "n"]]),
    ("lineitem", "l_suppkey", 2, [["sum", "l_quantity", "qty"], ["max", "l_discount", "mx"]]),
]
ROWS = {"lineitem": 4_000_000}


# the nodes' feeding of Acero (``services/store/_exec.py``: ``compact``, ``_acero_source``),
# written out here so the harness can set the alternative beside it
COMPACT_BELOW_ROWS = 16_384
COMPACT_BATCH_ROWS = 65_536
COMPACT_MAX_BYTES = 64 << 20


def _read_all(node: Any, sources: Any, cols: Any) -> list[Any]:
    """Every source's columns read on the node (its warm reads)."""
    return [node.read_source(s, cols) for s in sources]


def slices(t: pa.Table) -> list[pa.RecordBatch]:
    """What nodes feed Acero of a read extent: its non-empty batches, made into 64k-row batches
    when they average under 16k rows (``compact``)."""
    kept = [b for b in t.to_batches() if b.num_rows]
    if len(kept) > 1 and t.num_rows < COMPACT_BELOW_ROWS * len(kept) and t.nbytes <= COMPACT_MAX_BYTES:
        one = pa.Table.from_batches(kept, schema=t.schema).combine_chunks()
        return one.to_batches(max_chunksize=COMPACT_BATCH_ROWS)
    return kept


def whole(t: pa.Table) -> list[pa.RecordBatch]:
    """The alternative tried in session 37: a read extent as one batch (at most 64 MB)."""
    if t.nbytes > COMPACT_MAX_BYTES:
        return slices(t)
    return [b for b in t.combine_chunks().to_batches() if b.num_rows]


def acero_agg(
    tables: list[pa.Table], feed: Callable[[pa.Table], list[pa.RecordBatch]], key: str, aggs: list[list[str]]
) -> pa.Table:
    """The node's streamed hash aggregation (one Acero plan over a batch reader), fed by ``feed``."""
    schema = tables[0].schema

    def batches() -> Iterator[pa.RecordBatch]:
        for t in tables:
            yield from feed(t)

    specs = [
        ([] if col == "*" else col, "hash_count_all" if col == "*" else f"hash_{fn}", None, name)
        for fn, col, name in aggs
    ]
    src = acero.Declaration(
        "record_batch_reader_source",
        acero.RecordBatchReaderSourceNodeOptions(pa.RecordBatchReader.from_batches(schema, batches())),
    )
    return acero.Declaration(
        "aggregate", acero.AggregateNodeOptions(specs, keys=[key]), inputs=[src]
    ).to_table(use_threads=True)


def _median_ms(f: Callable[[], Any], rounds: int) -> float:
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return round(statistics.median(ts) * 1e3, 2)


def sorted_runs(extent: pa.Table, key: str) -> int:
    """Runs of equal ``key`` in ``extent`` were each of its sub-bucket batches sorted on it."""
    runs = 0
    for b in extent.to_batches():
        if b.num_rows:
            col = b.column(key)
            if pa.types.is_date32(col.type):
                col = col.view(pa.int32())
            k = np.sort(np.asarray(col))
            runs += 1 + int(np.count_nonzero(k[1:] != k[:-1]))
    return runs


def _sort_subbuckets(extent: pa.Table, key: str) -> pa.Table:
    """``extent`` with each sub-bucket batch sorted on ``key`` (a layout the store does not have)."""
    out = [b.take(pc.sort_indices(b.column(key))) for b in extent.to_batches() if b.num_rows]
    return pa.Table.from_batches(out, schema=extent.schema)


def _ints(col: pa.ChunkedArray) -> np.ndarray:
    """A column's values as int64 or float64 (a decimal's low 64 bits: TPC-H's fit, not general)."""
    a = col.combine_chunks()
    if pa.types.is_decimal(a.type):
        words = np.frombuffer(a.buffers()[1], dtype=np.int64)
        return words[2 * a.offset : 2 * (a.offset + len(a))][0::2]
    if pa.types.is_date32(a.type):
        return np.asarray(a.view(pa.int32()))
    return np.asarray(a)


def runs_prototype(extents: list[pa.Table], key: str, values: list[str]) -> pa.Table:
    """The prototype of a run-based aggregation over sorted sub-buckets: per extent, run starts
    (a key change or a batch's start), each value summed per run (``reduceat``) and the run's
    length; then the runs' partials hashed into groups (Acero). Sums and counts only, no nulls:
    a measurement of the ceiling, not an implementation."""
    parts = []
    for t in extents:
        k = _ints(t.column(key))
        flag = np.empty(len(k), bool)
        flag[0] = True
        np.not_equal(k[1:], k[:-1], out=flag[1:])
        off = 0
        for b in t.to_batches():
            flag[off] = True
            off += b.num_rows
        starts = np.flatnonzero(flag)
        cols = {"k": k[starts], "n": np.diff(np.append(starts, len(k)))}
        for v in values:
            cols[v] = np.add.reduceat(_ints(t.column(v)), starts)
        parts.append(pa.table(cols))
    runs = pa.concat_tables(parts)
    return runs.group_by("k").aggregate([(v, "sum") for v in values] + [("n", "sum")])


def _written(node: Any, table: str, t: pa.Table, specs: list[PartitionSpec], sort: bool) -> dict[str, Any]:
    """``t`` cut into extents (sorted within sub-buckets, or in the order rows came: ``sort``)
    and written by ``node``: per replica its sources, and the seconds and file bytes."""
    t0 = time.perf_counter()
    ext = bucketed_extents(t, specs, sort=sort)
    took = time.perf_counter() - t0
    sources: dict[int, list[dict[str, Any]]] = {}
    stored = 0
    tag = "sorted" if sort else "flat"
    for (r, p), (rows, index) in ext.items():
        eid = f"s000000-r{r}-p{p:04d}-{tag}"
        put = node.put_extent(table, eid, rows, index)
        stored += put["bytes"]
        sources.setdefault(r, []).append(
            {"node": "n0", "table": table, "extent": eid, "checksum": put["checksum"]}
        )
    return {"sources": sources, "bucket_s": took, "file_bytes": stored}


def measure(data: Path, rounds: int = 9) -> dict[str, Any]:
    """Each group-by's matched fragment on its node (``NodeStore.run``, the nodes' own path) over
    three things, interleaved (a rotating order each round), medians: the extents as main writes
    them before session 38 (``flat``: rows in a sub-bucket in the order they came; Acero's hash
    aggregation), the extents sorted within each sub-bucket on the replica's partition column
    (``sorted_hash``: the same hash aggregation, to see what locality alone gives) and the same
    sorted extents with the catalog's flag (``sorted_runs``: aggregated by runs, ``_runs``)."""
    out: dict[str, Any] = {"rounds": rounds, "tables": {}, "queries": []}
    with tempfile.TemporaryDirectory(prefix="store-node-agg-") as d:
        node = NodeStore("n0", d)
        for table in ("orders", "lineitem"):
            t = pq.read_table(data / f"{table}.parquet")
            t = t.slice(0, ROWS.get(table, t.num_rows))
            t = t.cast(
                pa.schema(
                    [
                        pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else f.type)
                        for f in t.schema
                    ]
                )
            )
            specs = [PartitionSpec.parse(s) for s in SPECS[table]]
            flat = _written(node, table, t, specs, sort=False)
            ordered = _written(node, table, t, specs, sort=True)
            out["tables"][table] = {
                "rows": t.num_rows,
                "bucket_flat_s": round(flat["bucket_s"], 3),
                "bucket_sorted_s": round(ordered["bucket_s"], 3),
                "file_bytes_flat": flat["file_bytes"],
                "file_bytes_sorted": ordered["file_bytes"],
            }
            for _name, key, r, aggs in (q for q in QUERIES if q[0] == table):
                cols = [key] + sorted({a[1] for a in aggs if a[1] != "*"})
                post = {"agg": {"keys": [key], "aggs": aggs}}

                def task(
                    sources: list[dict[str, Any]], cols: list[str] = cols, post: Any = post
                ) -> dict[str, Any]:
                    return {
                        "op": "fragment",
                        "left": {"sources": sources, "where": [], "read": cols, "keep": cols},
                        "post": post,
                    }

                tasks = {
                    "flat": task(flat["sources"][r]),
                    "sorted_hash": task(ordered["sources"][r]),
                    "sorted_runs": task([{**s, "sorted": key} for s in ordered["sources"][r]]),
                }
                answers = {k: node.run(v).sort_by(key) for k, v in tasks.items()}  # warm: decoded
                for k in tasks:
                    assert answers[k].equals(answers["flat"]), k
                timed: dict[str, list[float]] = {k: [] for k in tasks}
                names = list(tasks)
                for i in range(rounds):
                    for k in names[i % 3 :] + names[: i % 3]:
                        t0 = time.perf_counter()
                        node.run(tasks[k])
                        timed[k].append(time.perf_counter() - t0)
                reads = [node.read_source(s, cols) for s in flat["sources"][r]]
                runs = sum(sorted_runs(x, key) for x in reads)
                n = sum(x.num_rows for x in reads)
                med = {k: round(statistics.median(v) * 1e3, 2) for k, v in timed.items()}
                out["queries"].append(
                    {
                        "table": table,
                        "key": key,
                        "replica": r,
                        "rows": n,
                        "groups": answers["flat"].num_rows,
                        "extents": len(reads),
                        **{f"{k}_ms": v for k, v in med.items()},
                        "flat_over_sorted_runs": round(med["flat"] / med["sorted_runs"], 2),
                        "flat_over_sorted_hash": round(med["flat"] / med["sorted_hash"], 2),
                        "warm_reads_ms": _median_ms(
                            functools.partial(_read_all, node, ordered["sources"][r], cols), rounds
                        ),
                        "sorted_subbucket_runs": runs,
                        "rows_per_run": round(n / runs, 2),
                        "rows_per_group": round(n / max(1, answers["flat"].num_rows), 2),
                    }
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="a folder of TPC-H Parquet files (orders, lineitem)")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    print(json.dumps(measure(args.data, args.rounds), indent=1))


if __name__ == "__main__":
    main()
