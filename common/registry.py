"""Service registration under an etcd lease, and discovery by name.

A service instance writes ``/microco/services/<name>/<instance_id>`` under a lease it keeps
alive; if the process dies the lease expires and the entry vanishes by itself. Clients need
only the etcd address: ``discover(kv, "scheduler")`` lists the live instances.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from .errors import Unavailable
from .kv import KV, LeaseKeeper, dumps

log = logging.getLogger(__name__)

SERVICES_PREFIX = "/microco/services/"


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    instance_id: str
    address: str
    version: str = ""
    started_at: float = 0.0
    metrics_address: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{SERVICES_PREFIX}{self.name}/{self.instance_id}"

    def to_json(self) -> bytes:
        return dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> ServiceRecord:
        return cls(**json.loads(raw))


#: The longest wait between two attempts to put a key back after its lease was lost.
RENEW_RETRY_MAX_S = 2.0


class LeasedKey:
    """Keeps one key in etcd under a lease for as long as its owner lives.

    The lease is refreshed from a background thread; if etcd ever drops it (etcd restarted, or
    the process was paused past its TTL) the key is put again under a fresh lease. ``value`` is
    called at every (re)put, so what is advertised is always current. Used for service
    registration and for node agents' device records alike."""

    def __init__(self, kv: KV, key: str, value: Callable[[], bytes], ttl: int = 5) -> None:
        self.kv, self.key, self.value, self.ttl = kv, key, value, ttl
        self._keeper: LeaseKeeper | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> LeasedKey:
        with self._lock:
            if self._closed:
                return self
            lease = self.kv.lease(self.ttl)
            self.kv.put(self.key, self.value(), lease=lease)
            self._keeper = LeaseKeeper(lease, on_lost=self._renew)
        return self

    def _renew(self) -> None:
        """Put the key again under a new lease, retrying (backed off, at most
        ``RENEW_RETRY_MAX_S`` apart) until it is in or the key is stopped: the first calls after
        etcd returns may still fail, and a key given up here would stay missing for good."""
        delay = 0.1
        while not self._closed:
            try:
                self.start()
                return
            except Unavailable as exc:
                log.warning(
                    "re-putting %s under a new lease failed (retrying in %.1fs): %s", self.key, delay, exc
                )
                time.sleep(delay)
                delay = min(delay * 2, RENEW_RETRY_MAX_S)

    def refresh_value(self) -> None:
        """Put the current ``value()`` again, under the same lease."""
        with self._lock:
            if self._keeper is not None:
                self.kv.put(self.key, self.value(), lease=self._keeper.lease)

    def stop(self) -> None:
        """Revoke the lease: the key disappears now rather than after the TTL. Idempotent."""
        with self._lock:
            self._closed = True
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            try:
                keeper.stop(revoke=True)
            except Unavailable as exc:
                log.warning("could not revoke the lease of %s (it will expire): %s", self.key, exc)


class Registration:
    """Keeps one ``ServiceRecord`` in etcd for as long as the process lives."""

    def __init__(self, kv: KV, record: ServiceRecord, ttl: int = 5) -> None:
        self.record = record
        self._key = LeasedKey(kv, record.key, lambda: self.record.to_json(), ttl)

    def start(self) -> Registration:
        self._key.start()
        log.info("registered", extra={"key": self.record.key, "address": self.record.address})
        return self

    def update(self, record: ServiceRecord) -> None:
        """Change what is advertised (e.g. a new label) under the same lease."""
        self.record = record
        self._key.refresh_value()

    def stop(self) -> None:
        """Revoke the lease: the entry disappears now rather than after the TTL. Idempotent."""
        self._key.stop()


def discover(kv: KV, name: str | None = None) -> list[ServiceRecord]:
    """Live instances of service ``name`` (all services when None), from etcd."""
    prefix = service_prefix(name)
    return service_records(prefix, kv.get_prefix(prefix))


def service_prefix(name: str | None = None) -> str:
    """The keys under which the instances of service ``name`` (all when None) register."""
    return SERVICES_PREFIX + (f"{name}/" if name else "")


def service_records(prefix: str, items: Iterable[tuple[str, bytes]]) -> list[ServiceRecord]:
    """The records of the (key, value) pairs read under ``prefix`` (``discover``'s, from a read
    made with other reads: ``KV.get_many``); malformed ones skipped."""
    out = []
    for _, raw in items:
        try:
            out.append(ServiceRecord.from_json(raw))
        except (ValueError, TypeError):
            log.warning("skipping malformed service record under %s", prefix)
    return out
