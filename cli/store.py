"""``microco store ...``: tables with three differently partitioned replicas (Instalytics)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from ._platform import add_etcd_arguments

HELP = """Instalytics store: each table is kept as three replicas, each partitioned on a different
column (hash or range). Queries go to the replica whose partitioning matches them.

Partitioning specs (--replica, three times): COLUMN[:hash[:PARTITIONS]] or COLUMN:range:B1,B2,...,
each optionally @CODEC (zstd, lz4, none: that replica's extent codec; default zstd)
examples:
  microco store create orders --from orders.parquet --replica o_orderkey --replica o_custkey:hash:16 \\
        --replica o_orderdate:range:1994-01-01,1996-01-01
  microco store load orders orders.parquet
  microco store query orders --group-by o_custkey --agg sum:o_totalprice:total --order-by total:desc --limit 5
  microco store explain orders --group-by o_custkey --agg count:*:n
  microco store query orders --join lineitem --on o_orderkey=l_orderkey --group-by o_orderpriority --agg sum:l_quantity
  microco store sql "select o_orderpriority, count(*) n from orders group by o_orderpriority order by n desc"
  microco store nodes ; microco store recovery --watch
  microco store recode lineitem 1 lz4 --watch   # one replica's extent codec, rewritten live
  microco store grant orders bob ; microco store grants orders ; microco store revoke orders bob
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "store",
        help="Instalytics tables: create, load, query, explain, nodes, recovery",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_etcd_arguments(p)
    p.add_argument("--coordinator", default="", help="coordinator host:port (default: found in etcd)")
    s = p.add_subparsers(dest="store_command", metavar="SUBCOMMAND")

    c = s.add_parser("create", help="create a table with three partitionings")
    c.add_argument("name", help="the table's name")
    c.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="take the schema from this file, folder or glob (Parquet, CSV/TSV/.tbl, JSON lines; text "
        "may be .gz/.bz2/.zst/.lz4; a CSV's types are those every row fits, read through)",
    )
    c.add_argument("--schema", help="schema as NAME:TYPE,... (int64, float64, string, date32, bool)")
    c.add_argument(
        "--replica",
        action="append",
        default=[],
        required=True,
        help="partitioning spec (three times); a suffix @CODEC sets that replica's extent codec",
    )
    c.add_argument(
        "--codecs",
        default="",
        help="the replicas' extent codecs, e.g. zstd,lz4,zstd (zstd, lz4 or none; default zstd for each)",
    )
    c.set_defaults(func=cmd_create)

    ld = s.add_parser(
        "load",
        help="append a file, folder or glob to a table (all rows or none)",
        description="Append the rows of FILE: Parquet, CSV (.csv, .tsv, .tbl) or JSON lines (.json, .jsonl, "
        ".ndjson), text compressed or not (.gz, .bz2, .zst, .lz4); or a folder of such files (Hive-style "
        "key=value folders give their columns; names starting with _ or . are skipped) or a quoted glob. "
        "Rows are read with the table's column types and streamed: all become visible at once, or none.",
    )
    ld.add_argument("name", help="the table's name")
    ld.add_argument("file", metavar="FILE", help="a file, a folder of files or a quoted glob (above)")
    ld.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds the load may take (default: 600, more for a big file: its size at 0.5 MB/s)",
    )
    ld.set_defaults(func=cmd_load)

    for name, fn, hlp in (
        ("query", cmd_query, "run a query"),
        ("explain", cmd_explain, "show the plan: which replica and why"),
    ):
        q = s.add_parser(name, help=hlp)
        q.add_argument("table", help="the table's name")
        q.add_argument(
            "--where", action="append", default=[], help='filter "COL OP VALUE" (OP: = != < <= > >= in)'
        )
        q.add_argument("--select", help="columns to return, comma-separated")
        q.add_argument("--join", help="table to inner-join")
        q.add_argument("--on", help="join keys LEFT=RIGHT")
        q.add_argument("--group-by", help="group-by columns, comma-separated")
        q.add_argument(
            "--agg", action="append", default=[], help="FN:COL[:NAME], FN in sum count min max mean"
        )
        q.add_argument("--order-by", action="append", default=[], help="COL[:desc]")
        q.add_argument("--limit", type=int, help="return at most N rows")
        q.add_argument("--replica", type=int, choices=[0, 1, 2], help="force a replica (to compare plans)")
        q.add_argument("--query-json", help="the whole query as JSON instead of the flags")
        if name == "query":
            q.add_argument(
                "--format", choices=["table", "csv", "json"], default="table", help="how the rows are printed"
            )
            q.add_argument("--explain", action="store_true", help="print the plan after the result")
        q.set_defaults(func=fn)

    sq = s.add_parser("sql", help="run a SQL query (SELECT), planned onto the replicas")
    sq.add_argument("query", help="the SQL text, or - to read it from stdin")
    sq.add_argument(
        "--format", choices=["table", "csv", "json"], default="table", help="how the rows are printed"
    )
    sq.add_argument("--explain", action="store_true", help="print the plan after the result")
    sq.add_argument("--explain-only", action="store_true", help="print the plan without running the query")
    sq.set_defaults(func=cmd_sql)

    n = s.add_parser("nodes", help="store nodes: alive, fault domain, extents, bytes")
    n.add_argument("--json", action="store_true", help="print JSON")
    n.set_defaults(func=cmd_nodes)

    t = s.add_parser("tables", help="tables with rows, bytes, replicas and unavailable extents")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.set_defaults(func=cmd_tables)

    r = s.add_parser("recovery", help="recovery progress (and --start to run a pass now)")
    r.add_argument("--start", action="store_true", help="run a recovery pass now")
    r.add_argument(
        "--relax-fault-domains",
        action="store_true",
        help="with --start (administrators): rebuild extents stuck for want of a node in an unused fault "
        "domain on nodes that hold no copy of their rows, sharing a domain with one (docs/store.md)",
    )
    r.add_argument("--watch", action="store_true", help="follow until nothing is left to rebuild")
    r.add_argument("--json", action="store_true", help="print the coordinator's progress record as JSON")
    r.set_defaults(func=cmd_recovery)

    rc = s.add_parser(
        "recode",
        help="change a replica's extent codec on a live table (rewritten in the background)",
    )
    rc.add_argument("table", help="the table's name")
    rc.add_argument("replica", type=int, choices=[0, 1, 2], help="which of the three replicas")
    rc.add_argument("codec", nargs="?", default="", help="zstd, lz4 or none; omitted: show progress")
    rc.add_argument("--watch", action="store_true", help="follow until the recode ends")
    rc.add_argument("--json", action="store_true", help="print the progress record as JSON")
    rc.set_defaults(func=cmd_recode)

    sc = s.add_parser(
        "scrub",
        help="verify every extent's checksum (corrupt ones get rebuilt) and delete orphan extent files",
    )
    sc.set_defaults(func=cmd_scrub)

    for name, fn, hlp in (
        ("grant", cmd_grant, "let USER (and their jobs) read TABLE: its owner or an administrator"),
        ("revoke", cmd_revoke, "withdraw USER's grant to read TABLE"),
    ):
        g = s.add_parser(name, help=hlp)
        g.add_argument("table", help="the table's name")
        g.add_argument("user", help="a user's name (alice, or user:alice)")
        g.set_defaults(func=fn)
    gs = s.add_parser("grants", help="who owns TABLE and whom it is shared with")
    gs.add_argument("table", help="the table's name")
    gs.set_defaults(func=cmd_grants)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _client(args: argparse.Namespace) -> Any:
    from microco.clients.store import StoreClient

    if args.coordinator:
        return StoreClient.from_address(args.coordinator)
    from microco.common.kv import EtcdKV

    from . import etcd_for

    return StoreClient.from_etcd(EtcdKV(etcd_for(args)))


def _value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text.strip("'\"")


def parse_where(text: str) -> list[Any]:
    from microco.common.errors import InvalidArgument

    stripped = text.strip()
    if stripped.startswith('"'):
        # a column name SQL would quote ("My Col", "select"): held out (session 39), a name with
        # a space could not be filtered on ("filter operator 'Col' is not one of ...")
        end = stripped.find('"', 1)
        rest = stripped[end + 1 :].split(None, 1) if end > 0 else []
        parts = [stripped[1:end], *rest] if end > 1 else []
    else:
        parts = text.split(None, 2)
    if len(parts) != 3:
        raise InvalidArgument(f'bad --where {text!r}: expected "COLUMN OP VALUE" (a column name in "...")')
    col, op, val = parts
    if op == "in":
        return [col, op, [_value(v.strip()) for v in val.strip("()[]").split(",")]]
    return [col, op, _value(val)]


def build_query(args: argparse.Namespace) -> dict[str, Any]:
    from microco.common.errors import InvalidArgument

    if args.query_json:
        return json.loads(args.query_json)
    q: dict[str, Any] = {"table": args.table, "where": [parse_where(w) for w in args.where]}
    if args.select:
        q["select"] = [c.strip() for c in args.select.split(",")]
    if args.join:
        if not args.on or "=" not in args.on:
            raise InvalidArgument("--join needs --on LEFT=RIGHT")
        left, right = args.on.split("=", 1)
        q["join"] = {"table": args.join, "left_on": left.strip(), "right_on": right.strip()}
    if args.group_by:
        q["group_by"] = [c.strip() for c in args.group_by.split(",")]
    aggs = []
    for a in args.agg:
        parts = a.split(":")
        if len(parts) not in (2, 3):
            raise InvalidArgument(f"bad --agg {a!r}: expected FN:COL[:NAME]")
        name = parts[2] if len(parts) == 3 else f"{parts[0]}_{parts[1]}".replace("*", "all")
        aggs.append([parts[0], parts[1], name])
    if aggs:
        q["aggs"] = aggs
    if args.order_by:
        q["order_by"] = [[o.split(":")[0], "desc" if o.endswith(":desc") else "asc"] for o in args.order_by]
    if args.limit is not None:
        q["limit"] = args.limit
    if args.replica is not None:
        q["replica"] = args.replica
    return q


def _parse_schema(text: str) -> Any:
    import pyarrow as pa

    from microco.common.errors import InvalidArgument

    types = {
        "int64": pa.int64(),
        "int32": pa.int32(),
        "float64": pa.float64(),
        "double": pa.float64(),
        "string": pa.string(),
        "date32": pa.date32(),
        "date": pa.date32(),
        "bool": pa.bool_(),
    }
    fields = []
    for item in text.split(","):
        name, _, typ = item.partition(":")
        if typ.strip() not in types:
            raise InvalidArgument(f"bad schema field {item!r}: type must be one of {', '.join(types)}")
        fields.append(pa.field(name.strip(), types[typ.strip()]))
    return pa.schema(fields)


def cmd_create(args: argparse.Namespace) -> int:
    from microco.common.errors import InvalidArgument

    if len(args.replica) != 3:
        raise InvalidArgument(f"give --replica exactly three times (got {len(args.replica)})")
    if args.source:
        from microco.clients.store import infer_schema

        schema = infer_schema(args.source)  # types every row fits (a CSV is read through, streaming)
    elif args.schema:
        schema = _parse_schema(args.schema)
    else:
        raise InvalidArgument("give the schema with --from FILE or --schema NAME:TYPE,...")
    codecs = [x.strip() for x in args.codecs.split(",")] if args.codecs else None
    if codecs is not None and len(codecs) != 3:
        raise InvalidArgument(f"give --codecs as three codecs, e.g. zstd,lz4,zstd (got {args.codecs!r})")
    with _client(args) as c:
        t = c.create_table(args.name, schema, args.replica, codecs=codecs)
    print(
        f"created {t['name']}: replicas "
        + ", ".join(f"{r['column']} ({r['kind']}, {r['codec']})" for r in t["replicas"])
    )
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from microco.clients.store import LoadProgress, file_deadline_s, file_rows
    from microco.common.errors import InvalidArgument

    from ._format import count, size

    if args.timeout is not None and args.timeout <= 0:
        raise InvalidArgument(f"--timeout must be positive (got {args.timeout:g})")
    timeout = args.timeout if args.timeout is not None else file_deadline_s(args.file)
    t0 = time.monotonic()
    # rows sent, of the file's rows when its footer says (Parquet); a CSV file counts up
    with tqdm(
        total=file_rows(args.file), desc=f"load {args.file}", unit=" rows", unit_scale=True, file=sys.stderr
    ) as bar:
        progress = LoadProgress(bar.total, on_batch=bar.update)
        with _client(args) as c:
            res = c.append(args.name, args.file, timeout=timeout, progress=progress)
    print(
        f"loaded {count(res['rows'])} rows into {args.name} ({size(res['bytes'])} in 3 replicas, "
        f"super-extents {res['super_extents']}) in {time.monotonic() - t0:.1f}s"
    )
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.query == "-" else args.query
    with _client(args) as c:
        if args.explain_only:
            print(c.explain_sql(text))
            return 0
        t0 = time.monotonic()
        table = c.sql(text)
        dt = time.monotonic() - t0
        plan = c.last_plan
    return _print_result(args, table, dt, plan)


def cmd_query(args: argparse.Namespace) -> int:
    q = build_query(args)
    with _client(args) as c:
        t0 = time.monotonic()
        table = c.query(q)
        dt = time.monotonic() - t0
        plan = c.last_plan
    return _print_result(args, table, dt, plan)


def _print_result(args: argparse.Namespace, table: Any, dt: float, plan: dict[str, Any]) -> int:
    if args.format == "json":
        print(json.dumps(table.to_pylist(), default=str))  # dates, decimals as text
    elif args.format == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, sys.stdout.buffer)
    else:
        from ._format import count

        shown = table.slice(0, 1000).to_pylist()
        if shown:
            _print_rows(shown, table.column_names)
        else:
            print("(no rows)")
        if table.num_rows > len(shown):
            print(f"... {count(table.num_rows - len(shown))} more rows (use --format csv for all)")
        print(
            f"\n{count(table.num_rows)} rows in {dt:.3f}s; plan {plan.get('kind')} on replicas {plan.get('replicas')}",
            file=sys.stderr,
        )
    if args.explain:
        print(plan.get("explain", ""), file=sys.stderr)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    with _client(args) as c:
        print(c.explain(build_query(args)))
    return 0


def _result_cell(v: Any) -> str:
    """A query's value as text: ``cell``'s, except a NULL is ``NULL`` (in a list or a struct
    too) and a float NaN ``NaN``, as DuckDB's shell shows them: ``cell``'s ``-`` for a missing
    value read like a string ``-`` (held out, session 39). An empty string stays empty."""
    from ._format import cell

    if v is None:
        return "NULL"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_result_cell(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_result_cell(x) for x in v) + "]"
    return cell(v)


def _print_rows(rows: list[dict[str, Any]], cols: list[str]) -> None:
    """A query's rows: column names as the table has them, numbers rounded for reading and
    right-aligned (values are not grouped: a number in a result may be an id); NULL as ``NULL``
    (``_result_cell``)."""
    from ._format import print_table

    print_table(rows, cols, upper=False, formats=dict.fromkeys(cols, _result_cell))


# The store's own tables: counts grouped in thousands, bytes in binary units.
def _store_formats() -> dict[str, Any]:
    from ._format import count, size

    return {"rows": count, "extents": count, "unavailable": count, "bytes": size}


def cmd_nodes(args: argparse.Namespace) -> int:
    with _client(args) as c:
        nodes = c.nodes()
    if args.json:
        print(json.dumps(nodes))
    else:
        from ._format import print_table

        cols = ["name", "alive", "fault_domain", "extents", "bytes", "address"]
        print_table(nodes, cols, formats=_store_formats(), right=("bytes",))
        from ._format import size

        by_table: dict[str, list[int]] = {}
        for n in nodes:
            for t, per in (n.get("read_by_replica") or {}).items():
                acc = by_table.setdefault(t, [0, 0, 0])
                for r, b in enumerate(per[:3]):
                    acc[r] += b
        if by_table:
            print("read since the nodes started, by replica (choosing a codec: docs/store.md):")
            for t, per in sorted(by_table.items()):
                print(f"  {t}: " + ", ".join(f"replica {r} {size(b)}" for r, b in enumerate(per)))
    return 0


def cmd_tables(args: argparse.Namespace) -> int:
    with _client(args) as c:
        tables = c.list_tables()
    rows = [
        {
            "name": t["name"],
            "rows": t["rows"],
            "bytes": t["bytes"],
            "extents": t["extents"],
            "unavailable": t["unavailable_extents"],
            "replicas": "; ".join(f"{r['column']}:{r['kind']}@{r['codec']}" for r in t["replicas"]),
        }
        for t in tables
    ]
    if args.json:
        print(json.dumps(rows))
    else:
        from ._format import print_table

        cols = ["name", "rows", "bytes", "extents", "unavailable", "replicas"]
        print_table(rows, cols, formats=_store_formats(), right=("bytes",))
    return 0


def cmd_recovery(args: argparse.Namespace) -> int:
    with _client(args) as c:
        if args.relax_fault_domains and not args.start:
            from microco.common.errors import InvalidArgument

            raise InvalidArgument("--relax-fault-domains goes with --start")
        rec = c.start_recovery(relax_fault_domains=args.relax_fault_domains) if args.start else c.recovery()
        if args.watch:
            from tqdm import tqdm

            with tqdm(desc="recovery", unit="extent", file=sys.stderr) as bar:
                while True:
                    rec = c.recovery()
                    bar.total = rec.get("lost_extents") or bar.total
                    bar.n = rec.get("rebuilt", 0)
                    bar.refresh()
                    if rec["unavailable_extents"] == 0 or rec.get("state") == "stuck":
                        break
                    time.sleep(0.5)
    if args.json:
        print(json.dumps(rec, indent=2))
        return 0
    from ._format import print_table, size

    print_table(
        [
            {
                "state": rec.get("state") or "idle",
                "lost": rec.get("lost_extents", 0),
                "rebuilt": rec.get("rebuilt", 0),
                "unavailable": rec.get("unavailable_extents", 0),
                "bytes_lost": size(rec.get("bytes_lost")),
                "bytes_read": size(rec.get("bytes_read")),
                "seconds": rec.get("seconds"),
            }
        ]
    )
    for item in rec.get("stuck") or []:
        print(f"stuck: {item}")
    for item in rec.get("advice") or []:
        print(f"to do: {item}")
    if rec.get("targets"):
        print("rebuilt on: " + ", ".join(f"{n} ({k})" for n, k in sorted(rec["targets"].items())))
    for item in rec.get("errors") or []:
        print(f"error: {item}")
    return 0


def cmd_recode(args: argparse.Namespace) -> int:
    with _client(args) as c:
        rec = c.recode(args.table, args.replica, args.codec)
        if args.watch:
            from tqdm import tqdm

            with tqdm(desc=f"recode {args.table}", unit="extent", file=sys.stderr) as bar:
                while rec.get("state") == "running":
                    time.sleep(0.5)
                    rec = c.recode(args.table, args.replica)
                    bar.total = rec.get("extents") or bar.total
                    bar.n = rec.get("recoded", 0)
                    bar.refresh()
    if args.json:
        print(json.dumps(rec, indent=2))
        return 0
    print(
        f"recode {rec.get('table')} replica {rec.get('replica', args.replica)} to {rec.get('codec', '-')}: "
        f"{rec.get('state')}, {rec.get('recoded', 0)} of {rec.get('extents', 0)} extents, "
        f"{rec.get('bytes_before', 0)} -> {rec.get('bytes_after', 0)} bytes in {rec.get('seconds', 0):.1f}s"
    )
    for item in rec.get("errors") or []:
        print(f"error: {item}")
    if rec.get("state") == "interrupted":
        print("interrupted (its coordinator stopped): run the same recode again to finish it")
    return 0 if rec.get("state") in ("running", "done", "idle") else 1


def cmd_scrub(args: argparse.Namespace) -> int:
    with _client(args) as c:
        rep = c.scrub(report=True)
    bad = rep["corrupt"]
    print("\n".join(bad) if bad else "all extents match their checksums")
    if rep["orphans_deleted"]:
        print(f"deleted {len(rep['orphans_deleted'])} orphan extent files ({rep['orphan_bytes']} bytes)")
    return 0


def _print_grants(g: dict[str, Any]) -> int:
    owner = f"user {g['owner']}" if g["owner"] else "none (a platform table: every caller reads it)"
    print(f"table {g['table']}: owner {owner}; shared with: {', '.join(g['users']) or 'nobody'}")
    return 0


def cmd_grant(args: argparse.Namespace) -> int:
    with _client(args) as c:
        return _print_grants(c.grant_read(args.table, args.user))


def cmd_revoke(args: argparse.Namespace) -> int:
    with _client(args) as c:
        return _print_grants(c.revoke_read(args.table, args.user))


def cmd_grants(args: argparse.Namespace) -> int:
    with _client(args) as c:
        return _print_grants(c.table_grants(args.table))
