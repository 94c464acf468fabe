"""Super-extent placement: which node holds each extent, so that no node and no fault domain ever
holds two copies of a row.

Fault domains are split into three disjoint groups. Every replica of a table lives on one group
and partition ``p`` of it on one node of that group, **whatever the super-extent**: so a
partition's rows, however many super-extents they were appended in, sit on one node, and a
group-by on a replica's partition column aggregates each group on one node (no merge of partials
at the coordinator), and a join of co-partitioned, co-located replicas reads only local extents.
The three replicas of a table take three disjoint groups, so the three copies of any row sit on
three nodes in three fault domains. Co-located placement (``homes``) sends the first replica of
each partition function to the group that function hashes to, and partition ``p`` to node
``p mod size`` of it, for every table, so such partitions of different tables share a node.
Pure functions of (live nodes, partition counts, homes).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from microco.common.errors import FailedPrecondition

REPLICAS = 3


@dataclass(frozen=True)
class NodeInfo:
    """A live store node as placement sees it."""

    name: str
    fault_domain: str = ""
    address: str = ""

    @property
    def domain(self) -> str:
        # A node without a label is a fault domain of its own.
        return self.fault_domain or f"node:{self.name}"


def domain_groups(nodes: Sequence[NodeInfo]) -> list[list[NodeInfo]]:
    """Split nodes into three groups with disjoint fault domains, balanced by node count."""
    by_domain: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in nodes:
        by_domain[n.domain].append(n)
    if len(by_domain) < REPLICAS:
        raise FailedPrecondition(
            f"need live store nodes in at least {REPLICAS} fault domains, have {len(by_domain)} "
            f"({len(nodes)} nodes: {sorted(n.name for n in nodes)})"
        )
    groups: list[list[NodeInfo]] = [[] for _ in range(REPLICAS)]
    for dom in sorted(by_domain, key=lambda d: (-len(by_domain[d]), d)):
        target = min(range(REPLICAS), key=lambda g: (len(groups[g]), g))
        groups[target].extend(sorted(by_domain[dom], key=lambda n: n.name))
    for g in groups:
        g.sort(key=lambda n: n.name)
    return groups


def place_super_extent(
    nodes: Sequence[NodeInfo],
    super_extent: int,
    partition_counts: Sequence[int],
    homes: Sequence[str | None] | None = None,
) -> dict[tuple[int, int], str]:
    """Node name for every extent ``(replica, partition)`` of super-extent ``super_extent``.

    The answer does not depend on ``super_extent`` (kept so callers say which one they place):
    replica ``r`` goes to one group and partition ``p`` to one node of it for every super-extent,
    so each partition of each replica stays on one node as a table grows (until the live nodes
    change: a new group layout places later super-extents anew).

    ``homes[r]``, when given, names replica ``r``'s partition function (``PartitionSpec.function_key``):
    such a replica is *co-located*: it goes to the group that key hashes to, and partition ``p``
    to node ``p mod size`` of that group, whatever the table. So partition ``p`` of every table
    partitioned by the same function sits on one node, and a join on those keys moves no bytes.
    The other replicas take the remaining groups in replica order, partition ``p`` on node
    ``(p + r) mod size`` (the replica number spreads partitions that do not divide evenly)."""
    del super_extent  # placement is the same for every super-extent (see above)
    groups = domain_groups(nodes)
    homes = list(homes) if homes is not None else [None] * len(partition_counts)
    taken: dict[int, int] = {}  # replica -> group
    homed: set[int] = set()
    for r, key in enumerate(homes):
        if key is not None:
            g = zlib.crc32(key.encode()) % REPLICAS
            if g not in taken.values():
                taken[r] = g
                homed.add(r)
    for r in range(len(partition_counts)):
        if r in taken:
            continue
        g = r % REPLICAS
        while g in taken.values():
            g = (g + 1) % REPLICAS
        taken[r] = g
    out: dict[tuple[int, int], str] = {}
    for r, count in enumerate(partition_counts):
        group = groups[taken[r]]
        shift = 0 if r in homed else r
        for p in range(count):
            out[(r, p)] = group[(p + shift) % len(group)].name
    return out


@dataclass(frozen=True)
class Copy:
    """Where one copy of some rows lives: used to check the invariant."""

    replica: int
    node: str
    domain: str


def check_row_copies(copies: Iterable[Copy]) -> str | None:
    """None if the copies of one row are 3, on 3 nodes in 3 fault domains; else what is wrong."""
    cs = list(copies)
    replicas = sorted(c.replica for c in cs)
    if replicas != list(range(REPLICAS)):
        return f"row has copies in replicas {replicas}, expected one in each of 0..{REPLICAS - 1}"
    if len({c.node for c in cs}) != len(cs):
        return f"two copies on one node: {[c.node for c in cs]}"
    if len({c.domain for c in cs}) != len(cs):
        return f"two copies in one fault domain: {[c.domain for c in cs]}"
    return None


def recovery_target(
    candidates: Sequence[NodeInfo],
    forbidden_nodes: set[str],
    forbidden_domains: set[str],
    load: dict[str, int],
) -> NodeInfo | None:
    """The least-loaded live node outside the nodes and domains that already hold a copy of any of
    the rows to rebuild; None when no node qualifies (the extent stays under-replicated)."""
    ok = [n for n in candidates if n.name not in forbidden_nodes and n.domain not in forbidden_domains]
    if not ok:
        return None
    return min(ok, key=lambda n: (load.get(n.name, 0), n.name))
