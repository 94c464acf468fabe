"""Fencing: an agent cut off from etcd stops its jobs before its lease can expire.

The scheduler treats a node whose record (kept under the agent's lease) has vanished as lost,
and starts its jobs elsewhere from their checkpoints. An agent that is merely cut off from etcd
(a network partition, not a crash) would keep running those jobs, so two copies would run and
write the same checkpoint and outputs. The agent therefore keeps its own, conservative, count
of when the lease may expire and stops every job before then:

* a keep-alive *sent* at monotonic time ``t`` that etcd answered with the lease alive means
  etcd renewed the lease at some moment after ``t``, so the lease lives at least until
  ``t + ttl``: the agent's deadline. (Measured from the send, never from the answer, so a
  slow answer can only make the agent fence early.)
* a watchdog thread, independent of the keep-alive calls (which may hang for their timeout
  while the network is down), fences at ``deadline - margin``: every job is stopped
  (SIGTERM, then SIGKILL) and the agent refuses to start or resume jobs;
* once etcd answers again the node record is put back under a **new** lease, whose id is the
  node's new ``epoch`` (published in the record): the fence lifts, and a scheduler can tell the
  re-registered node from the one whose jobs it already moved.

Clock skew between hosts plays no part: the agent compares its own monotonic readings only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from microco.common.kv import KV, Lease

log = logging.getLogger(__name__)

#: Fraction of the lease TTL after the last confirmed keep-alive at which the agent fences
#: (the rest of the TTL is left for stopping the jobs). Keep-alives go out every TTL/6, so
#: two or three slow or lost keep-alives in a row do not fence.
FENCE_AT = 0.75
#: Fraction of the TTL before the lease may expire by which a fenced job is killed
#: (``FencedLease.kill_grace``): half of what the fence leaves.
KILL_MARGIN = 0.5 * (1.0 - FENCE_AT)
#: How often the watchdog looks at the clock, at most (seconds).
WATCH_S = 0.05


def _revoke_quietly(lease: Lease) -> None:
    try:
        lease.revoke()
    except Exception as exc:  # noqa: BLE001 - best effort: it expires on its own
        log.debug("revoking lease %s: %s", lease.id, exc)


class FencedLease:
    """One key kept under a lease, with fencing (see the module's doc).

    ``value()`` gives the key's value at every (re)put; ``on_fence()`` stops the jobs (called
    once per loss, from the watchdog thread). ``epoch`` is the id of the lease the key is
    under now (0 while the agent holds none); ``fenced`` is True from a fence until the key is
    back under a new lease. ``clock`` is a monotonic clock (tests give their own)."""

    def __init__(
        self,
        kv: KV,
        key: str,
        value: Callable[[], bytes],
        ttl: int,
        on_fence: Callable[[], None],
        *,
        fence_at: float = FENCE_AT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 1:
            raise ValueError("the lease TTL must be >= 1 s")
        if not 0 < fence_at < 1:
            raise ValueError("fence_at must be in (0, 1): a fraction of the TTL")
        self.kv, self.key, self.value, self.ttl = kv, key, value, ttl
        self.on_fence = on_fence
        self.fence_at = fence_at
        self.clock = clock
        self.fenced = False
        self.fences = 0  # how many times the agent fenced (observable in tests and status)
        self._lease: Lease | None = None
        self._deadline = float("inf")  # the lease lives at least until then (monotonic)
        self._expires_by = float("inf")  # at a fence: the deadline it was reached against
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def epoch(self) -> int:
        lease = self._lease
        return int(lease.id) if lease is not None else 0

    # -- lifecycle
    def start(self) -> FencedLease:
        """Put the key under a new lease (raises if etcd cannot be reached), then keep it."""
        self._put_new()
        for name, target in (("lease-keepalive", self._keepalive), ("lease-watchdog", self._watchdog)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, revoke: bool = True) -> None:
        """Stop keeping the key; revoke the lease so the key disappears now. Idempotent."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2)
        with self._lock:
            lease, self._lease = self._lease, None
        if revoke and lease is not None:
            lease.revoke()

    def refresh_value(self) -> None:
        """Put the current ``value()`` again, under the same lease."""
        with self._lock:
            if self._lease is not None and not self.fenced:
                self.kv.put(self.key, self.value(), lease=self._lease)

    # -- internals
    def _put_new(self) -> None:
        """The key under a new lease; the fence lifts only once the key is in. (A put failing
        after its lease was granted, as etcd comes back, used to lift the fence with no record
        in etcd: the node stayed unregistered while its keep-alives went to the new lease.)"""
        sent = self.clock()
        lease = self.kv.lease(self.ttl)
        with self._lock:
            self._lease = lease  # the record's epoch (``value()`` reads it); still fenced
        try:
            self.kv.put(self.key, self.value(), lease=lease)
        except BaseException:
            with self._lock:
                if self._lease is lease:
                    self._lease = None
            threading.Thread(target=_revoke_quietly, args=(lease,), name="lease-revoke", daemon=True).start()
            raise
        with self._lock:
            self._deadline = sent + self.ttl
            self.fenced = False
        log.info("node record under lease %s (epoch)", lease.id, extra={"key": self.key})

    def _keepalive(self) -> None:
        interval = max(self.ttl / 6.0, 0.1)
        delay = 0.1
        while not self._stop.wait(interval if not self.fenced else delay):
            lease = self._lease
            if self.fenced or lease is None:
                # put the key back under a fresh lease once etcd answers
                try:
                    self._put_new()
                    delay = 0.1
                    log.warning("etcd reachable again: node re-registered under epoch %s", self.epoch)
                except Exception as exc:  # noqa: BLE001 - whatever etcd's outage raises, try again
                    # (a paused etcd answers late with a deadline error, not "unavailable"; this
                    # thread ending here left the node unregistered for good)
                    log.debug("re-registering failed: %s", exc)
                    delay = min(delay * 2, 1.0)
                continue
            sent = self.clock()
            try:
                alive = lease.refresh()
            except Exception as exc:  # noqa: BLE001 - the watchdog fences if this goes on
                log.warning("lease %s keep-alive failed: %s", lease.id, exc)
                continue
            if alive:
                with self._lock:
                    if self._lease is lease:
                        self._deadline = max(self._deadline, sent + self.ttl)
            else:
                log.warning("lease %s expired: fencing", lease.id)
                self._fence("the lease expired")

    def _watchdog(self) -> None:
        while not self._stop.wait(WATCH_S):
            with self._lock:
                due = not self.fenced and self._lease is not None and self.clock() >= self._fence_time()
            if due:
                self._fence("no keep-alive confirmed for %.1f s" % (self.fence_at * self.ttl))

    def _fence_time(self) -> float:
        return self._deadline - (1.0 - self.fence_at) * self.ttl

    def kill_grace(self, wanted_s: float) -> float:
        """How long a fenced job may take to stop after SIGTERM before it is killed: at most
        ``wanted_s``, and never past the moment the lease may expire less ``KILL_MARGIN`` of
        its TTL for the kill to land. A fence reached late (a watchdog starved on a loaded
        machine) kills at once: with a 3 s lease, a fixed 0.6 s grace after a fence due 0.75 s
        before expiry left the job alive 0.64 s after its lease had gone (CI, 2026-12-02)."""
        left = self._expires_by - self.clock() - KILL_MARGIN * self.ttl
        return max(0.0, min(wanted_s, left))

    def _fence(self, why: str) -> None:
        with self._lock:
            if self.fenced:
                return
            self.fenced = True
            self.fences += 1
            old, self._lease = self._lease, None
            self._expires_by, self._deadline = self._deadline, float("inf")
        if old is not None:
            # best effort, not waited for: if etcd is reachable after all (a slow keep-alive,
            # not a partition) the record goes now and the scheduler moves the jobs at once
            threading.Thread(target=_revoke_quietly, args=(old,), name="lease-revoke", daemon=True).start()
        log.warning("fenced (%s): stopping every job before the lease can expire", why)
        try:
            self.on_fence()
        except Exception:
            log.exception("stopping the jobs on fence")

    def check(self) -> None:
        """One watchdog step now (tests with their own clock call it instead of waiting)."""
        with self._lock:
            due = not self.fenced and self._lease is not None and self.clock() >= self._fence_time()
        if due:
            self._fence("no keep-alive confirmed")
