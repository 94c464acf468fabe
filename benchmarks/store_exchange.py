"""The SQL repartition exchange against the gather it replaces, in one run: the h2o.ai
db-benchmark's tables (``store_h2o``'s generator) on a store cluster of real processes, each
query run by two coordinators' cores in this process over the same nodes (Flight, mutual TLS),
one with exchanges off (``sql_exchange = False``: the gather, the plan before) and one with
them wherever one applies (``sql_exchange = True``), and by DuckDB on the same Parquet files; trials interleaved in a
rotating order, medians kept; each answer checked against DuckDB's; ``plan_by_cost`` is what
the default core (the cost) plans. JSON on stdout.

    python -m microco.benchmarks.store_exchange [--rows 1000000] [--trials 3]

The queries: the suite's ``median``/``sd`` and ``corr`` group-bys (q6, q9) and a count distinct,
grouped off every replica's partition column; an outer join and an anti join on keys no replica
pair co-partitions; an inner join of two tables of ``rows`` rows each on a key neither is
partitioned by here (``big``'s replicas leave out ``id3``)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from microco.benchmarks.store_h2o import GROUPBY, same, tables

QUERIES: dict[str, str] = {
    "q6_median_sd": GROUPBY["q6"],
    "q9_corr": GROUPBY["q9"],
    "count_distinct": "SELECT id4, count(DISTINCT id6) AS n FROM x GROUP BY id4",
    "left_join_median": (
        "SELECT xj.id5, count(*) AS n, median(medium.v2) AS m FROM xj LEFT JOIN medium "
        "ON xj.id5 = medium.id5 GROUP BY xj.id5"
    ),
    "anti_join_topk": (
        "SELECT id3, v1 FROM xj WHERE NOT EXISTS (SELECT 1 FROM big WHERE big.id3 = xj.id3) "
        "ORDER BY v1 DESC, id3 LIMIT 10"
    ),
    "inner_join_big": (
        "SELECT xj.id1, count(*) AS n, sum(big.v2) AS v2 FROM xj JOIN big ON xj.id3 = big.id3 GROUP BY xj.id1"
    ),
}
# as ``store_h2o`` places them, but ``big`` not on ``id3`` (its join key with ``xj``)
PARTITIONING: dict[str, list[str]] = {
    "x": ["id1:hash:4", "id3:hash:4", "id6:hash:4"],
    "xj": ["id1:hash:4", "id2:hash:4", "id3:hash:4"],
    "medium": ["id2:hash:4", "id1:hash:2", "id2:hash:2"],
    "big": ["id1:hash:4", "id2:hash:4", "id6:hash:4"],
}


def _log(msg: str) -> None:
    print(f"[bench store-exchange] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    import duckdb
    import pyarrow.parquet as pq

    from microco.benchmarks.store import _geomean, bench_cluster, load_timeout, parquet_schema
    from microco.clients.store import StoreClient
    from microco.common.kv import EtcdKV
    from microco.services.store import FlightTransport, StoreCore

    ap = argparse.ArgumentParser(prog="python -m microco.benchmarks.store_exchange", description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--queries", default="", help="comma-separated names (default: all)")
    ap.add_argument("--data", type=Path, default=Path("/tmp/microco-bench-exchange"))
    args = ap.parse_args(argv)
    names = [q for q in args.queries.split(",") if q] or list(QUERIES)
    d = args.data / f"n{args.rows}"
    d.mkdir(parents=True, exist_ok=True)
    if not all((d / f"{t}.parquet").exists() for t in PARTITIONING):
        for t, data in tables(args.rows).items():
            if t in PARTITIONING:
                pq.write_table(data, d / f"{t}.parquet")
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    for t in PARTITIONING:
        con.execute(f"create view \"{t}\" as select * from read_parquet('{d / t}.parquet')")
    result: dict[str, Any] = {
        "benchmark": "store_exchange",
        "rows": args.rows,
        "nodes": args.nodes,
        "trials": args.trials,
        "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_at_start": os.getloadavg()[0],
    }
    with bench_cluster(
        "microco-bench-exchange-", args.nodes, ["--recovery-rate-mb", "0", "--recovery-interval-s", "3600"]
    ) as cluster:
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
        t0 = time.perf_counter()
        for t in PARTITIONING:
            path = d / f"{t}.parquet"
            client.create_table(t, parquet_schema(path), PARTITIONING[t])
            client.append(t, path, timeout=load_timeout(path))
        result["load_s"] = round(time.perf_counter() - t0, 1)
        _log(f"loaded in {result['load_s']} s")
        kv = EtcdKV(cluster.etcd)
        transport = FlightTransport(kv)
        gather = StoreCore(kv, transport)
        gather.sql_exchange = False
        exchange = StoreCore(kv, transport)
        exchange.sql_exchange = True  # the exchange wherever one applies (the mechanism measured)
        auto = StoreCore(kv, transport)  # the default: what the cost picks (planned only)
        rows = []
        for name in names:
            sql = QUERIES[name]
            steps = {
                "gather": lambda sql=sql: gather.sql(sql),
                "exchange": lambda sql=sql: exchange.sql(sql),
                "duckdb": lambda sql=sql: (con.sql(sql).to_arrow_table(), None),
            }
            row: dict[str, Any] = {"query": name}
            try:
                outs = {k: fn() for k, fn in steps.items()}  # warm-ups, and the answers
                times: dict[str, list[float]] = {k: [] for k in steps}
                order = list(steps)
                for k in range(args.trials):
                    for step in order[k % 3 :] + order[: k % 3]:
                        t_start = time.perf_counter()
                        steps[step]()
                        times[step].append(time.perf_counter() - t_start)
                med = {k: statistics.median(v) for k, v in times.items()}
                want = outs["duckdb"][0]
                plan = outs["exchange"][1]
                row.update(
                    plan=plan.kind,
                    plan_gather=outs["gather"][1].kind,
                    plan_by_cost=auto.explain_sql(sql).kind,
                    correct=same(outs["exchange"][0], want) and same(outs["gather"][0], want),
                    exchange_s=round(med["exchange"], 4),
                    gather_s=round(med["gather"], 4),
                    duckdb_s=round(med["duckdb"], 4),
                    gather_over_exchange=round(med["gather"] / med["exchange"], 2),
                    moved_mb=round(plan.moved_bytes / 1e6, 2),
                    explain_cost=[
                        x for x in plan.explain if x.startswith(("cost:", "  rather than", "exchange not"))
                    ],
                    load_average=os.getloadavg()[0],
                )
            except Exception as exc:  # noqa: BLE001 - reported per query
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            _log(str(row))
            rows.append(row)
    ok = [r for r in rows if r.get("correct")]
    result.update(
        correct=f"{len(ok)}/{len(rows)}",
        geomean_gather_over_exchange=_geomean([r["gather_over_exchange"] for r in ok]) if ok else None,
        queries=rows,
        end_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        load_average_at_end=os.getloadavg()[0],
    )
    print(json.dumps(result, indent=1))
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
