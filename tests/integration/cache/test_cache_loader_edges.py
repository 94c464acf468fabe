"""Loader edges against an in-process cache server: map-style access, honest hit counts,
an explicit "no cache"."""

from __future__ import annotations

from microco.clients.cache import QuiverLoader, open_loader, register_dataset
from microco.common.kv import MemoryKV
from microco.services.cache import LocalStore, build_index


def _loader(root, address, **kw):
    store = LocalStore(str(root))
    idx = build_index(store.list_files(), store.read, 8000)
    return idx, QuiverLoader(
        idx, store, batch_size=8, dataset="d", job_id="j", server=address, prefetch=False, **kw
    )


def test_map_style_access_before_any_epoch(make_dataset, tmp_path, inproc_cache):
    # What ``QuiverDataset(loader)[i]`` and ``__getitems__`` call (the torch wrapper itself runs
    # in test_cache_frameworks.py; importing torch here would cost this test seconds).
    files = make_dataset(tmp_path / "d", n=40, size=2000)
    address, _core = inproc_cache(1 << 20)
    idx, loader = _loader(tmp_path / "d", address)
    try:
        assert len(loader.index) == 40
        for i in (0, 17, 39):
            assert loader.read([i])[0] == files[idx.samples[i].path]
        assert loader.read([3, 4], [3, 4]) == [files[idx.samples[i].path] for i in (3, 4)]
    finally:
        loader.close()


def test_hit_rate_counts_only_samples_served_from_the_cache(make_dataset, tmp_path, inproc_cache):
    make_dataset(tmp_path / "d", n=80, size=2000)
    # Room for everything, but the first epoch starts cold and without a prefetcher: every
    # sample of it comes from the backing store (whole chunks fetched on a miss included).
    address, _core = inproc_cache(1 << 20)
    idx, loader = _loader(tmp_path / "d", address)
    try:
        n = sum(len(b) for _, b in loader.epoch(0))
        assert n == 80
        s = loader.stats
        assert s.hits + s.misses == 80
        assert s.backing_bytes == idx.total_bytes  # every byte read once, from the backing store
        assert s.hits == 0 and s.hit_rate == 0.0, (s.hits, s.staged_served)
        # Whole chunks fetched on a miss: their other samples are the cache's fill, counted
        # apart from the misses that made the fetch.
        assert 0 < s.fill_bytes < s.backing_bytes
        sum(len(b) for _, b in loader.epoch(1))
        assert loader.stats.hits > 0  # the second epoch finds what the first one inserted
    finally:
        loader.close()


def test_an_insert_finishing_during_a_lookup_is_not_read_twice(make_dataset, tmp_path, inproc_cache):
    # The race behind a flaky CI run: the server answers a lookup before a chunk's insert
    # lands, the insert then lands and drops the chunk from the loader's staged set, and the
    # chunk was in neither answer, so its other samples were read from the backing store again.
    make_dataset(tmp_path / "d", n=80, size=2000)
    address, _core = inproc_cache(1 << 20)
    idx, loader = _loader(tmp_path / "d", address)
    srv = loader._server()
    assert srv is not None
    asked = srv.lookup_room

    def lookup_then_let_inserts_land(*a, **k):
        answer = asked(*a, **k)
        loader._puts.submit(lambda: None).result()  # every insert queued so far has landed
        return answer

    srv.lookup_room = lookup_then_let_inserts_land  # type: ignore[method-assign]
    try:
        assert sum(len(b) for _, b in loader.epoch(0)) == 80
        assert loader.stats.chunk_fetched > 0  # whole chunks were fetched and inserted
        assert loader.stats.backing_bytes == idx.total_bytes
    finally:
        loader.close()


def test_open_loader_server_false_means_no_cache(make_dataset, tmp_path, monkeypatch):
    make_dataset(tmp_path / "d", n=10, size=500)
    kv = MemoryKV()
    register_dataset(kv, "ten", str(tmp_path / "d"), chunk_bytes=2000)
    import microco.clients.cache as cc

    asked = []
    monkeypatch.setattr(cc, "find_server", lambda *a, **k: asked.append(1) or "127.0.0.1:1")
    loader = open_loader(kv, "ten", server=False, batch_size=4, job_id="j")
    try:
        assert loader.client is None and not asked
        assert sum(len(i) for i, _ in loader.epoch(0)) == 10
    finally:
        loader.close()
    loader = open_loader(kv, "ten", batch_size=4, job_id="j")  # the default still discovers
    try:
        assert asked and loader.client is not None
    finally:
        loader.close()


def test_a_server_that_does_not_answer_for_a_while_still_gets_the_epochs_chunks(
    make_dataset, tmp_path, inproc_cache
):
    # A CI run at load 17: the cache's lookups timed out while the prefetcher asked about its
    # window of chunks; the window was dropped for the epoch and two jobs on one single-chunk
    # dataset both read every sample from the backing store (hit rates 0%, 0%). The chunks a
    # failed lookup or insert asked about are asked about again on a later pass.
    from microco.common.errors import Unavailable

    make_dataset(tmp_path / "d", n=80, size=2000)
    address, core = inproc_cache(1 << 20)
    idx, loader = _loader(tmp_path / "d", address, retry_server_s=0.01)
    real = loader.client.lookup_room
    failures = [3]

    def flaky(*a, **kw):
        if failures[0] > 0:
            failures[0] -= 1
            raise Unavailable("deadline exceeded (a test's fault)")
        return real(*a, **kw)

    loader.client.lookup_room = flaky
    try:
        loader._start_epoch(0)  # the epoch's shares, as its first batch would set them
        loader._prefetch_loop(0, __import__("threading").Event())
        assert failures == [0] and loader.stats.server_failures == 3
        held = core.lookup([c.digest for c in idx.chunks])
        assert sorted(held) == sorted(c.digest for c in idx.chunks)  # every chunk, none dropped
        assert loader.stats.backing_bytes == idx.total_bytes  # each read once
    finally:
        loader.close()


def test_a_cache_registered_after_the_loader_opened_is_used(make_dataset, tmp_path, inproc_cache):
    # No cache server in etcd when a job opened its loader (its lease briefly lapsed, or the
    # job started first): the loader read the backing store for the whole run. It now keeps
    # looking and uses the server once one is registered.
    make_dataset(tmp_path / "d", n=80, size=2000)
    address, core = inproc_cache(1 << 20)
    registered: list[str | None] = [None]
    idx, loader = _loader(tmp_path / "d", None, resolve_server=lambda: registered[0], retry_server_s=0.0)
    try:
        assert sum(len(b) for _, b in loader.epoch(0)) == 80
        assert loader.stats.hits == 0 and core.lookup([c.digest for c in idx.chunks]) == []
        registered[0] = address
        assert sum(len(b) for _, b in loader.epoch(1)) == 80
        assert sum(len(b) for _, b in loader.epoch(2)) == 80
        assert loader.stats.hits > 0  # epoch 1 filled the cache, epoch 2 read from it
        assert core.lookup([c.digest for c in idx.chunks])
    finally:
        loader.close()
