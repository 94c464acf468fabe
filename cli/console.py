"""``microco console open | token``: find the admin console and sign in to it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ._platform import add_etcd_arguments


def register(sub: Any) -> None:
    p = sub.add_parser(
        "console",
        help="the admin console (REST API and web page)",
        description=(
            "The console serves a REST API (OpenAPI at /api/v1/openapi.json) and a web page with\n"
            "services, jobs and their device timelines, cache hit rates, store tables and compiler\n"
            "explorations. Sign in with the console token."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = p.add_subparsers(dest="console_command", metavar="SUBCOMMAND", required=True)

    o = csub.add_parser("open", help="print the console's URL (found in etcd) and open it in a browser")
    add_etcd_arguments(o)
    o.add_argument("--no-browser", action="store_true", help="only print the URL")
    o.set_defaults(func=cmd_open)

    t = csub.add_parser(
        "token",
        help="print the token to sign in with",
        description=(
            "Prints MICROCO_CONSOLE_TOKEN when set; otherwise the token of the stack `microco up` started\n"
            "from --home (made once, in <home>/pki/console-token, readable by its owner only); otherwise,\n"
            "in the dev profile, the default development token (which a console outside the dev profile\n"
            "refuses, and which a stack started by `microco up` does not use)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument(
        "--profile",
        default=os.environ.get("MICROCO_PROFILE", "dev"),
        choices=["dev", "prod"],
        help="the console's profile (default MICROCO_PROFILE, else dev): only dev falls back to the development token",
    )
    t.add_argument(
        "--home", type=Path, default=None, help="as given to `microco up` (default ~/.microco, MICROCO_HOME)"
    )
    t.set_defaults(func=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    from microco.common.errors import FailedPrecondition
    from microco.services.console import DEFAULT_DEV_TOKEN, TOKEN_ENV
    from microco.services.stack import console_token_file, default_home

    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        print(token)
        return 0
    path = console_token_file(args.home or default_home())
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    except OSError as exc:
        raise FailedPrecondition(f"cannot read the stack's console token {path}: {exc}") from exc
    if token:
        print(token)
        return 0
    if args.profile != "dev":
        raise FailedPrecondition(f"{TOKEN_ENV} is not set; outside the dev profile there is no default token")
    print(DEFAULT_DEV_TOKEN)
    print(f"(the default development token; set {TOKEN_ENV} for anything shared)", file=sys.stderr)
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    from microco.common.errors import FailedPrecondition
    from microco.common.kv import EtcdKV
    from microco.common.registry import discover

    from . import etcd_for

    kv = EtcdKV(etcd_for(args))
    try:
        records = discover(kv, "console")
    finally:
        kv.close()
    if not records:
        raise FailedPrecondition("no console is registered in etcd: start one with `microco up`")
    urls = [f"http://{r.address}/" for r in sorted(records, key=lambda r: r.instance_id)]
    for url in urls:
        print(url)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(urls[0])
    return 0
