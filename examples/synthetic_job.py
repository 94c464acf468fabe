"""A framework-free job for exercising the scheduler cheaply (starts in ~0.1 s).

Each mini-batch busies the CPU for ``--compute-ms`` (so two jobs packed on one virtual device,
i.e. one core, really slow each other down) and then waits ``--io-ms`` (a job that leaves its
device idle part of the time, which is what packing exploits). Its state is a hash chain over
the steps, so a run that was suspended, moved and resumed must end with the same digest as an
uninterrupted one.

    python -m microco.examples.synthetic_job --steps 100 --compute-ms 10 --io-ms 10

With ``--device-locks DIR`` each mini-batch's compute also holds an exclusive lock on a file
per device it was given (``DIR/<device id>``), as an accelerator runs one job's kernels at a
time: jobs packed on one device then share it whatever else the host runs (on a busy host a
core is shared with everything, so two packed CPU-bound jobs may lose nothing against one).

``--device-ms`` is a mini-batch's accelerator time: the job holds its devices (their locks)
for that long while its host thread waits, as a host waits for a GPU's kernels. Unlike
``--compute-ms`` it is not stretched by the host's load: a job that keeps its device busy
stays one on a busy machine (the scheduler's packing test, which on a loaded CI machine saw a
CPU-bound job keep its device 14% busy). The job's utilization, read from its CPU time, does
not see that time (a GPU's busy time is not measured either).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _devices_held(lock_dir: str | None) -> Iterator[None]:
    """Hold an exclusive lock on each of this process's devices (``MICROCO_DEVICES``), in
    order; nothing without ``lock_dir``."""
    if not lock_dir:
        yield
        return
    from microco.clients.scheduler import ENV_DEVICES

    with contextlib.ExitStack() as stack:
        for dev in sorted(d for d in os.environ.get(ENV_DEVICES, "").split(",") if d):
            f = stack.enter_context(open(Path(lock_dir) / dev.replace("/", "_"), "a"))
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--compute-ms", type=float, default=10.0, help="CPU-busy time per mini-batch")
    p.add_argument("--io-ms", type=float, default=0.0, help="idle (input-wait) time per mini-batch")
    p.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="accelerator time per mini-batch: the devices held that long while the host waits",
    )
    p.add_argument(
        "--device-locks",
        metavar="DIR",
        help="hold a lock per device (a file in DIR) while computing: packed jobs share their device",
    )
    p.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this step (tests)")
    p.add_argument("--out", help="write the final digest and steps here (JSON)")
    args = p.parse_args(argv)

    from microco.clients.scheduler import JobContext

    state = {"digest": hashlib.sha256(b"seed").hexdigest()}
    ctx = JobContext()
    ctx.save = lambda step: json.dumps({"step": step, **state}).encode()

    def load(blob: bytes) -> int:
        saved = json.loads(blob)
        state["digest"] = saved["digest"]
        return int(saved["step"])

    ctx.load = load
    start = ctx.restore()
    print(f"synthetic job: steps {start} to {args.steps}", flush=True)
    for step in range(start, args.steps):
        if step == args.fail_at:
            print(f"failing at step {step}, as asked (--fail-at)", file=sys.stderr, flush=True)
            raise SystemExit(3)
        # CPU time, not wall time: on a shared core the work takes longer, as real compute does.
        with _devices_held(args.device_locks):
            t_end = time.thread_time() + args.compute_ms / 1000.0
            x = 0
            while time.thread_time() < t_end:
                x += 1
            if args.device_ms:
                time.sleep(args.device_ms / 1000.0)
        if args.io_ms:
            time.sleep(args.io_ms / 1000.0)
        state["digest"] = hashlib.sha256(f"{state['digest']}:{step}".encode()).hexdigest()
        ctx.step_end(step + 1)
    ctx.finish()
    print(f"finished {args.steps} steps, digest {state['digest'][:12]}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "digest": state["digest"],
                    "steps": args.steps,
                    "restored_from_step": ctx.restored_from_step,
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
