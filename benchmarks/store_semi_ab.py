"""The SQL gather's semi-join reduction, before/after in one run: the 22 TPC-H queries on a store
cluster of real processes (as ``microco bench store`` loads it), each run by two coordinators'
cores in this process over the same nodes (Flight, mutual TLS), one with semi-joins off
(``sql_semi_join_bytes=0``: the plans before) and one with the default, and by DuckDB on the
same Parquet files; trials interleaved in a rotating order, medians kept. JSON on stdout.

    python -m microco.benchmarks.store_semi_ab --sf 1 [--trials 3] [--ab semi|subquery|partagg|plancache]

``--ab subquery``: "before" runs subqueries keyed to a partition column as gathers. ``--ab
partagg``: the JSON-model queries of ``microco bench store`` instead (only orders and lineitem
loaded), "before" aggregating a node's partitions together in a group-by on the partition column,
"after" each partition alone; the forced shuffle plan and DuckDB run in the same rotation.
``--ab plancache``: the same queries, "before" planning every query anew (``model_plan_cache=0``),
"after" reusing a plan made on the same catalog version; the shuffle plan runs on both cores.
``--ab residency``: the 22 TPC-H queries, "before" planning without asking the nodes what is in
memory (``residency_max_age_s=None``), "after" with it (the planner's residency, ``_residency``:
``--residency-max-age-s`` 1 s); give ``--replica-codecs lineitem=zstd,zstd,zstd`` so that it can
trade between replicas that decode alike. Each row also says which replicas each core's plan read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from microco.benchmarks.store import (
    REPLICA_CODECS,
    _geomean,
    _log,
    _norm,
    bench_cluster,
    generate,
    load_tables,
    parse_replica_codecs,
    queries,
)
from microco.benchmarks.store_tpch import QUERIES, REPLICAS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="store_semi_ab", description=__doc__)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--data-dir", default=os.path.expanduser("~/.cache/microco/tpch"))
    ap.add_argument(
        "--ab",
        choices=("semi", "subquery", "partagg", "plancache", "residency"),
        default="semi",
        help="what 'before' turns off: semi-join reduction, subqueries run per partition, or a "
        "partition-local group-by aggregating each partition alone, or the JSON-model plan cache "
        "(both: the JSON-model queries)",
    )
    ap.add_argument("--queries", default="", help="comma-separated query numbers (default: all 22)")
    ap.add_argument(
        "--replica-codecs",
        type=parse_replica_codecs,
        action="append",
        default=[],
        metavar="TABLE=C0,C1,C2",
        help="a table's replicas' extent codecs (as microco bench store's)",
    )
    args = ap.parse_args(argv)
    REPLICA_CODECS.clear()
    REPLICA_CODECS.update(dict(args.replica_codecs))

    import duckdb

    from microco.clients.store import StoreClient
    from microco.common.kv import EtcdKV
    from microco.services.store import FlightTransport, StoreCore

    data = generate(args.sf, Path(args.data_dir))
    qs = [int(x) for x in args.queries.split(",") if x] or sorted(QUERIES)
    result: dict[str, Any] = {"benchmark": "store_semi_ab", "scale_factor": args.sf, "trials": args.trials}
    result["load_average_at_start"] = os.getloadavg()[0]
    with bench_cluster(
        "microco-bench-semi-", args.nodes, coordinator_args=["--recovery-interval-s", "3600"]
    ) as cluster:
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
        t0 = time.perf_counter()
        model = args.ab in ("partagg", "plancache")
        load_tables(client, data, ["orders", "lineitem"] if model else list(REPLICAS))
        result["load_s"] = round(time.perf_counter() - t0, 1)
        _log(f"loaded in {result['load_s']} s")
        con = duckdb.connect()
        con.execute("SET threads TO 2")
        for f in sorted(data.glob("*.parquet")):
            con.execute(f"create view {f.stem} as select * from read_parquet('{f}')")
        kv = EtcdKV(cluster.etcd)
        transport = FlightTransport(kv)
        if args.ab == "semi":
            before = StoreCore(kv, transport, sql_semi_join_bytes=0)
        elif args.ab == "partagg":
            before = StoreCore(kv, transport)
            before.agg_by_partition = False
        elif args.ab == "plancache":
            before = StoreCore(kv, transport, model_plan_cache=0)
        elif args.ab == "residency":
            before = StoreCore(kv, transport)
            before.residency_max_age_s = None
        else:
            before = StoreCore(kv, transport)
            before.sql_subquery_pushdown = False
        result["ab"] = args.ab
        result["replica_codecs"] = dict(REPLICA_CODECS)
        after = StoreCore(kv, transport)
        if args.ab == "residency":  # (on, whatever the core's default)
            from microco.services.store import RESIDENCY_MAX_AGE_S

            after.residency_max_age_s = RESIDENCY_MAX_AGE_S
        if model:
            result["queries"] = _model_ab(
                before,
                StoreCore(kv, transport),
                client,
                con,
                args.trials,
                shuffle_both=args.ab == "plancache",
            )
            result["geomean_shuffle_over_matched_before"] = _geomean(
                [r["shuffle_over_matched_before"] for r in result["queries"] if r["kind"] != "filter"]
            )
            result["geomean_shuffle_over_matched_after"] = _geomean(
                [r["shuffle_over_matched_after"] for r in result["queries"] if r["kind"] != "filter"]
            )
            qs = []
        rows = []
        for q in qs:
            sql = QUERIES[q]
            steps = {
                "before": lambda sql=sql: before.sql(sql),
                "after": lambda sql=sql: after.sql(sql),
                "duckdb": lambda sql=sql: con.sql(sql).to_arrow_table(),
            }
            for fn in steps.values():
                fn()  # warm-up
            times: dict[str, list[float]] = {k: [] for k in steps}
            names = list(steps)
            outs: dict[str, Any] = {}
            for k in range(args.trials):
                for name in names[k % 3 :] + names[: k % 3]:
                    t = time.perf_counter()
                    outs[name] = steps[name]()
                    times[name].append(time.perf_counter() - t)
            got, plan = outs["after"]
            want = outs["duckdb"]
            a = _norm([tuple(r.values()) for r in got.to_pylist()])
            b = _norm([tuple(r.values()) for r in want.to_pylist()])
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {
                "query": q,
                "plan": plan.kind,
                "plan_before": outs["before"][1].kind,
                "correct": a == b
                if "order by" in sql.lower()
                else sorted(a, key=repr) == sorted(b, key=repr),
                "semi_joins": [f"{s['table']}.{s['column']} by {s['keys_from']}" for s in plan.semi],
                "replicas_before": outs["before"][1].replicas,
                "replicas_after": plan.replicas,
                **{f"{k}_s": round(v, 4) for k, v in med.items()},
                "before_over_duckdb": round(med["before"] / med["duckdb"], 2),
                "after_over_duckdb": round(med["after"] / med["duckdb"], 2),
            }
            _log(f"q{q}: {row}")
            rows.append(row)
        if rows:
            result["tpch"] = rows
            result["geomean_before_over_duckdb"] = _geomean([r["before_over_duckdb"] for r in rows])
            result["geomean_after_over_duckdb"] = _geomean([r["after_over_duckdb"] for r in rows])
            result["correct"] = sum(r["correct"] for r in rows)
        result["load_average_at_end"] = os.getloadavg()[0]
        transport.close()
        client.close()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


def _model_ab(
    before: Any, after: Any, client: Any, con: Any, trials: int, shuffle_both: bool = False
) -> list[dict[str, Any]]:
    """The JSON-model queries: matched plan before and after, the shuffle plan (after's core;
    ``shuffle_both``: before's too, for a change that touches both plans), DuckDB; a warm-up
    each, then ``trials`` in a rotating order; medians."""
    from microco.services.store import Query

    out = []
    for q in queries(client):
        matched = Query.from_json(q["frame"].to_json())
        shuffle = Query.from_json(q["frame"].on_replica(q["shuffle_replica"]).to_json())
        steps = {
            "before": lambda m=matched: before.query(m),
            "after": lambda m=matched: after.query(m),
            "shuffle": lambda s=shuffle: after.query(s),
            "duckdb": lambda q=q: (con.sql(q["sql"]).to_arrow_table(), None),
        }
        if shuffle_both:
            steps["shuffle_before"] = lambda s=shuffle: before.query(s)
        for fn in steps.values():
            fn()
        times: dict[str, list[float]] = {k: [] for k in steps}
        names = list(steps)
        outs: dict[str, Any] = {}
        for k in range(trials):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                t = time.perf_counter()
                outs[name] = steps[name]()
                times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows = {k: outs[k][0].num_rows for k in steps}
        row = {
            "name": q["name"],
            "kind": q.get("kind", "group_by"),
            "plan": outs["after"][1].kind,
            "shuffle_plan": outs["shuffle"][1].kind,
            **{f"{k}_s": round(v, 4) for k, v in med.items()},
            "shuffle_over_matched_before": round(
                med.get("shuffle_before", med["shuffle"]) / med["before"], 2
            ),
            "shuffle_over_matched_after": round(med["shuffle"] / med["after"], 2),
            "rows_agree": len(set(rows.values())) == 1,
        }
        _log(f"{q['name']}: {row}")
        out.append(row)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
