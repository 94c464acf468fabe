"""The job-trace format and importers for the public traces.

Trace CSV (documented in docs/scheduler-sim.md), one job per row, header required::

    job_id,submit_time,devices,duration_s,iterations,model,elastic,gpu_share

``submit_time`` and ``duration_s`` in seconds; ``duration_s`` is the run time with the
requested devices to itself on the reference device type; ``iterations`` may be empty
(then derived from the model's mini-batch time); ``model`` is a Gavel model name as
``gavel_throughputs.json`` spells it ("ResNet-50 (batch size 64)"), may be empty (an unknown
name runs at default speeds, listed in the result's ``unknown_models``); ``elastic`` is
0/1; ``gpu_share`` in (0, 1] is the fraction of one device a one-device job keeps busy
(empty = 1).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from bisect import bisect_right
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

TRACE_COLUMNS = (
    "job_id",
    "submit_time",
    "devices",
    "duration_s",
    "iterations",
    "model",
    "elastic",
    "gpu_share",
)


class TraceError(ValueError):
    """A trace file that cannot be read, with the file and line."""


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_time: float
    devices: int
    duration_s: float
    iterations: int | None = None
    model: str = ""
    elastic: bool = False
    gpu_share: float = 1.0
    priority: int = 0
    owner: str = ""


def default_traces_dir() -> Path:
    """``$MICROCO_TRACES`` or ``../shared/traces`` relative to the repository root."""
    env = os.environ.get("MICROCO_TRACES")
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parents[3]
    return (repo_root / ".." / "shared" / "traces").resolve()


def _stable_unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the given parts (no global RNG, no hash seed)."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


# ------------------------------------------------------------------ the native format
def read_trace_csv(path: str | os.PathLike) -> list[TraceJob]:
    """Read a trace in the documented format; raises TraceError naming the bad line."""
    p = Path(path)
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot open trace {p}: {exc.strerror}") from exc
    jobs: list[TraceJob] = []
    with fh:
        reader = csv.DictReader(fh)
        missing = {"job_id", "submit_time", "devices", "duration_s"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(
                f"{p}: missing column(s) {', '.join(sorted(missing))}; expected {','.join(TRACE_COLUMNS)}"
            )
        seen: set[str] = set()
        for n, row in enumerate(reader, start=2):
            try:
                jid = row["job_id"].strip()
                if not jid or jid in seen:
                    raise ValueError(f"job_id {jid!r} empty or repeated")
                seen.add(jid)
                dev = int(row["devices"])
                dur = float(row["duration_s"])
                sub = float(row["submit_time"])
                if dev < 1:
                    raise ValueError("devices must be >= 1")
                if dur < 0 or sub < 0:
                    raise ValueError("times must be >= 0")
                it = (row.get("iterations") or "").strip()
                share = (row.get("gpu_share") or "").strip()
                gs = float(share) if share else 1.0
                if not 0 < gs <= 1:
                    raise ValueError("gpu_share must be in (0, 1]")
                jobs.append(
                    TraceJob(
                        job_id=jid,
                        submit_time=sub,
                        devices=dev,
                        duration_s=dur,
                        iterations=int(float(it)) if it else None,
                        model=(row.get("model") or "").strip(),
                        elastic=(row.get("elastic") or "0").strip().lower() in ("1", "true", "yes"),
                        gpu_share=gs,
                    )
                )
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{p}:{n}: {exc}") from None
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs


def write_trace_csv(jobs: list[TraceJob], path: str | os.PathLike) -> None:
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TRACE_COLUMNS)
        for j in jobs:
            w.writerow(
                [
                    j.job_id,
                    j.submit_time,
                    j.devices,
                    j.duration_s,
                    "" if j.iterations is None else j.iterations,
                    j.model,
                    int(j.elastic),
                    j.gpu_share,
                ]
            )


# ------------------------------------------------------------------------- importers
# Gavel families that the trace-less jobs are given, so packing interference comes from
# measured pairs. Drawn per job from a stable hash: the same job gets the same model.
GAVEL_FAMILIES = (
    "ResNet-18 (batch size 64)",
    "ResNet-50 (batch size 64)",
    "Transformer (batch size 64)",
    "LM (batch size 20)",
    "Recommendation (batch size 2048)",
    "CycleGAN",
    "A3C",
)

# Tiresias model names -> nearest Gavel family (same architecture kind and rough size).
TIRESIAS_MODEL_MAP = {
    "resnet50": "ResNet-50 (batch size 64)",
    "resnet101": "ResNet-50 (batch size 32)",
    "resnet152": "ResNet-50 (batch size 16)",
    "vgg11": "ResNet-50 (batch size 128)",
    "vgg16": "ResNet-50 (batch size 64)",
    "vgg19": "ResNet-50 (batch size 32)",
    "alexnet": "ResNet-18 (batch size 256)",
    "googlenet": "ResNet-18 (batch size 64)",
    "inception3": "ResNet-50 (batch size 32)",
    "inception4": "ResNet-50 (batch size 16)",
}


def load_alibaba(
    path: str | os.PathLike,
    *,
    include_cpu_only: bool = False,
    elastic_fraction: float = 0.0,
    min_duration_s: float = 1.0,
    time_scale: float = 1.0,
) -> list[TraceJob]:
    """Alibaba ``cluster-trace-gpu-v2023`` pod list (``openb_pod_list_*.csv``).

    Real arrivals (``creation_time``), run times (``deletion_time - scheduled_time``, the
    time the pod actually held its devices), GPU counts and fractional GPU requests
    (``gpu_milli`` for one-GPU pods -> ``gpu_share``). CPU-only pods are skipped unless
    ``include_cpu_only`` (they need no device, so no GPU policy changes their completion).
    A model family is drawn per pod from a stable hash (the trace has none) so packing
    interference comes from Gavel's measured pairs; ``elastic_fraction`` of the
    multi-GPU-capable pods are marked elastic the same way. ``time_scale`` multiplies
    every time (e.g. 0.1 to compress the 150-day trace).
    """
    p = Path(path)
    jobs: list[TraceJob] = []
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot open Alibaba trace {p}: {exc.strerror}") from exc
    with fh:
        reader = csv.DictReader(fh)
        need = {"name", "num_gpu", "gpu_milli", "creation_time", "deletion_time"}
        if not need <= set(reader.fieldnames or ()):
            raise TraceError(f"{p}: not an Alibaba gpu-v2023 pod list (need {', '.join(sorted(need))})")
        for n, row in enumerate(reader, start=2):
            try:
                gpus = int(row["num_gpu"])
                if gpus == 0 and not include_cpu_only:
                    continue
                created = float(row["creation_time"])
                started = float(row.get("scheduled_time") or created or 0)
                started = max(started, created)
                deleted = float(row["deletion_time"])
                dur = max(min_duration_s, deleted - started)
                milli = int(row["gpu_milli"] or 1000)
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{p}:{n}: {exc}") from None
            name = row["name"]
            share = 1.0 if gpus != 1 else max(0.01, min(1.0, milli / 1000.0))
            model = GAVEL_FAMILIES[int(_stable_unit("model", name) * len(GAVEL_FAMILIES))]
            jobs.append(
                TraceJob(
                    job_id=name,
                    submit_time=created * time_scale,
                    devices=max(1, gpus),
                    duration_s=dur * time_scale,
                    model=model,
                    elastic=_stable_unit("elastic", name) < elastic_fraction,
                    gpu_share=share,
                )
            )
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs


def load_tiresias(path: str | os.PathLike) -> list[TraceJob]:
    """The Tiresias 60-job trace: GPUs, submit time, iterations, model, duration (s)."""
    p = Path(path)
    jobs: list[TraceJob] = []
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot open Tiresias trace {p}: {exc.strerror}") from exc
    with fh:
        for n, row in enumerate(csv.DictReader(fh), start=2):
            try:
                model = row["model_name"].strip()
                jobs.append(
                    TraceJob(
                        job_id=f"tiresias-{int(row['job_id']):03d}",
                        submit_time=float(row["submit_time"]),
                        devices=int(row["num_gpu"]),
                        duration_s=float(row["duration"]),
                        iterations=int(row["iterations"]),
                        model=TIRESIAS_MODEL_MAP.get(model, model),
                    )
                )
            except (KeyError, ValueError) as exc:
                raise TraceError(f"{p}:{n}: {exc}") from None
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs


PHILLY_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _philly_time(value: Any) -> datetime | None:
    """A ``cluster_job_log`` time, or None where the log has none (null, "", "None")."""
    if value is None or value in ("", "None"):
        return None
    return datetime.strptime(str(value), PHILLY_TIME_FORMAT)


def load_philly(
    path: str | os.PathLike,
    *,
    run_time: str = "held",
    statuses: tuple[str, ...] = ("Pass", "Killed", "Failed"),
    elastic_fraction: float = 0.0,
    min_duration_s: float = 1.0,
    time_scale: float = 1.0,
    skipped: dict[str, int] | None = None,
) -> list[TraceJob]:
    """Microsoft Philly's ``cluster_job_log`` (msr-fiddle/philly-traces: one JSON list of jobs,
    each ``{"status", "vc", "jobid", "attempts": [{"start_time", "end_time", "detail": [{"ip",
    "gpus": [...]}]}], "submitted_time", "user"}``, times as ``YYYY-mm-dd HH:MM:SS``).

    Arrivals are ``submitted_time`` in seconds after the earliest one in the file. The GPU count
    is the first attempt's GPUs over all its servers, as the trace's own analysis counts it. The
    run time (``run_time``) is ``"held"``: the sum of the attempts' ``end_time - start_time``,
    the time the job held its GPUs, as the Alibaba importer takes it (attempts without both
    times add nothing); or ``"span"``: the last attempt's end minus the first attempt's start
    (the trace's analysis; it counts the waits between attempts). Left out, counted by reason in
    ``skipped`` when given: a job without attempts, without GPUs in its first attempt, without a
    start to its first attempt, still running when the log was taken (its last attempt has no
    end), or of a status not in ``statuses``. The log's times carry no time zone (the per-minute
    files say PDT/PST): they are taken as written, so an attempt across 2017-11-05's change of
    clock may be an hour off. ``vc`` and ``user``: the owner (``vc/user``). A model family is
    drawn per job from a stable hash and ``elastic_fraction`` of the jobs marked elastic, as for
    the Alibaba trace (the log has neither)."""
    if run_time not in ("held", "span"):
        raise ValueError(f"run_time must be 'held' or 'span', not {run_time!r}")
    p = Path(path)
    try:
        with p.open() as fh:
            log = json.load(fh)
    except OSError as exc:
        raise TraceError(f"cannot open Philly trace {p}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}: not a Philly cluster_job_log (JSON): {exc}") from None
    if not isinstance(log, list):
        raise TraceError(
            f"{p}: not a Philly cluster_job_log: want a JSON list of jobs, got {type(log).__name__}"
        )
    counts: dict[str, int] = {} if skipped is None else skipped

    def skip(reason: str) -> None:
        counts[reason] = counts.get(reason, 0) + 1

    rows: list[tuple[datetime, str, int, float, str]] = []
    seen: set[str] = set()
    for n, job in enumerate(log):
        try:
            jid = str(job["jobid"])
            if jid in seen:
                raise ValueError(f"jobid {jid!r} repeated")
            seen.add(jid)
            if job.get("status") not in statuses:
                skip(f"status {job.get('status')}")
                continue
            submitted = _philly_time(job["submitted_time"])
            attempts = job.get("attempts") or []
            if submitted is None or not attempts:
                skip("no attempts" if submitted is not None else "no submitted_time")
                continue
            gpus = sum(len(d.get("gpus") or []) for d in attempts[0].get("detail") or [])
            times = [(_philly_time(a.get("start_time")), _philly_time(a.get("end_time"))) for a in attempts]
            if gpus < 1:
                skip("no GPUs")
                continue
            if times[0][0] is None:
                skip("no start")
                continue
            if times[-1][1] is None:
                skip("still running")
                continue
            if run_time == "span":
                seconds = (times[-1][1] - times[0][0]).total_seconds()
            else:
                seconds = sum((e - s).total_seconds() for s, e in times if s is not None and e is not None)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TraceError(f"{p}: job #{n}: {exc!r}") from None
        owner = f"{job.get('vc', '')}/{job.get('user', '')}"
        rows.append((submitted, jid, gpus, max(min_duration_s, seconds), owner))
    if not rows:
        return []
    origin = min(r[0] for r in rows)
    jobs = [
        TraceJob(
            job_id=jid,
            submit_time=(sub - origin).total_seconds() * time_scale,
            devices=gpus,
            duration_s=dur * time_scale,
            model=GAVEL_FAMILIES[int(_stable_unit("model", jid) * len(GAVEL_FAMILIES))],
            elastic=_stable_unit("elastic", jid) < elastic_fraction,
            owner=owner,
        )
        for sub, jid, gpus, dur, owner in rows
    ]
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs


# Alibaba PAI (cluster-trace-gpu-v2020): headerless CSV tables, the columns in ``*.header``
PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
PAI_TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)
PAI_STATUSES = ("Running", "Terminated", "Failed", "Waiting")
# What a table holds where it has no value: pandas writes NaN as an empty field; other tools
# write one of these words.
_PAI_MISSING = ("", "nan", "NaN", "NULL", "null", "None", "\\N")


def _pai_number(value: str) -> float | None:
    """A PAI table's number, or None where the table has none (empty, NaN, ...)."""
    value = value.strip()
    return None if value in _PAI_MISSING else float(value)


def _pai_time(value: str) -> float | None:
    """A PAI time in seconds; 0 means "none" (a task never launched has start_time 0, which
    the trace's own analysis turns into NaN)."""
    t = _pai_number(value)
    return t if t else None


def _pai_rows(p: Path, columns: tuple[str, ...], what: str):
    """(line number, row as a dict) of a PAI table: headerless as published (the columns are in
    the ``.header`` file beside it), or with that header as its first line."""
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot open PAI {what} {p}: {exc.strerror}") from exc
    with fh:
        for n, row in enumerate(csv.reader(fh), start=1):
            if not row or (n == 1 and tuple(c.strip() for c in row) == columns):
                continue
            if len(row) != len(columns):
                raise TraceError(
                    f"{p}:{n}: a PAI {what} row has {len(columns)} fields "
                    f"({','.join(columns)}), this one {len(row)}"
                )
            yield n, dict(zip(columns, row, strict=True))


def load_pai(
    task_table: str | os.PathLike,
    job_table: str | os.PathLike | None = None,
    *,
    statuses: tuple[str, ...] = ("Terminated", "Failed"),
    elastic_fraction: float = 0.0,
    min_duration_s: float = 1.0,
    time_scale: float = 1.0,
    skipped: dict[str, int] | None = None,
) -> list[TraceJob]:
    """Alibaba PAI's ``cluster-trace-gpu-v2020`` (alibaba/clusterdata): ``pai_task_table.csv``
    and, for arrivals and owners, ``pai_job_table.csv``. Both are CSV without a header line (the
    columns are in the ``.header`` files published beside them; a first line equal to the
    header is skipped too); times are seconds from a hidden origin, 0 or empty where there is none.

    A job is its tasks (roles such as ``ps``, ``worker``, ``evaluator``), each of ``inst_num``
    instances asking ``plan_gpu`` percent of a GPU (50 is half a GPU, 800 eight; empty for a
    CPU-only task). The job's GPUs are the sum over its tasks of ``inst_num * plan_gpu / 100``:
    ``devices`` is that rounded up, and a job asking less than one GPU in all is a one-device job
    with that ``gpu_share`` (as the v2023 importer takes ``gpu_milli``). Its run time is from its
    first task's launch to its last task's completion (the time it held its GPUs, as for the
    other traces). Its arrival is the job table's ``start_time`` (the submission: a task's
    launch minus it is the wait the cluster's scheduler imposed); without the job table, the
    first task's launch (so no wait is recorded). Arrivals are counted from the earliest one in
    the trace. The job's status is the job table's, else its tasks' (Failed if one failed,
    Terminated if all terminated, Waiting if all wait, otherwise Running); only ``statuses`` are kept (a failed job
    held its GPUs too). Left out, counted by reason in ``skipped`` when given: jobs asking no
    GPU, without a launch or a completion (still running or waiting), of another status, job
    rows without tasks. ``user`` is the owner. A model family is drawn per job from a stable
    hash and ``elastic_fraction`` of the jobs marked elastic, as for the other traces (the
    tables have neither)."""
    tp = Path(task_table)
    counts: dict[str, int] = {} if skipped is None else skipped

    def skip(reason: str) -> None:
        counts[reason] = counts.get(reason, 0) + 1

    # job -> [gpus in percent, first launch, last completion, task statuses]
    tasks: dict[str, list[Any]] = {}
    for n, row in _pai_rows(tp, PAI_TASK_COLUMNS, "task table"):
        try:
            name = row["job_name"].strip()
            if not name:
                raise ValueError("empty job_name")
            inst = _pai_number(row["inst_num"]) or 0.0
            gpu = _pai_number(row["plan_gpu"]) or 0.0
            if inst < 0 or gpu < 0:
                raise ValueError("inst_num and plan_gpu must be >= 0")
            start, end = _pai_time(row["start_time"]), _pai_time(row["end_time"])
        except ValueError as exc:
            raise TraceError(f"{tp}:{n}: {exc}") from None
        t = tasks.setdefault(name, [0.0, None, None, []])
        t[0] += inst * gpu
        if start is not None:
            t[1] = start if t[1] is None else min(t[1], start)
        if end is not None:
            t[2] = end if t[2] is None else max(t[2], end)
        t[3].append(row["status"].strip())

    jobs_info: dict[str, tuple[float | None, str, str]] = {}
    if job_table is not None:
        jp = Path(job_table)
        for n, row in _pai_rows(jp, PAI_JOB_COLUMNS, "job table"):
            name = row["job_name"].strip()
            try:
                if name in jobs_info:
                    raise ValueError(f"job_name {name!r} repeated")
                sub_time = _pai_time(row["start_time"])
            except ValueError as exc:
                raise TraceError(f"{jp}:{n}: {exc}") from None
            jobs_info[name] = (sub_time, row["status"].strip(), row["user"].strip())
        for _ in jobs_info.keys() - tasks.keys():
            skip("no tasks")

    rows: list[tuple[float, str, float, float, str]] = []
    for name, (gpu_pct, launched, completed, task_statuses) in tasks.items():
        submitted: float | None = None
        owner = ""
        if job_table is not None:
            if name not in jobs_info:
                skip("not in the job table")
                continue
            submitted, status, owner = jobs_info[name]
        elif "Failed" in task_statuses:
            status = "Failed"
        elif all(s == "Terminated" for s in task_statuses):
            status = "Terminated"
        elif all(s == "Waiting" for s in task_statuses):
            status = "Waiting"
        else:
            status = "Running"
        if status not in statuses:
            skip(f"status {status}")
            continue
        if gpu_pct <= 0:
            skip("no GPUs")
            continue
        if launched is None:
            skip("never launched")
            continue
        if completed is None:
            skip("no completion")
            continue
        arrival = launched if submitted is None else min(submitted, launched)
        rows.append((arrival, name, gpu_pct / 100.0, max(min_duration_s, completed - launched), owner))
    if not rows:
        return []
    origin = min(r[0] for r in rows)
    jobs = []
    for arrival, name, gpus, dur, owner in rows:
        devices = max(1, math.ceil(gpus - 1e-9))
        jobs.append(
            TraceJob(
                job_id=name,
                submit_time=(arrival - origin) * time_scale,
                devices=devices,
                duration_s=dur * time_scale,
                model=GAVEL_FAMILIES[int(_stable_unit("model", name) * len(GAVEL_FAMILIES))],
                elastic=_stable_unit("elastic", name) < elastic_fraction,
                gpu_share=max(0.01, min(1.0, gpus)) if devices == 1 else 1.0,
                owner=owner,
            )
        )
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs


def _pai_table_kind(first_row: list[str]) -> str | None:
    """ "task" or "job" for the first row of a PAI v2020 table (its header, or a headerless
    row whose fourth field is a PAI status), else None."""
    cells = tuple(c.strip() for c in first_row)
    if cells == PAI_TASK_COLUMNS:
        return "task"
    if cells == PAI_JOB_COLUMNS:
        return "job"
    if len(cells) >= 4 and cells[3] in PAI_STATUSES:
        if len(cells) == len(PAI_TASK_COLUMNS):
            return "task"
        if len(cells) == len(PAI_JOB_COLUMNS):
            return "job"
    return None


class PhillyDurations:
    """Philly run times (``philly_runtime.csv``) as an empirical distribution, to give
    durations to a trace that lacks them. ``sample(key)`` is deterministic in ``key``."""

    def __init__(self, path: str | os.PathLike, *, min_s: float = 1.0) -> None:
        p = Path(path)
        try:
            with p.open() as fh:
                next(fh)
                vals = sorted(max(min_s, float(x)) for x in fh if x.strip())
        except (OSError, StopIteration, ValueError) as exc:
            raise TraceError(f"cannot read Philly run times {p}: {exc}") from exc
        if not vals:
            raise TraceError(f"{p}: no run times")
        self.values = vals

    def quantile(self, q: float) -> float:
        q = min(max(q, 0.0), 1.0)
        return self.values[min(len(self.values) - 1, int(q * len(self.values)))]

    def sample(self, key: str) -> float:
        return self.quantile(_stable_unit("philly", key))

    def fraction_below(self, seconds: float) -> float:
        return bisect_right(self.values, seconds) / len(self.values)

    def resample(self, jobs: list[TraceJob]) -> list[TraceJob]:
        """The same jobs with durations drawn from Philly (e.g. for a trace without them)."""
        return [replace(j, duration_s=self.sample(j.job_id)) for j in jobs]


def load_trace(path: str | os.PathLike, **kw) -> list[TraceJob]:
    """Read any supported trace, recognised by its header: the native format, an Alibaba
    gpu-v2023 pod list, the Tiresias trace, (a JSON list) Philly's ``cluster_job_log``, or
    Alibaba PAI's v2020 ``pai_task_table.csv`` (with ``pai_job_table.csv`` beside it, when there
    is one). Extra keywords go to the Alibaba, Philly or PAI importer."""
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            first = fh.read(4096).lstrip()
            if first.startswith("["):  # a JSON list: Philly's cluster_job_log
                return load_philly(p, **kw)
            fh.seek(0)
            first_row = next(csv.reader(fh), [])
            header = set(first_row)
    except OSError as exc:
        raise TraceError(f"cannot open trace {p}: {exc.strerror}") from exc
    kind = _pai_table_kind(first_row)
    if kind == "task":
        # the job table published beside it gives arrivals (submissions) and owners
        beside = p.with_name(p.name.replace("pai_task_table", "pai_job_table"))
        return load_pai(p, beside if beside != p and beside.exists() else None, **kw)
    if kind == "job":
        raise TraceError(
            f"{p}: a PAI job table has no GPU requests; give pai_task_table.csv "
            "(a pai_job_table.csv beside it is read for arrivals and owners)"
        )
    if {"name", "num_gpu", "gpu_milli"} <= header:
        return load_alibaba(p, **kw)
    if {"model_name", "iterations", "num_gpu"} <= header:
        return load_tiresias(p)
    if {"job_id", "submit_time", "devices", "duration_s"} <= header:
        return read_trace_csv(p)
    raise TraceError(f"{p}: unrecognised trace header {sorted(header)}; expected {','.join(TRACE_COLUMNS)}")
