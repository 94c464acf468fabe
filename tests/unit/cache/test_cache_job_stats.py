"""Per-job hit/miss/bytes counters of a cache server core, in the shape the console reads
(no sockets: the core, the proto conversion and the console's parser are called directly)."""

from __future__ import annotations

from microco.services.cache import CacheCore, ChunkStore, digest
from microco.services.cache import _core as core_module
from microco.services.cache._servicer import stats_to_proto
from microco.services.console._proto import to_dict
from microco.services.console._views import per_job_counters


def _core(tmp_path) -> tuple[CacheCore, str, bytes]:
    core = CacheCore(ChunkStore(str(tmp_path)), 10_000, "coordinated")
    data = bytes(range(200))
    d = digest(data)
    assert core.put(d, data, "ds").outcome == "stored"
    return core, d, data


def test_counters_per_job_reach_the_console_shape(tmp_path):
    core, d, data = _core(tmp_path)
    # job a: two batches, 10 samples each, 70% and 100% hits; job b: one batch of 4, all misses
    core.report_progress("a", "ds", 0, [], timings=[(0.7, 0.1, 1000, 10), (1.0, 0.05, 1000, 10)])
    core.report_progress("b", "ds", 0, [], timings=[(0.0, 0.3, 400, 4)])
    sample = data[20:50]
    assert [x for _, x in core.read_samples([(d, 20, 30, digest(sample))] * 2, job="a")] == [sample, sample]
    assert [x for _, x in core.read_chunks([d], job="b")] == [data]
    list(core.read_samples([(d, 0, 10, digest(b"not these bytes"))], job="b"))  # refused: no bytes counted

    stats = core.stats()
    by_job = {j["job_id"]: j for j in stats["job_stats"]}
    assert by_job["a"] == {"job_id": "a", "dataset": "ds", "hits": 17, "misses": 3, "bytes_served": 60}
    assert by_job["b"] == {"job_id": "b", "dataset": "ds", "hits": 0, "misses": 4, "bytes_served": 200}
    # the per-job counters add up to the server's
    assert sum(j["hits"] for j in by_job.values()) == stats["hits"] == 17
    assert sum(j["misses"] for j in by_job.values()) == stats["misses"] == 7
    assert sum(j["bytes_served"] for j in by_job.values()) == stats["bytes_served"] == 260

    # Over the wire (CacheStats) and through the console's converter and parser: one entry per job.
    msg = stats_to_proto(stats)
    assert {j.job_id: (j.hits, j.misses, j.bytes_served) for j in msg.job_stats} == {
        "a": (17, 3, 60),
        "b": (0, 4, 200),
    }
    assert per_job_counters(to_dict(msg)) == {"a": {"hits": 17, "misses": 3}, "b": {"hits": 0, "misses": 4}}


def test_finished_jobs_keep_counters_and_the_map_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(core_module, "MAX_JOB_COUNTERS", 8)  # 1024 in service; small keeps this fast
    core, _, _ = _core(tmp_path)
    core.report_progress("done", "ds", 0, [], timings=[(0.5, 0.1, 100, 2)])
    core.report_progress("done", "ds", 0, [], finished=True)
    assert "done" not in core.stats()["jobs"]
    assert {j["job_id"]: j["hits"] for j in core.stats()["job_stats"]} == {"done": 1}
    for k in range(12):
        core.report_progress(f"j{k}", "ds", 0, [], timings=[(1.0, 0.1, 100, 1)])
    kept = {j["job_id"] for j in core.stats()["job_stats"]}
    assert kept == {f"j{k}" for k in range(4, 12)}  # the least recently active went first
