"""Which engine runs the store's node fragments: TPC-H Q1's scan + filter + partial aggregate over
one lineitem table, DuckDB (a cursor of the process's shared database, as the store runs it) vs
pyarrow compute / Acero (group_by().aggregate), interleaved, 9 rounds; the medians and the median of the paired ratios. JSON on stdout.

    python -m microco.benchmarks.store_fragment lineitem.parquet

Acero cannot evaluate Q1's charge expression on the decimal128(15, 2) columns (the product's
precision, 49 digits, exceeds 38), so its side casts to float64 first: not the same answer."""

import datetime
import json
import statistics
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from microco.services.store import duck as shared_db
from microco.services.store import to_plain_strings

COLUMNS = [
    "l_returnflag",
    "l_linestatus",
    "l_quantity",
    "l_extendedprice",
    "l_discount",
    "l_tax",
    "l_shipdate",
]
SQL = """select l_returnflag, l_linestatus, sum(l_quantity) a, sum(l_extendedprice) b,
 sum(l_extendedprice*(1-l_discount)) c, sum(l_extendedprice*(1-l_discount)*(1+l_tax)) d, count(*) n
 from t where l_shipdate <= date '1998-09-02' group by l_returnflag, l_linestatus"""


def run_duckdb(t: pa.Table) -> pa.Table:
    con = shared_db()
    con.register("t", t)
    r = con.sql(SQL).to_arrow_table()
    con.close()
    return r


def run_acero(t: pa.Table) -> pa.Table:
    f = t.filter(pc.field("l_shipdate") <= pc.scalar(datetime.date(1998, 9, 2)))
    # decimal128 arithmetic overflows precision here ((15,2)^3 -> 49 digits): Acero needs floats
    price, d_, tax = (f[c].cast(pa.float64()) for c in ("l_extendedprice", "l_discount", "l_tax"))
    disc = pc.multiply(price, pc.subtract(1.0, d_))
    charge = pc.multiply(disc, pc.add(1.0, tax))
    g = pa.table(
        {"l_returnflag": f["l_returnflag"], "l_linestatus": f["l_linestatus"], "a": f["l_quantity"],
         "b": f["l_extendedprice"], "c": disc, "d": charge}
    )  # fmt: skip
    aggs = [("a", "sum"), ("b", "sum"), ("c", "sum"), ("d", "sum"), ([], "count_all")]
    return g.group_by(["l_returnflag", "l_linestatus"]).aggregate(aggs)


def measure(path: str, rounds: int = 9) -> dict[str, Any]:
    t = to_plain_strings(pq.read_table(path, columns=COLUMNS))
    duck_s: list[float] = []
    acero_s: list[float] = []
    for _ in range(rounds):  # interleaved: both engines see the same machine load
        for out, fn in ((duck_s, run_duckdb), (acero_s, run_acero)):
            t0 = time.perf_counter()
            fn(t)
            out.append(time.perf_counter() - t0)
    return {
        "rows": t.num_rows,
        "rounds": rounds,
        "duckdb_s": statistics.median(duck_s),
        "acero_s": statistics.median(acero_s),
        "acero_over_duckdb": round(statistics.median(a / d for a, d in zip(acero_s, duck_s)), 2),
    }


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m microco.benchmarks.store_fragment lineitem.parquet")
    print(json.dumps(measure(sys.argv[1])))


if __name__ == "__main__":
    main()
