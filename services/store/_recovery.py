"""Recovery planning: which extents are lost, where each is rebuilt, and what is read to rebuild it.

A lost extent ``(s, r, p)`` (its node is dead, or its checksum failed) is rebuilt from another
replica ``r2`` of super-extent ``s``: the bucket ``p`` (under ``r``'s function) of every extent of
``r2``. Those buckets hold exactly the lost rows, so bytes read per byte lost is about 1, and they
come from many nodes. The target node must not hold, nor share a fault domain with, any other copy
of those rows. Pure function of (catalog, live nodes, fault domains).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._catalog import TableInfo
from ._layout import ExtentMeta, others
from ._placement import NodeInfo, recovery_target


@dataclass
class RebuildTask:
    table: str
    super_extent: int
    lost: ExtentMeta
    source_replica: int
    sources: list[dict[str, Any]]  # {"extent", "node", "address", "bucket": [pos, part], "bytes"}
    target: str
    in_place: bool = False

    @property
    def bytes_to_read(self) -> int:
        return sum(s["bytes"] for s in self.sources)

    @property
    def bytes_lost(self) -> int:
        return sum(b[3] for b in self.lost.buckets) if self.lost.buckets else self.lost.bytes

    def full_scan_bytes(self, t: TableInfo) -> int:
        """What a rebuild without buckets would read: every extent of the source replica."""
        s = next(x for x in t.super_extents if x.id == self.super_extent)
        return sum(sum(b[3] for b in e.buckets) for e in s.replica(self.source_replica))


@dataclass
class RecoveryPlan:
    tasks: list[RebuildTask] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # why some lost extents cannot be rebuilt now


def lost_extents(t: TableInfo, live: set[str]) -> list[tuple[int, ExtentMeta]]:
    return [(s.id, e) for s in t.super_extents for e in s.extents if e.node not in live or e.state != "ok"]


def plan_recovery(
    tables: Sequence[TableInfo],
    live_nodes: Sequence[NodeInfo],
    domains: dict[str, str],
) -> RecoveryPlan:
    """Rebuild tasks for every lost extent that can be rebuilt now."""
    live = {n.name for n in live_nodes}
    addresses = {n.name: n.address for n in live_nodes}
    domain_of = {**domains, **{n.name: n.domain for n in live_nodes}}
    load: dict[str, int] = defaultdict(int)
    for t in tables:
        for e in t.extents():
            if e.node in live:
                load[e.node] += e.bytes
    plan = RecoveryPlan()
    for t in tables:
        for sid, e in lost_extents(t, live):
            s = next(x for x in t.super_extents if x.id == sid)
            r, p = e.replica, e.partition
            chosen = None
            for r2 in others(r):
                needed = [x for x in s.replica(r2) if x.bucket_rows(r, p) > 0]
                if needed and all(x.node in live and x.state == "ok" for x in needed):
                    chosen = (r2, needed)
                    break
            if chosen is None:
                plan.stuck.append(f"{t.name}/{e.id}: no complete source replica is available")
                continue
            r2, needed = chosen
            pos = others(r2).index(r)
            sources = [
                {
                    "table": t.name,
                    "extent": x.id,
                    "node": x.node,
                    "address": addresses.get(x.node, ""),
                    "bucket": [pos, p],
                    "bytes": x.bucket_bytes(r, p),
                    "checksum": x.checksum,
                }
                for x in needed
            ]
            if e.node in live:  # corrupt, node alive: rebuild in place, placement unchanged
                plan.tasks.append(RebuildTask(t.name, sid, e, r2, sources, e.node, in_place=True))
                continue
            holders = {x.node for r3 in others(r) for x in s.replica(r3) if x.bucket_rows(r, p) > 0}
            forbidden_domains = {domain_of.get(n, f"node:{n}") for n in holders}
            target = recovery_target(live_nodes, holders | {e.node}, forbidden_domains, load)
            if target is None:
                plan.stuck.append(
                    f"{t.name}/{e.id}: every live node holds, or shares a fault domain with, another copy of its rows"
                )
                continue
            load[target.name] += e.bytes
            plan.tasks.append(RebuildTask(t.name, sid, e, r2, sources, target.name))
    return plan
