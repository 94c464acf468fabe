"""Fixtures: a real cache server process against the session's etcd and Redis, and small
datasets on disk."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from microco.common.channel import dial


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, proc: subprocess.Popen, address: str, data_dir: Path, log: Path) -> None:
        self.proc = proc
        self.address = address
        self.data_dir = data_dir
        self.log = log

    @property
    def chunk_dir(self) -> Path:
        return self.data_dir / "cache" / "chunks"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def cache_server(tmp_path: Path, etcd_endpoint: str, redis_url: str) -> Iterator[Callable[..., ServerProc]]:
    started: list[ServerProc] = []

    def start(
        capacity: str = "64M",
        policy: str = "coordinated",
        node: str = "",
        name: str = "s0",
        port: int = 0,
        redis: str = "",
    ) -> ServerProc:
        """A server; the same ``name`` reuses its data directory, ``port`` its address;
        ``redis``: another Redis than the session's."""
        port = port or _free_port()
        data = tmp_path / f"server-{name}"
        log = tmp_path / f"server-{name}-{len(started)}.log"
        cmd = [
            sys.executable,
            "-m",
            "microco.services.cache",
            "--port",
            str(port),
            "--etcd",
            etcd_endpoint,
            "--redis",
            redis or redis_url,
            "--data-dir",
            str(data),
            "--capacity",
            capacity,
            "--policy",
            policy,
            "--metrics-port",
            "-1",
            "--grace-s",
            "0.5",
            "--log-format",
            "text",
        ]
        if node:
            cmd += ["--node", node]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log, "wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        address = f"127.0.0.1:{port}"
        server = ServerProc(proc, address, data, log)
        started.append(server)
        deadline = time.monotonic() + 120
        with dial(address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"cache server exited: {log.read_text()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cache server not ready: {log.read_text()}")
                time.sleep(0.1)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def make_dataset() -> Callable[..., dict[str, bytes]]:
    """Factory: ``make_dataset(root, n, size, seed)`` writes a small dataset, returns its files."""
    return _make_dataset


def _make_dataset(root: Path, n: int = 120, size: int = 2000, seed: int = 0) -> dict[str, bytes]:
    """n files of ``size`` pseudo-random bytes (deterministic in ``seed``)."""
    import random

    rng = random.Random(seed)
    files = {}
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        data = rng.randbytes(size)
        name = f"class{i % 3}/img{i:05d}.bin"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        files[name] = data
    return files


@pytest.fixture
def inproc_cache(tmp_path: Path) -> Iterator[Callable[..., tuple[str, object]]]:
    """Factory: ``inproc_cache(capacity, policy)`` -> (address, core): a real gRPC cache server
    in this process (no etcd, no Redis), for loader tests that need a cache but no stack."""
    from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process

    servers = []

    def start(capacity: int = 1 << 20, policy: str = "coordinated", node: str = "") -> tuple[str, object]:
        core = CacheCore(ChunkStore(str(tmp_path / f"inproc-{len(servers)}")), capacity, policy, node=node)
        server, address = serve_in_process(CacheServicer(core))
        servers.append(server)
        return address, core

    yield start
    for s in servers:
        s.stop(0)


@pytest.fixture(autouse=True)
def _cache_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dataset indexes of each test go to its own MICROCO_HOME (inherited by subprocesses)."""
    monkeypatch.setenv("MICROCO_HOME", str(tmp_path_factory.mktemp("microco-home")))
