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


def test_node_args_reach_every_node(etcd_endpoint, tmp_path, monkeypatch):
    # the benchmark bounds each node's extent cache at large scale factors this way
    c = StoreCluster(
        etcd_endpoint, tmp_path, [("n0", "rack0"), ("n1", "rack1")], node_args=["--extent-cache-mb", "64"]
    )
    spawned: dict[str, list[str]] = {}
    monkeypatch.setattr(c, "_spawn", lambda name, args: spawned.setdefault(name, args))
    for name, domain in c.node_specs:
        c.start_node(name, domain)
    assert set(spawned) == {"n0", "n1"}
    for name, args in spawned.items():
        assert args[0] == "node" and args[-2:] == ["--extent-cache-mb", "64"]
        assert args[args.index("--fault-domain") + 1] == {"n0": "rack0", "n1": "rack1"}[name]
    c.kv.close()
