"""The ``microco`` command line.

Platform commands live here (``up``, ``down``, ``status``, ``bench``); each system adds its
own group from ``cli/<system>.py`` through a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from ._flags import add_global_flags, share_flags
from ._platform import etcd_for as etcd_for  # the command modules call it as `from . import etcd_for`
from ._platform import register as register_platform

# System command groups, in the order ``--help`` lists them. A module that is not part of this
# build is skipped (and said so by ``microco --help``).
SYSTEM_MODULES = ("job", "sim", "cache", "store", "compiler", "console", "user")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="microco",
        description=(
            "microco: micro co-design for GPU training and analytics clusters.\n"
            "Gandiva schedules training jobs at mini-batch boundaries, Quiver caches training data\n"
            "by content, Instalytics stores tables as three differently partitioned replicas, and\n"
            "Astra tunes training steps online. `microco up` runs it all on one machine."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"microco {_version()}")
    add_global_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_platform(sub)
    missing = []
    for name in SYSTEM_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(f"{__name__}.{name}"):
                missing.append(name)
                continue
            raise
        module.register(sub)
    if missing:
        parser.epilog = "not in this build: " + ", ".join(missing)
    share_flags(parser)  # every flag above a command is accepted after it too
    return parser


def _version() -> str:
    import microco

    return microco.__version__


def _credentials_from_home(args: argparse.Namespace) -> None:
    """``--home H`` names a stack: its administrator's credentials and its Redis password are
    used unless the environment names others."""
    from microco.common import identity
    from microco.common.hotstate import ENV_REDIS_PASSWORD, ENV_REDIS_PASSWORD_FILE

    home = getattr(args, "home", None)
    if home is None:
        return
    password = Path(home) / "pki" / "redis.password"
    if password.exists() and not (
        os.environ.get(ENV_REDIS_PASSWORD) or os.environ.get(ENV_REDIS_PASSWORD_FILE)
    ):
        os.environ[ENV_REDIS_PASSWORD_FILE] = str(password)
    if os.environ.get(identity.ENV_CREDENTIALS) or os.environ.get(identity.ENV_CREDENTIALS_PEM):
        return
    path = Path(home) / "credentials.pem"
    if path.exists():
        os.environ[identity.ENV_CREDENTIALS] = str(path)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # after parsing: `microco --help` and bad flags never load gRPC (microco.common does)
    from microco.common.errors import MicrocoError

    _credentials_from_home(args)
    try:
        return int(args.func(args) or 0)
    except MicrocoError as exc:
        print(f"microco {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
