"""SQLite's sqllogictest query files through the store's SQL, each answer checked against DuckDB
on the same tables (held-out correctness: queries nobody here wrote; docs/store.md, "SQLite's
sqllogictest queries").

A ``.test`` file is a script of records: ``statement ok`` (CREATE TABLE, INSERT, CREATE INDEX,
DELETE, CREATE VIEW ...) and ``query <types> <sort> [label]`` with its expected rows after
``----``, each record optionally guarded by ``skipif <engine>`` / ``onlyif <engine>``. The
expected rows are SQLite's (integer division, its NULL and type rules), so they are not used:
every statement runs in DuckDB (the reference), the store is given DuckDB's tables (each table's
three replicas hash-partitioned on its first three columns, 3, 2 and 4 partitions, on an
in-process cluster of four nodes in three fault domains), and every query DuckDB answers is run by
both and compared: the same column names and the same multiset of rows (numbers to 9 significant
digits). Records guarded ``onlyif`` another engine are skipped; queries DuckDB refuses (another
dialect) are counted, not run; queries over a view are counted and skipped (the store has no
views). ``group_concat``/``string_agg`` without an order are compared as sets of their parts.

Where the files are: a clone of https://github.com/gregrahn/sqllogictest (``test/``), read from
disk, or from a bare repository with ``--git REPO`` (``git show HEAD:<path>``).

    python -m microco.benchmarks.store_logictest --git /path/to/sqllogictest.git \\
        test/select1.test test/random/aggregates/slt_good_0.test --json

Exit status 1 when any answer differs (or the store refuses a query DuckDB answers)."""

from __future__ import annotations

import argparse
import decimal
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

ENGINE = "duckdb"  # what ``skipif``/``onlyif`` are judged as (the reference engine's name)
PARTITIONS = (3, 2, 4)
NODES = 4


def records(text: str) -> Iterator[tuple[str, str]]:
    """``(head, sql)`` of each record that applies here: ``head`` is the record's first line
    (``statement ok``, ``query III rowsort``); records guarded ``onlyif`` another engine or
    ``skipif`` this one are left out; ``halt`` ends the file unless guarded for another engine."""
    lines = text.split("\n")
    i, guards = 0, []
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#") or line.startswith("hash-threshold"):
            continue
        word = line.split()
        if word[0] in ("skipif", "onlyif") and len(word) > 1:
            guards.append((word[0], word[1].lower()))
            continue
        applies = all((k == "onlyif") == (e == ENGINE) for k, e in guards)
        guards = []
        if word[0] == "halt":
            if applies:
                return
            continue
        if word[0] not in ("statement", "query"):
            continue
        body = []
        while i < len(lines) and lines[i].strip() and lines[i].strip() != "----":
            body.append(lines[i])
            i += 1
        if i < len(lines) and lines[i].strip() == "----":
            i += 1
            while i < len(lines) and lines[i].strip():
                i += 1  # SQLite's expected rows: not used (DuckDB is the reference)
        if applies:
            yield line, "\n".join(body)


def _value(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return ("num", "nan")
    if isinstance(v, (float, decimal.Decimal)) or (isinstance(v, int) and not isinstance(v, bool)):
        return ("num", float(f"{float(v):.9g}"))
    return (type(v).__name__, v)


def rows(t: pa.Table, parts: bool = False) -> list[tuple]:
    """``t``'s rows as compared, sorted; ``parts``: strings as the sorted set of their
    comma-separated parts (an unordered ``group_concat``)."""
    cols = [t.column(i).to_pylist() for i in range(t.num_columns)]

    def one(v: Any) -> Any:
        if parts and isinstance(v, str):
            return ("parts", tuple(sorted(v.split(","))))
        return _value(v)

    return sorted((tuple(one(c[i]) for c in cols) for i in range(t.num_rows)), key=repr)


_UNORDERED_CONCAT = re.compile(r"\b(group_concat|string_agg)\s*\((?![^)]*\border\s+by\b)", re.I)


def _cluster(ref: duckdb.DuckDBPyConnection, work: str) -> tuple[Any, set[str]]:
    """A fresh in-process store holding DuckDB's tables now; and the names of DuckDB's views."""
    from microco.common.kv import MemoryKV
    from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, StoreCore

    tr = LocalTransport(work, [NodeInfo(f"n{i}", f"r{i % 3}") for i in range(NODES)])
    core = StoreCore(MemoryKV(), tr, recovery_rate_bytes=0)
    listed = ref.sql("SELECT table_name, table_type FROM information_schema.tables").fetchall()
    for name, kind in listed:
        if kind != "BASE TABLE":
            continue
        t = ref.sql(f'SELECT * FROM "{name}"').to_arrow_table()
        cols = t.schema.names
        specs = [PartitionSpec(cols[k % len(cols)], partitions=PARTITIONS[k]) for k in range(3)]
        core.create_table(name, t.schema, specs)
        if t.num_rows:
            core.append(name, t)
    return core, {n.lower() for n, kind in listed if kind == "VIEW"}


def run_text(text: str, name: str, limit: int | None = None, work: str | None = None) -> dict[str, Any]:
    """Run one file's records; its counts and the queries whose answers differ or were refused."""
    ref = duckdb.connect()
    core: Any = None
    views: set[str] = set()
    dirty = True
    stats = dict.fromkeys(
        ("queries", "equal", "wrong", "store_refused", "duckdb_refused", "over_a_view", "statements_failed"),
        0,
    )
    findings: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for head, sql in records(text):
        if head.startswith("statement"):
            try:
                ref.execute(sql)
                dirty = True
            except duckdb.Error:
                stats["statements_failed"] += 1
            continue
        if limit is not None and stats["queries"] >= limit:
            break
        try:
            want = ref.sql(sql).to_arrow_table()
        except duckdb.Error:
            stats["duckdb_refused"] += 1
            continue
        stats["queries"] += 1
        if dirty:
            core, views = _cluster(ref, tempfile.mkdtemp(dir=work, prefix="slt-"))
            dirty = False
        if views and any(re.search(rf"\b{re.escape(v)}\b", sql, re.I) for v in views):
            stats["over_a_view"] += 1
            continue
        try:
            got, _plan = core.sql(sql)
        except Exception as exc:  # noqa: BLE001 (what the store said is the finding)
            stats["store_refused"] += 1
            findings.append({"kind": "refused", "sql": sql, "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        parts = bool(_UNORDERED_CONCAT.search(sql))
        if got.schema.names != want.schema.names or rows(got, parts) != rows(want, parts):
            stats["wrong"] += 1
            findings.append(
                {
                    "kind": "wrong",
                    "sql": sql,
                    "names": [got.schema.names, want.schema.names],
                    "rows": [got.num_rows, want.num_rows],
                }
            )
        else:
            stats["equal"] += 1
    return {"file": name, **stats, "seconds": round(time.perf_counter() - t0, 1), "findings": findings}


def _read(path: str, git: str | None) -> str:
    if git is None:
        return Path(path).read_text()
    out = subprocess.run(
        ["git", "-C", git, "show", f"HEAD:{path}"], capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise FileNotFoundError(f"{path} is not in {git}: {out.stderr.strip()}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microco.benchmarks.store_logictest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="+", help="sqllogictest .test files (paths, or paths inside --git)")
    ap.add_argument("--git", help="read the files from this git repository's HEAD (a clone or a bare mirror)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many queries per file")
    ap.add_argument(
        "--json", action="store_true", help="one JSON object on stdout (the default prints a table)"
    )
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="microco-slt-") as work:
        for f in args.files:
            r = run_text(_read(f, args.git), f, args.limit, work)
            results.append(r)
            print(
                f"[logictest] {f}: {r['equal']}/{r['queries']} equal, {r['wrong']} wrong, "
                f"{r['store_refused']} refused by the store ({r['duckdb_refused']} refused by DuckDB, "
                f"{r['over_a_view']} over a view), {r['seconds']} s",
                file=sys.stderr,
                flush=True,
            )
    total = {k: sum(r[k] for r in results) for k in ("queries", "equal", "wrong", "store_refused")}
    if args.json:
        print(json.dumps({"files": results, "total": total}, indent=1, default=str))
    else:
        for r in results:
            for x in r["findings"]:
                print(f"{r['file']}: {x['kind']}: {x['sql']}")
        print(json.dumps(total))
    return 1 if total["wrong"] or total["store_refused"] else 0


if __name__ == "__main__":
    sys.exit(main())
