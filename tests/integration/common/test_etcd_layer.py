"""The KV layer, registration, discovery and leader election on a real etcd server."""

from __future__ import annotations

import threading
import time

import pytest
from _support import scaled, wait_for

from microco.common import (
    EtcdKV,
    LeaderElection,
    Registration,
    ServiceRecord,
    Unavailable,
    WatchEvent,
    discover,
)

pytestmark = pytest.mark.integration


def test_kv_contract_on_real_etcd(namespaced_kv: EtcdKV) -> None:
    kv = namespaced_kv
    kv.put("/a/1", b"x")
    kv.put("/a/2", b"y")
    assert kv.get("/a/1") == b"x"
    assert kv.get_prefix("/a/") == [("/a/1", b"x"), ("/a/2", b"y")]
    assert kv.compare_and_swap("/c", None, b"1")
    assert not kv.compare_and_swap("/c", None, b"2")
    assert kv.compare_and_swap("/c", b"1", b"2")
    assert not kv.commit(checks=[("/c", b"2"), ("/nope", b"x")], puts={"/c": b"3"})
    assert kv.get("/c") == b"2"
    assert kv.commit(checks=[("/c", b"2")], puts={"/c": b"3"}, deletes=["/a/1"])
    assert kv.get("/a/1") is None and kv.get("/c") == b"3"
    assert kv.delete_prefix("/a/") == 1


def test_watch_on_real_etcd(namespaced_kv: EtcdKV) -> None:
    seen: list[WatchEvent] = []
    cancel = namespaced_kv.watch_prefix("/w/", seen.append)
    try:
        namespaced_kv.put("/w/1", b"a")
        namespaced_kv.delete("/w/1")
        assert wait_for(lambda: len(seen) == 2)
        assert seen == [WatchEvent("put", "/w/1", b"a"), WatchEvent("delete", "/w/1", None)]
    finally:
        cancel()


def test_lease_expires_without_refresh(namespaced_kv: EtcdKV) -> None:
    lease = namespaced_kv.lease(1)
    namespaced_kv.put("/leased", b"1", lease=lease)
    assert namespaced_kv.get("/leased") == b"1"
    assert wait_for(lambda: namespaced_kv.get("/leased") is None, timeout=6)


def test_refreshes_of_every_lease_share_one_keep_alive_stream(namespaced_kv: EtcdKV) -> None:
    """Two leases refreshed again and again, from two threads, past their TTL: they live, on the
    one stream the client opened (not a stream and a thread per refresh); a lease etcd has
    already dropped answers False on that stream."""
    kv = namespaced_kv
    leases = [kv.lease(2), kv.lease(2)]
    kv.put("/a", b"1", lease=leases[0])
    kv.put("/b", b"2", lease=leases[1])

    def keep(lease, n=15) -> None:
        for _ in range(n):
            assert lease.refresh()
            time.sleep(0.2)

    threads = [threading.Thread(target=keep, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kv.get("/a") == b"1" and kv.get("/b") == b"2"  # 3 s of refreshes, longer than the TTL
    assert kv._keepalives.opened == 1
    leases[0].revoke()
    assert leases[0].refresh() is False
    assert leases[1].refresh() is True
    assert kv._keepalives.opened == 1


def test_a_keep_alive_stream_lost_with_etcd_is_opened_again(tmp_path) -> None:
    """etcd paused longer than a refresh's deadline: that refresh fails (``Unavailable``); once
    etcd continues, a refresh opens a new stream and the lease is alive again."""
    import signal

    from microco.services.stack import EtcdServer

    server = EtcdServer(tmp_path / "etcd").start()
    kv = EtcdKV(server.endpoint, timeout=1.0)
    try:
        lease = kv.lease(30)
        assert lease.refresh()
        server.proc.send_signal(signal.SIGSTOP)
        try:
            assert wait_for(lambda: _stopped(server.proc.pid), 10), "etcd never stopped"
            with pytest.raises(Unavailable):
                lease.refresh()
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: _refreshes(lease), 10), "no refresh within 10 s after etcd continues"
        assert kv._keepalives.opened >= 2
    finally:
        kv.close()
        server.stop()
    with pytest.raises(Unavailable, match="closed"):
        lease.refresh()


def _refreshes(lease) -> bool:
    try:
        return lease.refresh()
    except Unavailable:
        return False


def test_unreachable_etcd_names_the_address() -> None:
    from microco.services.stack import free_port

    port = free_port()
    with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
        EtcdKV(f"127.0.0.1:{port}", timeout=1.0)


def test_registration_and_discovery(etcd_kv: EtcdKV) -> None:
    rec = ServiceRecord(name="svc", instance_id="i1", address="127.0.0.1:1", labels={"node": "n"})
    reg = Registration(etcd_kv, rec, ttl=2).start()
    try:
        assert discover(etcd_kv, "svc") == [rec]
        time.sleep(3)  # longer than the TTL: the keeper refreshes the lease
        assert discover(etcd_kv, "svc") == [rec]
    finally:
        reg.stop()
    assert discover(etcd_kv, "svc") == []  # revoked at once, not after the TTL
    reg.stop()  # idempotent


def test_leader_election_hand_over(etcd_kv: EtcdKV) -> None:
    events: list[str] = []
    a = LeaderElection(etcd_kv, "sched", "a", ttl=2, on_elected=lambda: events.append("a")).start()
    assert a.wait_until_leader(scaled(5))
    b = LeaderElection(etcd_kv, "sched", "b", ttl=2, on_elected=lambda: events.append("b")).start()
    try:
        time.sleep(0.5)
        assert not b.is_leader and a.leader() == "a"
        a.resign()
        assert b.wait_until_leader(scaled(5))
        assert b.leader() == "b"
        assert events == ["a", "b"]
    finally:
        a.resign()
        b.resign()


def test_leader_killed_without_resigning_is_replaced(etcd_kv: EtcdKV, etcd_endpoint: str) -> None:
    """A leader whose lease stops being refreshed (a crashed process) loses the key within its TTL."""
    other = EtcdKV(etcd_endpoint)
    a = LeaderElection(other, "coord", "a", ttl=1).start()
    assert a.wait_until_leader(scaled(5))
    # Simulate a crash: stop refreshing without revoking (what kill -9 does to the keeper thread).
    assert a._keeper is not None
    a._stop.set()
    a._keeper._stop.set()
    b = LeaderElection(etcd_kv, "coord", "b", ttl=1).start()
    try:
        assert b.wait_until_leader(scaled(8))
    finally:
        b.resign()
        other.close()


def test_concurrent_cas_has_one_winner(namespaced_kv: EtcdKV) -> None:
    wins: list[int] = []

    def contend(i: int) -> None:
        if namespaced_kv.compare_and_swap("/once", None, str(i).encode()):
            wins.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert namespaced_kv.get("/once") == str(wins[0]).encode()


def test_a_client_is_back_within_seconds_of_an_etcd_pause(tmp_path) -> None:
    """etcd stopped for longer than a call's deadline, then continued: the client's next calls
    succeed within seconds, not after the etcd client's default five-minute endpoint quarantine."""
    import signal

    from microco.services.stack import EtcdServer

    server = EtcdServer(tmp_path / "etcd").start()
    kv = EtcdKV(server.endpoint, timeout=1.0)
    try:
        kv.put("/k", b"before")
        server.proc.send_signal(signal.SIGSTOP)
        try:
            # (kill() returns before the target is stopped: a read served in that moment
            # would not raise; wait until the kernel shows it stopped)
            assert wait_for(lambda: _stopped(server.proc.pid), 10), "etcd never stopped"
            with pytest.raises(Unavailable):
                kv.get("/k")
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: _reads(kv) == b"before", 10), "no read within 10 s after etcd continues"
        kv.put("/k", b"after")
        assert kv.get("/k") == b"after"
    finally:
        kv.close()
        server.stop()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _reads(kv: EtcdKV) -> bytes | None:
    try:
        return kv.get("/k")
    except Unavailable:
        return None
