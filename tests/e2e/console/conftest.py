"""Fixtures for the console's browser test: the same real platform the integration tests use
(console, scheduler, node agent, cache server as processes on the session's etcd and Redis)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The process harness is shared with tests/integration/console.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "console"))

from console_harness import Platform, start_platform


@pytest.fixture(scope="module")
def platform(
    etcd_endpoint: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    # A short time-slicing quantum, so that two jobs on the agent's one device take turns and the
    # timeline shows running and suspended periods within seconds.
    p = start_platform(
        etcd_endpoint,
        redis_url,
        tmp_path_factory.mktemp("console-e2e"),
        cache=False,
        scheduler_args=("--policy-config", json.dumps({"quantum_s": 1.5, "enable_packing": False})),
    )
    yield p
    p.stop()
