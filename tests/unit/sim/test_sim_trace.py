"""Trace format and importers for the public traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from microco.services.scheduler.sim import (
    PerfModel,
    PhillyDurations,
    TraceError,
    TraceJob,
    default_traces_dir,
    load_alibaba,
    load_tiresias,
    load_trace,
    read_trace_csv,
    write_trace_csv,
)

TRACES = default_traces_dir()
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"public traces not at {TRACES}")


def test_native_round_trip(tmp_path: Path) -> None:
    jobs = [
        TraceJob("b", 5.0, 2, 100.0, iterations=50, model="ResNet-50 (batch size 64)", elastic=True),
        TraceJob("a", 1.0, 1, 10.0, gpu_share=0.25),
    ]
    p = tmp_path / "t.csv"
    write_trace_csv(jobs, p)
    back = read_trace_csv(p)
    assert [j.job_id for j in back] == ["a", "b"]  # sorted by submit time
    assert back[1] == jobs[0] and back[0] == jobs[1]
    assert load_trace(p) == back


@pytest.mark.parametrize(
    "body, msg",
    [
        ("job_id,submit_time,devices,duration_s\nx,0,0,5\n", ":2: devices"),
        ("job_id,submit_time,devices,duration_s\nx,0,1,5\nx,1,1,5\n", ":3: job_id"),
        ("job_id,submit_time,devices,duration_s,gpu_share\nx,0,1,5,1.5\n", "gpu_share"),
        ("job_id,submit_time,devices\nx,0,1\n", "missing column"),
        ("job_id,submit_time,devices,duration_s\nx,zero,1,5\n", ":2:"),
    ],
)
def test_bad_traces_name_the_line(tmp_path: Path, body: str, msg: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(TraceError, match=msg):
        read_trace_csv(p)


def test_unknown_header_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("foo,bar\n1,2\n")
    with pytest.raises(TraceError, match="unrecognised"):
        load_trace(p)
    with pytest.raises(TraceError, match="cannot open"):
        load_trace(tmp_path / "nope.csv")


@needs_traces
def test_alibaba_import() -> None:
    jobs = load_alibaba(TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv")
    assert len(jobs) == 7064  # 8,152 pods, 1,088 of them CPU-only
    assert all(j.devices >= 1 and j.duration_s >= 1 for j in jobs)
    shares = [j.gpu_share for j in jobs if j.gpu_share < 1]
    assert len(shares) == 3078  # fractional GPU requests kept
    assert {j.devices for j in jobs} == {1, 2, 4, 8}
    assert all(j.model for j in jobs)
    assert jobs == sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
    again = load_alibaba(TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv", elastic_fraction=0.3)
    assert [j.model for j in again] == [j.model for j in jobs]  # deterministic
    assert 0.2 < sum(j.elastic for j in again) / len(again) < 0.4
    assert (
        len(load_alibaba(TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv", include_cpu_only=True))
        == 8152
    )


@needs_traces
def test_tiresias_and_philly_and_gavel() -> None:
    jobs = load_tiresias(TRACES / "tiresias_60_job.csv")
    assert len(jobs) == 60 and jobs[0].iterations == 606 and jobs[0].model.startswith("ResNet-50")
    ph = PhillyDurations(TRACES / "philly_runtime.csv")
    assert len(ph.values) == 83154
    assert ph.sample("job-1") == ph.sample("job-1")
    re = ph.resample(jobs)
    assert [j.job_id for j in re] == [j.job_id for j in jobs] and all(j.duration_s >= 1 for j in re)
    perf = PerfModel.from_gavel(TRACES / "gavel_throughputs.json")
    m = "ResNet-50 (batch size 64)"
    assert 0 < perf.pair_ratio(m, m, "v100") < 1
    assert perf.device_speed(m, "k80") < 1 < 1 / perf.device_speed(m, "k80")
    assert perf.packed_speed(m, 1.0, [], "v100") == 1.0
    # complementary shares interfere much less than two full jobs
    assert perf.packed_speed(m, 0.3, [(m, 0.3)], "v100") > perf.packed_speed(m, 1.0, [(m, 1.0)], "v100")
