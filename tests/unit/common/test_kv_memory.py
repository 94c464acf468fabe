"""MemoryKV keeps etcd's semantics (the same contract tests run on the real server)."""

from microco.common import MemoryKV, WatchEvent


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_put_get_prefix_delete() -> None:
    kv = MemoryKV()
    kv.put("/a/1", b"x")
    kv.put("/a/2", b"y")
    kv.put("/b/1", b"z")
    assert kv.get("/a/1") == b"x"
    assert kv.get_prefix("/a/") == [("/a/1", b"x"), ("/a/2", b"y")]
    assert kv.delete("/a/1") is True
    assert kv.delete("/a/1") is False
    assert kv.delete_prefix("/") == 2


def test_compare_and_swap_and_commit() -> None:
    kv = MemoryKV()
    assert kv.compare_and_swap("/k", None, b"1")
    assert not kv.compare_and_swap("/k", None, b"2")
    assert not kv.compare_and_swap("/k", b"0", b"2")
    assert kv.compare_and_swap("/k", b"1", b"2")
    assert kv.get("/k") == b"2"
    assert not kv.commit(checks=[("/k", b"2"), ("/other", b"x")], puts={"/k": b"3"})
    assert kv.get("/k") == b"2"
    assert kv.commit(checks=[("/k", b"2")], puts={"/k": b"3", "/j": b"1"}, deletes=["/other"])
    assert kv.get("/j") == b"1"
    assert kv.compare_and_swap("/k", b"3", None)
    assert kv.get("/k") is None


def test_lease_expiry_and_revoke() -> None:
    clock = FakeClock()
    kv = MemoryKV(clock=clock)
    lease = kv.lease(5)
    kv.put("/svc/a", b"1", lease=lease)
    clock.t = 4
    assert kv.get("/svc/a") == b"1"
    assert lease.refresh()
    clock.t = 8.9
    assert kv.get("/svc/a") == b"1"
    clock.t = 9.1
    assert kv.get("/svc/a") is None
    assert not lease.refresh()
    lease2 = kv.lease(5)
    kv.put("/svc/b", b"1", lease=lease2)
    lease2.revoke()
    assert kv.get("/svc/b") is None


def test_watch_sees_puts_and_deletes_until_cancelled() -> None:
    kv = MemoryKV()
    seen: list[WatchEvent] = []
    cancel = kv.watch_prefix("/w/", seen.append)
    kv.put("/w/1", b"a")
    kv.put("/x/1", b"b")
    kv.delete("/w/1")
    cancel()
    kv.put("/w/2", b"c")
    assert seen == [WatchEvent("put", "/w/1", b"a"), WatchEvent("delete", "/w/1", None)]


def test_json_helpers_are_canonical() -> None:
    kv = MemoryKV()
    kv.put_json("/j", {"b": 1, "a": [1, 2]})
    assert kv.get("/j") == b'{"a":[1,2],"b":1}'
    assert kv.get_json("/j") == {"a": [1, 2], "b": 1}


def test_a_key_whose_lease_was_lost_is_put_back_even_if_etcd_fails_at_first():
    """After etcd drops a lease, the first attempts to put the key back may fail (etcd is still
    coming back): the key is retried until it is in, never given up."""
    import threading

    from microco.common.errors import Unavailable
    from microco.common.kv import MemoryKV
    from microco.common.registry import LeasedKey

    class Flaky(MemoryKV):
        fail = 0

        def lease(self, ttl):
            if self.fail > 0:
                self.fail -= 1
                raise Unavailable("etcd is coming back")
            return super().lease(ttl)

    kv = Flaky()
    key = LeasedKey(kv, "/k", lambda: b"v", ttl=5).start()
    assert kv.get("/k") == b"v"
    kv.delete("/k")
    kv.fail = 3
    t = threading.Thread(target=key._renew)
    t.start()
    t.join(10)
    assert not t.is_alive() and kv.fail == 0
    assert kv.get("/k") == b"v"
    key.stop()
