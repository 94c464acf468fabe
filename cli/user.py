"""``microco user add NAME [--admin]``: a user's credentials, issued by the stack's CA;
``microco user revoke NAME``: every certificate of NAME issued until now refused by every
service (a user, or a job as ``job:<id>``)."""

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
    r = users.add_parser(
        "revoke",
        help="refuse NAME's credentials from now on",
        description=(
            "Every service refuses the certificates of NAME issued until now (a deny-list in etcd,\n"
            "followed by every service within seconds). NAME is a user's name, or an identity such\n"
            "as job:<id>. Credentials issued afterwards (`microco user add NAME --force`) work.\n"
            "etcd, which knows a certificate by its name only, loses NAME's etcd user: a user's\n"
            "new credentials add it again, and the revoked ones then reach etcd too until they\n"
            "expire, so give a stolen key's owner new credentials under another name."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("name", help="the user's name, or an identity (user:NAME, job:ID)")
    from ._platform import add_etcd_arguments

    add_etcd_arguments(r)
    r.set_defaults(func=cmd_user_revoke)


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
    _add_etcd_user(home, f"user:{args.name}", args.admin)
    print(f"export MICROCO_CREDENTIALS={path}")
    return 0


def cmd_user_revoke(args: argparse.Namespace) -> int:
    from microco.common.etcd_roles import remove_revoked_user
    from microco.common.identity import revoke, split_name
    from microco.common.kv import EtcdKV

    from ._platform import etcd_for

    name = args.name if ":" in args.name else f"user:{args.name}"
    split_name(name)  # a clear error for a bad name
    address = etcd_for(args)
    kv = EtcdKV(address)
    try:
        revoke(kv, name)
    finally:
        kv.close()
    print(f"{name}: every certificate issued until now is revoked", file=sys.stderr)
    if remove_revoked_user(address, name):
        again = (
            "; `microco user add --force` adds it again, and etcd then lets the revoked "
            "certificates in too until they expire: for a stolen key, issue new credentials "
            "under another name"
        )
        print(
            f"{name}: its etcd user is deleted (etcd knows a certificate by its name only)"
            + (again if name.startswith("user:") else ""),
            file=sys.stderr,
        )
    return 0


def _add_etcd_user(home: Path, name: str, admin: bool) -> None:
    """The user's etcd user in its role, when the stack's etcd runs (`microco up` adds the
    users of <home>/users at its start otherwise)."""
    from microco.common import find_etcd
    from microco.common.errors import MicrocoError
    from microco.common.etcd_roles import EtcdAuth

    try:
        found = find_etcd("", home)
    except MicrocoError:
        return
    if not found.source.endswith(".json"):
        return  # an etcd named by the environment is not this stack's: nothing to add to
    endpoint = found.address
    try:
        auth = EtcdAuth(endpoint.split(",")[0], _admin_identity())
        try:
            auth.add_identity(name, admin)
        finally:
            auth.close()
    except MicrocoError as exc:
        print(f"warning: {name} not added to the stack's etcd ({exc}); `microco up` adds it", file=sys.stderr)


def _admin_identity() -> Any:
    from microco.common.identity import current

    me = current()
    if me is None:
        from microco.common.errors import FailedPrecondition as _FP

        raise _FP("no credentials")
    return me
