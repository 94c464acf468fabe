"""Instalytics benchmark: matched replica vs forced shuffle vs DuckDB vs PySpark, and recovery.

    microco bench store [--quick] [--sf 1] [--nodes 6] [--json] [--no-spark]

TPC-H (``tpchgen-cli``, offline) is loaded into a store cluster of real processes (store nodes in
three fault domains, a coordinator, etcd). Each group-by and join query runs on the replica whose
partitioning matches it (``matched_s``) and forced onto a replica that does not (``shuffle_s``),
and DuckDB and PySpark (``local[2]``) run the same query on the same Parquet files. Then one store
node is killed with SIGKILL while a group-by that reads from it is in flight (``node_loss``: that
query's time against its healthy median, and its answer against the healthy one;
``store_node_loss.py``), and the node's recovery is timed: bytes read per byte lost (bucketed
rebuild) against what a full scan of the source replica would read. JSON on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from microco.benchmarks.store_node_loss import plan_nodes, query_at_node_loss
from microco.benchmarks.store_tpch import QUERIES as TPCH
from microco.clients.store import file_deadline_s
from microco.common.identity import private_ca_scope

P = 8  # hash partitions per replica


_T0 = time.perf_counter()


def _log(msg: str) -> None:
    print(f"[bench store {time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def generate(sf: float, out: Path) -> Path:
    """TPC-H Parquet files for all eight tables (cached by scale factor)."""
    from microco.benchmarks.store_tpch import generate as tpch_generate

    _log(f"TPC-H sf={sf:g} in {out}")
    return tpch_generate(sf, out)


def tpch_specs(name: str) -> list[str]:
    """The benchmark's partitionings of a TPC-H table: ``P`` hash partitions (shared keys hashed
    alike, so joins on them can be co-partitioned); orders also by year, lineitem by its three
    keys."""
    from microco.benchmarks.store_tpch import REPLICAS

    if name == "orders":
        bounds = ",".join(f"{y}-01-01" for y in range(1993, 1999))
        return [f"o_orderkey:hash:{P}", f"o_custkey:hash:{P}", f"o_orderdate:range:{bounds}"]
    if name == "lineitem":
        return [f"l_orderkey:hash:{P}", f"l_partkey:hash:{P}", f"l_suppkey:hash:{P}"]
    return [r.replace(":hash:4", f":hash:{P}") for r in REPLICAS[name]]


# table -> its replicas' extent codecs (``--replica-codecs``); a table not named: the default
# (zstd) for every replica. The operator's layout choice, like the partitionings: none by default.
REPLICA_CODECS: dict[str, list[str]] = {}


def parse_replica_codecs(text: str) -> tuple[str, list[str]]:
    """``TABLE=C0,C1,C2`` (``--replica-codecs``), each codec zstd, lz4 or none."""
    from microco.clients.store import check_codec
    from microco.common.errors import InvalidArgument

    name, sep, rest = text.partition("=")
    codecs = [c.strip() for c in rest.split(",")]
    if not sep or not name.strip() or len(codecs) != 3:
        raise argparse.ArgumentTypeError(f"give TABLE=CODEC,CODEC,CODEC (one per replica), got {text!r}")
    try:
        return name.strip(), [check_codec(c) for c in codecs]
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_tables(client: Any, data: Path, names: Sequence[str]) -> None:
    """Create and load these TPC-H tables from their Parquet files, partitioned by ``tpch_specs``
    (with their replicas' codecs from ``REPLICA_CODECS`` where given)."""
    for name in names:
        path = data / f"{name}.parquet"
        client.create_table(name, parquet_schema(path), tpch_specs(name), codecs=REPLICA_CODECS.get(name))
        client.append(name, path, timeout=load_timeout(path))


@contextlib.contextmanager
def bench_cluster(
    prefix: str,
    nodes: int,
    coordinator_args: Sequence[str],
    node_args: Sequence[str] = (),
    lease_ttl_s: int = 2,
) -> Iterator[Any]:
    """A store cluster of real processes of the benchmark's own (its CA, etcd, ``nodes`` store
    nodes in three fault domains, a coordinator) under a fresh directory, started; stopped and
    removed on leaving, SIGTERM included (``timeout`` runs the clean-up instead of orphaning it)."""
    from microco.services.stack import EtcdServer
    from microco.services.store import StoreCluster

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix=prefix))
    # The servers it starts are its own: so are their identities, for this cluster's life (a
    # second cluster in the process found the first's CA, removed with its directory, named).
    with private_ca_scope(work / "pki"):
        etcd = EtcdServer(work / "etcd").start()
        cluster = StoreCluster(
            etcd.endpoint,
            work / "store",
            [(f"store-{i}", f"rack{i % 3}") for i in range(nodes)],
            lease_ttl_s=lease_ttl_s,
            node_args=node_args,
            coordinator_args=coordinator_args,
        )
        try:
            _log(f"starting etcd and {nodes} store nodes + a coordinator")
            try:
                cluster.start(
                    timeout=300
                )  # six processes (and a JVM beside) starting on a loaded 2-core machine
            except Exception:
                for f in sorted(
                    (work / "store").glob("*.log")
                ):  # (removed below: what failed, kept in the log)
                    tail = f.read_text(errors="replace").strip().splitlines()[-5:]
                    if tail:
                        _log(f"{f.name}: " + " | ".join(tail)[-1500:])
                raise
            _log("cluster ready")
            yield cluster
        finally:
            cluster.stop()
            etcd.stop()
            shutil.rmtree(work, ignore_errors=True)
            _log("cluster stopped")


def parquet_schema(path: Path) -> Any:
    """A Parquet file's schema as the store keeps it (``string_view`` as ``string``), read
    without its rows: the file itself is appended batch by batch (``StoreClient.append(name,
    path)``), so the benchmark holds one batch, not the table (scale factor 10 needs that)."""
    import pyarrow.parquet as pq

    from microco.services.store import to_plain_strings

    return to_plain_strings(pq.read_schema(path).empty_table()).schema


def parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def load_timeout(path: Path) -> float:
    """Seconds the append of a Parquet file may take: the client's 600 s default, or more for a
    big file (scale factor 10's lineitem, 2.5 GB, took over 600 s to load here and hit it); the
    client's own rule for a file (``file_deadline_s``), which ``microco store load`` uses too."""
    return file_deadline_s(path)


def load_parquet(path: Path) -> Any:
    import pyarrow.parquet as pq

    from microco.services.store import to_plain_strings

    return to_plain_strings(pq.read_table(path))


# name, table, group/join description, matched replica, forced non-matching replica, SQL
def queries(client: Any) -> list[dict[str, Any]]:
    o, li = client.table("orders"), client.table("lineitem")
    return [
        {
            "name": "orders_groupby_custkey",
            "frame": o.group_by("o_custkey").agg(total=("sum", "o_totalprice"), n=("count", "*")),
            "shuffle_replica": 0,
            "sql": "select o_custkey, sum(o_totalprice) total, count(*) n from orders group by o_custkey",
        },
        {
            "name": "orders_groupby_orderdate",
            "frame": o.group_by("o_orderdate").agg(n=("count", "*"), total=("sum", "o_totalprice")),
            "shuffle_replica": 0,
            "sql": "select o_orderdate, count(*) n, sum(o_totalprice) total from orders group by o_orderdate",
        },
        {
            "name": "lineitem_groupby_orderkey",
            "frame": li.group_by("l_orderkey").agg(qty=("sum", "l_quantity"), n=("count", "*")),
            "shuffle_replica": 1,
            "sql": "select l_orderkey, sum(l_quantity) qty, count(*) n from lineitem group by l_orderkey",
        },
        {
            "name": "lineitem_groupby_partkey",
            "frame": li.group_by("l_partkey").agg(rev=("sum", "l_extendedprice"), n=("count", "*")),
            "shuffle_replica": 0,
            "sql": "select l_partkey, sum(l_extendedprice) rev, count(*) n from lineitem group by l_partkey",
        },
        {
            "name": "lineitem_groupby_suppkey",
            "frame": li.group_by("l_suppkey").agg(qty=("sum", "l_quantity"), mx=("max", "l_discount")),
            "shuffle_replica": 0,
            "sql": "select l_suppkey, sum(l_quantity) qty, max(l_discount) mx from lineitem group by l_suppkey",
        },
        {
            "name": "join_orders_lineitem_on_orderkey",
            "frame": o.join(li, "o_orderkey", "l_orderkey")
            .group_by("o_orderpriority")
            .agg(qty=("sum", "l_quantity")),
            "shuffle_replica": 1,
            "sql": "select o_orderpriority, sum(l_quantity) qty from orders join lineitem on o_orderkey = l_orderkey "
            "group by o_orderpriority",
        },
        # filters on a replica's partition column: the matching replica reads the partitions the
        # filter leaves (pruning), another replica scans everything and filters ("shuffle_s" is
        # then that plan: a scan of a replica not partitioned on the column)
        {
            "name": "orders_filter_orderdate_1995",
            "kind": "filter",
            "frame": o.filter("o_orderdate", ">=", "1995-01-01")
            .filter("o_orderdate", "<", "1996-01-01")
            .group_by("o_orderpriority")
            .agg(n=("count", "*"), total=("sum", "o_totalprice")),
            "shuffle_replica": 0,
            "sql": "select o_orderpriority, count(*) n, sum(o_totalprice) total from orders "
            "where o_orderdate >= date '1995-01-01' and o_orderdate < date '1996-01-01' group by o_orderpriority",
        },
        {
            "name": "lineitem_filter_partkey",
            "kind": "filter",
            "frame": li.filter("l_partkey", "=", 1234).select("l_orderkey", "l_quantity", "l_extendedprice"),
            "shuffle_replica": 0,
            "sql": "select l_orderkey, l_quantity, l_extendedprice from lineitem where l_partkey = 1234",
        },
    ]


WARM = True


def _norm(rows: list[tuple]) -> list[tuple]:
    import decimal

    return [
        tuple(round(float(x), 4) if isinstance(x, (float, decimal.Decimal)) else x for x in r) for r in rows
    ]


def tpch_queries(
    client: Any,
    con: Any,
    data: Path,
    sf: float,
    repeat: int,
    spark: _SparkSession | None = None,
    only: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """The 22 TPC-H queries through the store's SQL, each checked against DuckDB on the same Parquet
    files and timed beside it, then in PySpark (interleaved: store, DuckDB, Spark per query; orders
    and lineitem are already loaded; the rest are loaded here, their shared keys hashed like
    lineitem's so joins on them can be co-partitioned)."""
    from microco.benchmarks.store_tpch import REPLICAS

    have = {t["name"] for t in client.list_tables()}
    load_tables(client, data, [n for n in REPLICAS if n not in have])
    out = []
    for q, sql in sorted(TPCH.items()):
        if only and q not in only:
            continue
        row: dict[str, Any] = {
            "query": q,
            "scale": sf,
            "correct": False,
            "store_s": None,
            "duckdb_s": None,
            "spark_s": None,
        }
        try:
            # store, DuckDB and PySpark interleaved, a trial each in turn in a rotating order
            # (every engine warmed up once first, unless --quick): all see the same load
            fns = [lambda sql=sql: client.sql(sql), lambda sql=sql: con.sql(sql).to_arrow_table()]
            if spark is not None and spark.ready():
                fns.append(lambda sql=sql: spark.fetch(sql))
            timed = _interleaved(fns, repeat, client)
            (store_s, got, plan, store_med), (duck_s, want, _, duck_med) = timed[:2]
            row["plan"] = plan.get("kind")
            row["replicas"] = plan.get("replicas")
            # why a replica was read where memory decided (EXPLAIN's lines with the residency)
            row["residency"] = [
                line.strip()[:600] for line in plan.get("explain", "").splitlines() if "in memory" in line
            ][:4]
            row.update(_phases(plan.get("explain", "")))
            row["store_s"], row["duckdb_s"] = round(store_s, 4), round(duck_s, 4)
            # the medians of the same interleaved trials (fixed_cost's ``*_median_s`` are its own)
            row["median_store_s"], row["median_duckdb_s"] = round(store_med, 4), round(duck_med, 4)
            a = _norm([tuple(r.values()) for r in got.to_pylist()])
            b = _norm([tuple(r.values()) for r in want.to_pylist()])
            row["correct"] = (
                a == b if "order by" in sql.lower() else sorted(a, key=repr) == sorted(b, key=repr)
            )
            row["store_over_duckdb"] = round(store_s / duck_s, 2)
            if TRIALS:  # --trials 0 leaves the fixed-cost figures out (scale factor 10's time)
                row.update(fixed_cost(client, con, sql, TRIALS))
            if len(timed) > 2:
                spark_s, spark_med = timed[2][0], timed[2][3]
                row["spark_s"], row["median_spark_s"] = round(spark_s, 4), round(spark_med, 4)
                row["store_over_spark"] = round(store_s / spark_s, 2)
                row["median_store_over_spark"] = round(store_med / spark_med, 2)
        except Exception as exc:  # noqa: BLE001 - reported per query
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        _log(f"tpch q{q}: {row}")
        out.append(row)
    return out


TRIALS = 3  # interleaved trials per query of the plan cache's before/after (medians reported)
_NONCE = [0]


def _uncached(sql: str) -> str:
    """The same query as a text the plan cache has never seen (a leading block comment, which the
    normal form keeps): it is parsed and planned anew, as every query was before the cache."""
    _NONCE[0] += 1
    return f"/* bench {os.getpid()}-{_NONCE[0]} */ {sql}"


def fixed_cost(client: Any, con: Any, sql: str, trials: int) -> dict[str, Any]:
    """The per-query fixed cost, and the plan cache's before/after, measured interleaved.

    Each trial runs, in a rotating order: the query (its plan from the cache), the same query as a
    new text (parsed and planned anew: the cost before the cache), DuckDB; and EXPLAIN of both
    (the round trip and the planning, no data moved: the fixed cost a query pays before its data
    move). Medians over the trials. From the cached run's phases: ``flight_overhead_s``, the
    fragments' wall time less the slowest fragment's own read and run (the Flight round trips and
    the coordinator's waiting), and ``client_overhead_s``, the run's time at the client less the
    coordinator's (gRPC, the result's IPC)."""
    import statistics

    runs: dict[str, list[float]] = {
        k: [] for k in ("cached", "uncached", "duckdb", "fixed", "fixed_uncached")
    }
    phases: list[dict[str, float]] = []
    over: list[float] = []

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    steps = [
        ("cached", lambda: client.sql(sql)),
        ("uncached", lambda: client.sql(_uncached(sql))),
        ("duckdb", lambda: con.sql(sql).to_arrow_table()),
        ("fixed", lambda: client.explain_sql(sql)),
        ("fixed_uncached", lambda: client.explain_sql(_uncached(sql))),
    ]
    for k in range(trials):
        for name, fn in steps[k % len(steps) :] + steps[: k % len(steps)]:
            took = timed(fn)
            runs[name].append(took)
            if name == "cached":
                ph = _phases(client.last_plan.get("explain", ""))
                phases.append(ph)
                over.append(took - sum(ph.get(f"{p}_s", 0.0) for p in ("plan", "fragments", "merge")))
    med = {k: statistics.median(v) for k, v in runs.items()}
    last = phases[-1] if phases else {}
    return {
        "store_median_s": round(med["cached"], 4),
        "store_uncached_median_s": round(med["uncached"], 4),
        "duckdb_median_s": round(med["duckdb"], 4),
        "fixed_s": round(med["fixed"], 4),
        "fixed_uncached_s": round(med["fixed_uncached"], 4),
        "cached_plan_s": round(statistics.median(p.get("plan_s", 0.0) for p in phases), 4),
        "flight_overhead_s": round(
            max(
                0.0,
                last.get("fragments_s", 0.0)
                - last.get("slowest_fragment_read_s", 0.0)
                - last.get("slowest_fragment_run_s", 0.0),
            ),
            4,
        ),
        "client_overhead_s": round(statistics.median(over), 4),
        "trials": trials,
    }


def _phases(explain: str) -> dict[str, float]:
    """The coordinator's seconds per phase of the last run (EXPLAIN's ``timings:`` line)."""
    for line in explain.splitlines():
        if line.startswith("timings: "):
            return {
                f"{k.replace(' ', '_')}_s": float(v)
                for k, v in (p.rsplit(" ", 2)[:2] for p in line[len("timings: ") :].split(", "))
            }
    return {}


def _time(fn: Any, repeat: int) -> tuple[float, Any]:
    if WARM:
        fn()  # warm-up (page cache, connections, Spark's code generation): every engine gets one
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _interleaved(fns: list[Any], repeat: int, client: Any) -> list[tuple[float, Any, dict[str, Any], float]]:
    """Each of ``fns`` warmed up once, then ``repeat`` rounds, each running every one of them
    once in a rotating order; per function the best time, its last result, the client's plan
    of its last run (``{}`` for a function that is not the store's) and the median time."""
    n = len(fns)
    best = [float("inf")] * n
    times: list[list[float]] = [[] for _ in range(n)]
    outs: list[Any] = [None] * n
    plans: list[dict[str, Any]] = [{} for _ in range(n)]

    def run(i: int) -> float:
        before = client.last_plan
        t0 = time.perf_counter()
        outs[i] = fns[i]()
        took = time.perf_counter() - t0
        if client.last_plan is not before:
            plans[i] = dict(client.last_plan)
        return took

    if WARM:
        for i in range(n):
            run(i)
    for k in range(max(1, repeat)):
        for i in [(k + j) % n for j in range(n)]:
            times[i].append(run(i))
            best[i] = min(best[i], times[i][-1])
    return [(best[i], outs[i], plans[i], statistics.median(times[i])) for i in range(n)]


WARM_UP_SQL = (
    "select o_orderpriority, sum(l_quantity) qty from orders join lineitem on o_orderkey = l_orderkey "
    "group by o_orderpriority"
)


class _SparkSession:
    """PySpark ``local[2]`` started (JVM, views, one throwaway warm-up query) on a background
    thread, so its start-up (tens of seconds on 2 cores) overlaps the store's start and load instead
    of adding to the run's wall time. The warm-up is excluded from every timing."""

    def __init__(self, data: Path, small: bool) -> None:
        # Small data (--quick): 2 shuffle partitions, and the JVM's quick-start JIT (C1 only) and
        # serial GC, which halve Spark's start-up here; at scale factor 1 Spark keeps its defaults.
        self.data, self.small = data, small
        self.shuffle_partitions = 2 if small else P
        self.spark: Any = None
        self.error: BaseException | None = None
        self.ready_s: float | None = None
        self._forked = threading.Event()
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._thread.start()
        # PySpark forks its JVM launcher with a preexec_fn; a fork while gRPC threads run (the store
        # cluster's etcd and gRPC clients) breaks the child. So wait until that fork is done (a
        # second or so) before the caller starts anything that speaks gRPC.
        self._forked.wait(timeout=60)

    def _start(self) -> None:
        try:
            import pyspark.java_gateway as gateway
            from pyspark.sql import SparkSession
        except ImportError as exc:
            self.error = exc
            self._forked.set()
            return
        popen = gateway.Popen

        def popen_then_signal(*a: Any, **k: Any) -> Any:
            try:
                return popen(*a, **k)
            finally:
                self._forked.set()

        gateway.Popen = popen_then_signal  # type: ignore[misc,assignment]
        try:
            _log("starting PySpark local[2] (in the background)")
            builder = (
                SparkSession.builder.master("local[2]")
                .appName("microco-bench-store")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", str(self.shuffle_partitions))
                .config("spark.driver.memory", "4g")
            )
            if self.small:
                builder = builder.config(
                    "spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
                )
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            self.spark = spark
            for f in sorted(self.data.glob("*.parquet")):
                spark.read.parquet(str(f)).createOrReplaceTempView(f.stem)
            # one throwaway query that scans, joins and aggregates: warms the JVM's code paths
            df = spark.sql(WARM_UP_SQL)
            df.toArrow() if hasattr(df, "toArrow") else df.collect()
            self.ready_s = time.perf_counter() - _T0
            _log("PySpark ready (warm-up query done, not timed)")
        except BaseException as exc:  # noqa: BLE001 - reported in the JSON
            self.error = exc
        finally:
            gateway.Popen = popen  # type: ignore[misc]
            self._forked.set()

    def ready(self) -> bool:
        """Waits for the start; False when PySpark is not installed, an error when it failed."""
        self._thread.join()
        if self.spark is None or self.error is not None:
            if isinstance(self.error, ImportError):
                return False
            raise RuntimeError(f"PySpark did not start: {self.error}")
        return True

    def fetch(self, sql: str) -> Any:
        """``sql``'s every row, fetched as Arrow (after :meth:`ready`)."""
        assert self.spark is not None
        return self.spark.sql(sql).toArrow()

    def run(self, qs: list[dict[str, Any]], repeat: int) -> dict[str, float | None]:
        if not self.ready():
            return {q["name"]: None for q in qs}
        spark = self.spark
        # every result row comes back to the client as Arrow, as the store's client gets them
        # (toArrow, Spark >= 4; collect() of Python rows would mostly measure pickling)
        fetch = (
            (lambda df: df.toArrow())
            if hasattr(spark.sql("select 1"), "toArrow")
            else (lambda df: df.collect())
        )
        out: dict[str, float | None] = {}
        for q in qs:
            t, _ = _time(lambda q=q: fetch(spark.sql(q["sql"])), repeat)
            out[q["name"]] = t
            _log(f"spark {q['name']}: {t:.3f}s")
        return out

    def stop(self) -> None:
        self._thread.join()
        if self.spark is not None:
            self.spark.stop()


def _query_numbers(text: str) -> list[int]:
    """``--tpch-queries``: comma-separated TPC-H query numbers, each 1-22."""
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of query numbers: {text!r}") from None
    bad = [q for q in got if q not in TPCH]
    if not got or bad:
        raise argparse.ArgumentTypeError(f"TPC-H queries are 1-22, got {text!r}")
    return got


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--ssb" in argv:  # the Star Schema Benchmark instead (its own options: --ssb --help)
        from microco.benchmarks.store_ssb import main as ssb_main

        return ssb_main([a for a in argv if a != "--ssb"])
    if "--h2o" in argv:  # the h2o.ai db-benchmark's questions instead (--h2o --help)
        from microco.benchmarks.store_h2o import main as h2o_main

        return h2o_main([a for a in argv if a != "--h2o"])
    ap = argparse.ArgumentParser(
        prog="microco bench store", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ssb",
        action="store_true",
        help="run the Star Schema Benchmark's 13 queries instead (benchmarks/store_ssb.py; see --ssb --help)",
    )
    ap.add_argument(
        "--h2o",
        action="store_true",
        help="run the h2o.ai db-benchmark's group-by and join questions instead (benchmarks/store_h2o.py; --h2o --help)",
    )
    ap.add_argument("--quick", action="store_true", help="scale factor 0.01, one timed run (under a minute)")
    ap.add_argument(
        "--sf", type=float, default=None, help="TPC-H scale factor (default 1; 0.01 with --quick)"
    )
    ap.add_argument("--nodes", type=int, default=6, help="store node processes (in three fault domains)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="timed runs per query, best kept (default 2; 1 quick)"
    )
    ap.add_argument("--no-spark", action="store_true", help="skip PySpark")
    ap.add_argument(
        "--trials",
        type=int,
        default=3,
        help="interleaved trials per TPC-H query of the fixed cost and plan cache figures (medians); "
        "0 leaves them out",
    )
    ap.add_argument(
        "--node-cache-mb",
        type=float,
        default=None,
        help="each store node's cache of decompressed extent batches, MiB (default: the node's own); "
        "lower it to bound the cluster's memory at large scale factors",
    )
    ap.add_argument(
        "--data-dir", default=os.path.expanduser("~/.cache/microco/tpch"), help="where TPC-H is cached"
    )
    ap.add_argument(
        "--super-extent-rows",
        type=int,
        default=10_000_000,
        help="rows per super-extent (the coordinator holds one while it loads: its memory; "
        "co-partitioned extents co-locate whatever the size)",
    )
    ap.add_argument("--json", action="store_true", help="JSON only on stdout (it is always JSON)")
    ap.add_argument(
        "--tpch-only",
        action="store_true",
        help="only the 22 TPC-H queries beside DuckDB and PySpark (no JSON-model queries or recovery)",
    )
    ap.add_argument(
        "--no-tpch",
        action="store_true",
        help="only the JSON-model queries (matched replica vs shuffle) and recovery: no TPC-H queries, "
        "so only orders and lineitem are loaded (large scale factors, whose TPC-H figures a run "
        "with --tpch-only gives)",
    )
    ap.add_argument(
        "--no-model-queries",
        action="store_true",
        help="skip the JSON-model queries (with --no-tpch: load, storage and recovery only; their "
        "shuffle plans hold the most memory at large scale factors)",
    )
    ap.add_argument(
        "--tpch-queries",
        type=_query_numbers,
        default=None,
        metavar="N,N,...",
        help="run only these TPC-H queries (e.g. 1,6: a re-measurement of some at a large scale "
        "factor); default all 22",
    )
    ap.add_argument(
        "--replica-codecs",
        type=parse_replica_codecs,
        action="append",
        default=[],
        metavar="TABLE=C0,C1,C2",
        help="a table's replicas' extent codecs (zstd, lz4, none), e.g. lineitem=zstd,lz4,zstd (its "
        "l_partkey replica in lz4); repeatable; default zstd for every replica of every table",
    )
    ap.add_argument(
        "--residency",
        action="store_true",
        help="the coordinator plans asking the nodes what is in memory (--residency-max-age-s 1; "
        "off by default since 2026-12-04)",
    )
    ap.add_argument(
        "--no-residency",
        action="store_true",
        help="the coordinator plans without asking the nodes what is in memory (the default now; "
        "kept for the commands recorded in docs/benchmarks/store.md)",
    )
    ap.add_argument(
        "--sort-extents",
        action="store_true",
        help="the coordinator writes each replica's sub-buckets sorted on its partition column and "
        "a matched group-by on it aggregates runs of equal keys (off by default: docs/store.md, "
        "'Sorted replicas and runs of equal keys')",
    )
    args = ap.parse_args(argv)
    REPLICA_CODECS.clear()
    REPLICA_CODECS.update(dict(args.replica_codecs))
    if args.tpch_only and args.no_tpch:
        ap.error("--tpch-only and --no-tpch leave nothing to run")
    sf = args.sf if args.sf is not None else (0.01 if args.quick else 1.0)
    repeat = args.repeat or (1 if args.quick else 2)
    global WARM, TRIALS
    TRIALS = max(0, args.trials)
    WARM = not args.quick  # --quick: one warm-up per engine instead of one per query

    import duckdb

    from microco.clients.store import StoreClient, storage_report

    data = generate(sf, Path(args.data_dir))
    # Spark starts now, beside the store's start and load (its start-up is most of a quick run's
    # time); it is ready (warm-up done) before the first timed query, and each TPC-H query runs in
    # the store, DuckDB and Spark one after the other, so all three see the same machine load.
    small = sf < 0.5
    spark = None if args.no_spark else _SparkSession(data, small=small)
    nodes = [(f"store-{i}", f"rack{i % 3}") for i in range(args.nodes)]
    result: dict[str, Any] = {
        "benchmark": "store",
        "scale_factor": sf,
        "nodes": args.nodes,
        "fault_domains": 3,
        "partitions_per_replica": P,
        "repeat": repeat,
        "warm_up_per_query": WARM,
        "trials": TRIALS,
        "node_cache_mb": args.node_cache_mb,
        "super_extent_rows": args.super_extent_rows,
        "replica_codecs": dict(REPLICA_CODECS),
        "residency": args.residency and not args.no_residency,
        "sort_extents": args.sort_extents,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }
    with bench_cluster(
        "microco-bench-store-",
        args.nodes,
        node_args=[] if args.node_cache_mb is None else ["--extent-cache-mb", f"{args.node_cache_mb:g}"],
        # one super-extent per table at these sizes: orders and lineitem partitions co-locate
        coordinator_args=[
            "--super-extent-rows",
            str(args.super_extent_rows),
            "--recovery-rate-mb",
            "0",
            "--recovery-grace-s",
            "0",
            "--recovery-interval-s",
            "3600",
            *(["--residency-max-age-s", "1"] if args.residency and not args.no_residency else []),
            *(["--sort-extents"] if args.sort_extents else []),
        ],
    ) as cluster:
        client = StoreClient.from_address(cluster.coordinator_address, default_timeout=600)
        t0 = time.perf_counter()
        orders, lineitem = data / "orders.parquet", data / "lineitem.parquet"
        load_tables(client, data, ["orders", "lineitem"])
        result["load_s"] = round(time.perf_counter() - t0, 3)
        result["rows"] = {"orders": parquet_rows(orders), "lineitem": parquet_rows(lineitem)}
        _log(
            f"loaded {result['rows']['orders']} orders, {result['rows']['lineitem']} lineitems in {result['load_s']}s"
        )

        con = duckdb.connect()
        con.execute("SET threads TO 2")
        for f in sorted(data.glob("*.parquet")):
            con.execute(f"create view {f.stem} as select * from read_parquet('{f}')")
        qs = queries(client)
        if spark is not None:
            # Spark's start and warm-up overlap the load, not a timed query: the JSON-model queries
            # ran beside its JVM's start (ready ~15 s after the load at scale factor 1), which
            # took the 2 cores from the first, smallest queries
            spark.ready()
        client.query(qs[0]["frame"])  # warm-up of the store's connections
        con.sql("select count(*) from lineitem").fetchall()
        rows = []
        for q in [] if args.tpch_only or args.no_model_queries else qs:
            # the three interleaved, a trial each in turn, in a rotating order (best of
            # ``repeat`` each): all three see the same machine load
            (
                (matched_s, m, matched_plan, matched_med),
                (shuffle_s, s, shuffle_plan, shuffle_med),
                (
                    duck_s,
                    d,
                    _,
                    duck_med,
                ),
            ) = _interleaved(
                [
                    lambda q=q: client.query(q["frame"]),
                    lambda q=q: client.query(q["frame"].on_replica(q["shuffle_replica"])),
                    lambda q=q: con.sql(q["sql"]).to_arrow_table(),
                ],
                repeat,
                client,
            )
            same = m.num_rows == s.num_rows == d.num_rows
            rows.append(
                {
                    "name": q["name"],
                    "kind": q.get("kind", "group_by" if "join" not in q["name"] else "join"),
                    "matched_s": round(matched_s, 4),
                    "shuffle_s": round(shuffle_s, 4),
                    "duckdb_s": round(duck_s, 4),
                    "spark_s": None,
                    "shuffle_over_matched": round(shuffle_s / matched_s, 2),
                    # the medians of the same interleaved trials
                    "matched_median_s": round(matched_med, 4),
                    "shuffle_median_s": round(shuffle_med, 4),
                    "duckdb_median_s": round(duck_med, 4),
                    "shuffle_over_matched_median": round(shuffle_med / matched_med, 2),
                    # where the last run's time went, by the coordinator (EXPLAIN's timings):
                    # plan, fragments (the nodes' tasks and their results received), the slowest
                    # fragment's own run on its node, a shuffle's second stage, merge; the rest
                    # of a run's time is the result's way to the client (gRPC, IPC)
                    "matched_phases": _phases(matched_plan.get("explain", "")),
                    "shuffle_phases": _phases(shuffle_plan.get("explain", "")),
                    "matched_moved_bytes": matched_plan.get("moved_bytes", 0),
                    "shuffle_moved_bytes": shuffle_plan.get("moved_bytes", 0),
                    "matched_plan": matched_plan["kind"],
                    "matched_replicas": matched_plan["replicas"],
                    "shuffle_plan": shuffle_plan["kind"],
                    "shuffle_replicas": shuffle_plan["replicas"],
                    "result_rows": m.num_rows,
                    "results_agree_row_count": same,
                }
            )
            _log(
                f"{q['name']}: matched {matched_s:.3f}s ({matched_plan['kind']}), shuffle {shuffle_s:.3f}s, duckdb {duck_s:.3f}s"
            )
        result["queries"] = rows
        result["tpch"] = (
            [] if args.no_tpch else tpch_queries(client, con, data, sf, repeat, spark, args.tpch_queries)
        )
        # every TPC-H table is loaded now: what the store holds on disk against three Parquet copies
        # (the tables loaded: with --no-tpch only orders and lineitem)
        tables = client.list_tables()
        loaded = {t["name"] for t in tables}
        result["storage"] = storage_report(
            tables, {f.stem: f for f in data.glob("*.parquet") if f.stem in loaded}
        )
        # per table (a codec per replica changes its table's ratio): the two big ones, and any
        # table given codecs
        result["storage"]["tables"] = {
            n: storage_report(tables, {n: data / f"{n}.parquet"})
            for n in sorted({"orders", "lineitem", *REPLICA_CODECS} & loaded)
        }

        if args.tpch_only:
            if spark is not None:
                result["spark_ready_at_s"] = round(spark.ready_s, 1) if spark.ready_s else None
                spark.stop()
                spark = None
            return _summary(result)
        # ---- a query in flight when a node dies, then the recovery of that node (before Spark,
        # which needs the cores)
        before = {n["name"]: n for n in client.nodes()}
        by_name = {q["name"]: q["frame"] for q in qs}
        loss = query_at_node_loss(
            client, cluster, "lineitem_groupby_orderkey", by_name["lineitem_groupby_orderkey"],
            # a node the healthy plan read from (its replica's extents are there)
            lambda: (plan_nodes(client, "lineitem") or [nodes[1][0]])[0],
            max(3, repeat), log=_log,
        )  # fmt: skip
        victim, t_kill = loss["node"], loss.pop("_killed_at")
        result["node_loss"] = loss
        cluster.wait_gone(victim)
        t_gone = time.perf_counter()
        rec = client.start_recovery()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if rec.get("state") == "stuck" or (
                rec.get("state") in ("done", "partial") and rec["unavailable_extents"] == 0
            ):
                break
            time.sleep(0.2)
            rec = client.recovery()
        result["recovery"] = {
            "node": victim,
            "extents_lost": before[victim]["extents"],
            "bytes_lost": rec.get("bytes_lost"),
            "bytes_read": rec.get("bytes_read"),
            "bytes_read_per_byte_lost": round(rec["bytes_read_per_byte_lost"], 4)
            if rec.get("bytes_read_per_byte_lost")
            else None,
            "full_scan_bytes": rec.get("full_scan_bytes"),
            "full_scan_bytes_per_byte_lost": round(rec["full_scan_bytes"] / rec["bytes_lost"], 2)
            if rec.get("bytes_lost")
            else None,
            "seconds": round(rec.get("seconds", 0.0), 3),
            "lease_expiry_s": round(t_gone - t_kill, 2),
            "state": rec.get("state"),
            "unavailable_after": rec.get("unavailable_extents"),
        }
        _log(f"recovery: {result['recovery']}")
        # a query after recovery still answers
        client.query(qs[0]["frame"])
        client.close()

    if spark is not None:
        try:
            times = spark.run(qs, repeat)  # the JSON-model queries' SQL (TPC-H ran interleaved)
            for r in result["queries"]:
                took = times.get(r["name"])
                r["spark_s"] = round(took, 4) if took is not None else None
            result["spark_ready_at_s"] = round(spark.ready_s, 1) if spark.ready_s else None
        except Exception as exc:  # noqa: BLE001 - report, keep the measured figures
            result["spark_error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            spark.stop()
    return _summary(result)


def _geomean(xs: list[float], digits: int = 2) -> float:
    import math

    return round(math.exp(sum(math.log(max(x, 1e-9)) for x in xs) / len(xs)), digits)


def _summary(result: dict[str, Any]) -> int:
    result["wall_s"] = round(time.perf_counter() - _T0, 1)
    for r in result["queries"]:
        for peer in ("duckdb_s", "spark_s"):
            if r[peer]:
                r[f"matched_over_{peer[:-2]}"] = round(r["matched_s"] / r[peer], 2)
    ratios = [r for r in result["queries"] if r.get("shuffle_over_matched")]
    if ratios:
        # matched replica vs the plan on a replica not partitioned on the key: over every query,
        # and over the group-bys and the join alone (the partition-keyed filters prune, so
        # their ratio is the fraction of partitions read)
        result["queries_summary"] = {
            "geomean_shuffle_over_matched": _geomean([r["shuffle_over_matched"] for r in ratios]),
            "geomean_shuffle_over_matched_group_by_join": _geomean(
                [r["shuffle_over_matched"] for r in ratios if r.get("kind") != "filter"] or [1.0]
            ),
            "geomean_shuffle_over_matched_median": _geomean(
                [r["shuffle_over_matched_median"] for r in ratios if r.get("shuffle_over_matched_median")]
                or [1.0]
            ),
            "geomean_shuffle_over_matched_median_group_by_join": _geomean(
                [
                    r["shuffle_over_matched_median"]
                    for r in ratios
                    if r.get("kind") != "filter" and r.get("shuffle_over_matched_median")
                ]
                or [1.0]
            ),
        }
    ok = [r for r in result["tpch"] if r["correct"] and r["store_s"] and r["duckdb_s"]]
    if ok:
        import math

        result["tpch_summary"] = {
            "correct": sum(r["correct"] for r in result["tpch"]),
            "queries": len(result["tpch"]),
            "geomean_store_over_duckdb": round(
                math.exp(sum(math.log(r["store_s"] / r["duckdb_s"]) for r in ok) / len(ok)), 2
            ),
            "median_geomean_store_over_duckdb": _geomean(
                [r["median_store_s"] / r["median_duckdb_s"] for r in ok]
            ),
        }
        timed = [r for r in ok if r.get("store_median_s") and r.get("duckdb_median_s")]
        if timed:
            # the plan cache's before/after, interleaved per query (medians; fixed_cost)
            result["tpch_summary"]["plan_cache"] = {
                "geomean_store_over_duckdb": _geomean(
                    [r["store_median_s"] / r["duckdb_median_s"] for r in timed]
                ),
                "geomean_store_uncached_over_duckdb": _geomean(
                    [r["store_uncached_median_s"] / r["duckdb_median_s"] for r in timed]
                ),
                "geomean_fixed_s": _geomean([r["fixed_s"] for r in timed], 4),
                "geomean_fixed_uncached_s": _geomean([r["fixed_uncached_s"] for r in timed], 4),
            }
        with_spark = [r for r in ok if r.get("spark_s")]
        if with_spark:
            result["tpch_summary"]["geomean_store_over_spark"] = round(
                math.exp(sum(math.log(r["store_s"] / r["spark_s"]) for r in with_spark) / len(with_spark)), 2
            )
            result["tpch_summary"]["slower_than_spark"] = [
                r["query"] for r in with_spark if r["store_s"] > r["spark_s"]
            ]
            result["tpch_summary"]["median_slower_than_spark"] = [
                r["query"] for r in with_spark if r["median_store_s"] > r["median_spark_s"]
            ]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
