"""Scrub re-hashes extents whatever their cached verification: 768 bytes overwritten in place with
the mtime restored (bit rot keeps mtime and size) is found by the scrub, on demand and on the
schedule (throttled), and recovery rebuilds the extent so queries are exact again."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pytest

from microco.common.kv import MemoryKV
from microco.services.store import LocalTransport, NodeInfo, PartitionSpec, Query, StoreCore
from microco.services.store._service import RecoveryLoop

N = 6000
DATA = pa.table(
    {"k": np.arange(N, dtype=np.int64), "g": np.arange(N) % 7, "v": np.arange(N, dtype=np.float64) * 0.5}
)
SPECS = [
    PartitionSpec("k", "hash", 3),
    PartitionSpec("g", "hash", 2),
    PartitionSpec("v", "range", bounds=("1000",)),
]


@pytest.fixture()
def store(tmp_path):
    tr = LocalTransport(str(tmp_path), [NodeInfo(f"n{i}", f"rack{i % 3}") for i in range(6)])
    core = StoreCore(MemoryKV(), tr, super_extent_rows=3000, recovery_rate_bytes=0)
    core.create_table("t", DATA.schema, SPECS)
    core.append("t", DATA)
    return core, tr


def _rot(tr, core, nbytes=768):
    """Overwrite ``nbytes`` in the middle of one extent file (one: a flipped byte), restoring its mtime."""
    e = core.table("t").super_extents[0].replica(0)[0]
    path = tr.stores[e.node].path("t", e.id)
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2 - nbytes // 2)
        old = f.read(nbytes)
        f.seek(st.st_size // 2 - nbytes // 2)
        f.write(bytes([old[0] ^ 0x01]) if nbytes == 1 else os.urandom(nbytes))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    return e


def _sum(core):
    t, _ = core.query(
        Query("t", aggs=(__import__("microco.services.store", fromlist=["Agg"]).Agg("sum", "v", "s"),))
    )
    return t.column("s")[0].as_py()


@pytest.mark.parametrize("nbytes", [1, 768])
def test_scrub_finds_bit_rot_behind_a_cached_verification_and_recovery_repairs_it(store, nbytes):
    core, tr = store
    _sum(core)  # every extent read and verified once: the (mtime, size) verification is cached
    e = _rot(tr, core, nbytes)
    assert core.scrub() == [f"t/{e.id}"]
    assert core.table("t").super_extents[0].find(e.id).state == "corrupt"
    rep = core.recover()
    assert rep["rebuilt"] == 1 and core.lost_count() == 0
    assert core.scrub() == []
    assert _sum(core) == pytest.approx(float(DATA.column("v").to_numpy().sum()))


def test_scheduled_scrub_finds_it_and_triggers_recovery(store):
    core, tr = store
    _sum(core)
    e = _rot(tr, core)
    total = core.table("t").stored_bytes
    rate = total / 0.5  # the whole store in no less than ~0.5 s
    loop = RecoveryLoop(
        core,
        MemoryKV(),
        grace_s=0,
        interval_s=0.05,
        gc_interval_s=0,
        scrub_interval_s=0.01,
        scrub_rate_bytes=rate,
    )
    loop._thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ext = core.table("t").super_extents[0]
            if ext.find(e.id) is None and core.lost_count() == 0:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the scheduled scrub did not find and rebuild the extent")
    finally:
        loop.stop()
    assert _sum(core) == pytest.approx(float(DATA.column("v").to_numpy().sum()))


def test_scrub_throttle_paces_reads_to_the_rate(store, monkeypatch):
    from microco.services.store import _core

    core, _ = store
    slept = []
    monkeypatch.setattr(_core.time, "sleep", lambda s: slept.append(s))
    total = core.table("t").stored_bytes
    assert core.scrub(rate_bytes=total / 100.0) == []  # 100 s worth at that rate
    assert slept and max(slept) > 50  # the pace is kept by sleeping, not by reading faster
    assert core.scrub(rate_bytes=0) == []
