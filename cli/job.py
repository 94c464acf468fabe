"""``microco job ...``: submit, list, show and cancel training jobs on the Gandiva scheduler."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from typing import Any

from ._platform import add_etcd_arguments

_STATES = ("queued", "running", "suspended", "packed", "migrating", "finished", "failed", "cancelled")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "job",
        help="Gandiva: submit, list, show and cancel training jobs",
        description=(
            "Training jobs run on node agents under the Gandiva scheduler, which may time-slice,\n"
            "pack, migrate or resize them at mini-batch boundaries. A job's script reports to the\n"
            "scheduler with a few lines (microco.clients.scheduler: TorchHook or SchedulerCallback).\n\n"
            "example:\n"
            "  microco job submit --name digits --devices 1 -- python -m microco.examples.torch_digits --steps 500"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_etcd_arguments(p)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call to the scheduler")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    s = p.add_subparsers(dest="job_command", metavar="SUBCOMMAND")

    sb = s.add_parser(
        "submit",
        help="submit a job: everything after -- is its command",
        description="Submit a training job. The command (after --) runs on a node agent with "
        "MICROCO_DEVICES, MICROCO_CONTROL_DIR and MICROCO_CHECKPOINT_DIR set.",
    )
    sb.add_argument("--name", default="", help="a name for people (the id gets a suffix)")
    sb.add_argument("--devices", type=int, default=1, help="devices the job wants (>= 1)")
    sb.add_argument(
        "--elastic", action="store_true", help="the job may grow onto idle devices and shrink back"
    )
    sb.add_argument("--max-devices", type=int, default=0, help="elastic jobs: grow at most to this many")
    sb.add_argument(
        "--gpu-share",
        type=float,
        default=0.0,
        help="one-device jobs: fraction of a device the job needs, in (0, 1]; below 1 it may share one",
    )
    sb.add_argument("--priority", type=int, default=0, help="higher runs first")
    sb.add_argument(
        "--user",
        default="",
        help="owner (default: the user of your credentials; others: administrators only)",
    )
    sb.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for the job")
    sb.add_argument("--workdir", default="", help="working directory on the node")
    sb.add_argument(
        "--total-steps",
        type=int,
        default=0,
        help="mini-batches the job will run (for progress, and the compiler's exploration budget: the job sees it as $MICROCO_TOTAL_STEPS)",
    )
    sb.add_argument("--model", default="", help="model name: jobs of one model share a speed profile")
    sb.add_argument("--wait", action="store_true", help="follow the job until it ends (progress bar)")
    sb.add_argument("--json", action="store_true", help="print the job as JSON")
    sb.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the job's id (JOB=$(microco job submit -q ...))",
    )
    sb.add_argument("cmd", nargs=argparse.REMAINDER, help="the training command, after --")
    sb.set_defaults(func=cmd_submit)

    ls = s.add_parser("list", help="list jobs", description="List jobs, oldest first.")
    ls.add_argument("--state", action="append", default=[], choices=_STATES, help="only jobs in this state")
    ls.add_argument("--user", default="", help="only this owner's jobs")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=cmd_list)

    sh = s.add_parser("show", help="show one job and its history")
    sh.add_argument("job_id", help="the job's id, as `microco job list` shows it")
    sh.add_argument("--json", action="store_true", help="print JSON")
    sh.set_defaults(func=cmd_show)

    lg = s.add_parser(
        "logs",
        help="print a job's output (stdout and stderr), -f to follow it",
        description="Print what a job's process wrote, as the node it ran on keeps it: the latest "
        "attempt unless --attempt says which. Logs stay on the node while the job lives and for the "
        "scheduler's --log-retention-s (a day by default) after it ends.",
    )
    lg.add_argument("job_id", help="the job's id, as `microco job list` shows it")
    lg.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing while the process runs (a job not started yet is waited for)",
    )
    lg.add_argument("--tail", type=int, default=0, metavar="N", help="start N lines before the end")
    lg.add_argument("--attempt", type=int, default=0, help="which (re)start of the job (default: latest)")
    lg.set_defaults(func=cmd_logs)

    cn = s.add_parser("cancel", help="cancel a job (its process is stopped)")
    cn.add_argument("job_id", nargs="+", help="the ids of the jobs to cancel")
    cn.add_argument("--json", action="store_true", help="print JSON")
    cn.set_defaults(func=cmd_cancel)

    for action, helptext in (
        ("suspend", "suspend a running job (checkpointed, parked) and hold it until resumed"),
        ("resume", "resume a job an operator suspended (the policy places it, or --devices)"),
        ("migrate", "move a running job onto other devices (checkpoint, restart there)"),
        ("resize", "change an elastic job's devices (--devices, or a count on its node)"),
    ):
        op = s.add_parser(action, help=helptext, description=helptext[0].upper() + helptext[1:] + ".")
        op.add_argument("job_id", help="the job's id, as `microco job list` shows it")
        op.add_argument("--devices", default="", help="comma-separated device ids, e.g. n1/0,n1/1")
        if action == "resize":
            op.add_argument("count", nargs="?", type=int, default=0, help="devices on the job's node")
        op.add_argument("--json", action="store_true", help="print JSON")
        op.set_defaults(func=cmd_control, action=action)

    nd = s.add_parser("nodes", help="devices the scheduler can use, its leader and policy")
    nd.add_argument("--json", action="store_true", help="print JSON")
    nd.set_defaults(func=cmd_nodes)


def _kv(args: argparse.Namespace) -> Any:
    from microco.common.kv import EtcdKV

    from . import etcd_for

    return EtcdKV(etcd_for(args))


def _client(args: argparse.Namespace, kv: Any = None) -> Any:
    from microco.clients.scheduler import SchedulerClient

    # follows the scheduler to a standby if the instance it found goes away
    return SchedulerClient.from_etcd(kv or _kv(args), default_timeout=args.timeout)


def _row(j: dict[str, Any]) -> str:
    steps = f"{j['step']}/{j['total_steps']}" if j["total_steps"] else str(j["step"])
    ms = f"{j['minibatch_ms']:.1f}" if j["minibatch_ms"] else "-"
    return f"{j['id']:<28} {j['state']:<10} {','.join(j['devices']) or '-':<16} {steps:>10} {ms:>8}  {j['message'][:60]}"


_HEADER = f"{'ID':<28} {'STATE':<10} {'DEVICES':<16} {'STEP':>10} {'MB_MS':>8}  MESSAGE"


def cmd_submit(args: argparse.Namespace) -> int:
    from microco.clients.scheduler import job_to_dict, make_spec
    from microco.common.errors import InvalidArgument
    from microco.common.identity import insecure

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InvalidArgument("give the job's command after --, e.g. microco job submit -- python train.py")
    env = {}
    for item in args.env:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidArgument(f"bad --env {item!r}: expected KEY=VALUE")
        env[k] = v
    spec = make_spec(
        cmd,
        devices=args.devices,
        name=args.name,
        elastic=args.elastic,
        priority=args.priority,
        # The scheduler takes the owner from the caller's credentials; only an administrator
        # names another one. Without TLS (development) there are none: the login name stands in.
        user=args.user or (getpass.getuser() if insecure() else ""),
        env=env,
        workdir=args.workdir,
        total_steps=args.total_steps,
        model=args.model,
        max_devices=args.max_devices,
        gpu_share=args.gpu_share,
    )
    c = _client(args)
    job = job_to_dict(c.submit(spec))
    if args.json and not args.wait:
        print(json.dumps(job, indent=2))
        return 0
    if args.quiet:
        print(job["id"], flush=True)
    else:
        print(f"submitted {job['id']} ({job['state']})", file=sys.stderr if args.json else sys.stdout)
    if args.wait:
        job = _follow(c, job["id"], job["total_steps"])
        if args.json:
            print(json.dumps(job, indent=2))
        return 0 if job["state"] == "finished" else 1
    return 0


def _follow(c: Any, job_id: str, total: int) -> dict[str, Any]:
    from tqdm import tqdm

    from microco.clients.scheduler import job_to_dict

    bar = tqdm(total=total or None, desc=job_id, unit="step", file=sys.stderr)
    job = job_to_dict(c.get(job_id))
    while True:
        for ev in c.watch([job_id], timeout=30):
            job = job_to_dict(ev.job)
            bar.n = job["step"]
            bar.set_postfix_str(job["state"])
            bar.refresh()
            if job["state"] in ("finished", "failed", "cancelled"):
                bar.close()
                print(f"{job_id}: {job['state']}: {job['message']}", file=sys.stderr)
                return job
        time.sleep(0.1)


def cmd_list(args: argparse.Namespace) -> int:
    from microco.clients.scheduler import job_to_dict

    jobs = [job_to_dict(j) for j in _client(args).list(args.state, args.user)]
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    print(_HEADER)
    for j in jobs:
        print(_row(j))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from microco.clients.scheduler import job_to_dict

    from ._format import cell

    j = job_to_dict(_client(args).get(args.job_id))
    if args.json:
        print(json.dumps(j, indent=2))
        return 0
    for k in (
        "id",
        "name",
        "state",
        "message",
        "devices",
        "node",
        "step",
        "total_steps",
        "checkpoint_step",
        "attempt",
        "restarts",
        "minibatch_ms",
        "minibatch_ms_alone",
        "utilization",
        "packed_with",
        "attained_service_s",
        "devices_wanted",
        "elastic",
        "priority",
        "user",
        "command",
    ):
        v = j[k]
        if k in ("submitted_at", "first_step_at", "finished_at"):
            continue
        print(f"{k:>20}: {' '.join(v) if k == 'command' else cell(v)}")
    for k in ("submitted_at", "first_step_at", "finished_at"):
        if j[k]:
            print(f"{k:>20}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(j[k]))}")
    print("history:")
    for at, state, msg in j["history"]:
        print(f"  {time.strftime('%H:%M:%S', time.localtime(at))}  {state:<10} {msg}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from microco.clients.agent import AgentDirectory
    from microco.clients.scheduler import job_to_dict
    from microco.common.errors import InvalidArgument

    if args.tail < 0 or args.attempt < 0:
        raise InvalidArgument("--tail and --attempt must not be negative")
    kv = _kv(args)
    client = _client(args, kv)
    job = job_to_dict(client.get(args.job_id))  # an unknown job is NotFound here
    if args.follow and not job["node"] and job["state"] == "queued":
        job = _wait_started(client, job)
    agents = AgentDirectory(kv, timeout_s=args.timeout)
    out = sys.stdout.buffer
    try:
        node, first, rest = _open_log(agents, client, job, args)
        others = [a for a in first.attempts if a != first.attempt]
        print(
            f"[{job['id']} attempt {first.attempt} on {node}"
            + (f"; this node also has attempts {', '.join(map(str, others))}" if others else "")
            + "]",
            file=sys.stderr,
        )
        out.write(first.data)
        out.flush()
        for chunk in rest:
            out.write(chunk.data)
            out.flush()
    except KeyboardInterrupt:  # the way to stop following
        pass
    return 0


def _open_log(agents: Any, client: Any, job: dict[str, Any], args: argparse.Namespace) -> Any:
    """The job's log from the node that keeps it. Following a job that has not ended, a log not
    there yet is waited for: the scheduler names the job's node when it places it, and the node
    creates the log when it starts the process, a moment later (longer on a loaded machine)."""
    from microco.clients.scheduler import job_to_dict
    from microco.common.errors import NotFound

    said = False
    while True:
        try:
            return agents.open_log(
                job["id"],
                first_node=job["node"],
                attempt=args.attempt,
                tail_lines=args.tail,
                follow=args.follow,
            )
        except NotFound:
            if not args.follow or job["state"] in _STATES[5:]:
                raise  # (an ended job: asked again after it ended, so a log written at its end is read)
        if not said:
            print(f"[{job['id']} is {job['state']}; waiting for its log]", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)
        job = job_to_dict(client.get(job["id"]))


def _wait_started(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Following a job that is still queued: wait (saying so) until a node starts it."""
    from microco.clients.scheduler import job_to_dict

    print(f"[{job['id']} is queued; waiting for it to start]", file=sys.stderr, flush=True)
    while not job["node"] and job["state"] == "queued":
        time.sleep(0.5)
        job = job_to_dict(client.get(job["id"]))
    return job


def cmd_cancel(args: argparse.Namespace) -> int:
    from microco.clients.scheduler import job_to_dict

    c = _client(args)
    out = [job_to_dict(c.cancel(job_id)) for job_id in args.job_id]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for j in out:
            print(f"{j['id']}: {j['state']}{' (cancel requested)' if j['state'] not in _STATES[5:] else ''}")
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    """suspend / resume / migrate / resize: checked by the scheduler at once, carried out at
    its next tick (``microco job show`` has the outcome in the job's history)."""
    from microco.clients.scheduler import job_to_dict

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    count = getattr(args, "count", 0) or 0
    if args.action == "resize" and bool(devices) == bool(count):
        from microco.common.errors import InvalidArgument

        raise InvalidArgument("resize: give either a device count or --devices")
    j = job_to_dict(_client(args).control(args.job_id, args.action, devices, count))
    if args.json:
        print(json.dumps(j, indent=2))
    else:
        print(f"{j['id']}: {j['state']}; {j['message']}")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    resp = _client(args).list_nodes()
    devices = [{"id": d.id, "node": d.node, "kind": d.kind, "model": d.model} for d in resp.devices]
    if args.json:
        print(json.dumps({"leader": resp.leader, "policy": resp.policy, "devices": devices}, indent=2))
        return 0
    print(f"leader: {resp.leader or '-'}   policy: {resp.policy}")
    for d in devices:
        print(f"  {d['id']:<20} {d['kind']:<8} {d['model']}")
    return 0
