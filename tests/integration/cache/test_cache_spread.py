"""A cache spread over hosts: two real cache servers (in this process, registered in etcd as two
hosts' servers) hold disjoint parts of one dataset; two data-parallel ranks, one per host, read
it through both, every sample once per epoch and every byte right; a server leaving moves only
its share."""

from __future__ import annotations

import threading

from microco.clients.cache import QuiverLoader, SpreadCache, owned_bytes
from microco.clients.cache._placement import place
from microco.common.registry import Registration, ServiceRecord
from microco.services.cache import LocalStore, build_index


def test_two_servers_hold_disjoint_shares_and_two_ranks_read_exactly_once(
    make_dataset, tmp_path, inproc_cache, etcd_kv
):
    files = make_dataset(tmp_path / "d", n=96, size=2000)
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 8000)  # 4 samples per chunk, 24 chunks
    nodes = ["host-a", "host-b"]
    servers = {}
    regs = {}
    for node in nodes:
        address, core = inproc_cache(1 << 20, node=node)
        servers[node] = core
        rec = ServiceRecord("cache", f"inst-{node}", address, labels={"node": node})
        regs[node] = Registration(etcd_kv, rec).start()
    owner = place({c.digest: c.size for c in idx.chunks}, nodes)  # (what every loader computes)
    assert set(owner.values()) == set(nodes)  # (24 chunks: both own some)

    def ranks() -> list[QuiverLoader]:
        return [
            QuiverLoader(
                idx,
                store,
                batch_size=8,
                dataset="d",
                job_id="j",
                server=SpreadCache(etcd_kv, refresh_s=0.1),
                node=nodes[r],
                world_size=2,
                rank=r,
            )
            for r in range(2)
        ]

    def epoch(loaders: list[QuiverLoader], e: int) -> list[int]:
        seen: list[list[int]] = [[], []]

        def go(r: int) -> None:
            for indices, samples in loaders[r].epoch(e):
                assert samples == [files[idx.samples[i].path] for i in indices]
                seen[r] += indices

        threads = [threading.Thread(target=go, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not set(seen[0]) & set(seen[1])
        return seen[0] + seen[1]

    loaders = ranks()
    try:
        for e in range(3):
            assert sorted(epoch(loaders, e)) == list(range(96)), e
    finally:
        for ld in loaders:
            ld.close()
    held = {node: set(servers[node].ledger.entries) for node in nodes}
    # Disjoint: each server holds only chunks it owns, and both hold some.
    for node in nodes:
        assert held[node] and all(owner[d] == node for d in held[node]), node
    assert sum(ld.stats.hits for ld in loaders) > 0
    # Each server is told the dataset's size on it: the bytes of the chunks it owns.
    share = owned_bytes({c.digest: c.size for c in idx.chunks}, nodes)
    for node in nodes:
        assert servers[node].dataset_bytes["d"] == share[node]
    # Hits on the rank's own host are read from granted files; the other host's are streamed.
    for r, node in enumerate(nodes):
        other = nodes[1 - r]
        assert servers[other].job_counters[f"j/rank{r}"].bytes_served > 0
        assert servers[node].job_counters.get(f"j/rank{r}") is None or (
            servers[node].job_counters[f"j/rank{r}"].bytes_served == 0
        )

    # host-b leaves (its lease is revoked): its share moves to host-a, nothing else does.
    regs["host-b"].stop()
    loaders = ranks()
    try:
        for e in range(3, 5):
            assert sorted(epoch(loaders, e)) == list(range(96)), e
    finally:
        for ld in loaders:
            ld.close()
    regs["host-a"].stop()
    moved = set(servers["host-a"].ledger.entries) - held["host-a"]
    assert moved and all(owner[d] == "host-b" for d in moved)


def test_ranks_exchanging_hits_read_every_sample_once_and_resume_exactly(
    make_dataset, tmp_path, inproc_cache
):
    from microco.clients.cache import ThreadExchange

    files = make_dataset(tmp_path / "d", n=90, size=2000)
    store = LocalStore(str(tmp_path / "d"))
    idx = build_index(store.list_files(), store.read, 8000)
    address, core = inproc_cache(90_000)  # about half the dataset

    def ranks(group: ThreadExchange) -> list[QuiverLoader]:
        return [
            QuiverLoader(
                idx, store, batch_size=8, dataset="d", job_id="x", server=address, exchange=group.member(r)
            )
            for r in range(2)
        ]

    def run(loaders: list[QuiverLoader], e: int, stop_after: int | None = None) -> list[int]:
        seen: list[list[int]] = [[], []]

        def go(r: int) -> None:
            for k, (indices, samples) in enumerate(loaders[r].epoch(e)):
                assert samples == [files[idx.samples[i].path] for i in indices]
                seen[r] += indices
                if stop_after is not None and k + 1 == stop_after:
                    break

        threads = [threading.Thread(target=go, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen[0]) == len(seen[1]) or stop_after is None
        return seen[0] + seen[1]

    loaders = ranks(ThreadExchange(2))
    for e in range(2):
        got = run(loaders, e)
        assert sorted(got) == list(range(90)), e
    assert sum(ld.stats.hits for ld in loaders) > 0
    # Suspended mid-epoch (after 2 steps) and restarted from each rank's saved position.
    first = run(loaders, 2, stop_after=2)
    saved = [ld.state_dict() for ld in loaders]
    for ld in loaders:
        ld.close()
    loaders = ranks(ThreadExchange(2))
    for ld, state in zip(loaders, saved, strict=True):
        ld.load_state_dict(state)
        assert ld.resume_epoch == 2
    rest = run(loaders, 2)
    for ld in loaders:
        ld.close()
    assert sorted(first + rest) == list(range(90))
