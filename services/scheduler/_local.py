"""Start scheduler and agent processes on this machine (tests, benchmarks, demos)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from microco.common.kv import KV


def _wait(pred: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def spawn_agent(
    etcd: str,
    node: str,
    data_dir: str | os.PathLike[str],
    *,
    devices: int = 2,
    checkpoint_root: str | os.PathLike[str] | None = None,
    kv: KV | None = None,
    lease_ttl_s: int = 2,
    log_path: str | os.PathLike[str] | None = None,
    timeout: float = 30.0,
    preload: str = "none",
    wait_warm: bool = False,
) -> subprocess.Popen[bytes]:
    """A node agent process with ``devices`` virtual devices; waits until its node is registered
    (and, with ``wait_warm``, until its zygote has imported ``preload``).

    ``preload`` defaults to none here (the agent's own default is ``auto``): tests that run
    framework-free jobs should not pay a torch import per agent on a shared CI machine."""
    cmd = [
        sys.executable,
        "-m",
        "microco.services.agent",
        "--etcd",
        etcd,
        "--node",
        node,
        "--data-dir",
        str(data_dir),
        "--virtual-devices",
        str(devices),
        "--metrics-port",
        "-1",
        "--log-format",
        "text",
        "--lease-ttl-s",
        str(lease_ttl_s),
        "--log-level",
        "warning",
        "--preload",
        preload,
    ]
    if checkpoint_root:
        cmd += ["--checkpoint-root", str(checkpoint_root)]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    if kv is not None:
        from microco.clients.agent import NODES_PREFIX

        _wait(lambda: (kv.get_json(NODES_PREFIX + node) or {}).get("address"), timeout, f"agent {node}", proc)
        if wait_warm:
            _wait(
                lambda: (kv.get_json(NODES_PREFIX + node) or {}).get("preloaded"),
                max(timeout, 120.0),
                f"agent {node}'s warm zygote",
                proc,
            )
    return proc


def spawn_scheduler(
    etcd: str,
    data_dir: str | os.PathLike[str],
    *,
    policy: str = "gandiva",
    policy_config: dict[str, Any] | None = None,
    tick_s: float = 0.2,
    kv: KV | None = None,
    lease_ttl_s: int = 2,
    instance_id: str = "",
    log_path: str | os.PathLike[str] | None = None,
    wait_leader: bool = True,
    timeout: float = 30.0,
    extra_args: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """A scheduler process; when ``kv`` is given waits until it is registered (and, with
    ``wait_leader``, until some instance leads)."""
    import json

    cmd = [
        sys.executable,
        "-m",
        "microco.services.scheduler",
        "--etcd",
        etcd,
        "--data-dir",
        str(data_dir),
        "--metrics-port",
        "-1",
        "--log-format",
        "text",
        "--lease-ttl-s",
        str(lease_ttl_s),
        "--policy",
        policy,
        "--tick-s",
        str(tick_s),
        "--log-level",
        "warning",
    ]
    if policy_config:
        cmd += ["--policy-config", json.dumps(policy_config)]
    if instance_id:
        cmd += ["--instance-id", instance_id]
    cmd += list(extra_args or [])
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    if kv is not None:
        from microco.common.registry import discover

        if instance_id:
            _wait(
                lambda: any(r.instance_id == instance_id for r in discover(kv, "scheduler")),
                timeout,
                "scheduler registration",
                proc,
            )
        else:
            _wait(lambda: discover(kv, "scheduler"), timeout, "scheduler registration", proc)
        if wait_leader:
            _wait(lambda: kv.get("/microco/leader/scheduler"), timeout, "a scheduler leader", proc)
    return proc


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def data_path(base: str | os.PathLike[str], *parts: str) -> Path:
    p = Path(base, *parts)
    p.mkdir(parents=True, exist_ok=True)
    return p
