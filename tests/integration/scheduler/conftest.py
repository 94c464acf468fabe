"""Fixtures for the scheduler's integration tests: node agents as real processes."""

from __future__ import annotations

import pytest

from microco.services.scheduler._local import spawn_agent, stop_process


@pytest.fixture
def agents(etcd_endpoint, etcd_kv, tmp_path):
    """``start(node, devices=2)`` -> Popen of a real agent sharing one checkpoint root."""
    procs = []

    def start(node: str, devices: int = 2):
        p = spawn_agent(
            etcd_endpoint,
            node,
            tmp_path / "agents" / node,
            devices=devices,
            checkpoint_root=tmp_path / "checkpoints",
            kv=etcd_kv,
            log_path=tmp_path / f"agent-{node}.log",
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        stop_process(p)
