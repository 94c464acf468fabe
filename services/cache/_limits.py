"""Bounds on what a cache RPC may ask for, enforced at the edge (the servicer) before any work.

Every refusal is ``InvalidArgument`` with a message that names the field and the limit but
never repeats the offending value (a 1 MiB id must not come back in error metadata).
"""

from __future__ import annotations

from collections.abc import Sized

from microco.clients.cache import is_digest
from microco.common.errors import InvalidArgument

#: Digests in one Lookup, ReadChunks, OpenChunks or ReportProgress.consumed.
MAX_DIGESTS = 100_000
#: Sample reads in one ReadSamples.
MAX_READS = 100_000
#: Bytes of one sample: a sample must fit in one message (clients accept 64 MiB).
MAX_SAMPLE_BYTES = 64 << 20
#: Batch timings in one ReportProgress.
MAX_TIMINGS = 10_000
#: Dataset names, job ids and user names.
MAX_NAME = 256
#: Characters of a name a reader asks for: a string that is not a digest but no longer than this
#: simply names nothing held here (a miss); a longer one is refused.
MAX_DIGEST_CHARS = 128


def name(value: str, field: str, required: bool = False) -> str:
    if len(value) > MAX_NAME:
        raise InvalidArgument(f"{field} is {len(value)} characters long; at most {MAX_NAME}")
    if required and not value:
        raise InvalidArgument(f"{field} is required")
    return value


def count(items: Sized, field: str, limit: int) -> None:
    if len(items) > limit:
        raise InvalidArgument(f"{field} has {len(items)} entries; at most {limit} per call")


def digests(values: list[str], field: str, limit: int = MAX_DIGESTS) -> list[str]:
    """Names a reader asks about: bounded in number and length (a short non-digest is just
    not held here, as before; the core never holds one)."""
    count(values, field, limit)
    for i, d in enumerate(values):
        if len(d) > MAX_DIGEST_CHARS:
            raise InvalidArgument(f"{field}[{i}] is {len(d)} characters long; a digest has 64")
    return values


def digest_field(value: str, field: str) -> str:
    if not is_digest(value):
        raise InvalidArgument(f"{field} is not a digest (64 lower-case hex digits)")
    return value


def sample_read(i: int, chunk: str, offset: int, length: int, sample_digest: str) -> None:
    for what, d in (("chunk", chunk), ("digest", sample_digest)):
        if len(d) > MAX_DIGEST_CHARS:
            raise InvalidArgument(f"samples[{i}].{what} is {len(d)} characters long; a digest has 64")
    if offset < 0 or length < 0:
        raise InvalidArgument(f"samples[{i}]: offset and length must be non-negative")
    if length > MAX_SAMPLE_BYTES or offset > 1 << 40:
        raise InvalidArgument(
            f"samples[{i}]: length {length} or offset {offset} out of range "
            f"(a sample is at most {MAX_SAMPLE_BYTES} bytes)"
        )


def seconds(value: float, field: str) -> float:
    """A duration: finite and not negative (the core caps it)."""
    if not value >= 0 or value == float("inf"):
        raise InvalidArgument(f"{field} must be a finite number of seconds, not negative")
    return value
