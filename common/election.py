"""Leader election for services that run one active instance (the scheduler, the store
coordinator). The leader holds ``/microco/leader/<name>`` under its lease; standbys watch the
key and campaign again the moment it disappears, so a killed leader is replaced within one
lease TTL."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .errors import Unavailable
from .kv import KV, Lease, LeaseKeeper

log = logging.getLogger(__name__)

LEADER_PREFIX = "/microco/leader/"

#: Part of the message of every refusal by a standby (UNAVAILABLE): the call did nothing there, so
#: a client may send it again, non-idempotent or not, to the leader (``calls.never_served``).
NOT_LEADER = "is a standby, not the leader"


class LeaderElection:
    def __init__(
        self,
        kv: KV,
        name: str,
        instance_id: str,
        ttl: int = 5,
        on_elected: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.kv, self.name, self.instance_id, self.ttl = kv, name, instance_id, ttl
        self.key = LEADER_PREFIX + name
        self.on_elected, self.on_lost = on_elected, on_lost
        self._is_leader = threading.Event()
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._keeper: LeaseKeeper | None = None
        self._cancel_watch: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self._is_leader.is_set()

    def leader(self) -> str | None:
        """The instance id of the current leader, if any."""
        raw = self.kv.get(self.key)
        return raw.decode() if raw else None

    def start(self) -> LeaderElection:
        self._cancel_watch = self.kv.watch_prefix(self.key, lambda _event: self._changed.set())
        self._thread = threading.Thread(target=self._campaign_loop, name=f"election-{self.name}", daemon=True)
        self._thread.start()
        return self

    def wait_until_leader(self, timeout: float | None = None) -> bool:
        return self._is_leader.wait(timeout)

    def _try_acquire(self) -> bool:
        lease: Lease = self.kv.lease(self.ttl)
        if self.kv.compare_and_swap(self.key, None, self.instance_id.encode(), lease=lease):
            self._keeper = LeaseKeeper(lease, on_lost=self._lost)
            return True
        lease.revoke()
        return False

    def _lost(self) -> None:
        if self._is_leader.is_set():
            self._is_leader.clear()
            log.warning("lost leadership", extra={"election": self.name})
            if self.on_lost:
                self.on_lost()
        self._changed.set()

    def _campaign_loop(self) -> None:
        while not self._stop.is_set():
            self._changed.clear()
            if not self._is_leader.is_set():
                try:
                    if self._try_acquire():
                        self._is_leader.set()
                        log.info("elected leader", extra={"election": self.name})
                        if self.on_elected:
                            self.on_elected()
                except Unavailable as exc:
                    log.warning("election: %s", exc)
            # Wake on any change of the key, and re-check now and then in case a watch event was lost.
            self._changed.wait(timeout=max(self.ttl / 2.0, 0.5))

    def resign(self) -> None:
        """Stop campaigning and give up leadership now (standbys take over at once). Idempotent."""
        self._stop.set()
        self._changed.set()
        if self._cancel_watch:
            self._cancel_watch()
            self._cancel_watch = None
        was_leader = self._is_leader.is_set()
        self._is_leader.clear()
        if self._keeper is not None:
            keeper, self._keeper = self._keeper, None
            try:
                keeper.stop(revoke=True)
            except Unavailable as exc:
                log.warning("resign: %s", exc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if was_leader and self.on_lost:
            self.on_lost()
