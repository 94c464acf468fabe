"""Brings the whole platform up on one machine and takes it down again.

Starts a real etcd and a real Redis (unless addresses of running ones are given), then every
service as its own process (``python -m microco.services.<x>``), waits until each has registered
in etcd and answers its health check, and writes a state file so ``microco down`` (from another
shell) can stop what ``microco up`` started. Children run in their own sessions, so Ctrl-C
reaches only the supervisor, which then stops them in reverse order.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from microco.common.discovery import STATE_FILE, pid_alive, stack_home
from microco.common.election import LEADER_PREFIX
from microco.common.errors import FailedPrecondition, MicrocoError, Unavailable
from microco.common.health import check_health
from microco.common.kv import EtcdKV
from microco.common.registry import SERVICES_PREFIX, ServiceRecord
from microco.services.runtime.launch import kill_after, start_service

from ._pki import PRIVATE_UMASK, StackPki
from ._policy import DEFAULT_POLICY, scheduler_args
from ._restart import RestartPolicy, RestartTracker
from ._servers import EtcdServer, RedisServer, free_port

log = logging.getLogger(__name__)


def default_home() -> Path:
    return stack_home()


@dataclass(frozen=True)
class ProcessSpec:
    """One platform process: ``python -m <module> <args>``, registering as ``service``."""

    name: str
    service: str
    module: str
    args: tuple[str, ...] = ()
    elected: bool = False  # runs a leader election (one active instance, standbys)

    def available(self) -> bool:
        try:
            return importlib.util.find_spec(self.module + ".__main__") is not None
        except ModuleNotFoundError:
            return False


@dataclass
class StackOptions:
    home: Path = field(default_factory=default_home)
    etcd: str = ""  # an existing etcd to use; "" starts one
    redis: str = ""  # an existing Redis to use; "" starts one
    etcd_port: int = 0
    redis_port: int = 0
    devices: int = 4  # virtual devices the node agent offers on a host without GPUs
    # What the node agent's warm zygote imports for Python jobs to fork from (``auto``: NumPy
    # and PyTorch when installed; ``none``: no zygote, every job execs its own interpreter).
    preload: str = "auto"
    store_nodes: int = 6  # three node groups of two: any single node loss can be re-replicated
    cache_capacity_mb: int = 256
    console_port: int = 8080
    console: bool = True
    profile: str = "dev"
    extra_env: dict[str, str] = field(default_factory=dict)
    standbys: bool = True  # a second scheduler and store coordinator, taking over when the leader dies
    policy: str = DEFAULT_POLICY  # the schedulers' policy (``_policy``: checked by resolve_policy)
    policy_config: dict[str, Any] = field(default_factory=dict)
    # When the supervisor cannot remove a dead leader's key (etcd down), an elected service is
    # restarted no sooner than that lease can expire, so the warm standby takes over rather
    # than racing the restarted process for the key.
    leader_ttl_s: float = 5.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    # No TLS, no authentication, no authorisation: development only (``microco up --insecure``).
    insecure: bool = False


def platform_processes(opts: StackOptions) -> list[ProcessSpec]:
    """The processes of a one-machine platform, in start order."""
    policy = scheduler_args(opts.policy, opts.policy_config)
    specs = [
        ProcessSpec("scheduler", "scheduler", "microco.services.scheduler", policy, elected=True),
        *(
            [
                ProcessSpec(
                    "scheduler-standby", "scheduler", "microco.services.scheduler", policy, elected=True
                )
            ]
            if opts.standbys
            else []
        ),
        ProcessSpec(
            "agent",
            "agent",
            "microco.services.agent",
            ("--devices", str(opts.devices), "--preload", opts.preload),
        ),
        ProcessSpec("cache", "cache", "microco.services.cache", ("--capacity", f"{opts.cache_capacity_mb}M")),
        ProcessSpec("store", "store", "microco.services.store", ("coordinator",), elected=True),
        *(
            [ProcessSpec("store-standby", "store", "microco.services.store", ("coordinator",), elected=True)]
            if opts.standbys
            else []
        ),
    ]
    for i in range(opts.store_nodes):
        specs.append(
            ProcessSpec(
                f"store-node-{i + 1}",
                "store-node",
                "microco.services.store",
                ("node", "--fault-domain", f"fd-{i + 1}"),
            )
        )
    specs.append(ProcessSpec("compiler", "compiler", "microco.services.compiler"))
    if opts.console:
        specs.append(
            ProcessSpec(
                "console", "console", "microco.services.console", ("--http-port", str(opts.console_port))
            )
        )
    return specs


@dataclass
class Child:
    spec: ProcessSpec
    instance_id: str
    proc: subprocess.Popen[bytes] | None = None
    record: ServiceRecord | None = None
    status: str = "pending"
    tracker: RestartTracker = field(default_factory=RestartTracker)
    restart_at: float = 0.0  # monotonic time of the next restart, while "waiting-restart"
    launched_wall: float = 0.0  # time.time() of the latest launch


@dataclass
class Infra:
    """etcd or Redis started by the stack, restarted on the same port and data directory."""

    server: EtcdServer | RedisServer
    tracker: RestartTracker
    status: str = "running"
    restart_at: float = 0.0


class Stack:
    """The running platform. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, opts: StackOptions, progress: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.home = Path(opts.home)
        self.progress = progress or (lambda msg: log.info(msg))
        self.etcd: EtcdServer | None = None
        self.redis: RedisServer | None = None
        self.etcd_endpoint = opts.etcd
        self.redis_url = opts.redis
        self.children: list[Child] = []
        self.kv: EtcdKV | None = None
        self._stopping = False
        self._infra: list[Infra] = []
        self.pki: StackPki | None = None  # set up by start()

    # -- start
    def start(self, timeout: float = 90.0) -> Stack:
        self.home.mkdir(parents=True, exist_ok=True)
        existing = read_state(self.home)
        if existing and any_alive(existing):
            raise FailedPrecondition(
                f"a stack started from {self.home} is still running (pids in {self.home / STATE_FILE}); "
                "run `microco down` first"
            )
        (self.home / "logs").mkdir(exist_ok=True)
        self.pki = StackPki.set_up(self.home, self.opts.insecure, self.progress)
        try:
            if not self.etcd_endpoint:
                self.progress("starting etcd")
                self.etcd = EtcdServer(
                    self.home / "etcd",
                    port=self.opts.etcd_port or free_port(),
                    identity=self.pki.etcd_identity() if self.pki else None,
                ).start()
                self.etcd_endpoint = self.etcd.endpoint
                if self.pki is not None and not self.pki.insecure:  # its roles (docs/security.md)
                    services = [spec.service for spec in platform_processes(self.opts)]
                    self.pki.set_up_etcd_roles(self.etcd_endpoint, services)
            if not self.redis_url:
                self.progress("starting redis")
                self.redis = RedisServer(
                    self.home / "redis",
                    port=self.opts.redis_port or free_port(),
                    password=self.pki.redis_password if self.pki else "",
                    identity=self.pki.redis_identity() if self.pki else None,
                ).start()
                self.redis_url = self.redis.url
            self._infra = [
                Infra(server, RestartTracker(self.opts.restart))
                for server in (self.etcd, self.redis)
                if server
            ]
            self.kv = EtcdKV(self.etcd_endpoint)
            for spec in platform_processes(self.opts):
                child = Child(spec, instance_id=f"{spec.name}-{uuid.uuid4().hex[:6]}")
                child.tracker = RestartTracker(self.opts.restart)
                self.children.append(child)
                if not spec.available():
                    child.status = "absent"
                    self.progress(f"{spec.name}: not part of this build, skipped")
                    continue
                self._launch(child)
            self._write_state()
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def _launch(self, child: Child) -> None:
        spec = child.spec
        data_dir = self.home / "data" / spec.name
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *spec.args,
            "--etcd",
            self.etcd_endpoint,
            "--redis",
            self.redis_url,
            "--instance-id",
            child.instance_id,
            "--data-dir",
            str(data_dir),
            "--profile",
            self.opts.profile,
        ]
        child.proc = start_service(
            spec.module,
            cmd,
            log_path=self.home / "logs" / f"{spec.name}.log",
            env={**self.opts.extra_env, **(self.pki.child_env(spec.name, spec.service) if self.pki else {})},
            new_session=True,
            umask=PRIVATE_UMASK,
        )
        child.status = "starting"
        child.launched_wall = time.time()
        self.progress(f"{spec.name}: started (pid {child.proc.pid})")

    # -- supervision
    def supervise(self) -> None:
        """One pass of the supervisor (``microco up`` calls it about twice a second): a service,
        etcd or Redis that exited is restarted after a back-off that doubles with each failure in
        the policy's window (capped), and given up on, with a message, after too many; a restarted
        service counts as healthy again once it has registered anew and answers SERVING. Never
        restarts anything once ``stop()`` has begun."""
        changed = False
        for infra in self._infra:
            changed |= self._supervise_infra(infra)
        for child in self.children:
            if self._stopping:
                return
            changed |= self._supervise_child(child)
        if changed and not self._stopping:
            self._write_state()

    def _supervise_child(self, child: Child) -> bool:
        name = child.spec.name
        now = time.monotonic()
        if child.status in ("absent", "failed", "stopped", "pending"):
            return False
        if child.status == "waiting-restart":
            if now < child.restart_at or not self._etcd_serving():
                return False
            child.tracker.restarts += 1
            # A new instance id: the dead one's registration (and leader key) lingers until its
            # lease expires, and must not be mistaken for the new process.
            child.instance_id = f"{child.spec.name}-{uuid.uuid4().hex[:6]}"
            self._launch(child)
            child.status = "restarting"
            pid = child.proc.pid if child.proc else 0
            self.progress(f"{name}: restarted (restart {child.tracker.restarts}, pid {pid})")
            return True
        assert child.proc is not None
        if child.proc.poll() is not None:
            code = child.proc.returncode
            logs = self.home / "logs" / f"{name}.log"
            if not self._etcd_serving():
                # Every service needs etcd: an exit while etcd is down (paused, restarting) is
                # etcd's failure, not the service's. It does not count towards giving up; the
                # service is started again once etcd serves.
                child.status = "waiting-restart"
                child.restart_at = now
                self.progress(
                    f"{name} exited with code {code} while etcd is down; restarting once etcd is back"
                )
                return True
            delay = child.tracker.failed(now)
            if delay is None:
                child.status = "failed"
                self.progress(
                    f"{name} exited with code {code}: giving up after {child.tracker.describe_give_up()} "
                    f"(see {logs}); restart the stack once it is fixed"
                )
            else:
                if not self._forget(child) and child.spec.elected:
                    delay = max(delay, self.opts.leader_ttl_s)
                child.status = "waiting-restart"
                child.restart_at = now + delay
                self.progress(f"{name} exited with code {code}; restarting in {delay:.1f}s (log: {logs})")
            return True
        if child.status == "restarting" and self.kv is not None:
            try:
                raw = self.kv.get(f"{SERVICES_PREFIX}{child.spec.service}/{child.instance_id}")
            except MicrocoError:
                return False  # etcd is down: look again on the next pass
            if raw is None:
                return False
            record = ServiceRecord.from_json(raw)
            # The key may still hold the killed process's record until its lease expires.
            if record.started_at < child.launched_wall - 1 or check_health(record, timeout=1.0) != "SERVING":
                return False
            child.record = record
            child.status = "healthy"
            self.progress(f"{name}: healthy again at {record.address}")
            return True
        return False

    def _forget(self, child: Child) -> bool:
        """Remove what a dead child left in etcd: its registration, and its leadership if it
        led (only while the key still names it), so clients and ``microco status`` stop seeing
        it and a standby takes over now rather than when the leases expire. False if etcd
        could not be reached (the leases then expire by themselves within their TTL)."""
        if self.kv is None:
            return False
        try:
            self.kv.delete(f"{SERVICES_PREFIX}{child.spec.service}/{child.instance_id}")
            if child.spec.elected:
                self.kv.compare_and_swap(LEADER_PREFIX + child.spec.service, child.instance_id.encode(), None)
        except MicrocoError as exc:
            log.warning("could not remove %s from etcd: %s", child.instance_id, exc)
            return False
        return True

    def _supervise_infra(self, infra: Infra) -> bool:
        server = infra.server
        now = time.monotonic()
        if infra.status == "failed" or self._stopping:
            return False
        if infra.status == "waiting-restart":
            if now < infra.restart_at:
                return False
            infra.tracker.restarts += 1
            try:
                server.start()
            except MicrocoError as exc:
                server.proc = None
                return self._infra_failed(infra, now, f"restart failed: {exc}")
            infra.status = "running"
            self.progress(f"{server.name}: restarted on port {server.port} (pid {server.pid})")
            return True
        if server.proc is not None and server.proc.poll() is not None:
            return self._infra_failed(infra, now, f"exited with code {server.proc.returncode}")
        return False

    def _infra_failed(self, infra: Infra, now: float, why: str) -> bool:
        name = infra.server.name
        delay = infra.tracker.failed(now)
        if delay is None:
            infra.status = "failed"
            self.progress(
                f"{name} {why}: giving up after {infra.tracker.describe_give_up()} (see {infra.server.log_path})"
            )
        else:
            infra.status = "waiting-restart"
            infra.restart_at = now + delay
            self.progress(f"{name} {why}; restarting in {delay:.1f}s")
        return True

    def _wait_healthy(self, timeout: float) -> None:
        assert self.kv is not None
        deadline = time.monotonic() + timeout
        waiting = [c for c in self.children if c.status == "starting"]
        while waiting:
            for child in list(waiting):
                assert child.proc is not None
                if child.proc.poll() is not None:
                    tail = (self.home / "logs" / f"{child.spec.name}.log").read_text(errors="replace")[-1500:]
                    raise Unavailable(f"{child.spec.name} exited with code {child.proc.returncode}:\n{tail}")
                raw = self.kv.get(f"{SERVICES_PREFIX}{child.spec.service}/{child.instance_id}")
                if raw is None:
                    continue
                child.record = ServiceRecord.from_json(raw)
                if check_health(child.record) == "SERVING":
                    child.status = "healthy"
                    waiting.remove(child)
                    self.progress(f"{child.spec.name}: healthy at {child.record.address}")
            if waiting and time.monotonic() > deadline:
                names = ", ".join(c.spec.name for c in waiting)
                raise Unavailable(f"not healthy after {timeout:.0f}s: {names} (logs in {self.home / 'logs'})")
            if waiting:
                time.sleep(0.2)

    # -- state
    def _write_state(self) -> None:
        state: dict[str, Any] = {
            "etcd": self.etcd_endpoint,
            "redis": self.redis_url,
            "supervisor_pid": os.getpid(),
            "processes": [
                {"name": "etcd", "pid": self.etcd.pid} if self.etcd else None,
                {"name": "redis", "pid": self.redis.pid} if self.redis else None,
                *[
                    {
                        "name": c.spec.name,
                        "instance_id": c.instance_id,
                        "pid": c.proc.pid if c.proc else 0,
                        "status": c.status,
                        "restarts": c.tracker.restarts,
                        "address": c.record.address if c.record else "",
                        "spec": asdict(c.spec),
                    }
                    for c in self.children
                ],
            ],
        }
        state["processes"] = [p for p in state["processes"] if p]
        # Written beside and renamed over: a reader (`microco down`, `status`) never sees half of it.
        tmp = self.home / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.home / STATE_FILE)

    def _etcd_serving(self) -> bool:
        """Whether the stack's etcd answers (True when the stack uses an etcd it did not start)."""
        return self.etcd is None or self.etcd.ready()

    # -- stop
    def stop(self, grace: float = 10.0) -> None:
        """Stop every child (services first, newest first), then Redis and etcd. Idempotent."""
        self._stopping = True  # no restarts from here on
        for child in reversed(self.children):
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            if child.proc is not None:
                kill_after(child.proc, grace)
                child.status = "stopped"
        if self.kv is not None:
            self.kv.close()
            self.kv = None
        if self.redis is not None:
            self.redis.stop()
        if self.etcd is not None:
            self.etcd.stop()
        state = self.home / STATE_FILE
        if state.exists():
            state.unlink()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_state(home: Path) -> dict | None:
    path = Path(home) / STATE_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def any_alive(state: dict) -> bool:
    return any(pid_alive(p.get("pid", 0)) for p in state.get("processes", []))


def stop_from_state(home: Path, grace: float = 10.0, progress: Callable[[str], None] | None = None) -> int:
    """``microco down``: stop the processes a stack recorded in its state file. Returns how many
    of them were running and are stopped now, whoever stopped them: a foreground ``microco up``
    is asked to stop its own (in order), and whatever it leaves is stopped here. Services get
    SIGTERM (graceful), then SIGKILL after ``grace`` seconds."""
    say = progress or (lambda msg: None)
    state = read_state(home)
    if state is None:
        raise FailedPrecondition(f"no running stack recorded in {Path(home) / STATE_FILE}")
    running = [p for p in state.get("processes", []) if pid_alive(p.get("pid", 0))]
    supervisor = state.get("supervisor_pid", 0)
    if supervisor != os.getpid() and pid_alive(supervisor):
        # A foreground `microco up` is running: let it shut everything down in order.
        say(f"asking `microco up` (pid {supervisor}) to stop its {len(running)} processes")
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + grace + 15
        while pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
    procs = [p for p in running if pid_alive(p["pid"])]
    services = [p for p in procs if p["name"] not in ("etcd", "redis")]
    infra = [p for p in procs if p["name"] in ("etcd", "redis")]
    for group in (list(reversed(services)), infra):
        for p in group:
            say(f"stopping {p['name']} (pid {p['pid']})")
            os.kill(p["pid"], signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in group:
            while pid_alive(p["pid"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(p["pid"]):
                os.kill(p["pid"], signal.SIGKILL)
                gone_by = time.monotonic() + 5
                while pid_alive(p["pid"]) and time.monotonic() < gone_by:
                    time.sleep(0.05)
    path = Path(home) / STATE_FILE
    if path.exists():
        path.unlink()
    return sum(1 for p in running if not pid_alive(p["pid"]))


__all__ = [
    "STATE_FILE",
    "MicrocoError",
    "ProcessSpec",
    "Stack",
    "StackOptions",
    "default_home",
    "platform_processes",
    "read_state",
    "stop_from_state",
]
