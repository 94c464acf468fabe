"""A cache spread over hosts: chunk ownership by rendezvous hashing (pure functions)."""

from __future__ import annotations

import hashlib

from microco.clients.cache import Member, SpreadCache, chunk_owner, members_from_records, owned_bytes
from microco.clients.cache._placement import assign
from microco.common.registry import ServiceRecord


def _digests(n: int) -> list[str]:
    return [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]


def test_adding_a_fourth_server_moves_a_quarter_and_none_between_the_others():
    ds = _digests(4000)
    three = ["host-a", "host-b", "host-c"]
    before = {d: chunk_owner(d, three) for d in ds}
    after = {d: chunk_owner(d, [*three, "host-d"]) for d in ds}
    moved = [d for d in ds if before[d] != after[d]]
    assert all(after[d] == "host-d" for d in moved)  # nothing moves between the other three
    assert 0.22 < len(moved) / len(ds) < 0.28  # ~1/4 (binomial sd ~0.007)


def test_a_server_leaving_moves_only_its_share():
    ds = _digests(2000)
    four = ["a", "b", "c", "d"]
    before = {d: chunk_owner(d, four) for d in ds}
    after = {d: chunk_owner(d, ["a", "b", "d"]) for d in ds}
    assert all(before[d] == "c" for d in ds if before[d] != after[d])
    held_by_c = [d for d in ds if before[d] == "c"]
    # c's chunks spread over all three survivors, not all to one.
    assert {after[d] for d in held_by_c} == {"a", "b", "d"}


def test_ownership_is_disjoint_complete_and_order_free():
    ds = _digests(1000)
    got = assign(ds, ["x", "y", "z"])
    assert sorted(d for part in got.values() for d in part) == sorted(ds)
    assert assign(ds, ["z", "x", "y", "x"]) == got
    assert chunk_owner(ds[0], []) is None
    sizes = {d: i + 1 for i, d in enumerate(ds)}
    share = owned_bytes(sizes, ["x", "y", "z"])
    assert sum(share.values()) == sum(sizes.values())
    assert all(v > 0 for v in share.values())


def test_members_are_keyed_by_node_and_disambiguated():
    recs = [
        ServiceRecord("cache", "i2", "h:2", labels={"node": "n1"}),
        ServiceRecord("cache", "i1", "h:1", labels={"node": "n1"}),
        ServiceRecord("cache", "i3", "h:3", labels={"node": "n2"}),
        ServiceRecord("cache", "i4", "h:4", labels={}),
    ]
    keys = [m.key for m in members_from_records(recs)]
    assert sorted(keys) == ["i4", "n1/i1", "n1/i2", "n2"]
    spread = SpreadCache(members=[Member("n2", "h:3", "n2"), Member("n1", "h:1", "n1")])
    ds = _digests(200)
    owners = {spread.owner_key(d) for d in ds}
    assert owners == {"n1", "n2"}
    assert {m.key for m in spread.split(ds)} == {"n1", "n2"}
