"""Prometheus metrics of a cache server, read from the core at scrape time (``microco_cache_``).

A collector rather than counters in the data path: the core already counts, and a scrape
costs one ``stats()`` call instead of a metric update per sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ._core import CacheCore


class CacheCollector:
    def __init__(self, core: CacheCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Any]:
        s = self.core.stats()
        for name, doc in (("capacity_bytes", "configured capacity"), ("used_bytes", "bytes of chunks held")):
            yield GaugeMetricFamily(f"microco_cache_{name}", doc, value=s[name])
        yield GaugeMetricFamily("microco_cache_chunks", "chunks held", value=s["chunks"])
        yield GaugeMetricFamily("microco_cache_jobs", "jobs reporting to this server", value=len(s["jobs"]))
        for name, doc in (
            ("hits", "samples jobs read from the cache"),
            ("misses", "samples jobs read from the backing store"),
            ("evictions", "chunks evicted"),
            ("corrupt_dropped", "chunks dropped because they failed verification"),
            ("rejected", "inserts refused (digest, allocation, nothing evictable)"),
            ("bytes_served", "bytes sent by ReadSamples/ReadChunks"),
        ):
            yield CounterMetricFamily(f"microco_cache_{name}", doc, value=s[name])
        per = GaugeMetricFamily("microco_cache_dataset_bytes", "bytes held per dataset", labels=["dataset"])
        alloc = GaugeMetricFamily(
            "microco_cache_allocation_bytes", "bytes allocated per dataset", labels=["dataset"]
        )
        for ds, v in s["datasets"].items():
            per.add_metric([ds], v["bytes"])
        for a, _used in self.core.allocation_table():
            alloc.add_metric([a.dataset], a.bytes)
        yield per
        yield alloc
