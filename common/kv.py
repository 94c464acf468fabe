"""A small key-value interface over etcd: get, put, compare-and-swap, transactions, watch, leases.

``EtcdKV`` is the real thing (etcd v3 through ``pyetcd``, the maintained python-etcd3 fork);
``MemoryKV`` keeps the same semantics in a dict for pure unit tests. Integration tests use a
real etcd server. Keys are ``str``, values ``bytes``. A ``namespace`` prefixes every key so
that tests (or tenants) can share one etcd without seeing each other.
"""

from __future__ import annotations

import abc
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from .errors import MicrocoError, PermissionDenied, Unauthenticated, Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    key: str
    value: bytes | None


class Lease(abc.ABC):
    """A time-to-live grant; keys put under it vanish when it expires or is revoked."""

    id: int
    ttl: int

    @abc.abstractmethod
    def refresh(self) -> bool:
        """Extend the lease by its TTL; False when it has already expired."""

    @abc.abstractmethod
    def revoke(self) -> None:
        """End the lease now, deleting its keys."""


class KV(abc.ABC):
    """What microco needs from a consistent metadata store."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, value) under ``prefix``, sorted by key."""

    @abc.abstractmethod
    def put(self, key: str, value: bytes, lease: Lease | None = None) -> None: ...

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """True if the key existed."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int: ...

    @abc.abstractmethod
    def commit(
        self,
        checks: Sequence[tuple[str, bytes | None]] = (),
        puts: Mapping[str, bytes] | None = None,
        deletes: Sequence[str] = (),
        lease: Lease | None = None,
    ) -> bool:
        """Atomically: if every ``(key, expected)`` holds (``None`` = key absent), apply the puts
        and deletes and return True; otherwise change nothing and return False."""

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call ``callback`` for every change under ``prefix`` from now on; returns a cancel function."""

    @abc.abstractmethod
    def lease(self, ttl: int) -> Lease: ...

    def close(self) -> None:  # noqa: B027 - a store with nothing to release need not override it
        """Release connections."""

    # Conveniences built on the primitives.
    def compare_and_swap(
        self, key: str, expected: bytes | None, new: bytes | None, lease: Lease | None = None
    ) -> bool:
        """Set ``key`` to ``new`` (delete when None) only if it currently holds ``expected``."""
        if new is None:
            return self.commit(checks=[(key, expected)], deletes=[key])
        return self.commit(checks=[(key, expected)], puts={key: new}, lease=lease)

    def get_json(self, key: str) -> Any:
        raw = self.get(key)
        return None if raw is None else json.loads(raw)

    def put_json(self, key: str, value: Any, lease: Lease | None = None) -> None:
        self.put(key, dumps(value), lease=lease)

    def get_prefix_json(self, prefix: str) -> list[tuple[str, Any]]:
        return [(k, json.loads(v)) for k, v in self.get_prefix(prefix)]

    def get_many(
        self, keys: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> tuple[list[bytes | None], list[list[tuple[str, bytes]]]]:
        """``get`` of each of ``keys`` and ``get_prefix`` of each of ``prefixes``. A store that
        can (etcd: one transaction of range reads; memory: under its lock) reads them all in one
        request, at one revision; this default reads them one after another."""
        return [self.get(k) for k in keys], [self.get_prefix(p) for p in prefixes]


def dumps(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys), so equal values compare equal in compare-and-swap."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- in memory


class _MemoryLease(Lease):
    def __init__(self, kv: MemoryKV, lease_id: int, ttl: int) -> None:
        self.kv, self.id, self.ttl = kv, lease_id, ttl
        self.expires_at = kv.clock() + ttl

    def refresh(self) -> bool:
        with self.kv._lock:
            self.kv._expire()
            if self.id not in self.kv._leases:
                return False
            self.expires_at = self.kv.clock() + self.ttl
            return True

    def revoke(self) -> None:
        with self.kv._lock:
            self.kv._drop_lease(self.id)


class MemoryKV(KV):
    """In-process KV with etcd's semantics, for unit tests and the simulator. ``clock`` may be
    replaced by a virtual clock so lease expiry can be tested without sleeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._data: dict[str, tuple[bytes, int | None]] = {}
        self._leases: dict[int, _MemoryLease] = {}
        self._watchers: dict[int, tuple[str, Callable[[WatchEvent], None]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    def _expire(self) -> None:
        now = self.clock()
        for lease in [lease for lease in self._leases.values() if lease.expires_at <= now]:
            self._drop_lease(lease.id)

    def _drop_lease(self, lease_id: int) -> None:
        if self._leases.pop(lease_id, None) is None:
            return
        for key in [k for k, (_, lid) in self._data.items() if lid == lease_id]:
            self._delete(key)

    def _notify(self, event: WatchEvent) -> None:
        for prefix, callback in list(self._watchers.values()):
            if event.key.startswith(prefix):
                callback(event)

    def _delete(self, key: str) -> bool:
        if self._data.pop(key, None) is None:
            return False
        self._notify(WatchEvent("delete", key, None))
        return True

    def get(self, key: str) -> bytes | None:
        with self._lock:
            self._expire()
            item = self._data.get(key)
            return None if item is None else item[0]

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._lock:
            self._expire()
            return sorted((k, v) for k, (v, _) in self._data.items() if k.startswith(prefix))

    def get_many(
        self, keys: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> tuple[list[bytes | None], list[list[tuple[str, bytes]]]]:
        with self._lock:  # (one state: as etcd's one revision)
            self._expire()
            values = [None if (item := self._data.get(k)) is None else item[0] for k in keys]
            ranges = [sorted((k, v) for k, (v, _) in self._data.items() if k.startswith(p)) for p in prefixes]
            return values, ranges

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> None:
        self.commit(puts={key: value}, lease=lease)

    def delete(self, key: str) -> bool:
        with self._lock:
            self._expire()
            return self._delete(key)

    def delete_prefix(self, prefix: str) -> int:
        with self._lock:
            self._expire()
            keys = [k for k in self._data if k.startswith(prefix)]
            for k in keys:
                self._delete(k)
            return len(keys)

    def commit(
        self,
        checks: Sequence[tuple[str, bytes | None]] = (),
        puts: Mapping[str, bytes] | None = None,
        deletes: Sequence[str] = (),
        lease: Lease | None = None,
    ) -> bool:
        with self._lock:
            self._expire()
            for key, expected in checks:
                current = self._data.get(key)
                if (current[0] if current else None) != expected:
                    return False
            if lease is not None and lease.id not in self._leases:
                raise Unavailable(f"lease {lease.id} has expired")
            for key, value in (puts or {}).items():
                self._data[key] = (bytes(value), lease.id if lease else None)
                self._notify(WatchEvent("put", key, bytes(value)))
            for key in deletes:
                self._delete(key)
            return True

    def watch_prefix(self, prefix: str, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        with self._lock:
            wid = next(self._ids)
            self._watchers[wid] = (prefix, callback)

        def cancel() -> None:
            with self._lock:
                self._watchers.pop(wid, None)

        return cancel

    def lease(self, ttl: int) -> Lease:
        with self._lock:
            lease = _MemoryLease(self, next(self._ids), ttl)
            self._leases[lease.id] = lease
            return lease

    def expire_now(self) -> None:
        """Force expiry processing (tests with a virtual clock)."""
        with self._lock:
            self._expire()


# --------------------------------------------------------------------------- etcd


def parse_endpoints(endpoints: str | Iterable[str]) -> list[tuple[str, int]]:
    """``"127.0.0.1:2379,host-b:2379"`` or ``["http://h:2379"]`` -> [(host, port), ...]."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        for scheme in ("http://", "https://"):
            item = item.removeprefix(scheme)
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit() or not host:
            from .errors import InvalidArgument

            raise InvalidArgument(f"bad etcd endpoint {item!r}: expected host:port")
        out.append((host, int(port)))
    if not out:
        from .errors import InvalidArgument

        raise InvalidArgument("no etcd endpoint given")
    return out


class _KeepAlives:
    """One ``LeaseKeepAlive`` stream per client, carrying the refreshes of all its leases, as
    etcd's own clients keep it. pyetcd opens a new stream (and a thread to feed it) for every
    refresh: 2.3 ms of CPU between client and etcd each, a sizeable part of an idle service's
    CPU (docs/testing.md, "Idle services"). The stream opens at the first refresh; a refresh
    that gets no answer within the client's timeout, or a stream that ends, fails the refreshes
    waiting on it (``Unavailable``) and the next refresh opens a new one (on the endpoint the
    client fails over to)."""

    def __init__(self, client: Any, timeout: float) -> None:
        self._client, self._timeout = client, timeout
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[Any] | None = None
        self._call: Any = None
        self._generation = 0
        self._waiting: dict[int, list[_Refresh]] = {}
        self._closed = False
        self.opened = 0  # streams opened so far (one while etcd stays up)

    def refresh(self, lease_id: int) -> int:
        """The lease's remaining TTL after this refresh (0: it had expired)."""
        from pyetcd import etcdrpc

        waiter = _Refresh()
        with self._lock:
            if self._closed:
                raise Unavailable("etcd client closed")
            if self._requests is None:
                self._open()
            assert self._requests is not None
            self._waiting.setdefault(lease_id, []).append(waiter)
            self._requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
            generation = self._generation
        if not waiter.done.wait(self._timeout):
            self._end(generation, Unavailable(f"etcd lease refresh: no answer within {self._timeout:g} s"))
        if waiter.error is not None:
            raise waiter.error
        return waiter.ttl

    def _open(self) -> None:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def feed() -> Iterator[Any]:
            while (request := requests.get()) is not None:
                yield request

        client = self._client
        try:
            call = client.leasestub.LeaseKeepAlive(
                feed(), credentials=client.call_credentials, metadata=client.metadata
            )
        except Exception as exc:  # no endpoint to open it on: this refresh fails, the next tries again
            raise Unavailable(f"etcd lease keep-alive stream: {type(exc).__name__} {exc}".strip()) from exc
        self._generation += 1
        self._requests, self._call = requests, call
        self.opened += 1
        threading.Thread(
            target=self._read, args=(call, self._generation), name="etcd-keepalive", daemon=True
        ).start()

    def _read(self, call: Any, generation: int) -> None:
        error: Exception = Unavailable("etcd ended the lease keep-alive stream")
        try:
            for response in call:
                with self._lock:
                    waiters = self._waiting.get(response.ID)
                    waiter = waiters.pop(0) if waiters else None
                if waiter is not None:
                    waiter.ttl = int(response.TTL)
                    waiter.done.set()
        except Exception as exc:  # noqa: BLE001 - any end of the stream fails its waiters
            error = Unavailable(f"etcd lease keep-alive stream: {_rpc_error(self._client, exc)}")
        self._end(generation, error)

    def _end(self, generation: int, error: Exception) -> None:
        """Close stream ``generation`` (if still the current one) and fail what waits on it."""
        with self._lock:
            if generation != self._generation or self._requests is None:
                return
            requests, call, waiting = self._requests, self._call, self._waiting
            self._requests, self._call, self._waiting = None, None, {}
        requests.put(None)
        try:
            call.cancel()
        except Exception:  # noqa: BLE001, S110 - a stream already over has nothing to cancel
            pass
        for waiters in waiting.values():
            for waiter in waiters:
                waiter.error = error
                waiter.done.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            generation = self._generation
        self._end(generation, Unavailable("etcd client closed"))


class _Refresh:
    """One refresh waiting for its answer on the keep-alive stream."""

    __slots__ = ("done", "error", "ttl")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ttl = 0
        self.error: Exception | None = None


def _rpc_error(client: Any, exc: Exception) -> str:
    """``exc`` named; an RPC error also marks the endpoint failed, as pyetcd does for its own
    calls, so the next stream opens on another endpoint if there is one."""
    import grpc

    if isinstance(exc, grpc.RpcError):
        try:
            client._manage_grpc_errors(exc)
        except Exception:  # noqa: BLE001, S110 - it raises its mapped error: the mark is what counts
            pass
        return f"{exc.code()} {exc.details()}"
    return f"{type(exc).__name__} {exc}".strip()


class _EtcdLease(Lease):
    def __init__(self, raw: Any, ttl: int, keepalives: _KeepAlives) -> None:
        self.raw, self.id, self.ttl = raw, raw.id, ttl
        self._keepalives = keepalives

    def refresh(self) -> bool:
        return self._keepalives.refresh(self.id) > 0

    def revoke(self) -> None:
        try:
            self.raw.revoke()
        except Exception as exc:  # noqa: BLE001 - a revoke of an expired lease is not an error
            log.debug("lease revoke: %s", exc)


#: Seconds an etcd endpoint that failed a call is skipped before it is tried again.
ENDPOINT_RETRY_S = 1.0


def etcd_tls() -> dict[str, Any]:
    """``pyetcd.Endpoint`` arguments for this process: its credentials, the server checked to
    hold a platform service's certificate; none in insecure mode."""
    from .identity import SERVICE_NAME, channel_credentials
    from .identity import current as current_identity

    ident = current_identity()
    if ident is None:
        return {"secure": False}
    return {
        "secure": True,
        "creds": channel_credentials(ident),
        "opts": [("grpc.ssl_target_name_override", SERVICE_NAME)],
    }


def _refusal(exc: Exception) -> MicrocoError | None:
    """etcd's refusal of this process's identity (its role may not touch the key) as what it is,
    ``PermissionDenied``: it read "Unavailable etcd at ...", as if etcd were down, and was
    retried as such (session 40)."""
    code = getattr(exc, "code", None)
    try:
        status = code() if callable(code) else None
    except Exception:  # noqa: BLE001 - not a gRPC error
        return None
    if status not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return None
    from .identity import current as current_identity

    try:
        ident = current_identity()
        who = ident.name if ident is not None else "this process"
    except Exception:  # noqa: BLE001
        who = "this process"
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)  # type: ignore[attr-defined]
    kind = PermissionDenied if status == grpc.StatusCode.PERMISSION_DENIED else Unauthenticated
    return kind(
        f"etcd refused {who}: {details} (each identity reaches its own keys: docs/security.md, etcd roles)"
    )


class EtcdKV(KV):
    """The KV interface on a real etcd v3 cluster."""

    def __init__(
        self, endpoints: str | Iterable[str], namespace: str = "", timeout: float = 5.0, check: bool = True
    ) -> None:
        import pyetcd

        self.endpoints = parse_endpoints(endpoints)
        self.namespace = namespace
        self.timeout = timeout
        # The client marks an endpoint that failed a call as failed and skips it for
        # ``time_retry`` seconds (300 by default: a 2-second etcd hiccup then cost every client
        # five minutes); a short retry lets every process reconnect within seconds of etcd's return.
        # Mutual TLS with this process's identity (common/identity.py), plaintext in insecure mode.
        tls = etcd_tls()
        eps = [pyetcd.Endpoint(h, p, time_retry=ENDPOINT_RETRY_S, **tls) for h, p in self.endpoints]
        self._client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout, failover=True)
        self._watch_ids: set[Any] = set()
        self._keepalives = _KeepAlives(self._client, timeout)
        if check:
            self.check()

    @property
    def address(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)

    def check(self) -> None:
        """Raise ``Unavailable`` naming the address when etcd cannot be reached."""
        try:
            self._client.status()
        except Exception as exc:
            raise Unavailable(
                f"cannot reach etcd at {self.address}: {type(exc).__name__} {exc}".strip() + self._tls_hint()
            ) from exc

    def _tls_hint(self) -> str:
        """Why a listening etcd may still not answer: its TLS handshake refused this process's
        certificate (another CA's: session 40, where it read like etcd being down)."""
        import socket

        from .identity import current as current_identity

        try:
            ident = current_identity()
        except Exception:  # noqa: BLE001 - no credentials: said elsewhere
            return ""
        if ident is None:
            return ""
        for host, port in self.endpoints:
            try:
                socket.create_connection((host, port), timeout=1).close()
            except OSError:
                continue
            return (
                f" (something listens there: if it is the platform's etcd, it refused this process's "
                f"certificate, {ident.name}, in the TLS handshake: are these credentials issued by the "
                "platform's CA?)"
            )
        return ""

    def _k(self, key: str) -> str:
        return self.namespace + key

    def _strip(self, raw_key: bytes) -> str:
        return raw_key.decode()[len(self.namespace) :]

    # etcd refuses a request authorised before its auth store changed ("auth: revision in header
    # is old": a user or role added or removed meanwhile, e.g. the scheduler's user for each job)
    # and applies nothing of it; etcd's own client sends it again, and so does this one.
    OLD_AUTH_REVISION = "revision in header is old"
    OLD_AUTH_RETRIES = 8

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Unavailable:
                raise
            except Exception as exc:
                if self.OLD_AUTH_REVISION in str(exc) and attempt < self.OLD_AUTH_RETRIES:
                    time.sleep(0.01 * attempt)  # (the auth store changes in bursts)
                    attempt += 1
                    continue
                name = type(exc).__name__
                refused = _refusal(exc)
                if refused is not None:
                    raise refused from exc
                if "Connection" in name or "Timeout" in name or "NoServer" in name or "RpcError" in name:
                    raise Unavailable(f"etcd at {self.address}: {name} {exc}".strip()) from exc
                raise

    def get(self, key: str) -> bytes | None:
        value, _ = self._call(self._client.get, self._k(key))
        return bytes(value) if value is not None else None

    def get_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        items = self._call(lambda: list(self._client.get_prefix(self._k(prefix), sort_order="ascend")))
        return [(self._strip(meta.key), value) for value, meta in items]

    def get_many(
        self, keys: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> tuple[list[bytes | None], list[list[tuple[str, bytes]]]]:
        """One transaction of range reads (no comparisons): one round trip to etcd, one revision,
        where separate reads were a round trip each (a coordinator's query read the catalog's
        version and the node registry, ~1 ms each on loopback with TLS: issue 19, session 32)."""
        from pyetcd.utils import prefix_range_end

        t = self._client.transactions
        ops = [t.get(self._k(k).encode()) for k in keys]
        ops += [t.get(self._k(p).encode(), prefix_range_end(self._k(p).encode())) for p in prefixes]
        if not ops:
            return [], []
        _, responses = self._call(self._client.transaction, compare=[], success=ops, failure=[])
        values: list[bytes | None] = [bytes(r[0][0]) if r else None for r in responses[: len(keys)]]
        ranges = [
            sorted((self._strip(meta.key), bytes(value)) for value, meta in r) for r in responses[len(keys) :]
        ]
        return values, ranges

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> None:
        self._call(self._client.put, self._k(key), value, lease=lease.id if lease else None)

    def delete(self, key: str) -> bool:
        return bool(self._call(self._client.delete, self._k(key)))

    def delete_prefix(self, prefix: str) -> int:
        resp = self._call(self._client.delete_prefix, self._k(prefix))
        return int(resp.deleted)

    def commit(
        self,
        checks: Sequence[tuple[str, bytes | None]] = (),
        puts: Mapping[str, bytes] | None = None,
        deletes: Sequence[str] = (),
        lease: Lease | None = None,
    ) -> bool:
        t = self._client.transactions
        compare = []
        for key, expected in checks:
            if expected is None:
                compare.append(t.version(self._k(key)) == 0)
            else:
                compare.append(t.value(self._k(key)) == expected)
        success = [t.put(self._k(k), v, lease=lease.id if lease else None) for k, v in (puts or {}).items()]
        success += [t.delete(self._k(k)) for k in deletes]
        ok, _ = self._call(self._client.transaction, compare=compare, success=success, failure=[])
        return bool(ok)

    def watch_prefix(self, prefix: str, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        import pyetcd.events

        def on_response(response: Any) -> None:
            if isinstance(response, Exception):
                log.warning("etcd watch on %s ended: %s", prefix, response)
                return
            for event in response.events:
                kind = "delete" if isinstance(event, pyetcd.events.DeleteEvent) else "put"
                value = None if kind == "delete" else event.value
                try:
                    callback(WatchEvent(kind, self._strip(event.key), value))
                except Exception:  # a bad callback must not kill the watch thread
                    log.exception("watch callback failed for %s", prefix)

        watch_id = self._call(self._client.add_watch_prefix_callback, self._k(prefix), on_response)
        self._watch_ids.add(watch_id)

        def cancel() -> None:
            if watch_id in self._watch_ids:
                self._watch_ids.discard(watch_id)
                try:
                    self._client.cancel_watch(watch_id)
                except Exception as exc:  # noqa: BLE001 - cancelling on a closed client
                    log.debug("cancel watch: %s", exc)

        return cancel

    def lease(self, ttl: int) -> Lease:
        raw = self._call(self._client.lease, int(ttl))
        return _EtcdLease(raw, int(ttl), self._keepalives)

    def close(self) -> None:
        self._keepalives.close()
        for wid in list(self._watch_ids):
            try:
                self._client.cancel_watch(wid)
            except Exception:  # noqa: BLE001, S110 - closing: a watch already gone is not an error
                pass
        self._watch_ids.clear()
        try:
            self._client.close()
        except Exception:  # noqa: BLE001, S110 - closing: nothing to do for a dead channel
            pass


class LeaseKeeper:
    """Keeps a lease alive from a background thread (refresh every ttl/3). When a refresh finds the
    lease gone (etcd lost it, e.g. after a long pause), ``on_lost`` is called so the owner can
    re-register under a new lease."""

    def __init__(self, lease: Lease, on_lost: Callable[[], None] | None = None) -> None:
        self.lease = lease
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = max(self.lease.ttl / 3.0, 0.2)
        while not self._stop.wait(interval):
            try:
                alive = self.lease.refresh()
            except Unavailable as exc:
                log.warning("lease %s refresh failed: %s", self.lease.id, exc)
                continue
            if not alive:
                log.warning("lease %s expired", self.lease.id)
                if self.on_lost:
                    self.on_lost()
                return

    def stop(self, revoke: bool = True) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        if revoke:
            self.lease.revoke()
