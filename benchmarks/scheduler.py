"""Gandiva on this machine, with real training processes (PyTorch on scikit-learn's digits).

Measures, in one run:

* **suspend / resume at a mini-batch boundary**: from the control command to the job's
  acknowledgement (parked / running again), and the checkpoint written at that boundary
  against the process's peak resident memory (Gandiva's point: suspend where state is small);
* **migration of a one-device job** between two node agents: checkpoint-and-exit on one,
  restore on the other, until the first mini-batch after the move is done;
* **a burst of jobs on oversubscribed virtual devices**, ``gandiva`` against ``fifo``: time to
  first feedback (submission until the first mini-batch) and throughput (steps per second of
  the whole burst), with the live scheduler, node agent and real jobs.

    microco bench scheduler [--quick] --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _say(msg: str) -> None:
    print(f"[bench scheduler] {msg}", file=sys.stderr, flush=True)


def _torch_cmd(steps: int, hidden: int = 256, sleep_ms: float = 0.0) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "microco.examples.torch_digits",
        "--steps",
        str(steps),
        "--hidden",
        str(hidden),
    ]
    if sleep_ms:
        cmd += ["--step-sleep-ms", str(sleep_ms)]
    return cmd


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.005)
    raise TimeoutError(what)


def measure_suspend_resume(tmp: Path, repeats: int) -> dict[str, Any]:
    """A real PyTorch job driven through its control channel, as the agent drives it."""
    import subprocess

    from microco.clients.scheduler import ControlChannel

    ch = ControlChannel(tmp / "ctl")
    env = {
        **os.environ,
        "MICROCO_CONTROL_DIR": str(ch.dir),
        "MICROCO_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        _torch_cmd(100000, sleep_ms=2), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        ch.wait_status(lambda s: s.get("step", 0) >= 20, 120)
        suspend, resume, in_job_suspend, in_job_resume = [], [], [], []
        st: dict[str, Any] = {}
        for _ in range(repeats):
            t0 = time.perf_counter()
            st = ch.wait_ack(ch.send("suspend"), 30)
            suspend.append((time.perf_counter() - t0) * 1000)
            in_job_suspend.append(st["suspend_ms"])
            time.sleep(0.05)
            t0 = time.perf_counter()
            seq = ch.send("resume")
            st = ch.wait_ack(seq, 30)
            resume.append((time.perf_counter() - t0) * 1000)
            in_job_resume.append(st["resume_ms"])
            step = st["step"]
            ch.wait_status(lambda s, step=step: s["step"] >= step + 3, 30)
        st = ch.status() or st
        return {
            "suspend_ms": statistics.median(suspend),
            "resume_ms": statistics.median(resume),
            "suspend_in_job_ms": statistics.median(in_job_suspend),
            "resume_in_job_ms": statistics.median(in_job_resume),
            "minibatch_ms": st["minibatch_ms"],
            "checkpoint_bytes": st["checkpoint_bytes"],
            "peak_rss_bytes": st["peak_rss_bytes"],
            "checkpoint_to_peak_rss": st["checkpoint_bytes"] / st["peak_rss_bytes"],
            "repeats": repeats,
        }
    finally:
        proc.kill()
        proc.wait()


def measure_migration(kv: Any, etcd: str, tmp: Path, repeats: int) -> dict[str, Any]:
    """Checkpoint-and-move of one PyTorch job between two node agents (real processes)."""
    import grpc

    from microco.api.agent.v1 import agent_pb2, agent_pb2_grpc
    from microco.services.agent import NODES_PREFIX
    from microco.services.scheduler._local import spawn_agent, stop_process

    agents = [
        spawn_agent(etcd, f"m{i}", tmp / f"m{i}", devices=1, checkpoint_root=tmp / "ckpt", kv=kv)
        for i in range(2)
    ]
    try:
        stubs = [
            agent_pb2_grpc.NodeAgentServiceStub(
                grpc.insecure_channel(kv.get_json(NODES_PREFIX + f"m{i}")["address"])
            )
            for i in range(2)
        ]

        def proc(i: int, attempt: int) -> Any:
            for p in stubs[i].ListProcesses(agent_pb2.ListProcessesRequest(), timeout=5).processes:
                if p.job_id == "mig" and p.attempt == attempt:
                    return p
            return None

        cmd = _torch_cmd(100000, sleep_ms=2)
        stubs[0].StartProcess(
            agent_pb2.StartProcessRequest(job_id="mig", command=cmd, device_ids=["m0/0"], attempt=1)
        )
        _wait(lambda: (p := proc(0, 1)) is not None and p.step >= 20, 120, "job running")
        totals, stops = [], []
        attempt, src = 1, 0
        for _ in range(repeats):
            dst = 1 - src
            t0 = time.perf_counter()
            stubs[src].ControlProcess(
                agent_pb2.ControlProcessRequest(job_id="mig", control=agent_pb2.CONTROL_STOP)
            )
            p = _wait(
                lambda s=src, a=attempt: (
                    (q := proc(s, a)) is not None and q.state == agent_pb2.PROCESS_STATE_EXITED and q
                ),
                60,
                "checkpoint and exit",
            )
            stops.append((time.perf_counter() - t0) * 1000)
            left = p.checkpoint_step
            attempt += 1
            stubs[dst].StartProcess(
                agent_pb2.StartProcessRequest(
                    job_id="mig", command=cmd, device_ids=[f"m{dst}/0"], attempt=attempt
                )
            )
            q = _wait(
                lambda d=dst, a=attempt, lf=left: (q := proc(d, a)) is not None and q.step > lf and q,
                120,
                "first step after move",
            )
            totals.append((time.perf_counter() - t0) * 1000)
            assert q.restored_from_step == left, (q.restored_from_step, left)
            src = dst
        stubs[src].StopProcess(agent_pb2.StopProcessRequest(job_id="mig", grace_seconds=1), timeout=10)
        return {
            "migrate_ms": statistics.median(totals),
            "migrate_checkpoint_exit_ms": statistics.median(stops),
            "migrate_restart_ms": statistics.median(totals) - statistics.median(stops),
            "migrate_continues_from_step": True,
            "repeats": repeats,
        }
    finally:
        for a in agents:
            stop_process(a)


def run_burst(
    kv: Any, etcd: str, tmp: Path, policy: str, config: dict[str, Any], jobs: int, steps: int, devices: int
) -> dict[str, Any]:
    from microco.clients.common import channel_for
    from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
    from microco.services.scheduler._local import spawn_agent, spawn_scheduler, stop_process

    kv.delete_prefix("/microco/scheduler/")
    agent = spawn_agent(etcd, f"burst-{policy}", tmp / f"agent-{policy}", devices=devices, kv=kv)
    sched = spawn_scheduler(
        etcd,
        tmp / f"sched-{policy}",
        policy=policy,
        policy_config=config,
        tick_s=0.2,
        kv=kv,
        log_path=tmp / f"sched-{policy}.log",
    )
    try:
        c = SchedulerClient(channel_for(kv, "scheduler"))
        t0 = time.time()
        [
            c.submit(
                make_spec(
                    _torch_cmd(steps), devices=1, name=f"{policy}-{i}", total_steps=steps, model="digits-mlp"
                )
            )
            for i in range(jobs)
        ]
        done = _wait(
            lambda: (
                (js := [job_to_dict(j) for j in c.list()])
                and all(j["state"] in ("finished", "failed", "cancelled") for j in js)
                and js
            ),
            1800,
            f"{policy} burst to finish",
        )
        failed = [j["id"] for j in done if j["state"] != "finished"]
        ttff = [j["first_step_at"] - j["submitted_at"] for j in done if j["first_step_at"]]
        end = max(j["finished_at"] for j in done)
        total_steps = sum(j["step"] for j in done)
        decisions = kv.get_prefix_json("/microco/scheduler/jobs/")
        suspends = sum(sum(1 for h in r["history"] if h[1] == "suspended") for _, r in decisions)
        return {
            "jobs": jobs,
            "steps_per_job": steps,
            "devices": devices,
            "failed": failed,
            "avg_time_to_first_feedback_s": statistics.mean(ttff),
            "max_time_to_first_feedback_s": max(ttff),
            "makespan_s": end - t0,
            "throughput_steps_per_s": total_steps / (end - t0),
            "avg_completion_s": statistics.mean(j["finished_at"] - j["submitted_at"] for j in done),
            "suspensions": suspends,
        }
    finally:
        stop_process(sched)
        stop_process(agent)
        kv.delete_prefix("/microco/nodes/")


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    from microco.services.common.kv import EtcdKV
    from microco.services.stack import EtcdServer

    jobs = args.jobs or (4 if quick else 8)
    steps = args.steps or (100 if quick else 1500)
    devices = args.devices
    repeats = 3 if quick else 10
    with tempfile.TemporaryDirectory(prefix="microco-bench-sched-") as d:
        tmp = Path(d)
        etcd = EtcdServer(tmp / "etcd").start()
        try:
            kv = EtcdKV(etcd.endpoint)
            _say("suspend / resume of a PyTorch job at mini-batch boundaries")
            sr = measure_suspend_resume(tmp / "sr", repeats)
            _say("migration between two node agents")
            mig = measure_migration(kv, etcd.endpoint, tmp / "mig", max(1, repeats // 3))
            policies: dict[str, Any] = {}
            configs = {"fifo": {}, "gandiva": {"quantum_s": args.quantum_s}}
            for name in ("fifo", "gandiva"):
                _say(f"burst of {jobs} jobs x {steps} steps on {devices} virtual devices under {name}")
                policies[name] = run_burst(
                    kv, etcd.endpoint, tmp / name, name, configs[name], jobs, steps, devices
                )
            kv.close()
        finally:
            etcd.stop()
    f, g = policies["fifo"], policies["gandiva"]
    return {
        "benchmark": "scheduler",
        "quick": quick,
        "suspend_ms": sr["suspend_ms"],
        "resume_ms": sr["resume_ms"],
        "checkpoint_bytes": sr["checkpoint_bytes"],
        "peak_rss_bytes": sr["peak_rss_bytes"],
        "migrate_ms": mig["migrate_ms"],
        "suspend_resume": sr,
        "migration": mig,
        "policies": policies,
        "ratios": {
            "ttff_fifo_over_gandiva": f["avg_time_to_first_feedback_s"] / g["avg_time_to_first_feedback_s"],
            "throughput_gandiva_over_fifo": g["throughput_steps_per_s"] / f["throughput_steps_per_s"],
        },
        "config": {
            "jobs": jobs,
            "steps": steps,
            "devices": devices,
            "gandiva_quantum_s": args.quantum_s,
            "model": "torch_digits MLP hidden=256 (64-256-10), batch 32, 1 thread per virtual device",
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="microco bench scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="4 jobs x 100 steps, 3 repeats: about a minute on an idle 2-core machine",
    )
    p.add_argument("--json", action="store_true", help="JSON only on stdout (the default output is JSON too)")
    p.add_argument("--jobs", type=int, default=0, help="jobs in the burst (default 4 quick, 8 full)")
    p.add_argument("--steps", type=int, default=0, help="mini-batches per job (default 100 quick, 1500 full)")
    p.add_argument("--devices", type=int, default=2, help="virtual devices of the node agent")
    p.add_argument("--quantum-s", type=float, default=3.0, help="gandiva's time-slice quantum")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args.quick, args)
    print(json.dumps(result, indent=None if args.json else 2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
