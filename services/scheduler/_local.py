"""Start scheduler and agent processes on this machine (tests, benchmarks, demos), through the
one launcher in :mod:`microco.services.runtime.launch` (whose ``stop_process`` stops them)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from microco.common.kv import KV
from microco.common.registry import discover
from microco.services.runtime.launch import start_service, stop_process, wait_until

__all__ = ["data_path", "spawn_agent", "spawn_scheduler", "stop_process"]


def spawn_agent(
    etcd: str,
    node: str,
    data_dir: str | os.PathLike[str],
    *,
    devices: int = 2,
    checkpoint_root: str | os.PathLike[str] | None = None,
    kv: KV | None = None,
    # The agent's own default (``--node-lease-ttl-s``): an agent fences (stops its jobs) at 3/4
    # of it without a confirmed keep-alive. 3 s was too short on a loaded machine: at load 10-14
    # on 2 cores a Keras job was SIGTERMed by its agent's fence 15 s after its start (session 27's
    # CI beside two benchmarks). Callers that lose a node on purpose pass a short one.
    lease_ttl_s: int = 10,
    log_path: str | os.PathLike[str] | None = None,
    timeout: float = 90.0,  # to be registered: a loaded machine starts a Python service slowly
    preload: str = "none",
    wait_warm: bool = False,
) -> subprocess.Popen[bytes]:
    """A node agent process with ``devices`` virtual devices; waits until its node is registered
    (and, with ``wait_warm``, until its zygote has imported ``preload``).

    ``preload`` defaults to none here (the agent's own default is ``auto``): tests that run
    framework-free jobs should not pay a torch import per agent on a shared CI machine."""
    args = [
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
        "--node-lease-ttl-s",
        str(lease_ttl_s),
        "--log-level",
        "warning",
        "--preload",
        preload,
    ]
    if checkpoint_root:
        args += ["--checkpoint-root", str(checkpoint_root)]
    proc = start_service("microco.services.agent", args, log_path=log_path)
    if kv is not None:
        from microco.clients.agent import NODES_PREFIX

        wait_until(
            lambda: (kv.get_json(NODES_PREFIX + node) or {}).get("address"), timeout, f"agent {node}", proc
        )
        if wait_warm:
            wait_until(
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
    timeout: float = 90.0,  # to be registered: a loaded machine starts a Python service slowly
    extra_args: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """A scheduler process; when ``kv`` is given waits until it is registered (and, with
    ``wait_leader``, until some instance leads)."""
    args = [
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
        args += ["--policy-config", json.dumps(policy_config)]
    if instance_id:
        args += ["--instance-id", instance_id]
    args += list(extra_args or [])
    proc = start_service("microco.services.scheduler", args, log_path=log_path)
    if kv is not None:
        if instance_id:
            wait_until(
                lambda: any(r.instance_id == instance_id for r in discover(kv, "scheduler")),
                timeout,
                "scheduler registration",
                proc,
            )
        else:
            wait_until(lambda: discover(kv, "scheduler"), timeout, "scheduler registration", proc)
        if wait_leader:
            wait_until(lambda: kv.get("/microco/leader/scheduler"), timeout, "a scheduler leader", proc)
    return proc


def data_path(base: str | os.PathLike[str], *parts: str) -> Path:
    p = Path(base, *parts)
    p.mkdir(parents=True, exist_ok=True)
    return p
