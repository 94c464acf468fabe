"""Alibaba's GPU pod list (``cluster-trace-gpu-v2023``) written as the tables of its PAI trace
(``cluster-trace-gpu-v2020``), for the simulator's PAI reader.

    python -m microco.benchmarks.sim_pai_sample --out pai/
    microco sim --trace pai/pai_task_table.csv --policy gandiva --gpus 32 --json

The v2020 tables themselves (GBs, downloaded from Alibaba's object store) are not in
``../shared/traces`` and cannot be fetched here. What is real: every pod of the v2023 list (the
same company's GPU cluster, three years on): its submission (``creation_time``), launch
(``scheduled_time``) and end (``deletion_time``), its GPUs and its fractional GPU request
(``gpu_milli``). What is this script's rendering, in the v2020 README's schema: headerless
``pai_job_table.csv`` and ``pai_task_table.csv``; every time shifted by a constant (the v2020
times are "deducted by a constant" too); a pod of one GPU or less is one ``worker`` task asking
``gpu_milli / 10`` percent of a GPU; a pod of N GPUs is a ``ps`` task without GPU and a
``worker`` task of N instances at 100 percent each (the README's PS/worker shape); a CPU-only
pod is a task without ``plan_gpu``; the pod phase is the status (Succeeded: Terminated, Failed:
Failed, Running: Running, Pending: Waiting, never launched).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

OFFSET_S = 1_000_000.0  # the constant every time is shifted by
STATUS = {"Succeeded": "Terminated", "Failed": "Failed", "Running": "Running", "Pending": "Waiting"}


def pai_tables_from_pods(pods_csv: str | Path, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``pai_job_table.csv`` and ``pai_task_table.csv`` for the pods of a v2023 pod list;
    returns their paths (task table first)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task_path, job_path = out / "pai_task_table.csv", out / "pai_job_table.csv"
    with (
        Path(pods_csv).open(newline="") as fh,
        job_path.open("w", newline="") as jf,
        task_path.open("w", newline="") as tf,
    ):
        jobs, tasks = csv.writer(jf), csv.writer(tf)
        for pod in csv.DictReader(fh):
            name, status = pod["name"], STATUS.get(pod["pod_phase"], pod["pod_phase"])
            created = float(pod["creation_time"]) + OFFSET_S
            ended = float(pod["deletion_time"]) + OFFSET_S
            launched = float(pod["scheduled_time"]) + OFFSET_S if pod["scheduled_time"] else 0.0
            cpu, mem = float(pod["cpu_milli"]) / 10.0, float(pod["memory_mib"]) / 1024.0
            gpus, milli = int(pod["num_gpu"]), int(pod["gpu_milli"] or 1000)
            gpu_type = pod["gpu_spec"] or "MISC"
            # the job table's start_time is the submission; the tasks' the launch (0: none)
            jobs.writerow([name, f"inst-{name}", "", status, created, ended])
            times = [launched, ended if launched else ""]
            if gpus == 0:
                tasks.writerow([name, "worker", 1.0, status, *times, cpu, mem, "", ""])
            elif gpus == 1:
                tasks.writerow([name, "worker", 1.0, status, *times, cpu, mem, milli / 10.0, gpu_type])
            else:
                tasks.writerow([name, "ps", 1.0, status, *times, 600.0, 29.296875, "", ""])
                tasks.writerow([name, "worker", float(gpus), status, *times, cpu, mem, 100.0, gpu_type])
    return task_path, job_path


def main(argv: list[str] | None = None) -> int:
    from microco.services.scheduler.sim import default_traces_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--pods",
        default=None,
        help="a v2023 pod list (default: the public traces' openb_pod_list_default.csv)",
    )
    p.add_argument("--out", required=True, help="the folder the two tables are written to")
    args = p.parse_args(argv)
    pods = (
        Path(args.pods)
        if args.pods
        else default_traces_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
    )
    for path in pai_tables_from_pods(pods, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
