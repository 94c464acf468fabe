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


# ---------------------------------------------------------------- Philly's cluster_job_log
# Hand-written from msr-fiddle/philly-traces' README (its schema and example entry; the first job
# is that example): the trace itself (6.6 GB) is not in ../shared/traces.
PHILLY_SAMPLE = Path(__file__).parent / "data" / "philly_cluster_job_log_sample.json"


def test_philly_cluster_job_log_is_read_with_arrivals_gpus_and_run_times() -> None:
    from microco.services.scheduler.sim import load_philly

    skipped: dict[str, int] = {}
    jobs = load_philly(PHILLY_SAMPLE, skipped=skipped)
    by_id = {j.job_id.rsplit("_", 1)[1]: j for j in jobs}
    assert sorted(by_id) == ["14199", "14200", "14201", "14202"]
    assert [j.job_id[-5:] for j in jobs] == ["14200", "14199", "14201", "14202"]  # by arrival
    assert by_id["14200"].submit_time == 0.0  # the earliest submission
    assert by_id["14199"].submit_time == 12 * 60 + 9
    # the README's example: 8 GPUs, two attempts held for 74 s and 2 d 5 h 39 min 42 s
    assert by_id["14199"].devices == 8
    assert by_id["14199"].duration_s == 74 + 2 * 86400 + 5 * 3600 + 39 * 60 + 42
    assert by_id["14201"].devices == 16  # the first attempt's GPUs over its two servers
    assert by_id["14202"].duration_s == 5 * 60  # an attempt without its end adds nothing
    assert by_id["14200"].owner == "ee9e8c/a1b2c3"
    assert skipped == {"no attempts": 1, "no start": 1, "status Running": 1, "still running": 1, "no GPUs": 1}
    span = {j.job_id[-5:]: j for j in load_philly(PHILLY_SAMPLE, run_time="span")}
    assert span["14199"].duration_s == (2 * 86400 + 5 * 3600 + 41 * 60 + 3)  # with the 7 s between attempts
    assert span["14202"].duration_s == 15 * 60
    # recognised by load_trace (a JSON list), with the Alibaba importer's keywords
    scaled = load_trace(PHILLY_SAMPLE, time_scale=0.5, elastic_fraction=1.0)
    assert [j.duration_s for j in scaled] == [j.duration_s * 0.5 for j in jobs]
    assert all(j.elastic for j in scaled)


def test_philly_reader_says_what_is_wrong(tmp_path: Path) -> None:
    from microco.services.scheduler.sim import load_philly

    bad = tmp_path / "log.json"
    bad.write_text('{"jobid": "x"}')
    with pytest.raises(TraceError, match="JSON list of jobs"):
        load_philly(bad)
    bad.write_text('[{"jobid": "x", "status": "Pass", "submitted_time": "07/10/2017", "attempts": []}]')
    with pytest.raises(TraceError, match="job #0"):
        load_philly(bad)
    with pytest.raises(ValueError, match="run_time"):
        load_philly(PHILLY_SAMPLE, run_time="wall")


def test_a_philly_trace_runs_through_the_simulator_under_each_policy() -> None:
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import ClusterSpec, load_philly, simulate

    jobs = load_philly(PHILLY_SAMPLE, time_scale=0.01)
    for name in ("fifo", "las", "gandiva"):
        result = simulate(make_policy(name), jobs, ClusterSpec.for_gpus(16, 8), perf=PerfModel.uniform())
        assert result.jobs == len(jobs) and result.jobs_rejected == 0 and result.stopped_early == 0, name
        assert set(result.per_job) == {j.job_id for j in jobs}, name


def test_a_generated_philly_sample_reads_back_whole(tmp_path: Path) -> None:
    import json

    from microco.benchmarks.sim_philly_sample import philly_sample
    from microco.services.scheduler.sim import load_philly

    log = philly_sample(50, 16, 1.0, 3, [30.0, 600.0, 7200.0])
    path = tmp_path / "cluster_job_log"
    path.write_text(json.dumps(log))
    jobs = load_philly(path)
    assert len(jobs) == 50 and {j.devices for j in jobs} <= {1, 2, 4, 8, 16}
    assert jobs == load_trace(path)


# ------------------------------------------------ Alibaba PAI's cluster-trace-gpu-v2020 tables
# Hand-written from alibaba/clusterdata's cluster-trace-gpu-v2020 README and its ``.header``
# files (headerless CSV; the README's example job row and example task row are the first two
# jobs, its ps + 2 x 50% worker diagram the third): the tables themselves (GBs) are not in
# ../shared/traces.
PAI_SAMPLE = Path(__file__).parent / "data" / "pai_v2020"


def test_pai_v2020_tables_are_read_with_arrivals_gpus_shares_and_run_times() -> None:
    from microco.services.scheduler.sim import load_pai

    skipped: dict[str, int] = {}
    jobs = load_pai(PAI_SAMPLE / "pai_task_table.csv", PAI_SAMPLE / "pai_job_table.csv", skipped=skipped)
    by = {j.job_id[:4]: j for j in jobs}
    assert [j.job_id[:4] for j in jobs] == ["4f05", "7d1a", "a3f9", "4b3f"]  # by submission
    # the README's task row: 50% of one (MISC) GPU, launched 12 s after its submission, ran 38 s
    assert (by["4f05"].submit_time, by["4f05"].devices, by["4f05"].gpu_share) == (0.0, 1, 0.5)
    assert by["4f05"].duration_s == 38.0 and by["4f05"].owner == "a1b2c3d4e5f6"
    # a ps without GPUs and two workers at 50% each: one GPU, from the first launch to the last end
    assert (by["7d1a"].devices, by["7d1a"].gpu_share, by["7d1a"].duration_s) == (1, 1.0, 3600.0)
    assert by["7d1a"].submit_time == 1739990.0 - 1739150.0
    # 4 workers of a whole GPU and a half-GPU evaluator: 4.5 GPUs ask for 5 devices; failed jobs
    # held their GPUs too
    assert (by["a3f9"].devices, by["a3f9"].duration_s) == (5, 1752200.0 - 1745060.0)
    # the README's job row, submitted 11 s before its task's launch
    assert by["4b3f"].submit_time == 4550879.0 - 1739150.0 and by["4b3f"].duration_s == 526.0
    assert skipped == {
        "no GPUs": 1,
        "status Running": 1,
        "status Waiting": 1,
        "never launched": 1,
        "no tasks": 1,
        "not in the job table": 1,
    }
    # the task table alone: arrivals are launches, statuses the tasks'
    alone_skipped: dict[str, int] = {}
    alone = load_pai(PAI_SAMPLE / "pai_task_table.csv", skipped=alone_skipped)
    assert [j.job_id[:4] for j in alone] == ["4f05", "7d1a", "a3f9", "1234", "4b3f"]
    assert alone[1].submit_time == 1740000.0 - 1739162.0 and alone[0].owner == ""
    assert alone_skipped == {"no GPUs": 1, "status Running": 1, "status Waiting": 1, "never launched": 1}


def test_pai_v2020_task_table_is_recognised_with_its_job_table_beside_it(tmp_path: Path) -> None:
    from microco.services.scheduler.sim import PAI_JOB_COLUMNS, PAI_TASK_COLUMNS, load_pai

    both = load_pai(PAI_SAMPLE / "pai_task_table.csv", PAI_SAMPLE / "pai_job_table.csv")
    assert load_trace(PAI_SAMPLE / "pai_task_table.csv") == both
    scaled = load_trace(PAI_SAMPLE / "pai_task_table.csv", time_scale=0.5, elastic_fraction=1.0)
    assert [j.duration_s for j in scaled] == [j.duration_s * 0.5 for j in both]
    assert all(j.elastic for j in scaled)
    # with the .header files' line on top, as someone who joined them would have it
    for name, cols in (("pai_task_table.csv", PAI_TASK_COLUMNS), ("pai_job_table.csv", PAI_JOB_COLUMNS)):
        (tmp_path / name).write_text(",".join(cols) + "\n" + (PAI_SAMPLE / name).read_text())
    assert load_trace(tmp_path / "pai_task_table.csv") == both
    with pytest.raises(TraceError, match="job table has no GPU requests; give pai_task_table.csv"):
        load_trace(PAI_SAMPLE / "pai_job_table.csv")


def test_pai_v2020_reader_says_what_is_wrong(tmp_path: Path) -> None:
    from microco.services.scheduler.sim import load_pai

    bad = tmp_path / "pai_task_table.csv"
    bad.write_text("j1,worker,1.0,Terminated,10.0,20.0,600.0,29.3,100.0,T4\nj2,worker,1.0,Terminated\n")
    with pytest.raises(TraceError, match=r"pai_task_table.csv:2: a PAI task table row has 10 fields"):
        load_pai(bad)
    bad.write_text("j1,worker,one,Terminated,10.0,20.0,600.0,29.3,100.0,T4\n")
    with pytest.raises(TraceError, match=r"pai_task_table.csv:1: could not convert"):
        load_pai(bad)
    jobs = tmp_path / "pai_job_table.csv"
    bad.write_text("j1,worker,1.0,Terminated,10.0,20.0,600.0,29.3,100.0,T4\n")
    jobs.write_text("j1,i1,u,Terminated,5.0,20.0\nj1,i1,u,Terminated,5.0,20.0\n")
    with pytest.raises(TraceError, match=r"pai_job_table.csv:2: job_name 'j1' repeated"):
        load_pai(bad, jobs)


def test_a_pai_v2020_trace_runs_through_the_simulator_under_each_policy() -> None:
    from microco.services.scheduler.policy import make_policy
    from microco.services.scheduler.sim import ClusterSpec, load_pai, simulate

    jobs = load_pai(PAI_SAMPLE / "pai_task_table.csv", PAI_SAMPLE / "pai_job_table.csv", time_scale=0.01)
    for name in ("fifo", "las", "gandiva"):
        result = simulate(make_policy(name), jobs, ClusterSpec.for_gpus(16, 8), perf=PerfModel.uniform())
        assert result.jobs == len(jobs) and result.jobs_rejected == 0 and result.stopped_early == 0, name
        assert set(result.per_job) == {j.job_id for j in jobs}, name


@needs_traces
def test_the_v2023_pod_list_written_as_pai_tables_reads_back_as_its_launched_pods(tmp_path: Path) -> None:
    """A cross-check of the PAI reader against the v2023 reader on real data: every GPU pod of
    the public pod list, written in the v2020 schema (``benchmarks/sim_pai_sample.py``), reads
    back as the same jobs (arrival, devices, share, run time, model) as ``load_alibaba`` reads
    the pods that were launched; the 861 pods deleted while Pending never launched and are left
    out (``load_alibaba`` runs them for their wait)."""
    import csv

    from microco.benchmarks.sim_pai_sample import pai_tables_from_pods
    from microco.services.scheduler.sim import PAI_STATUSES, load_pai

    pods = TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
    task, job = pai_tables_from_pods(pods, tmp_path)
    skipped: dict[str, int] = {}
    pai = load_pai(task, job, statuses=PAI_STATUSES, skipped=skipped)
    with pods.open(newline="") as fh:
        launched = {r["name"] for r in csv.DictReader(fh) if r["scheduled_time"]}
    ali = [j for j in load_alibaba(pods) if j.job_id in launched]
    assert len(pai) == len(ali) == 7064 - 861
    assert skipped == {"no GPUs": 1088, "never launched": 861}
    for a, b in zip(pai, ali, strict=True):
        assert (a.job_id, a.submit_time, a.devices, a.duration_s, a.model) == (
            b.job_id,
            b.submit_time,
            b.devices,
            b.duration_s,
            b.model,
        )
        assert a.gpu_share == pytest.approx(b.gpu_share, rel=1e-12)
    # as a real v2020 table would be read: the jobs that ended (Terminated or Failed)
    ended = load_trace(task)
    assert {j.job_id for j in ended} < {j.job_id for j in pai} and len(ended) == 185 + 1869
