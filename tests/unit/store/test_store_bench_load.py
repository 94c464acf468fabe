"""The store benchmark's load deadline grows with the file: scale factor 10's lineitem (2.5 GB of
Parquet) took over the client's fixed 600 s to append on this machine, and the run failed with
DeadlineExceeded after 16 minutes of loading."""

from __future__ import annotations

from microco.benchmarks.store import LOAD_MB_PER_S, load_timeout


def test_small_files_keep_the_default_deadline(tmp_path):
    f = tmp_path / "t.parquet"
    f.write_bytes(b"x" * 1000)
    assert load_timeout(f) == 600.0


def test_a_big_file_gets_time_at_the_slowest_load_rate(tmp_path):
    f = tmp_path / "lineitem.parquet"
    with open(f, "wb") as out:  # sparse: 2.5 GB as scale factor 10's lineitem, no disk written
        out.truncate(2_500_000_000)
    assert load_timeout(f) == 2500 / LOAD_MB_PER_S > 600
