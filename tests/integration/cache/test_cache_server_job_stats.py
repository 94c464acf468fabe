"""Per-job counters from a real cache server process (gRPC GetStats), read the way the console
reads them."""

from __future__ import annotations

import time

import pytest

from microco.clients.cache import CacheClient, get_dataset, open_loader, register_dataset, stats_to_dict
from microco.services.cache import digest
from microco.services.console._proto import to_dict
from microco.services.console._views import per_job_counters

pytestmark = pytest.mark.integration


def test_get_stats_reports_hits_misses_and_bytes_per_job(make_dataset, tmp_path, etcd_kv, cache_server):
    server = cache_server()
    data = bytes(range(256)) * 4
    d = digest(data)
    with CacheClient(server.address) as c:
        assert list(c.put_chunks([(d, data)], dataset="ds").stored) == [d]
        c.report_progress("job-a", "ds", 0, timings=[(0.75, 0.1, 4000, 8), (0.5, 0.1, 4000, 4)])
        c.report_progress("job-b", "ds", 0, timings=[(0.0, 0.4, 4000, 5)])
        assert c.read_samples([(d, 0, 100, digest(data[:100]))], "job-a") == [data[:100]]
        assert c.read_chunks([d], job_id="job-b") == {d: data}
        st = c.stats()
    jobs = {j.job_id: (j.dataset, j.hits, j.misses, j.bytes_served) for j in st.job_stats}
    assert jobs == {"job-a": ("ds", 8, 4, 100), "job-b": ("ds", 0, 5, len(data))}
    assert (st.hits, st.misses) == (8, 9)
    # the console's recorder and page pick the entries out of the generic stats dict
    assert per_job_counters(to_dict(st)) == {
        "job-a": {"hits": 8, "misses": 4},
        "job-b": {"hits": 0, "misses": 5},
    }
    assert {j["job_id"]: j["hit_rate"] for j in stats_to_dict(st)["job_stats"]} == {
        "job-a": 8 / 12,
        "job-b": 0.0,
    }

    # a real data loader's job shows up under its own id with every sample it read this epoch
    files = make_dataset(tmp_path / "d", n=40)
    register_dataset(etcd_kv, "imgs", str(tmp_path / "d"), chunk_bytes=10_000)
    loader = open_loader(etcd_kv, "imgs", server=server.address, batch_size=8, job_id="loader-job")
    loader.warm()
    for _ in loader.epoch(0):
        time.sleep(0.02)  # a training step: the reader ahead has made its last report by the
        # time the last batch's step ends (that batch's timings come after it)
    loader.close()
    with CacheClient(server.address) as c:
        mine = next(j for j in c.stats().job_stats if j.job_id == "loader-job")
    # (same-host direct reads through OpenChunks grants are not bytes the server sent)
    assert (
        mine.dataset == get_dataset(etcd_kv, "imgs").qualified
        and mine.hits + mine.misses == len(files)
        and mine.hits > 0
    )
