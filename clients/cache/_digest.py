"""Content addressing: every sample and chunk is named by the BLAKE3 hash of its bytes.

A digest is a capability. The cache never lists digests: the Redis directory and the file
names on disk use *locators* derived from a digest by a one-way, domain-separated hash, so
whoever sees the directory or lists a cache server's disk learns where a chunk is without
learning the name needed to read it. Only a client that holds the data (or an index
computed from it) can name, and therefore read, a chunk.
"""

from __future__ import annotations

import blake3

DIGEST_HEX_LEN = 64


def digest(data: bytes | memoryview) -> str:
    """The content digest of ``data``: BLAKE3-256, lower-case hex."""
    return blake3.blake3(data).hexdigest()


def is_digest(value: str) -> bool:
    """True when ``value`` is well-formed (64 lower-case hex digits)."""
    if len(value) != DIGEST_HEX_LEN:
        return False
    try:
        int(value, 16)
    except ValueError:
        return False
    return value == value.lower()


def _derive(domain: bytes, value: str) -> str:
    return blake3.blake3(domain + bytes.fromhex(value)).hexdigest()[:40]


def file_locator(chunk_digest: str) -> str:
    """The file name of a chunk on a cache server's disk."""
    return _derive(b"quiver/file/v1:", chunk_digest)


def directory_locator(chunk_digest: str) -> str:
    """The key of a chunk in the Redis directory (unrelated to its file name)."""
    return _derive(b"quiver/dir/v1:", chunk_digest)
