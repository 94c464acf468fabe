"""A job that stops running here keeps reporting for a moment (its parked loader's read-ahead,
its last batches in flight): those late reports must not make it pin this host's cache again.
A suspended (lent) job's report adds to its lent progress, a job moved to another host is
ignored here until the scheduler says it is back. In-process core, no sockets."""

from __future__ import annotations

from microco.services.cache import CacheCore, ChunkStore, LocalStore, build_index


def _setup(tmp_path, name):
    root = tmp_path / "data"
    if not root.exists():
        root.mkdir()
        for i in range(16):
            (root / f"s{i:03d}").write_bytes(bytes([i]) * 100)
    store = LocalStore(str(root))
    index = build_index(store.list_files(), store.read, 400)
    core = CacheCore(ChunkStore(str(tmp_path / f"cache-{name}")), 800, "coordinated")
    return index, store, core


def _put(core, index, store, c) -> str:
    data = b"".join(store.read(s.path) for s in index.samples_of(c))
    return core.put(c.digest, data, "ds").outcome


def test_a_suspended_jobs_late_report_leaves_its_pins_lent(tmp_path):
    index, store, core = _setup(tmp_path, "lent")
    a, b, c = index.chunks[:3]
    size = index.total_bytes
    core.report_progress("run", "ds", 0, [], dataset_bytes=size)
    core.report_progress("sus", "ds", 0, [a.digest], dataset_bytes=size)
    assert _put(core, index, store, a) == _put(core, index, store, b) == "stored"
    core.report_progress("run", "ds", 0, [a.digest, b.digest])
    core.lend("sus")  # suspended: b, which only sus has still to read, is lent
    core.report_progress("sus", "ds", 0, [])  # a batch its loader had read ahead
    assert _put(core, index, store, c) == "stored"  # (a late report pinned b and a: refused)
    core.report_progress("sus", "ds", 0, [c.digest])
    core.restore("sus")
    assert core.consumed_by("sus") == {a.digest, c.digest}  # its progress, lent and late


def test_a_job_moved_away_is_ignored_here_until_it_arrives(tmp_path):
    index, store, core = _setup(tmp_path, "moved")
    a, b, c, d = index.chunks[:4]
    size = index.total_bytes
    core.report_progress("run", "ds", 0, [], dataset_bytes=size)
    core.report_progress("mover", "ds", 0, [], dataset_bytes=size)
    assert _put(core, index, store, a) == _put(core, index, store, b) == "stored"
    core.report_progress("run", "ds", 0, [a.digest, b.digest])
    core.forget_job("mover", moved=True)  # the scheduler moved it to another host
    core.report_progress("mover", "ds", 0, [])  # late, from the host it left
    assert "mover" not in core.jobs and _put(core, index, store, c) == "stored"
    core.report_progress("run", "ds", 0, [c.digest])
    core.arrive("mover")  # back here: it pins what it has not read
    core.report_progress("mover", "ds", 0, [])
    assert "mover" in core.jobs and _put(core, index, store, d) != "stored"
