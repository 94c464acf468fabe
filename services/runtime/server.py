"""The lifecycle every microco gRPC service shares.

``ServiceRuntime`` binds a gRPC server with health checking, reflection, the error and metrics
interceptors and a Prometheus endpoint, registers the instance in etcd under a lease, and stops
gracefully: health to NOT_SERVING, lease revoked (the registry entry vanishes at once), in-flight
calls given the grace period, stop hooks run. ``run_service`` is the ``main()`` of every service
process: flags, logging, etcd check with a clear error, SIGTERM/SIGINT handling.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import microco
from microco.api.common.v1 import common_pb2, common_pb2_grpc
from microco.common import identity
from microco.common.errors import InvalidArgument, MicrocoError
from microco.common.identity import Identity
from microco.common.kv import KV, EtcdKV
from microco.common.logs import configure_logging
from microco.common.registry import Registration, ServiceRecord

from . import metrics
from .auth import Caller, Revocations, caller
from .settings import ServiceSettings, add_common_flags, settings_from_args

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- interceptors


class _Malformed:
    """Stands in for a request that could not be parsed, so the call fails INVALID_ARGUMENT
    instead of gRPC's generic INTERNAL."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            return _Malformed(exc)

    return parse


def _check(request: Any) -> Any:
    if isinstance(request, _Malformed):
        raise InvalidArgument(f"malformed request: {request.exc}")
    return request


def _checked_stream(requests: Iterator[Any], context: Any) -> Iterator[Any]:
    for request in requests:
        caller(context)  # a certificate revoked while its stream is open goes no further
        yield _check(request)


def _checked_responses(responses: Iterator[Any], context: Any) -> Iterator[Any]:
    """``responses`` while the caller's certificate stands: one revoked (or its job ended) while
    the stream is open ends it at its next message, UNAUTHENTICATED. A stream opened before the
    revocation went on for as long as it lived (session 42: a revoked user's ``WatchJobs`` kept
    streaming her jobs' records, a ``ReadLog --follow`` the log)."""
    try:
        for response in responses:
            caller(context)
            yield response
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()


class StreamSlots:
    """How many streaming calls a service runs at once, in all and per caller.

    A gRPC server runs each call on a thread of its pool, and a streaming call (``WatchJobs``,
    ``ReadLog``, ``PutChunks``, ``Query``...) holds its thread for as long as the stream lives:
    sixteen streams a user or a job opened and left open took every thread of a service, which
    then answered no other call, health checks included (session 41). So streams may take all
    but ``reserve`` of the pool's threads, and one caller other than a platform service at most
    ``per_caller`` of them; a stream past either limit is refused (RESOURCE_EXHAUSTED, saying
    which), never queued behind the others."""

    def __init__(self, service: str, workers: int) -> None:
        self.service = service
        self.reserve = max(2, workers // 8)
        self.limit = max(1, workers - self.reserve)
        self.per_caller = max(1, self.limit * 3 // 8)
        self._lock = threading.Lock()
        self._total = 0
        self._held: dict[str, int] = {}

    def acquire(self, who: Caller, method: str) -> None:
        from microco.common.errors import ResourceExhausted

        mine = who.name if who.name and not who.is_service() else ""
        with self._lock:
            if mine and self._held.get(mine, 0) >= self.per_caller:
                raise ResourceExhausted(
                    f"{mine} already holds {self.per_caller} streaming calls on {self.service}, "
                    f"the most one caller may: {method} refused; close one first"
                )
            if self._total >= self.limit:
                raise ResourceExhausted(
                    f"{self.service} runs {self.limit} streaming calls already, its most (its "
                    f"other threads stay for other calls): {method} refused; retry later"
                )
            self._total += 1
            if mine:
                self._held[mine] = self._held.get(mine, 0) + 1

    def release(self, who: Caller) -> None:
        mine = who.name if who.name and not who.is_service() else ""
        with self._lock:
            self._total -= 1
            if mine:
                left = self._held.get(mine, 1) - 1
                if left > 0:
                    self._held[mine] = left
                else:
                    self._held.pop(mine, None)


class ErrorAndMetricsInterceptor(grpc.ServerInterceptor):
    """Maps ``MicrocoError`` to its gRPC status, any other exception to INTERNAL (logged with its
    stack, never sent), and counts every call by method and code. With ``workers`` (the size of
    the server's thread pool), streaming calls are limited by :class:`StreamSlots`."""

    def __init__(self, service: str, workers: int = 0) -> None:
        self.service = service
        self.slots = StreamSlots(service, workers) if workers else None

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        service = self.service

        def finish(context: grpc.ServicerContext, start: float, exc: BaseException | None) -> None:
            code = "OK"
            if isinstance(exc, MicrocoError):
                code = exc.grpc_code.name
            elif exc is not None:
                code = grpc.StatusCode.INTERNAL.name
            metrics.RPC_REQUESTS.labels(service, method, code).inc()
            metrics.RPC_LATENCY.labels(service, method).observe(time.perf_counter() - start)

        def abort(context: grpc.ServicerContext, exc: BaseException) -> None:
            if isinstance(exc, MicrocoError):
                context.abort(exc.grpc_code, str(exc))
            log.exception("unhandled error in %s", handler_call_details.method, exc_info=exc)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method} (see the {service} log)")

        slots = self.slots

        def wrap_unary(behavior: Callable[..., Any], stream_in: bool) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                start = time.perf_counter()
                metrics.RPC_IN_FLIGHT.labels(service).inc()
                who: Caller | None = None
                try:
                    peer = caller(context)  # refuses a revoked certificate before any handler runs
                    if stream_in and slots is not None:
                        slots.acquire(peer, method)
                        who = peer
                    req = _checked_stream(request, context) if stream_in else _check(request)
                    result = behavior(req, context)
                except Exception as exc:
                    if _is_abort(exc, context):
                        metrics.RPC_REQUESTS.labels(service, method, context.code().name).inc()
                        raise
                    finish(context, start, exc)
                    abort(context, exc)
                else:
                    finish(context, start, None)
                    return result
                finally:
                    if who is not None and slots is not None:
                        slots.release(who)
                    metrics.RPC_IN_FLIGHT.labels(service).dec()

            return call

        def wrap_stream(behavior: Callable[..., Any], stream_in: bool) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                start = time.perf_counter()
                metrics.RPC_IN_FLIGHT.labels(service).inc()
                who: Caller | None = None
                try:
                    peer = caller(context)  # refuses a revoked certificate before any handler runs
                    if slots is not None:
                        slots.acquire(peer, method)
                        who = peer
                    req = _checked_stream(request, context) if stream_in else _check(request)
                    yield from _checked_responses(behavior(req, context), context)
                except Exception as exc:
                    if _is_abort(exc, context):
                        metrics.RPC_REQUESTS.labels(service, method, context.code().name).inc()
                        raise
                    finish(context, start, exc)
                    abort(context, exc)
                else:
                    finish(context, start, None)
                finally:
                    if who is not None and slots is not None:
                        slots.release(who)
                    metrics.RPC_IN_FLIGHT.labels(service).dec()

            return call

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap_unary(handler.unary_unary, False),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap_unary(handler.stream_unary, True),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap_stream(handler.unary_stream, False),
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            wrap_stream(handler.stream_stream, True),
            request_deserializer=_lenient(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )


def _is_abort(exc: BaseException, context: grpc.ServicerContext) -> bool:
    """True when the servicer itself called ``context.abort`` (gRPC raises a bare ``Exception``
    after setting the code); such calls already carry their status."""
    code = context.code() if hasattr(context, "code") else None
    return type(exc) is Exception and not exc.args and code not in (None, grpc.StatusCode.OK)


# --------------------------------------------------------------------------- runtime

# A client has this long to finish its TLS handshake (session 41: gRPC's 120 s let idle sockets
# of anyone, no certificate needed, hold the service's descriptors); as the Redis TLS front.
HANDSHAKE_TIMEOUT_S = 10.0

_INFO_SERVICE = common_pb2.DESCRIPTOR.services_by_name["InfoService"].full_name


class _InfoServicer(common_pb2_grpc.InfoServiceServicer):
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.runtime = runtime
        self.started_at = time.time()

    def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: grpc.ServicerContext
    ) -> common_pb2.ServiceInfo:
        r = self.runtime
        return common_pb2.ServiceInfo(
            name=r.settings.name,
            instance_id=r.settings.instance_id,
            address=r.address,
            version=r.version,
            started_at=self.started_at,
            metrics_address=r.metrics_address,
            labels={"node": r.settings.node, **r.settings.labels},
        )


@dataclass
class ServiceRuntime:
    """One service process's gRPC server, health, metrics and registration."""

    settings: ServiceSettings
    kv: KV | None = None
    version: str = microco.__version__
    # Threads are started as calls need them. Streaming calls take at most all but an eighth of
    # them, one caller (not a service) at most 3/8 of the rest (``StreamSlots``): 42 of 128, more
    # than a job's loader holds on a cache server (8 fetch threads per reading process).
    max_workers: int = 128
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    # The credentials the server presents and checks clients against; by default the service's
    # own (``microco.common.identity.service_identity``). ``insecure=True`` (or the process in
    # insecure mode) serves plaintext.
    identity: Identity | None = None
    insecure: bool = False
    _services: list[tuple[Callable[[Any, grpc.Server], None], Any, str]] = field(default_factory=list)
    _stop_hooks: list[Callable[[], None]] = field(default_factory=list)
    _start_hooks: list[Callable[[ServiceRuntime], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server: grpc.Server | None = None
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.port = 0
        self.metrics_port = 0
        self._metrics_server: Any = None
        self._ready = False
        self.registration: Registration | None = None
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._labels_lock = threading.Lock()
        self._stopping = False

    # -- assembly
    def add_service(self, add_fn: Callable[[Any, grpc.Server], None], servicer: Any, full_name: str) -> None:
        """``add_fn`` is the generated ``add_XServicer_to_server``; ``full_name`` the proto service
        name (``microco.api.scheduler.v1.SchedulerService``) for health and reflection."""
        self._services.append((add_fn, servicer, full_name))

    def on_start(self, hook: Callable[[ServiceRuntime], None]) -> None:
        """Run ``hook(runtime)`` once the server is bound and serving (``address`` then carries
        the chosen port), before the service registers itself in etcd."""
        self._start_hooks.append(hook)

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` during shutdown, after the service stopped taking new calls."""
        self._stop_hooks.append(hook)

    @property
    def address(self) -> str:
        return f"{self.settings.advertised}:{self.port}"

    @property
    def metrics_address(self) -> str:
        return f"{self.settings.advertised}:{self.metrics_port}" if self.metrics_port else ""

    def advertise(self, **labels: str) -> None:
        """Set labels of this instance's registration (e.g. ``role=leader|standby`` after an
        election): kept in the settings, so that a registration made later carries them too (an
        election can be won before the service registers), and put again when registered.
        Serialised: callbacks racing from two threads leave the last call's labels."""
        with self._labels_lock:
            self.settings = replace(self.settings, labels={**self.settings.labels, **labels})
            if self.registration is not None:
                try:
                    self.registration.update(self.record())
                except MicrocoError as exc:
                    log.warning("could not advertise %s: %s", labels, exc)

    def record(self, **labels: str) -> ServiceRecord:
        return ServiceRecord(
            name=self.settings.name,
            instance_id=self.settings.instance_id,
            address=self.address,
            version=self.version,
            started_at=time.time(),
            metrics_address=self.metrics_address,
            labels={"node": self.settings.node, **self.settings.labels, **labels},
        )

    # -- lifecycle
    def start(self, register: bool = True) -> ServiceRuntime:
        s = self.settings
        options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
            ("grpc.so_reuseport", 0),
            # A connection that has not finished its TLS handshake by then is closed (gRPC's
            # default, 120 s, let anyone hold a descriptor per socket that sent nothing)
            ("grpc.server_handshake_timeout_ms", int(self.handshake_timeout_s * 1000)),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=s.name),
            interceptors=[ErrorAndMetricsInterceptor(s.name, self.max_workers)],
            options=options,
        )
        if not any(name == _INFO_SERVICE for _, _, name in self._services):
            self._services.insert(
                0, (common_pb2_grpc.add_InfoServiceServicer_to_server, _InfoServicer(self), _INFO_SERVICE)
            )
        names = [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        for add_fn, servicer, full_name in self._services:
            add_fn(servicer, server)
            names.append(full_name)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(names, server)
        ident = None if self.insecure else (self.identity or identity.service_identity(s.name))
        if ident is None:
            log.warning("%s serves WITHOUT TLS or authentication (insecure development mode)", s.name)
            self.port = server.add_insecure_port(f"{s.host}:{s.port}")
        else:
            self.identity = ident
            creds = identity.server_credentials(ident)
            self.port = server.add_secure_port(f"{s.host}:{s.port}", creds)  # type: ignore[arg-type]
        if self.port == 0:
            raise MicrocoError(f"{s.name}: cannot bind {s.host}:{s.port}")
        server.start()
        self.server = server
        if s.metrics_port >= 0:
            self._metrics_server, self.metrics_port = metrics.serve_metrics(
                s.host, s.metrics_port, ready=lambda: self._ready
            )
        for _, _, full_name in self._services:
            self.health.set(full_name, health_pb2.HealthCheckResponse.SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        metrics.SERVICE_UP.labels(s.name, s.instance_id).set(1)
        for hook in self._start_hooks:
            hook(self)
        if register and self.kv is not None:
            self.registration = Registration(self.kv, self.record(), ttl=s.lease_ttl_s).start()
        self._ready = True  # /readyz: serving, started and registered
        log.info(
            "serving",
            extra={"address": self.address, "metrics": self.metrics_address, "instance": s.instance_id},
        )
        return self

    def stop(self, grace: float | None = None) -> None:
        """Graceful, idempotent shutdown."""
        with self._stop_lock:
            if self._stopping:
                return
            self._stopping = True
        grace = self.settings.grace_s if grace is None else grace
        log.info("stopping", extra={"grace_s": grace})
        self._ready = False
        self.health.enter_graceful_shutdown()  # every service NOT_SERVING
        metrics.SERVICE_UP.labels(self.settings.name, self.settings.instance_id).set(0)
        if self.registration is not None:
            self.registration.stop()
        if self.server is not None:
            self.server.stop(grace).wait()
        for hook in reversed(self._stop_hooks):
            try:
                hook()
            except Exception:
                log.exception("stop hook failed")
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


# --------------------------------------------------------------------------- main()


@dataclass
class ServiceContext:
    """What a service's ``setup`` function gets: settings, its own parsed flags, the etcd KV and
    the runtime to add servicers and stop hooks to. Redis is connected on first use."""

    settings: ServiceSettings
    args: argparse.Namespace
    kv: KV
    runtime: ServiceRuntime
    _redis: Any = None

    @property
    def redis(self) -> Any:
        if self._redis is None:
            from microco.common.hotstate import connect_redis

            self._redis = connect_redis(self.settings.redis)
        return self._redis


class _StopDuringStartup(BaseException):
    """SIGTERM/SIGINT while the service was starting (see ``run_service``)."""


def run_service(
    name: str,
    description: str,
    setup: Callable[[ServiceContext], None],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
) -> int:
    """Parse flags, connect to etcd (a clear error naming the address if it is down), build the
    service with ``setup``, serve until SIGTERM/SIGINT, then shut down gracefully."""
    parser = argparse.ArgumentParser(prog=f"microco-{name}", description=description)
    add_common_flags(parser)
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(name, args)
    except MicrocoError as exc:
        parser.error(str(exc))
    configure_logging(name, settings.log_level, settings.log_format == "json")
    try:
        own = identity.service_identity(name)  # this process's clients dial as the service too
        identity.use(own)
        kv = EtcdKV(settings.etcd)
    except MicrocoError as exc:
        print(f"microco-{name}: error: {exc}", file=sys.stderr)
        return 2
    runtime = ServiceRuntime(settings, kv=kv, identity=own, insecure=own is None)
    runtime.on_stop(kv.close)
    if own is not None:  # revoked certificates are refused (services/runtime/auth.py)
        runtime.on_stop(Revocations(kv).start().stop)
    ctx = ServiceContext(settings=settings, args=args, kv=kv, runtime=runtime)
    # Signals are handled from before start-up: the service registers itself in etcd while it
    # starts, and a SIGTERM arriving between that and a handler installed afterwards killed the
    # process outright, its registration left behind until the lease expired (seen in CI). A
    # signal during ``setup`` (which may wait on a dependency) interrupts it; one during
    # ``runtime.start`` is held until start returns (interrupted half-way through registering,
    # the registration could not be revoked: seen in CI too), then stops the service gracefully.
    phase = ["setup"]  # "setup" -> "starting" -> "running"
    held: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal received", extra={"signal": signal.Signals(signum).name})
        if phase[0] == "setup":
            raise _StopDuringStartup(signum)
        if phase[0] == "starting":
            held.append(signum)
            return
        threading.Thread(target=runtime.stop, name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        setup(ctx)
        phase[0] = "starting"
        runtime.start()
    except _StopDuringStartup:
        runtime.stop(grace=0)
        return 0
    except MicrocoError as exc:
        print(f"microco-{name}: error: {exc}", file=sys.stderr)
        runtime.stop(grace=0)
        return 2
    phase[0] = "running"
    if held:
        runtime.stop()
    while not runtime.wait(timeout=1.0):
        pass
    return 0
