"""``microco up | down | status | bench``: the platform as a whole."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microco.common.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from microco.services.stack import Stack

BENCHMARKS = ("scheduler", "sim", "cache", "store", "compiler")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="run the whole platform on this machine",
        description=(
            "Start a real etcd and Redis (from the pip-installed binaries unless --etcd/--redis name\n"
            "running ones), every microco service, a node agent with virtual devices and the console;\n"
            "wait until all are healthy, show where each listens, and keep running until Ctrl-C\n"
            "(or `microco down` from another shell), then stop everything cleanly."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--home", type=Path, default=None, help="state, logs and data (default ~/.microco, MICROCO_HOME)")
    p.add_argument("--etcd", default="", help="use this running etcd (host:port) instead of starting one")
    p.add_argument("--redis", default="", help="use this running Redis (redis://...) instead of starting one")
    p.add_argument("--etcd-port", type=int, default=0, help="port for the etcd it starts (default: free port)")
    p.add_argument("--redis-port", type=int, default=0, help="port for the Redis it starts (default: free port)")
    p.add_argument("--devices", type=int, default=4, help="virtual devices the node agent offers (default 4)")
    p.add_argument("--store-nodes", type=int, default=6, help="store nodes, one fault domain each (default 6)")
    p.add_argument("--cache-capacity-mb", type=int, default=256, help="cache server capacity (default 256)")
    p.add_argument(
        "--console-port",
        type=int,
        default=None,
        help="console HTTP port (default 8080, or MICROCO_CONSOLE_PORT; 0: a free port)",
    )
    p.add_argument("--no-console", action="store_true", help="do not start the console")
    p.add_argument("--detach", action="store_true", help="start, print, and return (stop with `microco down`)")
    p.add_argument("--demo", action="store_true", help="once up, run the demo scenario through every system")
    p.add_argument("--exit-after-demo", action="store_true", help="with --demo: stop the stack when it ends")
    p.add_argument("--demo-jobs", type=int, default=5, help="with --demo: training jobs to submit (default 5)")
    p.add_argument("--demo-epochs", type=int, default=3, help="with --demo: epochs per job (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for health (default 120)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop a platform started by `microco up`")
    p.add_argument("--home", type=Path, default=None, help="as given to `microco up`")
    p.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL (default 10)")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser(
        "status",
        help="show which services are alive (read from etcd) and their health",
        description="List every service registered in etcd, with its address and gRPC/HTTP health.",
    )
    add_etcd_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "bench",
        help="run a system's benchmark (JSON on stdout)",
        description="Run a benchmark: " + ", ".join(BENCHMARKS) + ". Extra arguments go to it (try --help).",
    )
    p.add_argument("system", choices=BENCHMARKS)
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark, e.g. --quick --json")
    p.set_defaults(func=cmd_bench)


def add_etcd_arguments(p: argparse.ArgumentParser) -> None:
    """``--etcd`` and ``--home``: how every command that talks to the platform finds its etcd
    (:func:`etcd_for`)."""
    p.add_argument("--etcd", default="", help="etcd endpoint (default: MICROCO_ETCD or the running stack's)")
    p.add_argument("--home", type=Path, default=None, help="as given to `microco up` (where it finds etcd)")


def _home(args: argparse.Namespace) -> Path:
    from microco.common import stack_home

    return stack_home(getattr(args, "home", None))


def _say(msg: str) -> None:
    print(f"[microco] {msg}", file=sys.stderr, flush=True)


def _console_port(flag: int | None) -> int:
    if flag is not None:
        return flag
    text = os.environ.get("MICROCO_CONSOLE_PORT", "").strip()
    if not text:
        return 8080
    if not text.isdigit() or int(text) > 65535:
        raise InvalidArgument(f"MICROCO_CONSOLE_PORT={text!r} is not a port number")
    return int(text)


def cmd_up(args: argparse.Namespace) -> int:
    from microco.services.stack import Stack, StackOptions

    if args.devices < 1:
        raise InvalidArgument("--devices must be at least 1")
    if args.demo_jobs < 1 or args.demo_epochs < 1:
        raise InvalidArgument("--demo-jobs and --demo-epochs must be at least 1")
    if args.store_nodes < 3:
        raise InvalidArgument("--store-nodes must be at least 3 (one per replica)")
    opts = StackOptions(
        home=_home(args),
        etcd=args.etcd,
        redis=args.redis,
        etcd_port=args.etcd_port,
        redis_port=args.redis_port,
        devices=args.devices,
        store_nodes=args.store_nodes,
        cache_capacity_mb=args.cache_capacity_mb,
        console_port=_console_port(args.console_port),
        console=not args.no_console,
    )
    stack = Stack(opts, progress=_say)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # stop as Ctrl-C does (a stack still starting stops what it started)

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    stack.start(timeout=args.timeout)
    print_table(stack_rows(stack))
    _say(f"up in {time.monotonic() - t0:.1f}s; etcd {stack.etcd_endpoint}, redis {stack.redis_url}")
    console = next((c for c in stack.children if c.spec.name == "console" and c.record), None)
    if console:
        _say(f"console: http://{console.record.address}/ (sign in with the token `microco console token` prints)")
    if args.detach:
        _say("detached; stop with `microco down" + (f" --home {args.home}" if args.home else "") + "`")
        stack.children = []  # keep them running; the state file lets `microco down` stop them
        stack.etcd = stack.redis = None
        return 0
    try:
        if args.demo:
            from microco.examples.demo import run_demo

            run_demo(
                etcd=stack.etcd_endpoint,
                redis=stack.redis_url,
                home=opts.home,
                progress=_say,
                jobs=args.demo_jobs,
                epochs=args.demo_epochs,
            )
            if not args.exit_after_demo:
                _say("the platform stays up so you can look around in the console; Ctrl-C stops it")
            if args.exit_after_demo:
                return 0
        _say("running; Ctrl-C to stop")
        while True:
            for child in stack.children:
                if child.proc is not None and child.proc.poll() is not None and child.status == "healthy":
                    child.status = f"exited ({child.proc.returncode})"
                    _say(f"{child.spec.name} exited with code {child.proc.returncode}; see {opts.home}/logs")
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_stack(stack)
    return 0


def _stop_stack(stack: Stack) -> None:
    """Stop the stack gracefully; a second Ctrl-C (or SIGTERM) while it stops kills what is
    left at once rather than leaving etcd, Redis or a service running without its supervisor."""
    try:
        _say("stopping (Ctrl-C again to stop without waiting)")
        stack.stop()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _say("stopping at once")
        stack.stop(grace=0)
    _say("stopped")


def cmd_down(args: argparse.Namespace) -> int:
    from microco.services.stack import stop_from_state

    n = stop_from_state(_home(args), grace=args.grace, progress=_say)
    _say(f"stopped {n} process{'' if n == 1 else 'es'}")
    return 0


def etcd_for(args: argparse.Namespace) -> str:
    """The etcd endpoint a system command talks to, found as every client finds it
    (:func:`microco.common.find_etcd`): `--etcd`, then `MICROCO_ETCD`, then the stack
    `microco up` started from `--home` (MICROCO_HOME, ~/.microco)."""
    from microco.common import find_etcd

    return find_etcd(getattr(args, "etcd", ""), getattr(args, "home", None)).address


def cmd_status(args: argparse.Namespace) -> int:
    from microco.common.kv import EtcdKV
    from microco.common.registry import discover
    from microco.common.health import check_health

    kv = EtcdKV(etcd_for(args))
    try:
        rows = []
        for rec in sorted(discover(kv), key=lambda r: (r.name, r.instance_id)):
            rows.append(
                {
                    "service": rec.name,
                    "instance": rec.instance_id,
                    "address": rec.address,
                    "health": check_health(rec),
                    "node": rec.labels.get("node", ""),
                    "role": rec.labels.get("role", ""),
                    "metrics": rec.metrics_address,
                    "up_s": round(time.time() - rec.started_at, 1) if rec.started_at else None,
                }
            )
    finally:
        kv.close()
    if args.json:
        print(json.dumps({"services": rows}, indent=2))
    elif rows:
        print_table(rows)
    else:
        print("no services registered")
    return 0 if rows and all(r["health"] == "SERVING" for r in rows) else 1


def stack_rows(stack: Any) -> list[dict[str, Any]]:
    rows = []
    if stack.etcd:
        rows.append({"service": "etcd", "address": stack.etcd_endpoint, "status": "running", "pid": stack.etcd.pid})
    if stack.redis:
        rows.append({"service": "redis", "address": stack.redis_url, "status": "running", "pid": stack.redis.pid})
    for c in stack.children:
        rows.append(
            {
                "service": c.spec.name,
                "address": c.record.address if c.record else "",
                "status": c.status,
                "pid": c.proc.pid if c.proc else "",
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """Rows under an upper-case header, numbers formatted for people (``_format``)."""
    from ._format import print_table as _print

    _print(rows)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(f"microco.benchmarks.{args.system}")
    except ModuleNotFoundError as exc:
        raise FailedPrecondition(f"the {args.system} benchmark is not part of this build") from exc
    return int(module.main(list(args.args)) or 0)
