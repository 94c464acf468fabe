"""The LRU baseline: its semantics, and admission that does not scan the ledger."""

from __future__ import annotations

from microco.services.cache._eviction import ConsumptionTracker, Ledger, Outcome, make_policy


class _NoScan(dict):
    """A ledger's entry map that fails the test if anything iterates it."""

    def _scan(self, *a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the ledger was scanned")

    __iter__ = values = items = keys = _scan  # type: ignore[assignment]


def test_lru_semantics_recency_order_touch_and_readd():
    led, cons, lru = Ledger(), ConsumptionTracker(), make_policy("lru")
    for k in "abcd":
        led.add(k, 10, "ds")
    led.touch("a")  # order now b c d a
    led.add("c", 10, "ds")  # re-adding a present key refreshes it: b d a c
    assert list(led.coldest()) == ["b", "d", "a", "c"]
    adm = lru.admit(led, 40, "e", 25, "ds", cons)
    assert adm.outcome is Outcome.ADMIT and adm.victims == ("b", "d", "a")
    led.remove("b")
    assert list(led.coldest()) == ["d", "a", "c"] and led.used == 30
    assert lru.admit(led, 40, "f", 10, "ds", cons).victims == ()


def test_lru_admission_does_not_scan_the_ledger():
    led, cons, lru = Ledger(), ConsumptionTracker(), make_policy("lru")
    n = 10_000
    for i in range(n):
        led.add(f"k{i}", 1, "ds")
    led.touch("k0")
    led.entries = _NoScan(led.entries)
    adm = lru.admit(led, n, "new", 2, "ds", cons)
    assert adm.victims == ("k1", "k2")
    # The recency order is read from its cold end only: as many entries as victims (+1 to stop).
    led.entries = dict(dict.items(led.entries))
    visited = 0
    it = led.coldest()
    for _ in it:
        visited += 1
        if visited == 3:
            break
    assert visited == 3


def test_used_by_dataset_is_kept_not_summed():
    led = Ledger()
    led.add("a", 5, "x")
    led.add("b", 7, "y")
    led.add("c", 1, "x")
    led.entries = _NoScan(led.entries)
    assert led.used_by("x") == 6 and led.used_by("y") == 7 and led.used_by("z") == 0
    led.entries = dict(dict.items(led.entries))
    led.remove("a")
    assert led.used_by("x") == 1
