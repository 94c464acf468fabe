"""Helpers for the console tests: the console as its own process (``python -m
microco.services.console``, the way
``microco up`` starts it) against the session's real etcd and Redis, plus real service processes
for it to show."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from _support import scaled

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
            # (its jobs are framework-free: no warm zygote importing torch for them)
            ["--virtual-devices", "1", "--node", f"node-{port}", "--metrics-port", "-1", "--preload", "none"],
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
    deadline = time.monotonic() + scaled(timeout)
    body: dict = {}
    while time.monotonic() < deadline:
        body = httpx.get(platform.url + "/api/v1/nodes", headers=headers, timeout=10).json()
        if body["devices"] and platform.kv.get("/microco/leader/scheduler"):
            return
        time.sleep(0.2)
    raise AssertionError(f"scheduler not ready with devices in {timeout:.0f}s: {body}")


# What the job does: put a chunk of its dataset and read it back (bytes served to the job),
# report a mini-batch's hits the way its loader does (3 of 4 samples cached), and register its
# training step at the compiler, reporting trials until the configuration is committed. It also
# registers a second graph naming another job: a job's own certificate decides which job it is.
LINKS_JOB = textwrap.dedent(
    """
    import os, sys
    import blake3
    from microco.api.compiler.v1 import compiler_pb2 as pb
    from microco.clients.cache import CacheClient
    from microco.clients.compiler import RemoteExplorer
    from microco.clients.compiler.explore import wire
    from microco.clients.compiler.explore.types import GraphSpec, TrialReport, Variable

    cache_address, compiler_address, tag = sys.argv[1:4]
    job = os.environ["MICROCO_JOB_ID"]
    chunk = (tag * 512).encode()
    digest = blake3.blake3(chunk).hexdigest()
    with CacheClient(cache_address) as cache:
        cache.put_chunks([(digest, chunk)], dataset="links-" + tag)
        assert cache.read_chunks([digest], job_id=job) == {digest: chunk}
        cache.report_progress(job, "links-" + tag, epoch=0, timings=[(0.75, 0.01, len(chunk), 4)])
    explorer = RemoteExplorer.from_address(compiler_address, default_timeout=10.0)
    spec = GraphSpec(
        "links-graph-" + tag, "[8,16]", "cpu-links", (Variable("fusion", ("off", "fused")),),
        model_name="links-model", total_steps=100000,
    )
    config = explorer.register(spec)
    for _ in range(40):
        if config.committed:
            break
        ms = 5.0 if config.values.get("fusion") == "fused" else 9.0
        steps = max(config.steps, 2)
        config = explorer.report(config.key, TrialReport(config.trial, [ms * 3] + [ms] * (steps - 1)))
    forged = wire.spec_to_proto(GraphSpec("links-forged-" + tag, "[1]", "cpu-links", ()))
    forged.job_id = "someone-elses-job"
    explorer._stub.RegisterGraph(forged, timeout=10)
    print("registered", config.key, "committed" if config.committed else "exploring")
    """
)


@contextmanager
def links_servers(platform: Platform) -> Iterator[dict[str, Proc]]:
    """A compiler, and a cache server on the agent's node: a cache server counts the reports of
    the jobs that run on its own host only (the scheduler's phases say where each job runs)."""
    agent = platform.others["agent"].record
    assert agent is not None
    node = agent.labels.get("node") or "node-" + platform.url.rsplit(":", 1)[1]
    common = {"etcd": platform.etcd, "redis": platform.redis, "home": platform.home}
    procs = {
        "compiler": spawn(
            "microco.services.compiler", ["--metrics-port", "-1"], instance_id="compiler-links", **common
        ),
        "cache": spawn(
            "microco.services.cache",
            ["--capacity", "8M", "--node", node],
            instance_id="cache-links",
            **common,
        ),
    }
    try:
        for service, p in procs.items():
            wait_registered(platform.kv, service, p)
        yield procs
    finally:
        for p in procs.values():
            if p.proc.poll() is None:
                p.proc.terminate()
        for p in procs.values():
            p.stop()
