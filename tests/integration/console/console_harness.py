"""Helpers for the console tests: the console as its own process (``python -m
microco.services.console``, the way
``microco up`` starts it) against the session's real etcd and Redis, plus real service processes
for it to show."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from microco.common.kv import EtcdKV
from microco.common.registry import ServiceRecord

VIEW_TOKEN = "viewer-token-for-tests"


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    log: Path
    record: ServiceRecord | None = None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def stop(self, grace: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def spawn(
    module: str,
    args: list[str],
    *,
    etcd: str,
    redis: str,
    home: Path,
    instance_id: str,
    profile: str = "dev",
    env: dict[str, str] | None = None,
) -> Proc:
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"{instance_id}.log"
    cmd = [
        sys.executable,
        "-m",
        module,
        *args,
        "--etcd",
        etcd,
        "--redis",
        redis,
        "--instance-id",
        instance_id,
        "--data-dir",
        str(home / instance_id),
        "--profile",
        profile,
        "--log-format",
        "text",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    return Proc(instance_id, proc, log)


def wait_registered(kv: EtcdKV, service: str, p: Proc, timeout: float = 60.0) -> ServiceRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = kv.get(f"/microco/services/{service}/{p.name}")
        if raw is not None:
            p.record = ServiceRecord.from_json(raw)
            return p.record
        if p.proc.poll() is not None:
            raise AssertionError(f"{p.name} exited with {p.proc.returncode}:\n{p.log_tail()}")
        time.sleep(0.1)
    raise AssertionError(f"{p.name} did not register as {service} in {timeout:.0f}s:\n{p.log_tail()}")


@dataclass
class Platform:
    kv: EtcdKV
    url: str
    console: Proc
    etcd: str
    redis: str
    home: Path
    others: dict[str, Proc]
    stopped: bool = False

    def stop(self) -> None:
        """Idempotent: SIGTERM to every process (graceful), then close the etcd client."""
        if self.stopped:
            return
        self.stopped = True
        procs = [self.console, *self.others.values()]
        for p in procs:
            if p.proc.poll() is None:
                p.proc.terminate()
        for p in procs:
            p.stop()
        self.kv.close()


def start_platform(
    etcd: str,
    redis: str,
    home: Path,
    *,
    cache: bool = True,
    scheduler: bool = True,
    scheduler_args: tuple[str, ...] = (),
) -> Platform:
    """The console as ``microco up`` starts it, plus the real services it shows: a cache server,
    a scheduler and a node agent with one virtual device (each when part of this build). Every
    process is started before any is waited for, so they boot in parallel."""
    from microco.services.console._gateway import SYSTEMS
    from microco.services.stack import free_port

    kv = EtcdKV(etcd)
    port = free_port()
    common = {"etcd": etcd, "redis": redis, "home": home}
    console = spawn(
        "microco.services.console",
        ["--http-port", str(port), "--sample-every-s", "0.5"],
        instance_id=f"console-{port}",
        env={"MICROCO_CONSOLE_VIEW_TOKEN": VIEW_TOKEN},
        **common,
    )
    others: dict[str, Proc] = {}
    if cache and SYSTEMS["cache"].in_build():
        others["cache"] = spawn(
            "microco.services.cache", ["--capacity", "32M"], instance_id=f"cache-{port}", **common
        )
    if scheduler and SYSTEMS["scheduler"].in_build() and SYSTEMS["agent"].in_build():
        others["scheduler"] = spawn(
            "microco.services.scheduler",
            ["--tick-s", "0.2", "--metrics-port", "-1", *scheduler_args],
            instance_id=f"scheduler-{port}",
            **common,
        )
        others["agent"] = spawn(
            "microco.services.agent",
            ["--virtual-devices", "1", "--node", f"node-{port}", "--metrics-port", "-1"],
            instance_id=f"agent-{port}",
            **common,
        )
    platform = Platform(kv, f"http://127.0.0.1:{port}", console, etcd, redis, home, others)
    try:
        wait_registered(kv, "console", console)
        for service, p in others.items():
            wait_registered(kv, service, p)
        if "scheduler" in others:
            _wait_jobs_available(platform)
    except BaseException:
        platform.stop()
        raise
    return platform


def _wait_jobs_available(platform: Platform, timeout: float = 60.0) -> None:
    """Until the scheduler leads and sees the agent's device (the console answers for jobs)."""
    import httpx

    headers = {"Authorization": "Bearer microco-dev-token"}
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        body = httpx.get(platform.url + "/api/v1/nodes", headers=headers, timeout=10).json()
        if body["devices"] and platform.kv.get("/microco/leader/scheduler"):
            return
        time.sleep(0.2)
    raise AssertionError(f"scheduler not ready with devices in {timeout:.0f}s: {body}")
