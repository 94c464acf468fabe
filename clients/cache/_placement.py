"""Which cache server owns a chunk: rendezvous (highest random weight) hashing.

A cache spread over hosts holds each chunk of a shared dataset on exactly one server, its
*owner*: the live server whose ``score(server, chunk)`` is highest. The loader (which sends a
missed chunk's insert to its owner and looks it up there) and anyone else who needs to know
compute the same answer from the same list, with no table to keep in step. When a server
joins, it takes the chunks it now scores highest on (about ``1/n`` of them) and no chunk moves
between the others; when one leaves, only its chunks move, each to its next-highest server.
Pure functions, no I/O.
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


def owned_bytes(chunk_sizes: Mapping[str, int], servers: Sequence[str]) -> dict[str, int]:
    """Server -> bytes of the chunks (digest -> size) it owns: each server's share of a
    dataset, which is what it is told the dataset's size is (its allocation's bound)."""
    out = dict.fromkeys(sorted(set(servers)), 0)
    for s, ds in assign(chunk_sizes, list(out)).items():
        out[s] = sum(chunk_sizes[d] for d in ds)
    return out
