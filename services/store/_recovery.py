"""Recovery planning: which extents are lost, where each is rebuilt, and what is read to rebuild it.

A lost extent ``(s, r, p)`` (its node is dead, or its checksum failed) is rebuilt from another
replica ``r2`` of super-extent ``s``: the bucket ``p`` (under ``r``'s function) of every extent of
``r2``. Those buckets hold exactly the lost rows, so bytes read per byte lost is about 1, and they
come from many nodes (``r2`` alternates between the two other replicas, so both of their node
groups serve reads). The target node must not hold, nor share a fault domain with, any other copy
of those rows. Pure function of (catalog, live nodes, fault domains).

When an extent cannot be rebuilt now it is *stuck*, with a reason and what an operator can do
(``RecoveryPlan.advice``): its rows have no complete copy on live nodes (bring those nodes back),
or no live node is outside the nodes and fault domains holding the other copies (add a node in
another domain, or allow a shared domain with ``relax_domains``: the rebuilt copy then goes to
a node holding no copy of those rows, in a domain that holds one).
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
    relaxed: bool = False  # the target shares a fault domain with another copy (operator's choice)

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
    advice: list[str] = field(default_factory=list)  # what an operator can do about the stuck ones


RELAX_COMMAND = "microco store recovery --start --relax-fault-domains"


def _advice(
    no_source: dict[str, int], no_domain: dict[tuple[str, ...], int], no_node: dict[tuple[str, ...], int]
) -> list[str]:
    out = []
    for nodes, n in sorted(no_source.items()):
        out.append(
            f"{n} lost extents have no complete copy on live nodes: bring back store node(s) {nodes} "
            "(they hold the other copies; recovery resumes by itself once they register)"
        )
    for domains, n in sorted(no_domain.items()):
        out.append(
            f"{n} lost extents need a node outside fault domain(s) {', '.join(domains)} (they hold the "
            "other copies of those rows): add a store node in another fault domain, or run "
            f"`{RELAX_COMMAND}` (administrator) to rebuild them on live nodes that hold no copy of "
            "those rows, sharing a fault domain with one"
        )
    for domains, n in sorted(no_node.items()):
        out.append(
            f"{n} lost extents: every live store node holds another copy of some of their rows: start a "
            f"store node in a fault domain other than {', '.join(domains)} (recovery uses it as soon as it "
            "registers)"
        )
    return out


def lost_extents(t: TableInfo, live: set[str]) -> list[tuple[int, ExtentMeta]]:
    return [(s.id, e) for s in t.super_extents for e in s.extents if e.node not in live or e.state != "ok"]


def plan_recovery(
    tables: Sequence[TableInfo],
    live_nodes: Sequence[NodeInfo],
    domains: dict[str, str],
    relax_domains: bool = False,
) -> RecoveryPlan:
    """Rebuild tasks for every lost extent that can be rebuilt now; with ``relax_domains`` an
    extent no node of an unused fault domain can take goes to a node that holds no copy of its
    rows (the node rule kept, the domain rule given up for it)."""
    live = {n.name for n in live_nodes}
    addresses = {n.name: n.address for n in live_nodes}
    domain_of = {**domains, **{n.name: n.domain for n in live_nodes}}
    load: dict[str, int] = defaultdict(int)
    for t in tables:
        for e in t.extents():
            if e.node in live:
                load[e.node] += e.bytes
    plan = RecoveryPlan()
    no_source: dict[str, int] = defaultdict(int)
    no_domain: dict[tuple[str, ...], int] = defaultdict(int)
    no_node: dict[tuple[str, ...], int] = defaultdict(int)
    for t in tables:
        for sid, e in lost_extents(t, live):
            s = next(x for x in t.super_extents if x.id == sid)
            r, p = e.replica, e.partition
            chosen = None
            # alternate the source replica between the two others (by super-extent and
            # partition): each replica lives on one group of nodes (placement), so always taking
            # the first would read every rebuild from one group while the other's nodes idle
            a2, b2 = others(r)
            for r2 in (a2, b2) if (sid + p) % 2 == 0 else (b2, a2):
                needed = [x for x in s.replica(r2) if x.bucket_rows(r, p) > 0]
                if needed and all(x.node in live and x.state == "ok" for x in needed):
                    chosen = (r2, needed)
                    break
            if chosen is None:
                missing = sorted(
                    {x.node for r2 in others(r) for x in s.replica(r2) if x.bucket_rows(r, p) > 0} - live
                )
                plan.stuck.append(
                    f"{t.name}/{e.id}: no complete source replica is available"
                    + (f" (other copies on dead nodes {', '.join(missing)})" if missing else " (corrupt)")
                )
                no_source[", ".join(missing) or "holding the corrupt copies"] += 1
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
            relaxed = False
            if target is None and relax_domains:
                target = recovery_target(live_nodes, holders | {e.node}, set(), load)
                relaxed = target is not None
            if target is None:
                if recovery_target(live_nodes, holders | {e.node}, set(), load) is None:
                    plan.stuck.append(
                        f"{t.name}/{e.id}: every live node holds another copy of some of its rows"
                    )
                    no_node[tuple(sorted(forbidden_domains))] += 1
                else:
                    plan.stuck.append(
                        f"{t.name}/{e.id}: every live node holds, or shares a fault domain with, another "
                        f"copy of its rows (domains {', '.join(sorted(forbidden_domains))})"
                    )
                    no_domain[tuple(sorted(forbidden_domains))] += 1
                continue
            load[target.name] += e.bytes
            plan.tasks.append(RebuildTask(t.name, sid, e, r2, sources, target.name, relaxed=relaxed))
    plan.advice = _advice(no_source, no_domain, no_node)
    return plan
