"""`microco status` against an etcd that no local stack started: every required service without
an instance is listed as MISSING and the exit status is 1 (issue 16: it used to exit 0 with the
scheduler missing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from microco.services.stack import EtcdServer

pytestmark = pytest.mark.e2e


def test_status_names_every_missing_required_service(tmp_path: Path) -> None:
    with EtcdServer(tmp_path / "etcd") as etcd:
        out = subprocess.run(
            [sys.executable, "-m", "microco.cli", "status", "--etcd", etcd.endpoint, "--home", str(tmp_path), "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    missing = {r["service"] for r in doc["services"] if r["health"] == "MISSING"}
    assert missing == {"scheduler", "agent", "cache", "store", "store-node", "compiler"}
    assert "not healthy: scheduler (MISSING)" in out.stderr and "Traceback" not in out.stderr
