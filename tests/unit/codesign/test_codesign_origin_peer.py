"""A job resumed on another host reads its working set from the cache it moved from (issue
21: state that follows a job): the loader's position names the cache server it read through,
and a loader resumed from it elsewhere asks that server for what its own cache lacks (hits
over the network, and chunks its prefetch copies), not the backing store. Two in-process
cache servers (the core behind the real gRPC servicer), no processes."""

from __future__ import annotations

import pytest

from microco.clients.cache import LocalStore, QuiverLoader
from microco.services.cache import CacheCore, CacheServicer, ChunkStore, build_index, serve_in_process


class Counting:
    """The backing store, counting the samples read from it."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.url = store.url
        self.reads: list[str] = []

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return self.store.read(path)


@pytest.fixture
def hosts(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for i in range(32):
        (root / f"s{i:03d}").write_bytes(bytes([i]) * 100)
    store = LocalStore(str(root))
    index = build_index(store.list_files(), store.read, 400)
    cores, servers, address = {}, [], {}
    for node in ("h1", "h2"):
        cores[node] = CacheCore(ChunkStore(str(tmp_path / f"cache-{node}")), 1 << 20, node=node)
        server, address[node] = serve_in_process(CacheServicer(cores[node]))
        servers.append(server)
    # The old host's cache holds the whole dataset (the other jobs of the dataset keep it warm).
    for c in index.chunks:
        data = b"".join(store.read(s.path) for s in index.samples_of(c))
        assert cores["h1"].put(c.digest, data, "ds").outcome == "stored"
    yield index, store, cores, address
    for s in servers:
        s.stop(0)


def _position(index, store, address) -> dict:
    """The checkpoint of a job that read one batch through h1's cache."""
    first = QuiverLoader(
        index, store, batch_size=4, dataset="ds", job_id="j", server=address["h1"], prefetch=False
    )
    try:
        next(iter(first.epoch(0)))
        state = first.state_dict()
    finally:
        first.close()
    assert state["cache_server"] == address["h1"]
    return state


@pytest.mark.parametrize("follow", [True, False])
def test_a_job_resumed_on_another_host_reads_what_its_old_hosts_cache_holds(hosts, follow):
    index, store, _cores, address = hosts
    state = _position(index, store, address)
    counting = Counting(store)
    cls = type("Loader", (QuiverLoader,), {"FOLLOW_ORIGIN": follow})
    moved = cls(index, counting, batch_size=4, dataset="ds", job_id="j", server=address["h2"], prefetch=False)
    try:
        moved.load_state_dict(state)
        got = [i for indices, _ in moved.epoch(moved.resume_epoch or 0) for i in indices]
    finally:
        moved.close()
    assert len(got) == len(index) - len(state["seen"])  # the rest of the epoch, once each
    if follow:
        assert counting.reads == [] and moved.stats.remote_hits == len(got)
    else:  # (without it: h2's cache is cold, every sample comes from the backing store)
        assert len(counting.reads) >= len(got) and moved.stats.remote_hits == 0


def test_the_moved_jobs_prefetch_copies_chunks_from_its_old_hosts_cache(hosts):
    index, store, cores, address = hosts
    state = _position(index, store, address)
    counting = Counting(store)
    moved = QuiverLoader(
        index, counting, batch_size=4, dataset="ds", job_id="j", server=address["h2"], prefetch=False
    )
    try:
        moved.load_state_dict(state)
        assert moved.warm() == len(index.chunks)
    finally:
        moved.close()
    assert counting.reads == [] and moved.stats.peer_chunks == len(index.chunks)
    assert set(cores["h2"].lookup([c.digest for c in index.chunks])) == {c.digest for c in index.chunks}


def test_a_position_from_the_same_cache_or_a_gone_one_costs_nothing(hosts):
    index, store, _cores, address = hosts
    state = _position(index, store, address)
    same = QuiverLoader(
        index, store, batch_size=4, dataset="ds", job_id="j", server=address["h1"], prefetch=False
    )
    same.load_state_dict(state)
    assert same.peers is None
    same.close()
    gone = QuiverLoader(
        index, Counting(store), batch_size=4, dataset="ds", job_id="j", server=address["h2"], prefetch=False
    )
    gone.load_state_dict({**state, "cache_server": "127.0.0.1:1"})  # nothing listens there
    try:
        got = [i for indices, _ in gone.epoch(gone.resume_epoch or 0) for i in indices]
    finally:
        gone.close()
    assert len(got) == len(index) - len(state["seen"])  # read from the backing store instead
    assert gone.peers is not None and not gone.peers.usable


def test_the_old_cache_is_not_asked_once_the_working_set_has_left_it():
    from microco.clients.cache._origin import MAX_EMPTY, OriginPeer

    class Client:
        calls = 0
        held: set[str] = set()

        def lookup(self, digests, dataset, timeout=None, retry=True):
            Client.calls += 1
            return Client.held & set(digests)

    peer = OriginPeer("127.0.0.1:1", "ds")
    peer._client = Client()  # type: ignore[assignment]
    peer._connected = True  # (a fake: no channel to wait for)
    Client.held = {"a"}
    assert list(peer.holders(["a", "b"])) == ["a"]
    Client.held = set()  # the other jobs of the dataset finished there: nothing held
    for _ in range(MAX_EMPTY + 10):
        assert peer.holders(["a", "b"]) == {}
    assert Client.calls == 1 + MAX_EMPTY and not peer.usable


class SlowDoor:
    """A TCP relay to ``upstream`` that holds each new connection ``delay`` seconds before
    passing bytes: a connection (TLS handshake included) as slow as a busy host's."""

    def __init__(self, upstream: str, delay: float) -> None:
        import socket
        import threading

        self.upstream, self.delay = upstream, delay
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading
        import time

        while not self.closed:
            try:
                inner, _ = self.sock.accept()
            except OSError:
                return
            time.sleep(self.delay)
            host, port = self.upstream.rsplit(":", 1)
            outer = socket.create_connection((host, int(port)))
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def test_a_slow_connection_to_the_old_host_is_waited_for_apart_from_the_lookups_deadline(hosts):
    """Found in CI: the first lookup's 2 s deadline included the new channel's connection, so a
    busy host's slow handshake put the old cache aside and every chunk came from the store."""
    from microco.clients.cache._origin import OriginPeer

    index, _store, _cores, address = hosts
    door = SlowDoor(address["h1"], delay=3.0)  # longer than the lookup's own deadline
    peer = OriginPeer(door.address, "ds", timeout_s=2.0, connect_s=60.0)
    try:
        digests = [c.digest for c in index.chunks]
        assert set(peer.holders(digests)) == set(digests)
        assert peer.failures == 0 and peer.usable
    finally:
        peer.close()
        door.close()
