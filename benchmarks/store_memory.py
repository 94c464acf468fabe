"""The store coordinator's peak memory on TPC-H queries: a cluster of real processes (six nodes in
three fault domains, a coordinator) loaded with the eight tables as ``microco bench store`` loads
them; before each query the coordinator is restarted, so its peak resident set (``VmHWM``) is that
query's (plus the process's start-up, reported as ``start_rss_mb``). Each result is checked
against DuckDB's on the same Parquet files. JSON on stdout.

    python -m microco.benchmarks.store_memory --sf 1 --queries 9,18,21

The gather plans (subqueries, a table used twice, outer joins) bring each table's needed columns
to the coordinator and run the SQL there: the coordinator's memory is theirs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from microco.benchmarks.store import _log, _norm, bench_cluster, generate, load_tables
from microco.benchmarks.store_tpch import QUERIES, REPLICAS

# the gather plans of TPC-H (the rest split over partitions: their coordinator merges little)
GATHER = (2, 7, 8, 9, 11, 13, 15, 16, 20, 22)


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak) of a process, in kB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m microco.benchmarks.store_memory", description=__doc__)
    ap.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor")
    ap.add_argument(
        "--queries",
        default=",".join(map(str, GATHER)),
        help="TPC-H query numbers (default: the gather plans)",
    )
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--super-extent-rows", type=int, default=10_000_000)
    ap.add_argument(
        "--coordinator-arg",
        action="append",
        default=[],
        help="an extra coordinator flag (repeat; e.g. --coordinator-arg=--sql-memory-mb=256)",
    )
    ap.add_argument("--data-dir", default=os.path.expanduser("~/.cache/microco/tpch"))
    args = ap.parse_args(argv)
    wanted = [int(q) for q in args.queries.split(",") if q.strip()]

    import duckdb

    from microco.clients.store import StoreClient

    data = generate(args.sf, Path(args.data_dir))
    result: dict[str, Any] = {
        "benchmark": "store_memory",
        "scale_factor": args.sf,
        "nodes": args.nodes,
        "coordinator_args": args.coordinator_arg,
        "load_average_at_start": os.getloadavg()[0],
        "queries": [],
    }
    with bench_cluster(
        "microco-bench-store-memory-",
        args.nodes,
        coordinator_args=[
            "--super-extent-rows",
            str(args.super_extent_rows),
            "--recovery-interval-s",
            "3600",
            *args.coordinator_arg,
        ],
    ) as cluster:
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
        t0 = time.perf_counter()
        load_tables(client, data, list(REPLICAS))
        client.close()
        result["load_s"] = round(time.perf_counter() - t0, 1)
        _log(f"loaded sf {args.sf:g} in {result['load_s']}s")
        con = duckdb.connect()
        con.execute("SET threads TO 2")
        for f in sorted(data.glob("*.parquet")):
            con.execute(f"create view {f.stem} as select * from read_parquet('{f}')")
        for q in wanted:
            sql = QUERIES[q]
            cluster.restart_coordinator(timeout=120)
            pid = cluster.procs["coordinator"].pid
            client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
            client.list_tables()  # connected and serving
            start = proc_status(pid)
            c0, w0 = cpu_s(pid), time.perf_counter()
            row: dict[str, Any] = {"query": q, "start_rss_mb": round(start["VmRSS"] / 1024, 1)}
            try:
                got = client.sql(sql)
                row["store_s"] = round(time.perf_counter() - w0, 3)
                row["coordinator_cpu_s"] = round(cpu_s(pid) - c0, 3)
                row["coordinator_peak_rss_mb"] = round(proc_status(pid)["VmHWM"] / 1024, 1)
                row["plan"] = client.last_plan.get("kind")
                want = con.sql(sql).to_arrow_table()
                a = _norm([tuple(r.values()) for r in got.to_pylist()])
                b = _norm([tuple(r.values()) for r in want.to_pylist()])
                row["correct"] = (
                    a == b if "order by" in sql.lower() else sorted(a, key=repr) == sorted(b, key=repr)
                )
            except Exception as exc:  # noqa: BLE001 - reported per query
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["load_average"] = round(os.getloadavg()[0], 1)
            client.close()
            _log(f"q{q}: {row}")
            result["queries"].append(row)
    peaks = [r["coordinator_peak_rss_mb"] for r in result["queries"] if "coordinator_peak_rss_mb" in r]
    result["max_coordinator_peak_rss_mb"] = max(peaks, default=None)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
