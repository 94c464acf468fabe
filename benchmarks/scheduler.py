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

from microco.api.agent.v1 import agent_pb2
from microco.common.channel import dial
from microco.common.identity import private_ca, service_identity

_T0 = time.perf_counter()


def _say(msg: str) -> None:
    print(f"[bench scheduler {time.perf_counter() - _T0:5.1f}s] {msg}", file=sys.stderr, flush=True)


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


class _Agent:
    """A node agent process and a gRPC stub to it (the benchmark drives it as the scheduler does)."""

    def __init__(self, kv: Any, etcd: str, node: str, devices: int, tmp: Path, preload: str) -> None:
        from microco.services.scheduler import spawn_agent

        self.kv, self.node = kv, node
        self.proc = spawn_agent(
            etcd,
            node,
            tmp / node,
            devices=devices,
            checkpoint_root=tmp / "ckpt",
            kv=kv,
            preload=preload,
            log_path=tmp / f"agent-{node}.log",
        )
        self._stub: Any = None

    def wait_warm(self, timeout: float = 300.0) -> dict[str, Any]:
        from microco.clients.agent import NODES_PREFIX

        return _wait(
            lambda: (self.kv.get_json(NODES_PREFIX + self.node) or {}).get("preloaded"),
            timeout,
            "warm zygote",
        )

    @property
    def stub(self) -> Any:
        if self._stub is None:
            from microco.api.agent.v1 import agent_pb2_grpc
            from microco.clients.agent import NODES_PREFIX

            address = self.kv.get_json(NODES_PREFIX + self.node)["address"]
            # it stands in for the scheduler, the one identity an agent starts processes for
            self._stub = agent_pb2_grpc.NodeAgentServiceStub(
                dial(address, identity=service_identity("scheduler"))
            )
        return self._stub

    def proc_status(self, job_id: str, attempt: int) -> Any:

        for p in self.stub.ListProcesses(agent_pb2.ListProcessesRequest(), timeout=5).processes:
            if p.job_id == job_id and p.attempt == attempt:
                return p
        return None

    def start(self, job_id: str, cmd: list[str], device: str, attempt: int) -> Any:

        return self.stub.StartProcess(
            agent_pb2.StartProcessRequest(job_id=job_id, command=cmd, device_ids=[device], attempt=attempt),
            timeout=30,
        )

    def control(self, job_id: str, control: agent_pb2.Control) -> Any:
        return self.stub.ControlProcess(
            agent_pb2.ControlProcessRequest(job_id=job_id, control=control), timeout=10
        )

    def kill(self, job_id: str) -> None:

        self.stub.StopProcess(agent_pb2.StopProcessRequest(job_id=job_id, grace_seconds=1), timeout=10)

    def stop(self) -> None:
        from microco.services.scheduler import stop_process

        stop_process(self.proc)


def measure_suspend_resume(agent: _Agent, repeats: int) -> dict[str, Any]:
    """A real PyTorch job on a node agent, suspended and resumed through the agent's API (the
    path the scheduler uses): command sent until the job's acknowledgement is visible."""
    from microco.api.agent.v1 import agent_pb2

    agent.start("sr", _torch_cmd(100000, sleep_ms=2), f"{agent.node}/0", 1)
    try:
        st = _wait(
            lambda: (p := agent.proc_status("sr", 1)) is not None and p.step >= 20 and p, 120, "sr job"
        )
        suspend, resume, in_job_suspend, in_job_resume = [], [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            seq = agent.control("sr", agent_pb2.CONTROL_SUSPEND).control_seq
            st = _wait(lambda s=seq: (p := agent.proc_status("sr", 1)).seq_done >= s and p, 30, "parked")
            suspend.append((time.perf_counter() - t0) * 1000)
            in_job_suspend.append(st.suspend_ms)
            assert st.job_state == "parked", st.job_state
            time.sleep(0.05)
            t0 = time.perf_counter()
            seq = agent.control("sr", agent_pb2.CONTROL_RESUME).control_seq
            st = _wait(lambda s=seq: (p := agent.proc_status("sr", 1)).seq_done >= s and p, 30, "resumed")
            resume.append((time.perf_counter() - t0) * 1000)
            in_job_resume.append(st.resume_ms)
            step = st.step
            st = _wait(lambda s=step: (p := agent.proc_status("sr", 1)).step >= s + 3 and p, 30, "progress")
        return {
            "suspend_ms": statistics.median(suspend),
            "resume_ms": statistics.median(resume),
            "suspend_in_job_ms": statistics.median(in_job_suspend),
            "resume_in_job_ms": statistics.median(in_job_resume),
            "minibatch_ms": st.minibatch_ms,
            "checkpoint_bytes": st.checkpoint_bytes,
            "peak_rss_bytes": st.peak_rss_bytes,
            "checkpoint_to_peak_rss": st.checkpoint_bytes / st.peak_rss_bytes,
            "forked_from_zygote": st.forked,
            "repeats": repeats,
        }
    finally:
        agent.kill("sr")


def measure_migration(src0: _Agent, dst0: _Agent, repeats: int) -> dict[str, Any]:
    """Checkpoint-and-move of one PyTorch job between two node agents (real processes):
    checkpoint and exit on one, start on the other (forked from its warm zygote), restore,
    until the first mini-batch after the move is done."""
    from microco.api.agent.v1 import agent_pb2

    cmd = _torch_cmd(100000, sleep_ms=2)
    nodes = [(src0, f"{src0.node}/1"), (dst0, f"{dst0.node}/0")]
    nodes[0][0].start("mig", cmd, nodes[0][1], 1)
    _wait(lambda: (p := nodes[0][0].proc_status("mig", 1)) is not None and p.step >= 20, 120, "job running")
    totals, stops, forked = [], [], []
    attempt, src = 1, 0
    for _ in range(repeats):
        dst = 1 - src
        a, b = nodes[src][0], nodes[dst][0]
        t0 = time.perf_counter()
        a.control("mig", agent_pb2.CONTROL_STOP)
        p = _wait(
            lambda a=a, at=attempt: (
                (q := a.proc_status("mig", at)) is not None
                and q.state == agent_pb2.PROCESS_STATE_EXITED
                and q
            ),
            60,
            "checkpoint and exit",
        )
        stops.append((time.perf_counter() - t0) * 1000)
        assert p.exit_code == 75, p.exit_code
        left = p.checkpoint_step
        attempt += 1
        b.start("mig", cmd, nodes[dst][1], attempt)
        q = _wait(
            lambda b=b, at=attempt, lf=left: (
                (q := b.proc_status("mig", at)) is not None and q.step > lf and q
            ),
            120,
            "first step after move",
        )
        totals.append((time.perf_counter() - t0) * 1000)
        assert q.restored_from_step == left, (q.restored_from_step, left)
        forked.append(q.forked)
        src = dst
    nodes[src][0].kill("mig")
    return {
        "migrate_ms": statistics.median(totals),
        "migrate_checkpoint_exit_ms": statistics.median(stops),
        "migrate_restart_ms": statistics.median(totals) - statistics.median(stops),
        "migrate_continues_from_step": True,
        "restarts_forked_from_zygote": all(forked),
        "repeats": repeats,
    }


def run_burst(
    kv: Any, etcd: str, tmp: Path, policy: str, config: dict[str, Any], jobs: int, steps: int, devices: int
) -> dict[str, Any]:
    """A burst of jobs submitted at once to a fresh scheduler over the (warm) burst agent."""
    from microco.clients.scheduler import SchedulerClient, job_to_dict, make_spec
    from microco.common import channel_for
    from microco.services.scheduler import spawn_scheduler, stop_process

    kv.delete_prefix("/microco/scheduler/")
    tmp.mkdir(parents=True, exist_ok=True)
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


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    from microco.clients.agent import NODES_PREFIX
    from microco.common.kv import EtcdKV
    from microco.services.stack import EtcdServer

    jobs = args.jobs or (4 if quick else 8)
    steps = args.steps or (400 if quick else 1500)
    devices = args.devices
    quantum = args.quantum_s or (1.0 if quick else 3.0)
    repeats = 3 if quick else 10
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="microco-bench-sched-") as d:
        tmp = Path(d)
        private_ca(tmp / "pki")  # the servers it starts are its own: so are their identities
        etcd = EtcdServer(tmp / "etcd").start()
        agents: list[_Agent] = []
        try:
            kv = EtcdKV(etcd.endpoint)
            # Two node agents, started together so their zygotes warm up in parallel: "a"
            # (the burst's node, also the suspend/resume one and the migration source) and "b"
            # (the migration target, stopped before the bursts).
            _say(f"starting two node agents (preload {args.preload})")
            a = _Agent(kv, etcd.endpoint, "a", devices, tmp, args.preload)
            agents.append(a)
            b = _Agent(kv, etcd.endpoint, "b", 1, tmp, args.preload)
            agents.append(b)
            warm = {}
            if args.preload != "none":
                t0 = time.perf_counter()
                a.wait_warm()
                b.wait_warm()
                warm = {"preloaded": a.wait_warm(), "warm_up_s": time.perf_counter() - t0}
            _say("suspend / resume of a PyTorch job at mini-batch boundaries")
            sr = measure_suspend_resume(a, repeats)
            _say("migration between two node agents")
            mig = measure_migration(a, b, max(1, repeats // 3))
            b.stop()
            agents.remove(b)
            _wait(lambda: kv.get(NODES_PREFIX + "b") is None, 30, "agent b gone")
            policies: dict[str, Any] = {}
            configs = {"fifo": {}, "gandiva": {"quantum_s": quantum}}
            for name in ("fifo", "gandiva"):
                _say(f"burst of {jobs} jobs x {steps} steps on {devices} virtual devices under {name}")
                policies[name] = run_burst(
                    kv, etcd.endpoint, tmp / name, name, configs[name], jobs, steps, devices
                )
            kv.close()
        finally:
            for ag in agents:
                ag.stop()
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
        "agent_warm_up": warm,
        "wall_s": time.perf_counter() - t_start,
        "config": {
            "jobs": jobs,
            "steps": steps,
            "devices": devices,
            "gandiva_quantum_s": quantum,
            "agent_preload": args.preload,
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
        help="4 jobs x 400 steps, gandiva quantum 1 s, 3 repeats: under a minute on an idle 2-core machine",
    )
    p.add_argument("--json", action="store_true", help="JSON only on stdout (the default output is JSON too)")
    p.add_argument("--jobs", type=int, default=0, help="jobs in the burst (default 4 quick, 8 full)")
    p.add_argument("--steps", type=int, default=0, help="mini-batches per job (default 400 quick, 1500 full)")
    p.add_argument("--devices", type=int, default=2, help="virtual devices of the node agent")
    p.add_argument(
        "--quantum-s",
        type=float,
        default=0.0,
        help="gandiva's time-slice quantum (default 1 s quick, 3 s full)",
    )
    p.add_argument(
        "--preload",
        default="auto",
        help="the node agents' zygote preload ('auto': numpy + torch; 'none': every job process "
        "starts by exec and imports torch itself, as before the zygote)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args.quick, args)
    print(json.dumps(result, indent=None if args.json else 2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
