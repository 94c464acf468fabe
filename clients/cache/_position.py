"""A data-parallel job's position in an epoch, whatever its number of ranks.

A loader's ``state_dict()`` is its rank's position: the epoch, the samples this rank has been
given in it (``seen``), the samples the job had been given before this rank's share was split
(``base``: empty unless the epoch was resumed with another number of ranks), and ``job_seen``,
what this rank knows the whole job has been given. ``job_complete`` says whether that is all of
it: with hits exchanged between ranks (or with one rank) every rank knows every rank's progress,
so any one rank's position, taken at a step boundary as DDP's checkpoints are, is the job's;
with a static split each rank's order depends on its own cache, and only every rank's position
together is the job's (``merge_positions``). A job-wide position resumes with any number of
ranks: the samples no rank has seen are split again. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ints(state: dict[str, Any], key: str) -> list[int]:
    v = state.get(key) or []
    if not isinstance(v, list):
        raise ValueError(f"a saved position's {key!r} must be a list of sample indices")
    return [int(i) for i in v]


def job_seen(state: dict[str, Any]) -> set[int] | None:
    """The samples the whole job had been given at ``state`` (a loader's ``state_dict()`` or a
    merged position), or None when the position is one rank's of several (a static split)."""
    world = state.get("world_size")
    complete = state.get("job_complete")
    if complete is None:  # (a position saved before these fields: only one rank's is whole)
        complete = world == 1
    if not complete:
        return None
    if "job_seen" in state:
        return set(ints(state, "job_seen"))
    return set(ints(state, "seen"))


def merge_positions(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's ``state_dict()`` of one checkpoint -> the job's position, which loaders of
    any number of ranks load (``load_state_dict``). Refuses positions that are not of one job at
    one point: a missing rank, ranks in different epochs, a sample given to two ranks."""
    if not states:
        raise ValueError("no positions to merge")
    ns = {s.get("num_samples") for s in states}
    if len(ns) != 1:
        raise ValueError(f"the positions are for different datasets ({sorted(map(str, ns))} samples)")
    epochs = {int(s.get("epoch", -1)) for s in states}
    if len(epochs) != 1:
        raise ValueError(f"the ranks' positions are in different epochs: {sorted(epochs)}")
    (n,), (epoch,) = ns, epochs
    if not isinstance(n, int):
        raise ValueError("a saved position has no sample count")
    whole = [s for s in states if job_seen(s) is not None]
    if whole and len(whole) == len(states):
        # Every position is already the job's (ranks exchanging hits): they must agree.
        union: set[int] = set()
        for s in whole:
            union |= job_seen(s) or set()
        done = all(bool(s.get("epoch_done")) for s in whole)
        return _job_position(epoch, n, union, done)
    worlds = {s.get("world_size") for s in states}
    if len(worlds) != 1 or not isinstance(next(iter(worlds)), int):
        raise ValueError(f"the positions were saved by jobs of different sizes: {sorted(map(str, worlds))}")
    world = int(next(iter(worlds)))  # type: ignore[arg-type]
    ranks = sorted(int(s.get("rank", -1)) for s in states)
    if ranks != list(range(world)):
        raise ValueError(
            f"need the position of every rank of the {world}-rank job, exactly once; got ranks {ranks}"
        )
    bases = {tuple(sorted(ints(s, "base"))) for s in states}
    if len(bases) != 1:
        raise ValueError("the ranks' positions start from different resumed positions")
    union = set(next(iter(bases)))
    for s in states:
        mine = ints(s, "seen")
        twice = union.intersection(mine)
        if twice or len(set(mine)) != len(mine):
            raise ValueError(
                f"a sample was given twice ({len(twice) or len(mine) - len(set(mine))} of them): "
                "positions of different checkpoints?"
            )
        union.update(mine)
    if any(not 0 <= i < n for i in union):
        raise ValueError("a saved position names samples out of range")
    return _job_position(epoch, n, union, all(bool(s.get("epoch_done")) for s in states))


def _job_position(epoch: int, n: Any, seen: set[int], done: bool) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "num_samples": n,
        "seen": [],
        "base": sorted(seen),
        "job_seen": sorted(seen),
        "job_complete": True,
        "rank": None,
        "world_size": None,
        "epoch_done": done,
    }
