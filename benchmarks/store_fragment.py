"""Which engine runs the store's node fragments: TPC-H Q1's scan + filter + partial aggregate over
one lineitem table, DuckDB (a cursor of the process's shared database, as the store runs it) vs
pyarrow compute / Acero (group_by().aggregate), interleaved, best of 5. JSON on stdout.

    python -m microco.benchmarks.store_fragment lineitem.parquet

Acero cannot evaluate Q1's charge expression on the decimal128(15, 2) columns (the product's
precision, 49 digits, exceeds 38), so its side casts to float64 first: not the same answer."""
import datetime
import json
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from microco.services.store._exec import to_plain_strings
from microco.services.store._sql import duck as shared_db

t = to_plain_strings(pq.read_table(sys.argv[1], columns=["l_returnflag","l_linestatus","l_quantity","l_extendedprice","l_discount","l_tax","l_shipdate"]))
SQL = """select l_returnflag, l_linestatus, sum(l_quantity) a, sum(l_extendedprice) b,
 sum(l_extendedprice*(1-l_discount)) c, sum(l_extendedprice*(1-l_discount)*(1+l_tax)) d, count(*) n
 from t where l_shipdate <= date '1998-09-02' group by l_returnflag, l_linestatus"""
def duck():
    con = shared_db(); con.register("t", t)
    r = con.sql(SQL).to_arrow_table(); con.close(); return r
def acero():
    f = t.filter(pc.field("l_shipdate") <= pc.scalar(datetime.date(1998, 9, 2)))
    # decimal128 arithmetic overflows precision here (15,2)^3 -> 49 digits: Acero needs floats
    one = 1.0
    price, d_, tax = (f[c].cast(pa.float64()) for c in ("l_extendedprice", "l_discount", "l_tax"))
    disc = pc.multiply(price, pc.subtract(one, d_))
    charge = pc.multiply(disc, pc.add(one, tax))
    g = pa.table({"l_returnflag": f["l_returnflag"], "l_linestatus": f["l_linestatus"], "a": f["l_quantity"],
                  "b": f["l_extendedprice"], "c": disc, "d": charge})
    return g.group_by(["l_returnflag", "l_linestatus"]).aggregate([("a","sum"),("b","sum"),("c","sum"),("d","sum"),([], "count_all")])
res = {"rows": t.num_rows, "duckdb_s": [], "acero_s": []}
for _ in range(5):
    for name, fn in (("duckdb_s", duck), ("acero_s", acero)):
        t0 = time.perf_counter(); fn(); res[name].append(time.perf_counter() - t0)
res = {k: (min(v) if isinstance(v, list) else v) for k, v in res.items()}
res["acero_over_duckdb"] = round(res["acero_s"] / res["duckdb_s"], 2)
print(json.dumps(res))
