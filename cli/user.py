"""``microco user add NAME [--admin]``: a user's credentials, issued by the stack's CA."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "user",
        help="users and their credentials",
        description="Issue credentials (a certificate and key from the stack's CA) to a user.",
    )
    users = p.add_subparsers(dest="user_command", metavar="SUBCOMMAND", required=True)
    a = users.add_parser(
        "add",
        help="issue NAME's credentials file",
        description=(
            "Write NAME's credentials (certificate, key, CA certificate; readable by its owner only)\n"
            "to <home>/users/NAME.pem, or --out. The CLI and the SDK use them when\n"
            "MICROCO_CREDENTIALS names the file. A user acts on their own jobs, datasets and tables;\n"
            "an administrator (--admin) on everyone's."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("name", help="the user's name (letters, digits, - _ . @)")
    a.add_argument("--admin", action="store_true", help="an administrator: acts on every user's resources")
    a.add_argument("--home", type=Path, default=None, help="as given to `microco up` (where its CA is)")
    a.add_argument("--out", type=Path, default=None, help="where to write (default <home>/users/NAME.pem)")
    a.add_argument("--force", action="store_true", help="replace an existing file")
    a.set_defaults(func=cmd_user_add)


def cmd_user_add(args: argparse.Namespace) -> int:
    from microco.common import stack_home
    from microco.common.errors import FailedPrecondition
    from microco.common.identity import CertificateAuthority, split_name
    from microco.services.stack import stack_ca_dir as ca_dir

    home = stack_home(args.home)
    split_name(f"user:{args.name}")  # a clear error for a bad name
    out = args.out or home / "users" / f"{args.name}.pem"
    if out.exists() and not args.force:
        raise FailedPrecondition(f"{out} exists (--force replaces it)")
    ca = CertificateAuthority.load(ca_dir(home))
    path = ca.issue(f"user:{args.name}", admin=args.admin, days=365).write(out)
    role = "administrator" if args.admin else "user"
    print(f"{role} {args.name}: credentials written to {path}", file=sys.stderr)
    print(f"export MICROCO_CREDENTIALS={path}")
    return 0
