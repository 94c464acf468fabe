"""A cache server whose disk fills before its capacity does (session 40's held-out round, an
operator's fault: ``--capacity`` larger than the room under ``--data-dir``, or others filling
that disk). Every insert was then an INTERNAL error, for as long as the server ran, and each
left its part-written file behind. Now the chunk that finds no room is refused as ``disk_full``,
saying where; the server's capacity comes down to what the disk holds, so later inserts evict
cold chunks as at a full cache; reads go on."""

from __future__ import annotations

import os

import pytest

from microco.clients.cache import CacheClient
from microco.clients.cache._digest import digest

pytestmark = pytest.mark.integration


def test_a_full_disk_refuses_the_chunk_clearly_and_the_cache_goes_on(cache_server, tmp_path, small_disk):
    (tmp_path / "server-full").symlink_to(small_disk)  # the server's data directory, on the small disk
    server = cache_server(capacity="16M", name="full")
    chunks = [os.urandom(1 << 20) for _ in range(7)]
    with CacheClient(server.address) as c:
        outcomes = []
        for data in chunks:
            r = c.put_chunks([(digest(data), data)], dataset="ds")
            outcomes.append(
                ("stored", "")
                if r.stored
                else (r.rejected[0].reason, r.rejected[0].detail)
                if r.rejected
                else ("?", "")
            )
        reasons = [o for o, _ in outcomes]
        assert "disk_full" in reasons, outcomes
        detail = next(d for o, d in outcomes if o == "disk_full")
        assert "no space left" in detail and "capacity is now" in detail, detail
        # after it, inserts make room by evicting, as at a full cache
        assert reasons[reasons.index("disk_full") + 1 :] == ["stored"] * (
            len(reasons) - reasons.index("disk_full") - 1
        )
        last = chunks[-1]
        assert c.read_chunks([digest(last)]) == {digest(last): last}
        assert not list((small_disk / "cache" / "tmp").iterdir())  # nothing part-written left
