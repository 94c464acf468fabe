"""A store cluster that never becomes ready stops what it started (the leaked node processes of a
timed-out fixture kept running, and loading the machine, after the test run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from microco.common.errors import Unavailable
from microco.services.store._procs import StoreCluster


def test_a_cluster_that_is_never_ready_leaves_no_processes(etcd_endpoint, tmp_path, monkeypatch):
    c = StoreCluster(etcd_endpoint, tmp_path, [("n0", "rack0"), ("n1", "rack1")])
    # processes that never register, as store nodes too slow to start on a loaded machine
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    monkeypatch.setattr(c, "_spawn", lambda name, args: subprocess.Popen(sleeper))
    with pytest.raises(Unavailable, match="not ready"):
        c.start(timeout=0.5)
    assert len(c.procs) == 3 and all(p.poll() is not None for p in c.procs.values())
