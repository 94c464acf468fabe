"""The h2o.ai db-benchmark's group-by and join questions through the store's SQL: a public query
suite the SQL was not written against (the held-out check of docs/store.md, beside the SSB and
TPC-DS). Its ten group-by questions over one table ``x`` of ``N`` rows as its generator draws
them (``groupby-datagen.R``: ``id1``/``id2`` one of ``K`` strings, ``id3`` one of ``N/K``
strings, ``id4``/``id5`` one of ``K`` integers, ``id6`` one of ``N/K``, ``v1`` 1-5, ``v2`` 1-15,
``v3`` uniform 0-100 rounded to 6 digits; ``--nas`` a share of each id and value null), and
its five join questions over tables of its join task's shapes (``xj`` of ``N`` rows joined with
``small``, ``medium`` and ``big`` tables on integer and string keys, some keys unmatched), each
written as the suite's DuckDB solution writes it (``x.*`` beside the other side's columns,
``USING``). Every answer is checked against DuckDB on the same data (doubles to 1e-9 relative, NaN
equal to NaN: sums of doubles in another order); the time beside DuckDB's.

``python -m microco.benchmarks.store_h2o`` loads a cluster of real processes (``microco bench
store --h2o``); the unit test runs the questions at a small ``N`` in process."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

K = 100

GROUPBY: dict[str, str] = {
    "q1": "SELECT id1, sum(v1) AS v1 FROM x GROUP BY id1",
    "q2": "SELECT id1, id2, sum(v1) AS v1 FROM x GROUP BY id1, id2",
    "q3": "SELECT id3, sum(v1) AS v1, avg(v3) AS v3 FROM x GROUP BY id3",
    "q4": "SELECT id4, avg(v1) AS v1, avg(v2) AS v2, avg(v3) AS v3 FROM x GROUP BY id4",
    "q5": "SELECT id6, sum(v1) AS v1, sum(v2) AS v2, sum(v3) AS v3 FROM x GROUP BY id6",
    "q6": "SELECT id4, id5, median(v3) AS median_v3, stddev(v3) AS sd_v3 FROM x GROUP BY id4, id5",
    "q7": "SELECT id3, max(v1)-min(v2) AS range_v1_v2 FROM x GROUP BY id3",
    "q8": (
        "SELECT id6, v3 AS largest2_v3 FROM (SELECT id6, v3, row_number() OVER (PARTITION BY id6 "
        "ORDER BY v3 DESC) AS order_v3 FROM x WHERE v3 IS NOT NULL) sub_query WHERE order_v3 <= 2"
    ),
    "q9": "SELECT id2, id4, pow(corr(v1, v2), 2) AS r2_v1_v2 FROM x GROUP BY id2, id4",
    "q10": (
        "SELECT id1, id2, id3, id4, id5, id6, sum(v3) AS v3, count(*) AS count FROM x "
        "GROUP BY id1, id2, id3, id4, id5, id6"
    ),
}
JOIN: dict[str, str] = {
    "j1": "SELECT xj.*, small.id4 AS small_id4, v2 FROM xj JOIN small USING (id1)",
    "j2": (
        "SELECT xj.*, medium.id1 AS medium_id1, medium.id4 AS medium_id4, medium.id5 AS medium_id5, v2 "
        "FROM xj JOIN medium USING (id2)"
    ),
    "j3": (
        "SELECT xj.*, medium.id1 AS medium_id1, medium.id4 AS medium_id4, medium.id5 AS medium_id5, v2 "
        "FROM xj LEFT JOIN medium USING (id2)"
    ),
    "j4": (
        "SELECT xj.*, medium.id1 AS medium_id1, medium.id2 AS medium_id2, medium.id4 AS medium_id4, v2 "
        "FROM xj JOIN medium USING (id5)"
    ),
    "j5": (
        "SELECT xj.*, big.id1 AS big_id1, big.id2 AS big_id2, big.id4 AS big_id4, big.id5 AS big_id5, "
        "big.id6 AS big_id6, v2 FROM xj JOIN big USING (id3)"
    ),
}
QUERIES = {**GROUPBY, **JOIN}

# Each table's three replicas, as a user would place them for these questions: the group-by
# table on three of its keys (q8's window and q3/q5/q7's groups keyed by a replica), the join
# tables on their join keys (j5's big join co-partitioned)
PARTITIONING: dict[str, list[str]] = {
    "x": ["id1:hash:4", "id3:hash:4", "id6:hash:4"],
    "xj": ["id1:hash:4", "id2:hash:4", "id3:hash:4"],
    "small": ["id1:hash:2", "id4:hash:2", "id1:hash:2"],
    "medium": ["id2:hash:4", "id5:hash:4", "id1:hash:2"],
    "big": ["id3:hash:4", "id1:hash:4", "id6:hash:4"],
}


def _nulls(rng: np.random.Generator, a: pa.Array, share: float) -> pa.Array:
    if share <= 0:
        return a
    import pyarrow.compute as pc

    return pc.if_else(pa.array(rng.random(len(a)) >= share), a, pa.scalar(None, a.type))


def groupby_table(n: int, nas: float = 0.0, seed: int = 108) -> pa.Table:
    """The group-by question's table ``x``, drawn as ``groupby-datagen.R`` draws it."""
    rng = np.random.default_rng(seed)

    def ids(fmt: str, hi: int) -> pa.Array:
        return pa.array(np.char.mod(fmt, rng.integers(1, hi + 1, n)).astype(object), pa.string())

    cols = {
        "id1": ids("id%03d", K),
        "id2": ids("id%03d", K),
        "id3": ids("id%010d", max(1, n // K)),
        "id4": pa.array(rng.integers(1, K + 1, n), pa.int32()),
        "id5": pa.array(rng.integers(1, K + 1, n), pa.int32()),
        "id6": pa.array(rng.integers(1, max(1, n // K) + 1, n), pa.int32()),
        "v1": pa.array(rng.integers(1, 6, n), pa.int32()),
        "v2": pa.array(rng.integers(1, 16, n), pa.int32()),
        "v3": pa.array(np.round(rng.uniform(0, 100, n), 6)),
    }
    return pa.table({k: _nulls(rng, v, nas) for k, v in cols.items()})


def join_tables(n: int, seed: int = 109) -> dict[str, pa.Table]:
    """The join questions' tables: ``xj`` (``n`` rows) and ``small``/``medium``/``big`` of the
    join task's shapes, integer keys with string copies (``id4``-``id6``), about one key in ten
    of ``xj`` matching nothing."""
    rng = np.random.default_rng(seed)
    n_small, n_medium = max(10, n // 100_000), max(10, n // 1000)

    def keyed(count: int, extra: dict[str, Any]) -> pa.Table:
        k1 = rng.integers(1, n_small + 1, count)
        cols: dict[str, Any] = {"id1": pa.array(k1, pa.int32()), **extra}
        cols["id4"] = pa.array(np.char.mod("id%d", k1).astype(object), pa.string())
        cols["v2"] = pa.array(np.round(rng.uniform(0, 100, count), 6))
        return pa.table(cols)

    k2 = rng.permutation(n_medium) + 1
    medium = keyed(
        n_medium,
        {
            "id2": pa.array(k2, pa.int32()),
            "id5": pa.array(np.char.mod("id%d", k2).astype(object), pa.string()),
        },
    )
    k3 = rng.permutation(n) + 1
    big = keyed(
        n,
        {
            "id2": pa.array(rng.integers(1, n_medium + 1, n), pa.int32()),
            "id3": pa.array(k3, pa.int32()),
            "id5": pa.array(
                np.char.mod("id%d", rng.integers(1, n_medium + 1, n)).astype(object), pa.string()
            ),
            "id6": pa.array(np.char.mod("id%d", k3).astype(object), pa.string()),
        },
    )
    small = pa.table(
        {
            "id1": pa.array(np.arange(1, n_small + 1), pa.int32()),
            "id4": pa.array(np.char.mod("id%d", np.arange(1, n_small + 1)).astype(object), pa.string()),
            "v2": pa.array(np.round(rng.uniform(0, 100, n_small), 6)),
        }
    )
    x2 = rng.integers(1, int(n_medium * 1.1) + 1, n)
    xj = pa.table(
        {
            "id1": pa.array(rng.integers(1, int(n_small * 1.1) + 1, n), pa.int32()),
            "id2": pa.array(x2, pa.int32()),
            "id3": pa.array(rng.integers(1, int(n * 1.1) + 1, n), pa.int32()),
            "id5": pa.array(np.char.mod("id%d", x2).astype(object), pa.string()),
            "v1": pa.array(np.round(rng.uniform(0, 100, n), 6)),
        }
    )
    return {"xj": xj, "small": small, "medium": medium, "big": big}


def tables(n: int, nas: float = 0.0) -> dict[str, pa.Table]:
    return {"x": groupby_table(n, nas), **join_tables(n)}


def _close(x: float | None, y: float | None, rel: float) -> bool:
    if x is None or y is None:
        return x is y
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)  # (a correlation over one row: NaN both ways)
    return math.isclose(x, y, rel_tol=rel, abs_tol=1e-12)  # (a correlation of 0 as 1e-32)


def same(got: pa.Table, want: pa.Table, rel: float = 1e-9) -> bool:
    """The same rows in any order (none of the questions orders), the same names and types,
    doubles equal to ``rel`` (a sum of doubles in another order differs in its last digits)."""
    if got.schema.names != want.schema.names or got.schema.types != want.schema.types:
        return False
    if got.num_rows != want.num_rows:
        return False
    order = [(c, "ascending") for c in got.schema.names]
    a, b = got.sort_by(order), want.sort_by(order)
    for name in got.schema.names:
        ca, cb = a[name].to_pylist(), b[name].to_pylist()
        if pa.types.is_floating(got.schema.field(name).type):
            if not all(_close(x, y, rel) for x, y in zip(ca, cb)):
                return False
        elif ca != cb:
            return False
    return True


def _log(msg: str) -> None:
    print(f"[bench store-h2o] {msg}", file=sys.stderr, flush=True)


def run_suite(client: Any, con: Any, repeat: int) -> list[dict[str, Any]]:
    """Every question through the store's SQL and DuckDB, interleaved per question (median of
    ``repeat`` timed runs each, after a warm-up), checked equal."""
    rows = []
    for name, sql in QUERIES.items():
        row: dict[str, Any] = {"query": name, "correct": False, "store_s": None, "duckdb_s": None}
        try:
            got, want = client.sql(sql), con.sql(sql).to_arrow_table()  # (warm-ups, and the answers)
            row["plan"] = client.last_plan.get("kind")
            ts, td = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                client.sql(sql)
                ts.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                con.sql(sql).to_arrow_table()
                td.append(time.perf_counter() - t0)
            store_s, duck_s = float(np.median(ts)), float(np.median(td))
            row.update(
                correct=same(got, want),
                rows=got.num_rows,
                store_s=round(store_s, 4),
                duckdb_s=round(duck_s, 4),
                store_over_duckdb=round(store_s / duck_s, 2),
            )
        except Exception as exc:  # noqa: BLE001 - reported per question
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        _log(str(row))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Load the tables into a cluster of real processes; run the fifteen questions."""
    import duckdb
    import pyarrow.parquet as pq

    from microco.benchmarks.store import _geomean, bench_cluster, load_timeout, parquet_schema
    from microco.clients.store import StoreClient

    ap = argparse.ArgumentParser(prog="microco bench store --h2o", description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="N: rows of x and of xj (default 10^6)")
    ap.add_argument(
        "--nas", type=float, default=0.0, help="share of nulls in x's columns (the suite's 5%%: 0.05)"
    )
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per question after a warm-up (median)")
    ap.add_argument(
        "--data", type=Path, default=Path("/tmp/microco-bench-h2o"), help="where the Parquet files go"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    d = args.data / f"n{args.rows}-na{args.nas:g}"
    d.mkdir(parents=True, exist_ok=True)
    names = ("x", "xj", "small", "medium", "big")
    if not all((d / f"{t}.parquet").exists() for t in names):
        for t, data in tables(args.rows, args.nas).items():
            pq.write_table(data, d / f"{t}.parquet")
    con = duckdb.connect()
    con.execute("set threads = 2")
    for t in names:
        con.execute(f"create view \"{t}\" as select * from read_parquet('{d / t}.parquet')")
    result: dict[str, Any] = {
        "rows": args.rows,
        "nas": args.nas,
        "nodes": args.nodes,
        "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_at_start": os.getloadavg()[0],
    }
    coordinator_args = [*("--recovery-rate-mb", "0", "--recovery-interval-s", "3600")]
    with bench_cluster("microco-bench-h2o-", args.nodes, coordinator_args) as cluster:
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
        t0 = time.perf_counter()
        for t in names:
            path = d / f"{t}.parquet"
            client.create_table(t, parquet_schema(path), PARTITIONING[t])
            client.append(t, path, timeout=load_timeout(path))
        result["load_s"] = round(time.perf_counter() - t0, 1)
        _log(f"loaded in {result['load_s']} s")
        rows = run_suite(client, con, args.repeat)
    ok = [r for r in rows if r["correct"]]
    result.update(
        correct=f"{len(ok)}/{len(rows)}",
        geomean_store_over_duckdb=_geomean([r["store_over_duckdb"] for r in ok]) if ok else None,
        queries=rows,
        end_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        load_average_at_end=os.getloadavg()[0],
    )
    print(json.dumps(result, indent=1) if args.json else result)
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
