"""``microco cache ...``: Quiver datasets, cache servers and their allocations."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._platform import add_etcd_arguments


def register(sub: Any) -> None:
    p = sub.add_parser(
        "cache",
        help="Quiver: register datasets, inspect cache servers and allocations",
        description=(
            "Quiver caches training data by content. Register a dataset once (it is indexed into\n"
            "samples and chunks named by their BLAKE3 digests); jobs then read it through the cache\n"
            "server on their host with microco.clients.cache (PyTorch and tf.data integrations)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_etcd_arguments(p)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    s = p.add_subparsers(dest="cache_command", metavar="SUBCOMMAND")

    r = s.add_parser(
        "register",
        help="index a dataset and record it in etcd",
        description="Read every file under PATH (a directory or fsspec URL) once, name each by its content "
        "digest, group them into chunks, keep the index in the cache's state (HOME/cache/indexes, no more "
        "readable than the data; nothing is written into PATH) and record NAME in etcd.",
    )
    r.add_argument("name", help="dataset name (letters, digits, - _ .)")
    r.add_argument("path", help="local directory or fsspec URL of the data")
    r.add_argument("--chunk-size", default="4M", help="target chunk size (e.g. 4M, 512K)")
    r.add_argument(
        "--records",
        default="file",
        metavar="FORMAT",
        help="what a sample is: a whole file (file, the default) or each record of one: tfrecord "
        "(TFRecord shards), tar (WebDataset shards: members sharing a key are one sample), lines "
        "(JSON lines, text), npy (rows of a .npy array), idx (items of an MNIST-style IDX file), fixed:N (every N bytes, e.g. token blocks)",
    )
    r.add_argument(
        "--include",
        default="",
        metavar="GLOB",
        help="only the files whose path or name matches GLOB, e.g. '*.tfrecord-*' in a folder TFDS wrote "
        "(beside its dataset_info.json)",
    )
    r.add_argument(
        "--owner",
        default="",
        help="whose dataset it is (default: yours: the user your credentials name, or the system user "
        "without them); another user's only as an administrator. Each user's datasets are readable only "
        "by them, their jobs, administrators and the cache service",
    )
    r.add_argument("--json", action="store_true", help="print the record as JSON")
    r.set_defaults(func=cmd_register)

    d = s.add_parser("datasets", help="list your registered datasets (--all: every user's)")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.add_argument("--all", action="store_true", help="every user's datasets (administrators only)")
    d.set_defaults(func=cmd_datasets)

    st = s.add_parser("stats", help="capacity, use, hits and misses of every cache server")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=cmd_stats)

    al = s.add_parser(
        "allocations",
        help="how each cache server divides its capacity, and why",
        description="Per server and dataset: bytes allocated and used, measured benefit "
        "(seconds of training saved per epoch per GB cached), the jobs reading it and the reason.",
    )
    al.add_argument("--json", action="store_true", help="print JSON")
    al.set_defaults(func=cmd_allocations)


def _kv(args: argparse.Namespace) -> Any:
    from microco.common.kv import EtcdKV

    from . import etcd_for

    return EtcdKV(etcd_for(args))


def _human(n: float) -> str:
    from ._format import size

    return size(n)


def _table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    from ._format import print_table

    print_table(rows, cols)


def cmd_register(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from tqdm import tqdm

    from microco.clients.cache import included, open_store, register_dataset
    from microco.services.cache import parse_size

    chunk = parse_size(args.chunk_size)
    total = sum(size for _, size in included(open_store(args.path).list_files(), args.include))
    kv = _kv(args)
    try:
        with tqdm(
            total=total, unit="B", unit_scale=True, desc=f"indexing {args.name}", disable=args.json
        ) as bar:
            rec, _ = register_dataset(
                kv,
                args.name,
                args.path,
                owner=args.owner or None,
                chunk_bytes=chunk,
                progress=bar.update,
                home=str(args.home) if args.home else None,
                records=args.records,
                include=args.include,
            )
    finally:
        kv.close()
    if args.json:
        print(json.dumps(asdict(rec), indent=2))
    else:
        print(
            f"registered {rec.name}: {rec.num_samples} samples"
            + (f" ({rec.records} records)" if rec.records != "file" else "")
            + f" in {rec.num_chunks} chunks, "
            f"{_human(rec.total_bytes)}, index {rec.index_digest[:16]}..."
        )
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from microco.clients.cache import list_datasets

    kv = _kv(args)
    try:
        recs = list_datasets(kv, everyone=args.all)
    finally:
        kv.close()
    if args.json:
        print(json.dumps([asdict(r) for r in recs], indent=2))
        return 0
    _table(
        [
            {
                "name": r.name,
                "samples": r.num_samples,
                "chunks": r.num_chunks,
                "size": _human(r.total_bytes),
                "records": r.records,
                "owner": r.owner,
                "url": r.url,
            }
            for r in recs
        ],
        ["name", "samples", "chunks", "size", "records", "owner", "url"],
    )
    return 0


def _overview(args: argparse.Namespace) -> list[dict[str, Any]]:
    from microco.clients.cache import cache_overview
    from microco.common.errors import Unavailable

    kv = _kv(args)
    try:
        servers = cache_overview(kv)
    finally:
        kv.close()
    if not servers:
        raise Unavailable(
            "no cache server is registered in etcd (start one: python -m microco.services.cache)"
        )
    return servers


def cmd_stats(args: argparse.Namespace) -> int:
    servers = _overview(args)
    if args.json:
        print(json.dumps([{k: v for k, v in s.items() if k != "allocations"} for s in servers], indent=2))
        return 0
    out = []
    for s in servers:
        st = s.get("stats")
        if st is None:
            out.append(
                {"node": s["node"], "address": s["address"], "policy": f"unreachable: {s.get('error', '')}"}
            )
            continue
        out.append(
            {
                "node": st["node"],
                "address": s["address"],
                "policy": st["policy"],
                "used": f"{_human(st['used_bytes'])} / {_human(st['capacity_bytes'])}",
                "chunks": st["chunks"],
                "hit_rate": "-" if st["hit_rate"] is None else f"{st['hit_rate']:.0%}",
                "served": _human(st["bytes_served"]),
                "evicted": st["evictions"],
                "corrupt": st["corrupt_dropped"],
                "jobs": ",".join(st["jobs"]),
            }
        )
    _table(
        out,
        ["node", "address", "policy", "used", "chunks", "hit_rate", "served", "evicted", "corrupt", "jobs"],
    )
    return 0


def cmd_allocations(args: argparse.Namespace) -> int:
    servers = _overview(args)
    if args.json:
        print(
            json.dumps(
                [
                    {"address": s["address"], "node": s["node"], "allocations": s.get("allocations", [])}
                    for s in servers
                ],
                indent=2,
            )
        )
        return 0
    out = []
    for s in servers:
        for a in s.get("allocations", []):
            out.append(
                {
                    "server": s["node"] or s["address"],
                    "dataset": a["dataset"],
                    "allocated": _human(a["bytes"]),
                    "used": _human(a["used_bytes"]),
                    "size": _human(a["dataset_bytes"]),
                    "benefit_s/GB": f"{a['benefit_s_per_gb']:.3g}",
                    "jobs": ",".join(a["jobs"]),
                    "reason": a["reason"],
                }
            )
    if not out:
        print("no allocations yet: no job has reported to a cache server")
        return 0
    _table(out, ["server", "dataset", "allocated", "used", "size", "benefit_s/GB", "jobs", "reason"])
    return 0
