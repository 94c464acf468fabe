"""TPC-DS through the store's SQL, a held-out suite: its 99 queries on its 24 tables, each answer
checked against DuckDB's on the same Arrow data, with the plan each query got (how many split
over partitions, how many gather at the coordinator) and the time beside DuckDB's.

The query texts and the data generator are DuckDB's ``tpcds`` extension's (the TPC's texts, not
committed here). They come, in this order, from: ``--data DIR`` already holding the tables as
Parquet and ``queries.json`` (``{"1": "select ..."}``); the installed DuckDB's extension, if it
loads offline (``LOAD tpcds``); or ``--site DIR``, a folder holding a DuckDB and the extension for
it installed apart from the project's environment, e.g.

    pip install --target /tmp/tpcds-site duckdb==1.5.5 duckdb-extension-tpcds==1.5.5

run in a subprocess to generate the data. With none of them it says so and exits 0 (skipped).

The store is in process (six nodes, ``LocalTransport``: the same planner and fragments as a
cluster of processes, without the sockets); each table's three replicas are hash-partitioned
on three of its integer columns (``--variant first``: its first three, 4/3/2 partitions;
``last``: its last three, 2/5/3)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

GENERATE = r"""
import json, os, sys, duckdb
out, sf = sys.argv[1], float(sys.argv[2])
con = duckdb.connect()
try:
    con.load_extension("tpcds")
except Exception:
    import duckdb_extension_tpcds as m
    root = os.path.dirname(m.__file__)
    ext = [os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs if f.endswith(".duckdb_extension")]
    con.load_extension(ext[0])
con.sql(f"call dsdgen(sf={sf})")
for (t,) in con.sql("show tables").fetchall():
    con.sql(f"copy {t} to '{out}/{t}.parquet' (format parquet)")
qs = con.sql("select query_nr, query from tpcds_queries()").fetchall()
json.dump({str(n): q for n, q in qs}, open(os.path.join(out, "queries.json"), "w"))
"""


def _log(msg: str) -> None:
    print(f"[bench store-tpcds] {msg}", file=sys.stderr, flush=True)


def obtain(data: Path, sf: float, site: str | None) -> str | None:
    """Make sure ``data`` holds the tables and queries; None, or why they cannot be had."""
    if (data / "queries.json").exists():
        return None
    data.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site  # that folder's DuckDB, not the project's
    else:
        import duckdb

        try:
            duckdb.connect().load_extension("tpcds")
        except duckdb.Error as exc:
            return (
                f"DuckDB's tpcds extension does not load offline ({str(exc).splitlines()[0][:120]}); "
                "give --site DIR with a DuckDB and the extension installed apart "
                "(pip install --target DIR duckdb==1.5.5 duckdb-extension-tpcds==1.5.5) or --data DIR"
            )
    _log(f"generating TPC-DS at SF {sf} into {data}")
    r = subprocess.run(
        [sys.executable, "-c", GENERATE, str(data), str(sf)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0 or not (data / "queries.json").exists():
        return f"generating TPC-DS failed: {r.stderr.strip()[-300:]}"
    return None


def specs_for(schema: Any, variant: str) -> list[str]:
    """Three hash partitionings on integer columns (the first three, or the last three)."""
    import pyarrow as pa

    ints = [f.name for f in schema if pa.types.is_integer(f.type)]
    cols = ints[:3] if variant == "first" else ints[-3:]
    cols = (cols * 3)[:3] if cols else [schema.names[0]] * 3
    counts = (4, 3, 2) if variant == "first" else (2, 5, 3)
    return [f"{c}:hash:{n}" for c, n in zip(cols, counts, strict=True)]


def normalised(table: Any) -> list[tuple]:
    import datetime as dt
    import decimal

    def norm(x: Any) -> Any:
        if isinstance(x, (float, decimal.Decimal)):
            return round(float(x), 2)
        if isinstance(x, dt.datetime):
            return x.isoformat()
        return x

    return [tuple(norm(x) for x in r.values()) for r in table.to_pylist()]


def same(sql: str, got: Any, want: Any) -> bool:
    """Rows (in order when the query orders at its end), names and types equal to DuckDB's."""
    a, b = normalised(got), normalised(want)
    ordered = "order by" in sql.lower()[-400:]
    rows = a == b if ordered else sorted(a, key=repr) == sorted(b, key=repr)
    if not rows and ordered:  # ties in the ORDER BY may come in any order
        rows = sorted(a, key=repr) == sorted(b, key=repr)
    return rows and got.schema.names == want.schema.names and got.schema.types == want.schema.types


def _best(fn: Any, repeat: int) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()  # the first run warms (and fills the plan cache); timed only when alone
    best = time.perf_counter() - t0 if repeat == 0 else float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(
    data: Path,
    variant: str,
    repeat: int,
    only: list[str] | None,
    nodes: int,
    ab: bool = False,
    exchange: str = "auto",
) -> dict[str, Any]:
    import duckdb
    import pyarrow.parquet as pq

    from microco.common.kv import MemoryKV
    from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore, to_plain_strings

    queries = json.loads((data / "queries.json").read_text())
    tables = {p.stem: to_plain_strings(pq.read_table(p)) for p in sorted(data.glob("*.parquet"))}
    con = duckdb.connect()
    con.execute("set threads to 2")
    with tempfile.TemporaryDirectory(prefix="store-tpcds-") as tmp:
        tr = LocalTransport(tmp, [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(nodes)])
        core = StoreCore(MemoryKV(), tr, super_extent_rows=1_000_000, recovery_rate_bytes=0)
        # repartition exchanges: by cost (auto), wherever one applies (on: checks their answers
        # on tables too small for the cost to choose them), or never (off: the gather)
        core.sql_exchange = {"auto": None, "on": True, "off": False}[exchange]
        t0 = time.perf_counter()
        for name, t in tables.items():
            specs = []
            for text in specs_for(t.schema, variant):
                col, kind, n = text.split(":")
                specs.append(PartitionSpec(col, kind, int(n)))
            core.create_table(name, t.schema, specs)
            if t.num_rows:
                core.append(name, t)
            con.register(name, t)
        _log(f"loaded {len(tables)} tables in {time.perf_counter() - t0:.1f} s")
        rows = []
        for q, sql in sorted(queries.items(), key=lambda kv: int(kv[0])):
            if only and q not in only:
                continue
            row: dict[str, Any] = {"query": int(q), "correct": False}
            try:
                if ab:  # the same query without staged plans (gathered whole), interleaved
                    core.sql_staging = False
                    off_s, (off, off_plan) = _best(
                        lambda sql=sql: core.sql(f"/* no staging */ {sql}"), repeat
                    )
                    core.sql_staging = True
                    row.update(unstaged_plan=off_plan.kind, unstaged_s=round(off_s, 4))
                store_s, (got, plan) = _best(lambda sql=sql: core.sql(sql), repeat)
                duck_s, want = _best(lambda sql=sql: con.sql(sql).to_arrow_table(), repeat)
                row.update(
                    correct=same(sql, got, want),
                    plan=plan.kind,
                    stages=[s.kind for _, s in plan.stages],
                    rows=got.num_rows,
                    store_s=round(store_s, 4),
                    duckdb_s=round(duck_s, 4),
                )
            except Exception as exc:  # noqa: BLE001 - reported per query
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            _log(str(row))
            rows.append(row)
    timed = [r for r in rows if r.get("store_s") and r.get("duckdb_s")]
    geo = math.exp(sum(math.log(r["store_s"] / r["duckdb_s"]) for r in timed) / len(timed)) if timed else None
    both = [r for r in timed if r.get("unstaged_s") and r.get("plan") == "staged"]
    staged_gain = (
        math.exp(sum(math.log(r["unstaged_s"] / r["store_s"]) for r in both) / len(both)) if both else None
    )
    return {
        "variant": variant,
        "staged_speedup_vs_gather": round(staged_gain, 3) if staged_gain else None,
        "staged_timed": len(both),
        "queries": rows,
        "correct": sum(r["correct"] for r in rows),
        "total": len(rows),
        "plans": dict(Counter(r.get("plan", "error") for r in rows)),
        "gathered": sum(r.get("plan") == "gather" for r in rows),
        "exchange": exchange,
        "with_exchange": sum(r.get("plan") == "exchange" or "exchange" in r.get("stages", []) for r in rows),
        "geomean_store_over_duckdb": round(geo, 3) if geo else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m microco.benchmarks.store_tpcds", description=__doc__)
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--data", type=Path, help="folder of the tables (Parquet) and queries.json")
    ap.add_argument("--site", help="a folder with a DuckDB and its tpcds extension (pip install --target)")
    ap.add_argument(
        "--variant", action="append", choices=["first", "last"], help="repeatable; default: first"
    )
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per query after a warm-up (best)")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--query", action="append", help="only these query numbers (repeatable)")
    ap.add_argument(
        "--ab", action="store_true", help="also time each query without staged plans (interleaved)"
    )
    ap.add_argument(
        "--exchange",
        choices=["auto", "on", "off"],
        default="auto",
        help="SQL repartition exchanges: by cost, wherever one applies, or never",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    data = a.data or Path(tempfile.gettempdir()) / f"microco-tpcds-sf{a.sf}"
    why = obtain(data, a.sf, a.site)
    if why is not None:
        out: dict[str, Any] = {"skipped": why}
        print(json.dumps(out) if a.json else f"skipped: {why}")
        return 0
    results = [run(data, v, a.repeat, a.query, a.nodes, a.ab, a.exchange) for v in a.variant or ["first"]]
    if a.json:
        print(json.dumps({"sf": a.sf, "results": results}, indent=1))
    else:
        for r in results:
            print(
                f"{r['variant']}: {r['correct']}/{r['total']} correct, plans {r['plans']}, "
                f"{r['with_exchange']} with an exchange, "
                f"geomean store/DuckDB {r['geomean_store_over_duckdb']}, "
                f"staged vs gathered {r['staged_speedup_vs_gather']}x over {r['staged_timed']} queries"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
