"""One job's links across the systems (issue 21): its device timeline, its cache hits and the
compiler configuration its training step ran under, assembled from what each system reports.

Pure: the view (``_views.job_links``) reads the three sources; this module only joins them on
the job id, so the joining is unit-tested without servers.

* **Cache**: every cache server's ``CacheStats.job_stats`` entries of this job (one per
  dataset the job read from that server), summed per dataset across servers.
* **Compiler**: the graphs whose ``jobs`` name this job (the compiler client sends
  ``$MICROCO_JOB_ID`` when it registers a graph; the service keeps the last 100 jobs per graph).
"""

from __future__ import annotations

from typing import Any


def _rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def cache_links(job_id: str, servers: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's cache counters. ``servers``: ``{"instance_id", "stats": CacheStats as a dict,
    "error"}`` per cache server (``stats`` absent when the server could not be read).

    Answers per dataset (summed over servers) and per (server, dataset), with the totals; a
    server that could not be read is listed in ``errors`` rather than counted as zero."""
    per_server: list[dict[str, Any]] = []
    datasets: dict[str, dict[str, Any]] = {}
    errors: list[dict[str, str]] = []
    for server in servers:
        instance = str(server.get("instance_id", ""))
        if server.get("error"):
            errors.append({"instance_id": instance, "error": str(server["error"])})
            continue
        for entry in (server.get("stats") or {}).get("job_stats") or []:
            if str(entry.get("job_id", "")) != job_id:
                continue
            dataset = str(entry.get("dataset", ""))
            hits, misses = int(entry.get("hits", 0)), int(entry.get("misses", 0))
            served = int(entry.get("bytes_served", 0))
            per_server.append(
                {
                    "instance_id": instance,
                    "dataset": dataset,
                    "hits": hits,
                    "misses": misses,
                    "bytes_served": served,
                    "hit_rate": _rate(hits, misses),
                }
            )
            d = datasets.setdefault(
                dataset, {"dataset": dataset, "hits": 0, "misses": 0, "bytes_served": 0, "servers": []}
            )
            d["hits"] += hits
            d["misses"] += misses
            d["bytes_served"] += served
            d["servers"].append(instance)
    rows = [{**d, "hit_rate": _rate(d["hits"], d["misses"])} for _, d in sorted(datasets.items())]
    hits = sum(d["hits"] for d in rows)
    misses = sum(d["misses"] for d in rows)
    return {
        "datasets": rows,
        "servers": sorted(per_server, key=lambda s: (s["instance_id"], s["dataset"])),
        "hits": hits,
        "misses": misses,
        "bytes_served": sum(d["bytes_served"] for d in rows),
        "hit_rate": _rate(hits, misses),
        "errors": errors,
    }


def compiler_links(job_id: str, graphs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The graphs this job registered, newest registration first, each with ``job``: this job's
    registration (``registered_at``, and ``committed``: it started from a committed configuration,
    with no exploration). ``graphs``: ``GraphState`` dicts (with the console's summary figures)."""
    out = []
    for g in graphs:
        mine = [j for j in g.get("jobs") or [] if str(j.get("job_id", "")) == job_id]
        if mine:
            reg = max(mine, key=lambda j: float(j.get("registered_at") or 0.0))
            out.append({**g, "job": reg})
    return sorted(out, key=lambda g: (-float(g["job"].get("registered_at") or 0.0), str(g.get("key", ""))))


def job_links(
    job: dict[str, Any],
    cache: dict[str, Any],
    compiler: dict[str, Any],
) -> dict[str, Any]:
    """The job (with its timeline, scheduler history and progress, as ``GET /jobs/{id}`` answers
    it) beside its cache counters and compiler graphs. ``cache``/``compiler``: ``{"available",
    "reason", "servers"}`` / ``{"available", "reason", "graphs"}`` as the views read them; a
    system that is not there says so instead of showing zero hits or no configuration."""
    job_id = str(job.get("id", ""))
    cache_part: dict[str, Any] = {
        "available": bool(cache.get("available")),
        "reason": cache.get("reason", ""),
    }
    if cache_part["available"]:
        cache_part.update(cache_links(job_id, cache.get("servers") or []))
    compiler_part: dict[str, Any] = {
        "available": bool(compiler.get("available")),
        "reason": compiler.get("reason", ""),
        "graphs": compiler_links(job_id, compiler.get("graphs") or []) if compiler.get("available") else [],
    }
    return {"job": job, "cache": cache_part, "compiler": compiler_part}
