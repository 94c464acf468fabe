"""The length of a union of time intervals: what a step's profile spent in a kind of kernel,
overlaps counted once (both frameworks' profiles, ``_step_profile`` and ``_tf_profile``)."""

from __future__ import annotations

from collections.abc import Iterable


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union of ``(start, end)`` intervals, in their own unit."""
    total, end = 0, -1
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total
