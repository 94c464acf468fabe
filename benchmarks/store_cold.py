"""Cold and warm scans of the store against DuckDB, the two extent layouts side by side.

    python -m microco.benchmarks.store_cold [--sf 10] [--trials 2] [--queries 6,19]

One store cluster of real processes (as ``microco bench store`` starts it) loads TPC-H
``lineitem`` and ``part`` once per extent layout (``--layouts 1,2``: the nodes are restarted with
``--extent-layout`` before each load; table names ``lineitem_l1``, ``part_l1``...), so both layouts
are read by the same node processes and their queries interleave. Each query runs cold (every
extent file and Parquet file evicted from the page cache with ``posix_fadvise(DONTNEED)`` just
before) and then warm, on the store for each layout and on DuckDB over the Parquet files, in a
rotating order per trial. Disk bytes read: ``/proc/<pid>/io`` ``read_bytes``, summed over the
store's node processes, and the benchmark's own process for DuckDB. JSON on stdout; medians over
the trials. Linux only (``/proc``, ``posix_fadvise``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from microco.benchmarks.store import (
    REPLICA_CODECS,
    _log,
    _norm,
    bench_cluster,
    parquet_schema,
    parse_replica_codecs,
    tpch_specs,
)
from microco.benchmarks.store_tpch import QUERIES

TABLES = ("lineitem", "part")


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (pages a process still maps stay)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_bytes(pids: list[int]) -> int:
    """Bytes these processes have read from storage (``/proc/<pid>/io``)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("read_bytes:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def renamed(sql: str, suffix: str) -> str:
    for t in TABLES:
        sql = re.sub(rf"\b{t}\b", f"{t}{suffix}", sql)
    return sql


def _files(root: Path, tables: list[str]) -> list[Path]:
    return [p for t in tables for p in root.glob(f"*/tables/{t}/*.arrow")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microco.benchmarks.store_cold",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sf", type=float, default=10, help="TPC-H scale factor")
    ap.add_argument("--trials", type=int, default=2, help="interleaved trials (medians reported)")
    ap.add_argument("--queries", default="6,19", help="TPC-H queries on lineitem and part only")
    ap.add_argument("--layouts", default="1,2", help="extent layouts to load and compare")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--node-cache-mb", type=float, default=512)
    ap.add_argument("--super-extent-rows", type=int, default=2_500_000)
    ap.add_argument(
        "--replica-codecs",
        action="append",
        type=parse_replica_codecs,
        default=None,
        help="TABLE=C0,C1,C2 (default lineitem=zstd,lz4,zstd, as docs/store.md's cold figures)",
    )
    ap.add_argument("--data-dir", default=os.path.expanduser("~/.cache/microco/tpch"))
    args = ap.parse_args(argv)
    import duckdb

    from microco.benchmarks.store_tpch import generate
    from microco.clients.store import StoreClient

    REPLICA_CODECS.update(dict(args.replica_codecs or [("lineitem", ["zstd", "lz4", "zstd"])]))
    layouts = [int(x) for x in args.layouts.split(",")]
    queries = [int(x) for x in args.queries.split(",")]
    data = generate(args.sf, Path(args.data_dir), TABLES)
    parquet = [data / f"{t}.parquet" for t in TABLES]
    result: dict[str, Any] = {"sf": args.sf, "layouts": layouts, "codecs": REPLICA_CODECS}
    node_args = ["--extent-cache-mb", f"{args.node_cache_mb:g}"]
    coordinator_args = ["--super-extent-rows", str(args.super_extent_rows), "--recovery-rate-mb", "0"]
    # the nodes restart between loads: no rebuild of their extents meanwhile
    coordinator_args += ["--recovery-grace-s", "36000", "--recovery-interval-s", "36000"]
    with bench_cluster("microco-bench-cold-", args.nodes, coordinator_args, node_args) as cluster:
        names = [n for n, _ in cluster.node_specs]
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=3600)
        storage: dict[str, Any] = {}
        for layout in layouts:
            for n, domain in cluster.node_specs:  # restart every node writing this layout
                p = cluster.procs[n]
                p.terminate()
                p.wait(timeout=60)
                cluster.node_args = [*node_args, "--extent-layout", str(layout)]
                cluster.start_node(n, domain)
            cluster.wait_ready(timeout=300)
            t0 = time.perf_counter()
            for t in TABLES:
                name = f"{t}_l{layout}"
                client.create_table(
                    name, parquet_schema(data / f"{t}.parquet"), tpch_specs(t), codecs=REPLICA_CODECS.get(t)
                )
                client.append(name, data / f"{t}.parquet", timeout=36000)
            files = _files(cluster.root, [f"{t}_l{layout}" for t in TABLES])
            size = sum(p.stat().st_size for p in files)
            storage[f"l{layout}"] = {
                "load_s": round(time.perf_counter() - t0, 1),
                "bytes": size,
                "over_3_parquet": round(size / (3 * sum(p.stat().st_size for p in parquet)), 3),
            }
            _log(f"layout {layout}: loaded {storage[f'l{layout}']}")
        result["storage"] = storage
        pids = [cluster.procs[n].pid for n in names]
        everything = _files(cluster.root, [f"{t}_l{x}" for t in TABLES for x in layouts]) + parquet
        con = duckdb.connect()
        con.execute("SET threads TO 2")
        for t in TABLES:
            con.execute(f"create view {t} as select * from read_parquet('{data / (t + '.parquet')}')")
        engines: list[tuple[str, Any, list[int]]] = [
            (f"store_l{x}", lambda sql, x=x: client.sql(renamed(sql, f"_l{x}")), pids) for x in layouts
        ]
        engines.append(("duckdb", lambda sql: con.sql(sql).to_arrow_table(), [os.getpid()]))
        runs: dict[int, dict[str, dict[str, list[Any]]]] = {
            q: {e: {"cold_s": [], "cold_mb": [], "warm_s": [], "warm_mb": []} for e, _, _ in engines}
            for q in queries
        }
        answers: dict[int, dict[str, Any]] = {q: {} for q in queries}
        # each layout's plan (the same replica and kind are expected: the catalog records the same
        # rows and Arrow bytes for both)
        result["explain"] = {
            f"q{q} l{x}": client.explain_sql(renamed(QUERIES[q], f"_l{x}")) for q in queries for x in layouts
        }
        for trial in range(args.trials):
            order = engines[trial % len(engines) :] + engines[: trial % len(engines)]
            for q in queries:
                for name, fn, who in order:
                    for kind in ("cold", "warm"):
                        if kind == "cold":
                            evict(everything)
                        before = read_bytes(who)
                        t0 = time.perf_counter()
                        got = fn(QUERIES[q])
                        dt = time.perf_counter() - t0
                        mb = (read_bytes(who) - before) / 1e6
                        runs[q][name][f"{kind}_s"].append(round(dt, 3))
                        runs[q][name][f"{kind}_mb"].append(round(mb, 1))
                        answers[q][name] = _norm([tuple(r.values()) for r in got.to_pylist()])
                        _log(f"trial {trial} q{q} {name} {kind}: {dt:.2f} s, {mb:.0f} MB read")
        out = []
        for q in queries:
            row: dict[str, Any] = {"query": q, "runs": runs[q]}
            for name, _, _ in engines:
                for k, v in runs[q][name].items():
                    row[f"median_{name}_{k}"] = round(statistics.median(v), 3) if v else None
                row[f"{name}_correct"] = answers[q][name] == answers[q]["duckdb"]
            out.append(row)
        result["queries"] = out
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
