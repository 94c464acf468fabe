"""The CPU seconds a command and every process it starts use (measuring a test's cost on a
shared machine, where its wall time says little: docs/testing.md).

    python tests/_treecpu.py python -m pytest -q tests/integration/scheduler/test_sched_spread.py

Prints ``TREECPU <cpu-s> cpu-s, <wall> s wall, <n> processes, rc <rc>, load at end <load>`` on
stderr and exits with the command's status. Orphans (a detached stack's supervisor, a job whose
agent was killed) are re-parented here (a child subreaper), so they are counted too. Each
process's own user+system time is sampled every 0.1 s and its last value kept: a process that
lives less than that may be missed (a fraction of a CPU-second each)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _procs() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds, start time) of every process readable now."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        out[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / hz, fields[19])
    return out


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    me, seen = os.getpid(), {}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)

    def sample() -> None:
        procs = _procs()
        tree, grew = {me}, True
        while grew:
            grew = False
            for pid, (ppid, _, _) in procs.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree - {me}:
            seen[(pid, procs[pid][2])] = procs[pid][1]  # (pid, start time): a reused pid is another

    while proc.poll() is None:
        sample()
        time.sleep(0.1)
    while True:  # what is left (orphans re-parented here), until every child is reaped
        sample()
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.1)
        except ChildProcessError:
            break
    load = open("/proc/loadavg").read().split()[0]
    print(
        f"TREECPU {sum(seen.values()):.1f} cpu-s, {time.monotonic() - t0:.1f} s wall, {len(seen)} processes, "
        f"rc {proc.returncode}, load at end {load}",
        file=sys.stderr,
    )
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
