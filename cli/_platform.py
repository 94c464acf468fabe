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

from ._lazy import PolicyFlag

if TYPE_CHECKING:
    from microco.services.stack import Stack, StackOptions

BENCHMARKS = ("scheduler", "sim", "cache", "store", "compiler", "codesign", "faults")


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
    p.add_argument(
        "--home", type=Path, default=None, help="state, logs and data (default ~/.microco, MICROCO_HOME)"
    )
    p.add_argument("--etcd", default="", help="use this running etcd (host:port) instead of starting one")
    p.add_argument("--redis", default="", help="use this running Redis (redis://...) instead of starting one")
    p.add_argument(
        "--etcd-port", type=int, default=0, help="port for the etcd it starts (default: free port)"
    )
    p.add_argument(
        "--redis-port", type=int, default=0, help="port for the Redis it starts (default: free port)"
    )
    p.add_argument("--devices", type=int, default=4, help="virtual devices the node agent offers (default 4)")
    p.add_argument(
        "--store-nodes", type=int, default=6, help="store nodes, one fault domain each (default 6)"
    )
    p.add_argument("--cache-capacity-mb", type=int, default=256, help="cache server capacity (default 256)")
    p.add_argument(
        "--preload",
        default="auto",
        metavar="MODULES",
        help="what the node agent imports once for Python jobs to start from by fork: auto (NumPy and "
        "PyTorch when installed), none (each job starts its own interpreter), or a comma-separated "
        "module list (default auto)",
    )
    p.add_argument(
        "--console-port",
        type=int,
        default=None,
        help="console HTTP port (default 8080, or MICROCO_CONSOLE_PORT; 0: a free port)",
    )
    p.add_argument("--no-console", action="store_true", help="do not start the console")
    p.add_argument(
        "--no-standby",
        action="store_true",
        help="no standby scheduler or store coordinator (saves two processes on small machines)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="start, print, and return, leaving a supervisor in the background (stop with `microco down`)",
    )
    p.add_argument(
        "--policy",
        default="gandiva",
        metavar="NAME",
        action=PolicyFlag,
        help="the schedulers' policy, by the names `microco sim --policy` takes: {policies} (default gandiva)",
    )
    p.add_argument(
        "--policy-config",
        default="",
        metavar="FILE|JSON",
        help="the policy's settings: a JSON file, or JSON text such as '{\"quantum_s\": 10}'",
    )
    p.add_argument("--demo", action="store_true", help="once up, run the demo scenario through every system")
    p.add_argument("--exit-after-demo", action="store_true", help="with --demo: stop the stack when it ends")
    p.add_argument(
        "--demo-jobs", type=int, default=5, help="with --demo: training jobs to submit (default 5)"
    )
    p.add_argument("--demo-epochs", type=int, default=3, help="with --demo: epochs per job (default 3)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for health (default 120)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="DEVELOPMENT ONLY: no TLS, no authentication, no authorisation (clients then need MICROCO_INSECURE=1)",
    )
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
    p.add_argument("system", choices=BENCHMARKS, help="whose benchmark to run")
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
    from microco.common.errors import InvalidArgument

    if flag is not None:
        return flag
    text = os.environ.get("MICROCO_CONSOLE_PORT", "").strip()
    if not text:
        return 8080
    if not text.isdigit() or int(text) > 65535:
        raise InvalidArgument(f"MICROCO_CONSOLE_PORT={text!r} is not a port number")
    return int(text)


def stack_options(args: argparse.Namespace) -> StackOptions:
    """``microco up``'s flags as the stack's options, every one checked before anything starts."""
    from microco.common.errors import InvalidArgument
    from microco.services.stack import StackOptions, resolve_policy

    if args.devices < 1:
        raise InvalidArgument("--devices must be at least 1")
    if args.demo_jobs < 1 or args.demo_epochs < 1:
        raise InvalidArgument("--demo-jobs and --demo-epochs must be at least 1")
    if args.store_nodes < 3:
        raise InvalidArgument("--store-nodes must be at least 3 (one per replica)")
    policy, policy_config = resolve_policy(args.policy, args.policy_config)
    return StackOptions(
        home=_home(args),
        etcd=args.etcd,
        redis=args.redis,
        etcd_port=args.etcd_port,
        redis_port=args.redis_port,
        devices=args.devices,
        preload=args.preload,
        store_nodes=args.store_nodes,
        cache_capacity_mb=args.cache_capacity_mb,
        console_port=_console_port(args.console_port),
        console=not args.no_console,
        standbys=not args.no_standby,
        policy=policy,
        policy_config=policy_config,
        insecure=args.insecure,
    )


def cmd_up(args: argparse.Namespace) -> int:
    from microco.services.stack import Stack

    opts = stack_options(args)
    if args.detach:
        return _up_detached(args, opts.home, args.timeout, describe_policy(opts.policy, opts.policy_config))
    stack = Stack(opts, progress=_say)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # stop as Ctrl-C does (a stack still starting stops what it started)

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C stops the stack even when this process was started with SIGINT ignored (a script's
    # background `&` without job control ignores it): "Ctrl-C to stop" is the supervisor's interface.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    # A Ctrl-C from the start on is a stop, whenever it comes: while the services start (the
    # stack stops what it started), between the state file's last "healthy" and this table
    # (found on a busy CI host: "interrupted", exit 130, no "stopping"), or while running.
    try:
        stack.start(timeout=args.timeout)
        print_table(stack_rows(stack))
        _say(f"up in {time.monotonic() - t0:.1f}s; etcd {stack.etcd_endpoint}, redis {stack.redis_url}")
        _say(f"scheduling policy: {describe_policy(opts.policy, opts.policy_config)}")
        console = next((c.record for c in stack.children if c.spec.name == "console" and c.record), None)
        if console:
            _say(
                f"console: http://{console.address}/ (sign in with the token `microco console token"
                + (f" --home {args.home}" if args.home else "")
                + "` prints)"
            )
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
        _say("running; a service that exits is restarted; Ctrl-C to stop")
        while True:
            stack.supervise()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_stack(stack)
    return 0


def describe_policy(name: str, config: dict[str, Any]) -> str:
    """``gandiva (quantum_s=10, enable_packing=no)``: the policy and the settings given."""
    from ._format import cell

    given = ", ".join(f"{k}={cell(v)}" for k, v in sorted(config.items()))
    return f"{name} ({given})" if given else f"{name} (its defaults)"


def _up_detached(args: argparse.Namespace, home: Path, timeout: float, policy: str = "") -> int:
    """``microco up --detach``: the same ``microco up`` (without ``--detach``) as a background
    supervisor in a session of its own, so crashed services are restarted after this command
    returns; wait until it reports the stack healthy, print where each service listens, return.
    ``microco down`` asks that supervisor to stop everything."""
    from microco.common.errors import FailedPrecondition
    from microco.services.runtime.launch import start_service
    from microco.services.stack import any_alive, read_state

    existing = read_state(home)
    if existing and any_alive(existing):
        raise FailedPrecondition(
            f"a stack started from {home} is still running (pids in {home / 'stack.json'}); run `microco down` first"
        )
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    (home / "logs").mkdir(parents=True, exist_ok=True)
    log_path = home / "logs" / "supervisor.log"
    proc = start_service("microco.cli", argv, log_path=log_path, new_session=True)
    deadline = time.monotonic() + timeout + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise FailedPrecondition(
                f"`microco up` exited with code {proc.returncode}; its log ends:\n{tail}"
            )
        state = read_state(home)
        if state and state.get("supervisor_pid") == proc.pid:
            services = [p for p in state["processes"] if p["name"] not in ("etcd", "redis")]
            if services and all(p.get("status") in ("healthy", "absent") for p in services):
                print_table(
                    [
                        {k: p.get(k, "") for k in ("name", "address", "status", "pid")}
                        for p in state["processes"]
                    ]
                )
                if policy:
                    _say(f"scheduling policy: {policy}")
                _say(
                    f"detached; the supervisor (pid {proc.pid}) restarts crashed services and logs to {log_path}"
                )
                _say("stop with `microco down" + (f" --home {args.home}" if args.home else "") + "`")
                return 0
        time.sleep(0.3)
    proc.terminate()
    raise FailedPrecondition(f"the stack was not healthy in {timeout:.0f}s; see {log_path}")


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
    # stopped: a Ctrl-C from here on has nothing left to stop (it would only turn this exit into
    # "interrupted")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


# What a platform cannot work without; `microco status` names any of these that is missing.
REQUIRED_SERVICES = ("scheduler", "agent", "cache", "store", "store-node", "compiler")


def cmd_status(args: argparse.Namespace) -> int:
    """Every registered service with its health and role, plus what should be there and is not:
    the processes of the stack `microco up` started against this etcd (from its state file), or
    else one instance of each required service. Exit status 1 when anything required is missing
    or not serving, or an elected service has no leader; the culprits are listed on stderr."""
    from microco.common.election import LEADER_PREFIX
    from microco.common.health import check_health
    from microco.common.kv import EtcdKV
    from microco.common.registry import discover
    from microco.services.stack import read_state

    endpoint = etcd_for(args)
    kv = EtcdKV(endpoint)
    try:
        records = sorted(discover(kv), key=lambda r: (r.name, r.instance_id))
        leaders = {k[len(LEADER_PREFIX) :]: v.decode() for k, v in kv.get_prefix(LEADER_PREFIX)}
    finally:
        kv.close()
    rows: list[dict[str, Any]] = []
    for rec in records:
        role = rec.labels.get("role", "")
        if rec.name in leaders:
            role = "leader" if leaders[rec.name] == rec.instance_id else "standby"
        rows.append(
            {
                "service": rec.name,
                "instance": rec.instance_id,
                "address": rec.address,
                "health": check_health(rec),
                "node": rec.labels.get("node", ""),
                "role": role,
                "metrics": rec.metrics_address,
                "up_s": round(time.time() - rec.started_at, 1) if rec.started_at else None,
            }
        )
    problems = [f"{r['instance']} ({r['health']})" for r in rows if r["health"] != "SERVING"]
    state = read_state(_home(args))
    if state and state.get("etcd") == endpoint:
        present = {r["instance"] for r in rows}
        for p in state.get("processes", []):
            if p["name"] in ("etcd", "redis") or p.get("status") == "absent" or not p.get("instance_id"):
                continue
            if p["instance_id"] not in present:
                said = p.get("status", "")
                health = "MISSING" + (f" ({said})" if said and said != "healthy" else "")
                rows.append(
                    {
                        "service": p.get("spec", {}).get("service", p["name"]),
                        "instance": p["instance_id"],
                        "address": "",
                        "health": health,
                        "node": "",
                        "role": "",
                        "metrics": "",
                        "up_s": None,
                    }
                )
                problems.append(f"{p['instance_id']} ({health})")
        if state.get("redis"):
            rows.append(_redis_row(state["redis"], _home(args)))
            if rows[-1]["health"] != "SERVING":
                problems.append(f"redis ({rows[-1]['health']})")
    else:
        names = {r["service"] for r in rows}
        for name in REQUIRED_SERVICES:
            if name not in names:
                rows.append(
                    {
                        "service": name,
                        "instance": "",
                        "address": "",
                        "health": "MISSING",
                        "node": "",
                        "role": "",
                        "metrics": "",
                        "up_s": None,
                    }
                )
                problems.append(f"{name} (MISSING)")
    for name in sorted({r["service"] for r in rows if r["role"] in ("leader", "standby")}):
        if not any(r["service"] == name and r["role"] == "leader" and r["health"] == "SERVING" for r in rows):
            problems.append(f"{name} (no serving leader)")
    if args.json:
        print(json.dumps({"services": rows, "problems": problems}, indent=2))
    else:
        print_table(rows)
    if problems:
        _say("not healthy: " + ", ".join(problems))
        return 1
    return 0


def _redis_row(url: str, home: Path) -> dict[str, Any]:
    """Redis of the stack started from ``home``, checked with that stack's password (not one the
    environment names for some other Redis: that made a healthy Redis look unreachable)."""
    from urllib.parse import quote

    from microco.common.errors import Unavailable
    from microco.common.hotstate import connect_redis

    secret = home / "pki" / "redis.password"
    if "@" not in url.split("//", 1)[-1] and secret.is_file():
        scheme, rest = url.split("//", 1)
        url_with = f"{scheme}//:{quote(secret.read_text().strip(), safe='')}@{rest}"
    else:
        url_with = url
    try:
        connect_redis(url_with, timeout=1.0).close()
        health = "SERVING"
    except Unavailable:
        health = "UNREACHABLE"
    return {
        "service": "redis",
        "instance": "redis",
        "address": url,
        "health": health,
        "node": "",
        "role": "",
        "metrics": "",
        "up_s": None,
    }


def stack_rows(stack: Any) -> list[dict[str, Any]]:
    rows = []
    if stack.etcd:
        rows.append(
            {"service": "etcd", "address": stack.etcd_endpoint, "status": "running", "pid": stack.etcd.pid}
        )
    if stack.redis:
        rows.append(
            {"service": "redis", "address": stack.redis_url, "status": "running", "pid": stack.redis.pid}
        )
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
    from microco.common.errors import FailedPrecondition

    try:
        module = importlib.import_module(f"microco.benchmarks.{args.system}")
    except ModuleNotFoundError as exc:
        raise FailedPrecondition(f"the {args.system} benchmark is not part of this build") from exc
    return int(module.main(list(args.args)) or 0)
