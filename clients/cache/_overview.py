"""What every cache server holds and how it divides its capacity, as plain dicts (for the
CLI and the console)."""

from __future__ import annotations

from typing import Any

from microco.api.cache.v1 import cache_pb2
from microco.common.errors import MicrocoError
from microco.common.registry import discover

from ._client import CacheClient


def stats_to_dict(st: cache_pb2.CacheStats) -> dict[str, Any]:
    """A ``CacheStats`` message as a plain dict (ints stay ints)."""
    n = st.hits + st.misses
    return {
        "node": st.node,
        "policy": st.policy,
        "capacity_bytes": st.capacity_bytes,
        "used_bytes": st.used_bytes,
        "chunks": st.chunks,
        "hits": st.hits,
        "misses": st.misses,
        "hit_rate": st.hits / n if n else None,
        "evictions": st.evictions,
        "corrupt_dropped": st.corrupt_dropped,
        "rejected": st.rejected,
        "bytes_served": st.bytes_served,
        "datasets": {d.dataset: {"bytes": d.bytes, "chunks": d.chunks} for d in st.datasets},
        "jobs": list(st.jobs),
        "job_stats": [
            {
                "job_id": j.job_id,
                "dataset": j.dataset,
                "hits": j.hits,
                "misses": j.misses,
                "hit_rate": j.hits / (j.hits + j.misses) if j.hits + j.misses else None,
                "bytes_served": j.bytes_served,
            }
            for j in st.job_stats
        ],
    }


def allocation_to_dict(a: cache_pb2.Allocation) -> dict[str, Any]:
    """An ``Allocation`` message as a plain dict."""
    return {
        "dataset": a.dataset,
        "bytes": a.bytes,
        "used_bytes": a.used_bytes,
        "dataset_bytes": a.dataset_bytes,
        "benefit_s_per_gb": a.benefit_s_per_gb,
        "jobs": list(a.jobs),
        "reason": a.reason,
    }


def cache_overview(kv: Any, timeout: float = 5.0) -> list[dict[str, Any]]:
    """One entry per live cache server (from etcd): instance, address, node, ``stats`` and
    ``allocations`` (each with its reason), or ``error`` when the server did not answer."""
    out = []
    for rec in sorted(discover(kv, "cache"), key=lambda r: (r.labels.get("node", ""), r.instance_id)):
        entry: dict[str, Any] = {
            "instance": rec.instance_id,
            "address": rec.address,
            "node": rec.labels.get("node", ""),
        }
        try:
            with CacheClient(rec.address, timeout=timeout) as c:
                entry["stats"] = stats_to_dict(c.stats())
                entry["allocations"] = [allocation_to_dict(a) for a in c.allocations().allocations]
        except MicrocoError as exc:
            entry["error"] = str(exc)
        out.append(entry)
    return out
