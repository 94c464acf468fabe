"""The Star Schema Benchmark (O'Neil, O'Neil, Chen: "Star Schema Benchmark", revision 3, 2009):
its 13 queries Q1.1-Q4.3 as the paper prints them, and its five tables derived from TPC-H data the
way the paper's ``dbgen`` derives them (``lineorder`` is ``lineitem`` joined with ``orders`` and
``partsupp``; ``customer``/``supplier`` take their nation and region names and a city of nine
letters of the nation and a digit; ``part`` its manufacturer, category and brand as ``MFGR#m``,
``MFGR#mc``, ``MFGR#mcb``; ``date`` one row per day of 1992-1998).

A query suite the store's SQL was not written against (the held-out check of docs/store.md): the
unit test runs it at SF 0.05 in process under each partitioning, ``microco bench store --ssb``
(``python -m microco.benchmarks.store_ssb``) on a cluster of real processes, each result against DuckDB on the
same data."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TABLES = ("lineorder", "date", "customer", "supplier", "part")

# The 13 queries, as printed in the paper (section 3), with its selectivity constants.
QUERIES: dict[str, str] = {
    "Q1.1": """
select sum(lo_extendedprice*lo_discount) as revenue
from lineorder, date
where lo_orderdate = d_datekey and d_year = 1993 and lo_discount between 1 and 3 and lo_quantity < 25""",
    "Q1.2": """
select sum(lo_extendedprice*lo_discount) as revenue
from lineorder, date
where lo_orderdate = d_datekey and d_yearmonthnum = 199401
  and lo_discount between 4 and 6 and lo_quantity between 26 and 35""",
    "Q1.3": """
select sum(lo_extendedprice*lo_discount) as revenue
from lineorder, date
where lo_orderdate = d_datekey and d_weeknuminyear = 6 and d_year = 1994
  and lo_discount between 5 and 7 and lo_quantity between 26 and 35""",
    "Q2.1": """
select sum(lo_revenue), d_year, p_brand1
from lineorder, date, part, supplier
where lo_orderdate = d_datekey and lo_partkey = p_partkey and lo_suppkey = s_suppkey
  and p_category = 'MFGR#12' and s_region = 'AMERICA'
group by d_year, p_brand1
order by d_year, p_brand1""",
    "Q2.2": """
select sum(lo_revenue), d_year, p_brand1
from lineorder, date, part, supplier
where lo_orderdate = d_datekey and lo_partkey = p_partkey and lo_suppkey = s_suppkey
  and p_brand1 between 'MFGR#2221' and 'MFGR#2228' and s_region = 'ASIA'
group by d_year, p_brand1
order by d_year, p_brand1""",
    "Q2.3": """
select sum(lo_revenue), d_year, p_brand1
from lineorder, date, part, supplier
where lo_orderdate = d_datekey and lo_partkey = p_partkey and lo_suppkey = s_suppkey
  and p_brand1 = 'MFGR#2239' and s_region = 'EUROPE'
group by d_year, p_brand1
order by d_year, p_brand1""",
    "Q3.1": """
select c_nation, s_nation, d_year, sum(lo_revenue) as revenue
from customer, lineorder, supplier, date
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_orderdate = d_datekey
  and c_region = 'ASIA' and s_region = 'ASIA' and d_year >= 1992 and d_year <= 1997
group by c_nation, s_nation, d_year
order by d_year asc, revenue desc""",
    "Q3.2": """
select c_city, s_city, d_year, sum(lo_revenue) as revenue
from customer, lineorder, supplier, date
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_orderdate = d_datekey
  and c_nation = 'UNITED STATES' and s_nation = 'UNITED STATES' and d_year >= 1992 and d_year <= 1997
group by c_city, s_city, d_year
order by d_year asc, revenue desc""",
    "Q3.3": """
select c_city, s_city, d_year, sum(lo_revenue) as revenue
from customer, lineorder, supplier, date
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_orderdate = d_datekey
  and (c_city = 'UNITED KI1' or c_city = 'UNITED KI5') and (s_city = 'UNITED KI1' or s_city = 'UNITED KI5')
  and d_year >= 1992 and d_year <= 1997
group by c_city, s_city, d_year
order by d_year asc, revenue desc""",
    "Q3.4": """
select c_city, s_city, d_year, sum(lo_revenue) as revenue
from customer, lineorder, supplier, date
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_orderdate = d_datekey
  and (c_city = 'UNITED KI1' or c_city = 'UNITED KI5') and (s_city = 'UNITED KI1' or s_city = 'UNITED KI5')
  and d_yearmonth = 'Dec1997'
group by c_city, s_city, d_year
order by d_year asc, revenue desc""",
    "Q4.1": """
select d_year, c_nation, sum(lo_revenue - lo_supplycost) as profit
from date, customer, supplier, part, lineorder
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_partkey = p_partkey and lo_orderdate = d_datekey
  and c_region = 'AMERICA' and s_region = 'AMERICA' and (p_mfgr = 'MFGR#1' or p_mfgr = 'MFGR#2')
group by d_year, c_nation
order by d_year, c_nation""",
    "Q4.2": """
select d_year, s_nation, p_category, sum(lo_revenue - lo_supplycost) as profit
from date, customer, supplier, part, lineorder
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_partkey = p_partkey and lo_orderdate = d_datekey
  and c_region = 'AMERICA' and s_region = 'AMERICA' and (d_year = 1997 or d_year = 1998)
  and (p_mfgr = 'MFGR#1' or p_mfgr = 'MFGR#2')
group by d_year, s_nation, p_category
order by d_year, s_nation, p_category""",
    "Q4.3": """
select d_year, s_city, p_brand1, sum(lo_revenue - lo_supplycost) as profit
from date, customer, supplier, part, lineorder
where lo_custkey = c_custkey and lo_suppkey = s_suppkey and lo_partkey = p_partkey and lo_orderdate = d_datekey
  and c_region = 'AMERICA' and s_nation = 'UNITED STATES' and (d_year = 1997 or d_year = 1998)
  and p_category = 'MFGR#14'
group by d_year, s_city, p_brand1
order by d_year, s_city, p_brand1""",
}

# Partitionings to run the suite under: each is three replicas per table. "keys" partitions every
# table by its key (lineorder by each of its three foreign keys, so a join with a dimension can be
# co-partitioned); "dims" partitions the fact table by order key, date and customer, the dimensions
# by the attributes the queries filter and group on.
PARTITIONINGS: dict[str, dict[str, list[str]]] = {
    "keys": {
        "lineorder": ["lo_custkey:hash:4", "lo_partkey:hash:4", "lo_suppkey:hash:4"],
        "customer": ["c_custkey:hash:4", "c_region:hash:2", "c_nation:hash:2"],
        "supplier": ["s_suppkey:hash:4", "s_region:hash:2", "s_nation:hash:2"],
        "part": ["p_partkey:hash:4", "p_category:hash:2", "p_mfgr:hash:2"],
        "date": ["d_datekey:hash:2", "d_year:hash:2", "d_yearmonth:hash:2"],
    },
    "dims": {
        "lineorder": [
            "lo_orderkey:hash:4",
            "lo_orderdate:range:19930101,19950101,19970101",
            "lo_custkey:hash:3",
        ],
        "customer": ["c_region:hash:3", "c_city:hash:2", "c_custkey:hash:3"],
        "supplier": ["s_nation:hash:2", "s_city:hash:3", "s_region:hash:2"],
        "part": ["p_brand1:hash:3", "p_mfgr:hash:2", "p_partkey:hash:2"],
        "date": ["d_year:range:1994,1996", "d_datekey:range:19950101", "d_weeknuminyear:hash:2"],
    },
}

# One DuckDB statement per table over the TPC-H tables (registered under their names).
_DERIVE: dict[str, str] = {
    "lineorder": """
select l_orderkey::int as lo_orderkey, l_linenumber::int as lo_linenumber, o_custkey::int as lo_custkey,
       l_partkey::int as lo_partkey, l_suppkey::int as lo_suppkey,
       (year(o_orderdate) * 10000 + month(o_orderdate) * 100 + day(o_orderdate))::int as lo_orderdate,
       o_orderpriority as lo_orderpriority, o_shippriority::int as lo_shippriority,
       l_quantity::int as lo_quantity, l_extendedprice as lo_extendedprice, o_totalprice as lo_ordtotalprice,
       (l_discount * 100)::int as lo_discount,
       (l_extendedprice * (100 - (l_discount * 100)::int) / 100)::decimal(15, 2) as lo_revenue,
       ps_supplycost as lo_supplycost, (l_tax * 100)::int as lo_tax,
       (year(l_commitdate) * 10000 + month(l_commitdate) * 100 + day(l_commitdate))::int as lo_commitdate,
       l_shipmode as lo_shipmode
from lineitem join orders on l_orderkey = o_orderkey
     join partsupp on l_partkey = ps_partkey and l_suppkey = ps_suppkey
order by l_orderkey, l_linenumber""",
    "customer": """
select c_custkey::int as c_custkey, c_name, c_address,
       rpad(substr(n_name, 1, 9), 9, ' ') || (c_custkey % 10)::varchar as c_city,
       n_name as c_nation, r_name as c_region, c_phone, c_mktsegment
from customer join nation on c_nationkey = n_nationkey join region on n_regionkey = r_regionkey
order by c_custkey""",
    "supplier": """
select s_suppkey::int as s_suppkey, s_name, s_address,
       rpad(substr(n_name, 1, 9), 9, ' ') || (s_suppkey % 10)::varchar as s_city,
       n_name as s_nation, r_name as s_region, s_phone
from supplier join nation on s_nationkey = n_nationkey join region on n_regionkey = r_regionkey
order by s_suppkey""",
    "part": """
select p_partkey::int as p_partkey, p_name,
       'MFGR#' || m as p_mfgr, 'MFGR#' || m || c as p_category,
       'MFGR#' || m || c || (1 + p_partkey % 40)::varchar as p_brand1,
       split_part(p_name, ' ', 1) as p_color, p_type, p_size::int as p_size, p_container
from (select *, right(p_mfgr, 1) as m, right(p_brand, 1) as c from part)
order by p_partkey""",
    "date": """
select (year(d) * 10000 + month(d) * 100 + day(d))::int as d_datekey,
       strftime(d, '%B %-d, %Y') as d_date, dayname(d) as d_dayofweek, monthname(d) as d_month,
       year(d)::int as d_year, (year(d) * 100 + month(d))::int as d_yearmonthnum,
       strftime(d, '%b%Y') as d_yearmonth, isodow(d)::int as d_daynuminweek,
       day(d)::int as d_daynuminmonth, dayofyear(d)::int as d_daynuminyear,
       month(d)::int as d_monthnuminyear, ((dayofyear(d) - 1) // 7 + 1)::int as d_weeknuminyear,
       case when month(d) in (12, 1, 2) then 'Winter' when month(d) in (3, 4, 5) then 'Spring'
            when month(d) in (6, 7, 8) then 'Summer' else 'Fall' end as d_sellingseason,
       isodow(d) = 7 as d_lastdayinweekfl, d = last_day(d) as d_lastdayinmonthfl,
       (month(d) = 12 and day(d) = 25) or (month(d) = 1 and day(d) = 1) as d_holidayfl,
       isodow(d) <= 5 as d_weekdayfl
from (select unnest(range(date '1992-01-01', date '1999-01-01', interval 1 day))::date as d)
order by d""",
}

_SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def derive(tpch_dir: Path, out: Path) -> Path:
    """SSB Parquet files in ``out`` from the TPC-H Parquet files in ``tpch_dir`` (kept if there)."""
    import duckdb

    out = Path(out)
    if all((out / f"{t}.parquet").exists() for t in TABLES):
        return out
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute("set enable_progress_bar = false")
    for t in _SOURCES:
        con.execute(f"create view {t} as select * from read_parquet('{Path(tpch_dir) / t}.parquet')")
    for t in TABLES:
        tmp = out / f"{t}.parquet.tmp"
        con.execute(f"copy ({_DERIVE[t]}) to '{tmp}' (format parquet)")
        tmp.rename(out / f"{t}.parquet")
    con.close()
    return out


def generate(sf: float, out: Path) -> Path:
    """SSB Parquet files at scale ``sf`` under ``out/ssb-sf<sf>`` (from TPC-H at that scale)."""
    from microco.benchmarks.store_tpch import generate as tpch_generate

    return derive(tpch_generate(sf, Path(out)), Path(out) / f"ssb-sf{sf:g}")


def load_ssb(d: Path) -> dict[str, Any]:
    """The SSB tables as Arrow (``string_view`` as ``string``, what the store keeps)."""
    import pyarrow.parquet as pq

    from microco.services.store import to_plain_strings

    return {t: to_plain_strings(pq.read_table(Path(d) / f"{t}.parquet")) for t in TABLES}


def normalised(table: Any) -> list[tuple]:
    """A result's rows with numbers rounded (decimal sums and float sums agree to 4 places)."""
    import decimal

    return [
        tuple(round(float(x), 4) if isinstance(x, (float, decimal.Decimal)) else x for x in r.values())
        for r in table.to_pylist()
    ]


def same(sql: str, got: Any, want: Any) -> bool:
    """The store's answer equals DuckDB's: rows (in order when the query orders), names, types."""
    a, b = normalised(got), normalised(want)
    rows = a == b if "order by" in sql.lower() else sorted(a, key=repr) == sorted(b, key=repr)
    return rows and got.schema.names == want.schema.names and got.schema.types == want.schema.types


def _log(msg: str) -> None:
    print(f"[bench store-ssb] {msg}", file=sys.stderr, flush=True)


def _best(fn: Any, repeat: int) -> tuple[float, Any]:
    out, best = fn(), float("inf")  # the first run warms (and fills the plan cache)
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_suite(client: Any, con: Any, repeat: int) -> list[dict[str, Any]]:
    """Every query through the store's SQL and DuckDB (interleaved per query), checked equal."""
    rows = []
    for name, sql in QUERIES.items():
        row: dict[str, Any] = {"query": name, "correct": False, "store_s": None, "duckdb_s": None}
        try:
            store_s, got = _best(lambda sql=sql: client.sql(sql), repeat)
            row["plan"] = client.last_plan.get("kind")
            duck_s, want = _best(lambda sql=sql: con.sql(sql).to_arrow_table(), repeat)
            row.update(
                correct=same(sql, got, want),
                rows=got.num_rows,
                store_s=round(store_s, 4),
                duckdb_s=round(duck_s, 4),
                store_over_duckdb=round(store_s / duck_s, 2),
            )
        except Exception as exc:  # noqa: BLE001 - reported per query
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        _log(str(row))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Load SSB into a cluster of real processes once per partitioning; run the 13 queries."""
    import duckdb

    from microco.benchmarks.store import _geomean, bench_cluster, load_timeout, parquet_schema
    from microco.clients.store import StoreClient

    ap = argparse.ArgumentParser(prog="microco bench store --ssb", description=__doc__)
    ap.add_argument("--sf", type=float, default=0.1, help="scale factor of the TPC-H data it derives from")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per query after a warm-up (best)")
    ap.add_argument(
        "--partitioning", action="append", choices=sorted(PARTITIONINGS), help="repeatable; default: each"
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=Path("/tmp/microco-bench-tpch"),
        help="where TPC-H and SSB files are kept",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    data = generate(args.sf, args.data)
    con = duckdb.connect()
    con.execute("set threads = 2")
    for t in TABLES:
        con.execute(f"create view \"{t}\" as select * from read_parquet('{data / t}.parquet')")
    result: dict[str, Any] = {
        "sf": args.sf,
        "nodes": args.nodes,
        "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_at_start": os.getloadavg()[0],
        "runs": [],
    }
    coordinator_args = [
        *("--super-extent-rows", "100000000"),  # one super-extent per table: partitions co-locate
        *("--recovery-rate-mb", "0", "--recovery-interval-s", "3600"),
    ]
    for part in args.partitioning or sorted(PARTITIONINGS):
        with bench_cluster("microco-bench-ssb-", args.nodes, coordinator_args) as cluster:
            client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
            t0 = time.perf_counter()
            for t in TABLES:
                path = data / f"{t}.parquet"
                client.create_table(t, parquet_schema(path), PARTITIONINGS[part][t])
                client.append(t, path, timeout=load_timeout(path))
            load_s = time.perf_counter() - t0
            _log(f"{part}: loaded in {load_s:.1f} s")
            rows = run_suite(client, con, args.repeat)
        ok = [r for r in rows if r["correct"]]
        result["runs"].append(
            {
                "partitioning": part,
                "load_s": round(load_s, 1),
                "correct": f"{len(ok)}/{len(rows)}",
                "geomean_store_over_duckdb": _geomean([r["store_over_duckdb"] for r in ok]) if ok else None,
                "queries": rows,
            }
        )
    result["end_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    result["load_average_at_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1) if args.json else result)
    return 0 if all(r["correct"] == f"{len(QUERIES)}/{len(QUERIES)}" for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
