"""Which cache server owns a chunk: rendezvous (highest random weight) hashing.

A cache spread over hosts holds each chunk of a shared dataset on exactly one server, its
*owner*: the live server whose ``score(server, chunk)`` is highest. The loader (which sends a
missed chunk's insert to its owner and looks it up there) and anyone else who needs to know
compute the same answer from the same list, with no table to keep in step. When a server
joins, it takes the chunks it now scores highest on (about ``1/n`` of them) and no chunk moves
between the others; when one leaves, only its chunks move, each to its next-highest server.
Pure functions, no I/O.

Rendezvous alone is even only in expectation: over few chunks it is lumpy (6 chunks may all
score highest on one of two servers, which must then hold the dataset while the other holds
nothing of it). ``place`` bounds the loads: a dataset's chunks (in digest order) each go to the
highest-scoring server it leaves within 5% above the average share; with many chunks the
bound rarely binds, so owners and moves stay rendezvous's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence


def score(server: str, chunk_digest: str) -> int:
    """The weight of ``server`` for ``chunk_digest``: 64 bits of BLAKE2b over both."""
    h = hashlib.blake2b(f"{server}\0{chunk_digest}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def owner(chunk_digest: str, servers: Iterable[str]) -> str | None:
    """The server (by placement key) that owns ``chunk_digest``; None when there is none.
    Ties (astronomically unlikely) go to the greater key, so every caller agrees."""
    best: tuple[int, str] | None = None
    for s in servers:
        k = (score(s, chunk_digest), s)
        if best is None or k > best:
            best = k
    return best[1] if best is not None else None


def assign(chunk_digests: Iterable[str], servers: Sequence[str]) -> dict[str, list[str]]:
    """Server -> the chunks it owns (every server of ``servers`` present, maybe empty)."""
    members = sorted(set(servers))
    out: dict[str, list[str]] = {s: [] for s in members}
    if not members:
        return out
    for d in chunk_digests:
        o = owner(d, members)
        assert o is not None
        out[o].append(d)
    return out


#: A server's share of a placed dataset may exceed the average by this fraction (and one chunk).
SLACK = 0.05


def place(chunk_sizes: Mapping[str, int], servers: Sequence[str], slack: float = SLACK) -> dict[str, str]:
    """Chunk digest -> owner, for one dataset's chunks (digest -> size): rendezvous with bounded
    loads. Chunks are taken in digest order; each goes to the highest-scoring server that it
    leaves within ``(1 + slack)`` times the average share, else to the highest-scoring one still
    under that bound (there is always one: the loads so far sum to less than the total), so no
    server owns more than the bound plus one chunk.
    The same answer for every caller with the same chunks and servers."""
    members = sorted(set(servers))
    if not members:
        return {}
    bound = sum(chunk_sizes.values()) / len(members) * (1 + slack)
    load = dict.fromkeys(members, 0)
    out: dict[str, str] = {}
    for d in sorted(chunk_sizes):
        ranked = sorted(members, key=lambda s: (score(s, d), s), reverse=True)
        size = chunk_sizes[d]
        o = next(
            (s for s in ranked if load[s] + size <= bound),
            next((s for s in ranked if load[s] < bound), ranked[0]),
        )
        load[o] += size
        out[d] = o
    return out


def owned_bytes(chunk_sizes: Mapping[str, int], servers: Sequence[str]) -> dict[str, int]:
    """Server -> bytes of the chunks (digest -> size) it owns under ``place``: each server's
    share of a dataset, which is what it is told the dataset's size is (its allocation's bound)."""
    out = dict.fromkeys(sorted(set(servers)), 0)
    for d, s in place(chunk_sizes, list(out)).items():
        out[s] += chunk_sizes[d]
    return out
