"""The Join Order Benchmark's queries through the store's SQL, each answer checked against DuckDB on
the same tables (held-out correctness, session 40: docs/store.md, "Session 40 held-out round").

JOB (Leis et al., VLDB 2015; https://github.com/gregrahn/join-order-benchmark) is 113 queries of
4 to 17 tables over the IMDB schema's 21 tables. The IMDB data is not used: each table of the
suite's ``schema.sql`` is made synthetic with its declared types and NOT NULLs (ids 1..n, each
foreign key into its table's ids, ``NULL_SHARE`` of every nullable column NULL), and every string
column is drawn mostly from the literals the queries compare it with (a LIKE pattern filled in),
so that the queries' filters select rows. Each table gets three replicas: by ``id``, by its first
foreign key and by another column (the six small type tables: by ``id``, their name and a range of
``id``), on an in-process cluster of six nodes in three fault domains.

    python -m microco.benchmarks.store_job --git /path/to/join-order-benchmark --json

(``--git``: a clone or a bare mirror, read at HEAD; ``--dir``: a plain folder of the files.)
Exit status 1 when any answer differs from DuckDB's or the store refuses a query DuckDB answers.
A query DuckDB refuses as written (its alias ``at`` is a keyword in DuckDB 2) is run with that
alias quoted, and counted in ``quoted``."""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

SIZES = {
    "kind_type": 7, "company_type": 4, "info_type": 113, "role_type": 12, "comp_cast_type": 4,
    "link_type": 18, "title": 3000, "name": 3000, "char_name": 2000, "company_name": 1200,
    "keyword": 1200, "movie_companies": 9000, "movie_info": 15000, "movie_info_idx": 7000,
    "movie_keyword": 12000, "cast_info": 20000, "aka_name": 3000, "aka_title": 1500,
    "complete_cast": 2500, "movie_link": 2000, "person_info": 6000,
}  # fmt: skip
FK = {
    "movie_id": "title", "linked_movie_id": "title", "episode_of_id": "title", "person_id": "name",
    "person_role_id": "char_name", "company_id": "company_name", "company_type_id": "company_type",
    "info_type_id": "info_type", "keyword_id": "keyword", "kind_id": "kind_type", "role_id": "role_type",
    "link_type_id": "link_type", "subject_id": "comp_cast_type", "status_id": "comp_cast_type",
}  # fmt: skip
OTHER_ROWS = 1000  # a table of another schema than IMDB's
DENSE = ("title", "name", "char_name", "company_name", "keyword")  # divided by --dense
NULL_SHARE = 0.08
WORDS = [
    "alpha",
    "Bravo",
    "char",
    "delta (uncredited)",
    "echo",
    "(voice)",
    "golf",
    "[us]",
    "[de]",
    "Índia",
    "日本",
    "x",
]


class Source:
    """The suite's files: from a git repository's HEAD, or a folder."""

    def __init__(self, git: str | None = None, folder: str | None = None) -> None:
        self.git, self.folder = git, folder

    def names(self) -> list[str]:
        if self.git:
            out = subprocess.run(
                ["git", "-C", self.git, "ls-tree", "--name-only", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
        else:
            out = [p.name for p in Path(str(self.folder)).iterdir()]
        return out

    def read(self, name: str) -> str:
        if self.git:
            return subprocess.run(
                ["git", "-C", self.git, "show", f"HEAD:{name}"], capture_output=True, text=True, check=True
            ).stdout
        return Path(str(self.folder), name).read_text()


def queries(src: Source) -> dict[str, str]:
    """The queries by name (``1a`` ... ``33c``), in the suite's order."""
    qs = [n for n in src.names() if re.fullmatch(r"\d+[a-z]\.sql", n)]
    qs.sort(key=lambda n: (int(n[:-5]), n[-5]))
    return {n[:-4]: src.read(n) for n in qs}


def literals(qs: dict[str, str]) -> dict[tuple[str, str], list[tuple[str, Any]]]:
    """(table, column) -> the literals the queries compare it with: ``("like", pattern)``,
    ``("str", value)`` or ``("num", value)``."""
    import sqlglot
    from sqlglot import exp

    out: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    kinds = (exp.EQ, exp.NEQ, exp.Like, exp.ILike, exp.In, exp.LT, exp.GT, exp.LTE, exp.GTE, exp.Between)
    for text in qs.values():
        tree = sqlglot.parse_one(text, read="postgres")
        alias = {t.alias_or_name: t.name for t in tree.find_all(exp.Table)}
        for node in tree.find_all(*kinds):
            col = node.this
            if not isinstance(col, exp.Column) or col.table not in alias:
                continue
            if isinstance(node, exp.In):
                vals = list(node.expressions)
            elif isinstance(node, exp.Between):
                vals = [node.args["low"], node.args["high"]]
            else:
                vals = [node.expression]
            for v in vals:
                if not isinstance(v, exp.Literal):
                    continue
                like = isinstance(node, (exp.Like, exp.ILike))
                kind = ("like" if like else "str") if v.is_string else "num"
                out.setdefault((alias[col.table], col.name), []).append(
                    (kind, v.this if v.is_string else float(v.this))
                )
    return out


def tables(src: Source, seed: int = 1, dense: int = 1) -> dict[str, pa.Table]:
    """The suite's 21 tables, synthetic (above); ``dense`` divides the sizes of the tables most
    others point into, so that more joined rows meet every filter."""
    r = random.Random(seed)
    sizes = {k: (v // dense if k in DENSE else v) for k, v in SIZES.items()}
    lits = literals(queries(src))
    share = 0.6 if dense == 1 else 0.85
    con = duckdb.connect()
    con.execute(src.read("schema.sql"))
    names = [
        r[0]
        for r in con.sql("select table_name from information_schema.tables order by table_name").fetchall()
    ]
    sizes = {name: sizes.get(name, OTHER_ROWS) for name in names}
    out = {}
    for name, n in sizes.items():
        cols = con.sql(
            "select column_name, data_type, is_nullable from information_schema.columns "
            f"where table_name = '{name}' order by ordinal_position"
        ).fetchall()
        data: dict[str, list[Any]] = {}
        for col, typ, nullable in cols:
            opts = lits.get((name, col), [])
            strs = sorted({v for k, v in opts if k == "str"})
            nums = [v for k, v in opts if k == "num"]
            vals: list[Any] = []
            for i in range(n):
                if col == "id":
                    vals.append(i + 1)
                elif nullable == "YES" and r.random() < NULL_SHARE:
                    vals.append(None)
                elif col in FK and FK[col] in sizes:
                    vals.append(r.randint(1, sizes[FK[col]]))
                elif typ == "INTEGER":
                    if nums and r.random() < 0.5:
                        vals.append(int(r.choice(nums)) + r.choice((-1, 0, 0, 1)))
                    else:
                        vals.append(r.randint(1900, 2019) if col == "production_year" else r.randint(0, 200))
                elif n < 200:  # a type table: each literal once, then made-up names
                    vals.append(strs[i] if i < len(strs) else f"{col} {i}")
                elif opts and r.random() < share:
                    kind, v = r.choice(opts)
                    if kind == "like":
                        v = "".join(r.choice(WORDS) if c == "%" else ("q" if c == "_" else c) for c in v)
                    vals.append(v if kind != "num" else str(v))
                elif typ.endswith("(1)"):
                    vals.append(r.choice("mf"))
                else:
                    vals.append(" ".join(r.choice(WORDS) for _ in range(r.randint(1, 3))))
            data[col] = vals
        schema = pa.schema(
            [(c, pa.int32() if t == "INTEGER" else pa.string(), nl == "YES") for c, t, nl in cols]
        )
        out[name] = pa.table(data, schema=schema)
    return out


def partitionings(t: pa.Table) -> list[Any]:
    from microco.services.store import PartitionSpec

    cols = t.schema.names
    fks = [c for c in cols if c in FK]
    others = [c for c in cols if c != "id" and c not in fks]
    if t.num_rows < 200:
        return [
            PartitionSpec("id", partitions=2),
            PartitionSpec(others[0], partitions=2),
            PartitionSpec("id", kind="range", bounds=(str(t.num_rows // 2),)),
        ]
    second = fks[0] if fks else others[0]
    third = fks[1] if len(fks) > 1 else (others[0] if others else "id")
    return [
        PartitionSpec("id", partitions=4),
        PartitionSpec(second, partitions=4),
        PartitionSpec(third, partitions=3),
    ]


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return ("f", "nan") if math.isnan(v) else ("f", float(f"{v:.9g}"))
    return (type(v).__name__, v)


def rows(t: pa.Table) -> list[tuple[Any, ...]]:
    cols = [c.to_pylist() for c in t.columns]
    return sorted((tuple(_value(c[i]) for c in cols) for i in range(t.num_rows)), key=repr)


def run(src: Source, seed: int = 1, dense: int = 1, work: str | None = None) -> dict[str, Any]:
    from microco.common.kv import MemoryKV
    from microco.services.store import LocalTransport, NodeInfo, StoreCore

    data = tables(src, seed, dense)
    ref = duckdb.connect()
    with tempfile.TemporaryDirectory(dir=work, prefix="microco-job-") as d:
        tr = LocalTransport(d, [NodeInfo(f"n{i}", f"r{i % 3}") for i in range(6)])
        core = StoreCore(MemoryKV(), tr, recovery_rate_bytes=0, super_extent_rows=5000)
        for k, v in data.items():
            ref.register(k, v)
            core.create_table(k, v.schema, partitionings(v))
            core.append(k, v)
        res: dict[str, Any] = {
            "queries": 0,
            "equal": 0,
            "non_empty": 0,
            "quoted": [],
            "plans": {},
            "findings": [],
        }
        t0 = time.perf_counter()
        for q, sql in queries(src).items():
            try:
                want = ref.sql(sql).to_arrow_table()
            except duckdb.Error:
                sql = re.sub(r"\bat\.", '"at".', re.sub(r"\bAS at\b", 'AS "at"', sql))
                want = ref.sql(sql).to_arrow_table()
                res["quoted"].append(q)
            res["queries"] += 1
            try:
                got, plan = core.sql(sql)
            except Exception as exc:  # noqa: BLE001 (what the store said is the finding)
                res["findings"].append(
                    {"query": q, "kind": "refused", "error": f"{type(exc).__name__}: {exc}"[:400]}
                )
                continue
            res["plans"][plan.kind] = res["plans"].get(plan.kind, 0) + 1
            if got.schema.names == want.schema.names and rows(got) == rows(want):
                res["equal"] += 1
                res["non_empty"] += any(v is not None for r in want.to_pylist() for v in r.values())
            else:
                res["findings"].append(
                    {"query": q, "kind": "wrong", "got": str(rows(got)[:2]), "want": str(rows(want)[:2])}
                )
        res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microco.benchmarks.store_job",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--git", help="the suite's repository (a clone or a bare mirror), read at HEAD")
    where.add_argument("--dir", help="a folder holding schema.sql and the queries")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--dense", type=int, default=1, help="divide the sizes of the most-referenced tables by this"
    )
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    res = run(Source(args.git, args.dir), args.seed, args.dense)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for f in res["findings"]:
            print(f"{f['query']}: {f['kind']}: {f.get('error') or (f['got'], f['want'])}")
        print(
            f"{res['equal']}/{res['queries']} equal to DuckDB ({res['non_empty']} of them non-empty), "
            f"plans {res['plans']}, {res['seconds']} s"
        )
    return 0 if res["equal"] == res["queries"] else 1


if __name__ == "__main__":
    sys.exit(main())
