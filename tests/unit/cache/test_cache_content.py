"""Pins, quotas and allocation follow chunk digests, not the dataset name that inserted them."""

from __future__ import annotations

from microco.services.cache import CacheCore, ChunkStore, digest


def _chunks(n: int, size: int = 100, salt: int = 0) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        data = bytes([(i + salt) % 256]) * size
        out.append((digest(data), data))
    return out


def _timings(t_hit: float, t_miss: float, batch_bytes: int) -> list[tuple[float, float, int, int]]:
    return [(0.0, t_miss, batch_bytes, 10), (1.0, t_hit, batch_bytes, 10)] * 3


def test_a_second_users_job_on_the_same_bytes_pins_them(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path)), 300, "coordinated")
    chunks = _chunks(3)
    digests = [d for d, _ in chunks]
    core.report_progress("a", "alice-imgs", 0, [], dataset_bytes=300)
    for d, data in chunks:
        assert core.put(d, data, "alice-imgs").outcome == "stored"
    # Bob's job reads the same bytes under his own name: it has consumed none of them.
    core.report_progress("b", "bob-imgs", 0, [], dataset_bytes=300)
    assert core.lookup(digests, "bob-imgs") == digests
    core.report_progress("a", "alice-imgs", 0, digests)  # alice's job is done with them
    new, data = _chunks(1, salt=50)[0]
    r = core.put(new, data, "alice-imgs")
    assert r.outcome in ("no_evictable", "over_allocation"), r  # bob still needs every one of them
    core.report_progress("b", "bob-imgs", 0, digests[:1])
    assert core.put(new, data, "alice-imgs").outcome == "stored"  # now the first may go
    assert digests[0] not in core.lookup(digests)


def test_allocation_never_counts_the_same_bytes_twice(tmp_path):
    core = CacheCore(ChunkStore(str(tmp_path)), 1000, "coordinated", probe_bytes=0)
    shared = [d for d, _ in _chunks(3)]
    # Two users, the same 300 bytes under two names; a third dataset of 800 bytes.
    core.lookup(shared, "alice-imgs")
    core.lookup(shared, "bob-imgs")
    core.report_progress("a", "alice-imgs", 0, [], _timings(0.1, 1.0, 100), dataset_bytes=300)
    core.report_progress("b", "bob-imgs", 0, [], _timings(0.1, 1.0, 100), dataset_bytes=300)
    core.report_progress("c", "text", 0, [], _timings(0.5, 1.0, 100), dataset_bytes=800)
    allocs = core.allocations
    assert sum(a.bytes for a in allocs) <= 1000
    by = {ds: a for a in allocs for ds in a.dataset.split("+")}
    assert by["alice-imgs"] is by["bob-imgs"] and by["alice-imgs"].bytes == 300
    assert set(by["alice-imgs"].jobs) == {"a", "b"}  # one copy serves both: their benefit adds up
    assert by["text"].bytes == 700
    # The quota binds the shared bytes once, whichever name inserts them.
    for d, data in _chunks(3):
        assert core.put(d, data, "bob-imgs" if d == shared[1] else "alice-imgs").outcome == "stored"
    table = {a.dataset: used for a, used in core.allocation_table()}
    assert table[by["alice-imgs"].dataset] == 300
    extra, data = _chunks(1, salt=90)[0]
    core.lookup([extra], "bob-imgs")
    assert core.put(extra, data, "bob-imgs").outcome == "over_allocation"
