"""Fault recovery benchmark: ``microco bench faults [--json] [--case NAME ...]``.

Starts one local stack (``microco up``: console, standby scheduler and store coordinator on),
then, one case at a time, kills (SIGKILL) or pauses (SIGSTOP, then SIGCONT) one of its
processes and measures how long until ``microco status`` exits 0 again, probed in this process
about every 0.1 s. Each case is measured from its dependency's return: the kill for a service
(the supervisor restarts it at once), the new process for etcd and Redis (their restart), the
SIGCONT for a pause; the time from the fault's start is reported too. A case passes when the
stack is clean within ``--target-s`` (issue 16: 10 s) of that moment.

This measures; the fault tests (tests/e2e/test_fault_matrix.py, test_self_healing.py) check
behaviour with generous deadlines. Results: docs/faults.md."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MICROCO = [sys.executable, "-m", "microco.cli"]
TARGET_S = 10.0
#: case -> (process name in the stack's state, or ``service:role`` of an elected one; action;
#: what is expected)
CASES: dict[str, tuple[str, str, str]] = {
    "scheduler-leader-kill": (
        "scheduler:leader",
        "kill",
        "the standby leads; the killed one back as standby",
    ),
    "scheduler-standby-kill": (
        "scheduler:standby",
        "kill",
        "the standby back, standing by; the leader untouched",
    ),
    "store-leader-kill": (
        "store:leader",
        "kill",
        "the standby coordinator leads; the killed one back as standby",
    ),
    "store-standby-kill": ("store:standby", "kill", "the standby coordinator back; the leader untouched"),
    "agent-kill": ("agent", "kill", "the agent back"),
    "cache-kill": ("cache", "kill", "the cache back on a new port"),
    "store-node-kill": ("store-node-1", "kill", "the node back"),
    "compiler-kill": ("compiler", "kill", "the compiler back"),
    "console-kill": ("console", "kill", "the console back"),
    "redis-pause": ("redis", "pause", "status fails while paused; clean after SIGCONT"),
    "redis-kill": ("redis", "kill", "restarted empty; services unaffected"),
    "etcd-pause": ("etcd", "pause", "status fails while paused; clean after SIGCONT"),
    "etcd-kill": ("etcd", "kill", "restarted on the same data; registrations back"),
}


class Stack:
    def __init__(self, home: Path, store_nodes: int) -> None:
        self.home = home
        self.log = home.parent / "up.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*MICROCO, "up", "--home", str(home), "--console-port", "0", "--devices", "1",
                 "--store-nodes", str(store_nodes)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def state(self) -> dict[str, Any]:
        return json.loads((self.home / "stack.json").read_text())

    def pid(self, name: str) -> int:
        return int(next(p for p in self.state()["processes"] if p["name"] == name)["pid"])

    def process_in_role(self, service: str, role: str) -> str:
        """The stack's process name of the ``role`` (leader, standby) instance of ``service``."""
        for _ in range(100):
            rows = self.status_doc().get("services", [])
            inst = next((r["instance"] for r in rows if r["service"] == service and r["role"] == role), None)
            for p in self.state()["processes"]:
                if inst is not None and p.get("instance_id") == inst:
                    return str(p["name"])
            time.sleep(0.1)
        raise RuntimeError(f"no {role} of {service}")

    def status_doc(self) -> dict[str, Any]:
        from microco.cli import main as cli_main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli_main(["status", "--home", str(self.home), "--json"])
        try:
            return dict(json.loads(out.getvalue()))
        except ValueError:
            return {}

    def status(self) -> tuple[int, list[str]]:
        """`microco status --json` in this process (a fresh interpreter would add seconds)."""
        from microco.cli import main as cli_main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(["status", "--home", str(self.home), "--json"])
        try:
            return code, list(json.loads(out.getvalue()).get("problems", []))
        except ValueError:
            return code, [err.getvalue().strip()]

    def wait_clean(self, timeout: float) -> float | None:
        """Seconds until status exits 0, or None past ``timeout``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"microco up exited: see {self.log}")
            if self.status()[0] == 0:
                return time.monotonic() - t0
            time.sleep(0.1)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if (self.home / "stack.json").exists():
            subprocess.run(
                [*MICROCO, "down", "--home", str(self.home)], capture_output=True, timeout=90, check=False
            )


def run_case(stack: Stack, name: str, pause_s: float, bound_s: float) -> dict[str, Any]:
    proc, action, expected = CASES[name]
    elected = proc.split(":")[0] if ":" in proc else ""
    leader_before = stack.process_in_role(elected, "leader") if elected else ""
    if ":" in proc:
        proc = stack.process_in_role(*proc.split(":"))
    old = stack.pid(proc)
    t_fault = time.monotonic()
    if action == "pause":
        os.kill(old, signal.SIGSTOP)
        time.sleep(pause_s)
        during = stack.status()  # (while paused)
        os.kill(old, signal.SIGCONT)
        t_back = time.monotonic()
    else:
        os.kill(old, signal.SIGKILL)
        during = stack.status()
        t_back = time.monotonic()
        if proc in ("etcd", "redis"):  # measured from the dependency's return: its new process
            while time.monotonic() - t_fault < bound_s:
                try:
                    if stack.pid(proc) != old:
                        break
                except (OSError, ValueError, StopIteration):
                    pass
                time.sleep(0.05)
            t_back = time.monotonic()
    took = stack.wait_clean(bound_s)
    done = time.monotonic()
    recovery = None if took is None else done - t_back
    leaders = {}
    if elected:  # which process leads before and after (a standby's kill must not move it)
        leaders = {"leader_before": leader_before, "leader_after": stack.process_in_role(elected, "leader")}
    return {
        **leaders,
        "case": name,
        "process": proc,
        "fault": f"SIGSTOP {pause_s:.0f}s" if action == "pause" else "SIGKILL",
        "expected": expected,
        "status_during": {"exit": during[0], "problems": during[1][:3]},
        "recovery_s": None if recovery is None else round(recovery, 2),
        "from_fault_s": None if took is None else round(done - t_fault, 2),
        "within_target": recovery is not None and recovery <= TARGET_S,
    }


def main(argv: list[str] | None = None) -> int:
    global TARGET_S
    p = argparse.ArgumentParser(prog="microco bench faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (repeatable)")
    p.add_argument("--target-s", type=float, default=TARGET_S, help="recovery target (default 10 s)")
    p.add_argument("--bound-s", type=float, default=120.0, help="give up on a case after this long")
    p.add_argument("--pause-s", type=float, default=3.0, help="how long a pause lasts")
    p.add_argument("--store-nodes", type=int, default=3)
    args = p.parse_args(argv)
    TARGET_S = args.target_s
    cases = args.case or list(CASES)
    with tempfile.TemporaryDirectory(prefix="microco-faults-") as tmp:
        stack = Stack(Path(tmp) / "home", args.store_nodes)
        try:
            t0 = time.monotonic()
            if stack.wait_clean(300) is None:
                raise RuntimeError(f"the stack did not become healthy: see {stack.log}")
            start_s = time.monotonic() - t0
            results = []
            for name in cases:
                results.append(run_case(stack, name, args.pause_s, args.bound_s))
                if not args.json:
                    r = results[-1]
                    print(
                        f"{name:24s} recovery {r['recovery_s']} s (from the fault {r['from_fault_s']} s)",
                        flush=True,
                    )
                if stack.wait_clean(args.bound_s) is None:  # settled before the next case
                    break
        finally:
            stack.stop()
    doc = {
        "benchmark": "faults",
        "target_s": TARGET_S,
        "stack_start_s": round(start_s, 1),
        "load_average": os.getloadavg(),
        "cases": results,
        "all_within_target": all(r["within_target"] for r in results),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0 if doc["all_within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
