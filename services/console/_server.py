"""The console process: flags, the HTTP server, registration in etcd, graceful shutdown.

``python -m microco.services.console --http-port 8080 --etcd ... --redis ... --profile dev``.
It registers as service ``console`` with ``protocol=http`` (so ``microco status`` and
``microco up`` check ``/healthz``). On SIGTERM it first revokes its registration (it vanishes
from the registry at once), then stops taking connections and lets requests in flight finish.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import microco
from microco.common.errors import MicrocoError
from microco.common.kv import EtcdKV
from microco.common.logs import configure_logging
from microco.common.registry import Registration, ServiceRecord
from microco.services.runtime.settings import add_common_flags

from ._app import create_app
from ._config import ConsoleConfig, add_console_flags, config_from_args
from ._limits import REQUEST_TIMEOUT_S, timely_protocol

log = logging.getLogger(__name__)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class Presence:
    """A registration in the service registry, written once and revoked once. Entering and
    leaving exclude each other, and leaving is final: a SIGTERM that lands while the
    registration is being written (its key already in etcd, the object not yet kept) waits for
    it and revokes it, instead of leaving the key to expire with its lease (seen in CI)."""

    def __init__(self, make: Callable[[], Registration]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self.registration: Registration | None = None
        self._left = False

    def enter(self) -> None:
        with self._lock:
            if self.registration is None and not self._left:
                self.registration = self._make().start()

    def leave(self) -> None:
        with self._lock:
            self._left = True
            reg, self.registration = self.registration, None
            if reg is not None:
                reg.stop()


class ConsoleServer:
    """The console's HTTP server and registration, startable in-process (tests) or as ``main``."""

    def __init__(
        self,
        config: ConsoleConfig,
        kv: EtcdKV,
        redis: Any = None,
        register: bool = True,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        import uvicorn

        self.config = config
        self.kv = kv
        self.sock = _bind(config.host, config.http_port)
        self.port = int(self.sock.getsockname()[1])
        self.presence = Presence(lambda: Registration(self.kv, self.record(), ttl=config.lease_ttl_s))
        self._register = register
        self.app = create_app(config, kv, redis)
        self._uv = uvicorn.Server(
            uvicorn.Config(
                self.app,
                http=timely_protocol(request_timeout_s),
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=5,
                lifespan="on",
            )
        )
        self._stop_lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.config.advertise_host or self.config.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def record(self) -> ServiceRecord:
        return ServiceRecord(
            name="console",
            instance_id=self.config.instance_id,
            address=self.address,
            version=microco.__version__,
            started_at=time.time(),
            metrics_address=self.address,  # /metrics on the same port (bearer token required)
            labels={"node": self.config.node, "protocol": "http", "profile": self.config.profile},
        )

    def _registered(self) -> None:
        if self._register:
            self.presence.enter()

    def serve(self) -> None:
        """Serve in this thread until ``stop`` (uvicorn handles SIGTERM/SIGINT when in the main thread)."""
        threading.Thread(target=self._register_when_started, name="console-register", daemon=True).start()
        self._uv.run(sockets=[self.sock])
        self._unregister()

    def start_background(self, timeout: float = 15.0) -> ConsoleServer:
        """Serve in a background thread (for tests); returns once it answers and is registered."""
        self._thread = threading.Thread(target=lambda: self._uv.run(sockets=[self.sock]), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uv.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise MicrocoError("console did not start")
            time.sleep(0.02)
        self._registered()
        return self

    def _register_when_started(self) -> None:
        while not self._uv.started and not self._uv.should_exit:
            time.sleep(0.02)
        if self._uv.started and not self._uv.should_exit:
            self._registered()

    def _unregister(self) -> None:
        self.presence.leave()

    def stop(self) -> None:
        """Graceful and idempotent: leave the registry, then let in-flight requests finish."""
        with self._stop_lock:
            if self._stopping:
                return
            self._stopping = True
        self._unregister()
        self._uv.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.sock.close()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="microco-console",
        description="The microco admin console: REST API (OpenAPI at /api/v1/openapi.json) and web page.",
    )
    add_common_flags(parser)
    add_console_flags(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except MicrocoError as exc:
        parser.error(str(exc))
    configure_logging("console", config.log_level, config.log_format == "json")
    for warning in config.start_warnings():
        log.warning(warning)
        print(f"microco-console: warning: {warning}", file=sys.stderr)
    try:
        kv = EtcdKV(config.etcd)
    except MicrocoError as exc:
        print(f"microco-console: error: {exc}", file=sys.stderr)
        return 2
    try:
        server = ConsoleServer(config, kv)
    except OSError as exc:
        print(
            f"microco-console: error: cannot listen on {config.host}:{config.http_port}: {exc}",
            file=sys.stderr,
        )
        kv.close()
        return 2
    log.info("console serving", extra={"url": server.url, "instance": config.instance_id})

    # uvicorn's own SIGTERM handler stops the server; revoke the registration first so that
    # nobody is sent here while it drains.
    original = server._uv.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        server._unregister()  # one etcd call: milliseconds, worth doing before anything else
        original(sig, frame)

    server._uv.handle_exit = handle_exit  # type: ignore[method-assign]
    try:
        server.serve()
    finally:
        server._unregister()
        kv.close()
    return 0
