"""The console's settings: validated once at start-up, frozen afterwards.

Two tokens: the admin token reads and changes; an optional viewer token only reads. A token is
never taken from the command line alone in production (it would show in ``ps``): use
``MICROCO_CONSOLE_TOKEN`` or ``--token-file``. The well-known development token is accepted only
under the ``dev`` profile, so a production console can never run with it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from microco.common.errors import InvalidArgument
from microco.common.kv import parse_endpoints

# Printed in the docs and used by `microco up` in development; refused under any other profile.
DEFAULT_DEV_TOKEN = "microco-dev-token"
MIN_PROD_TOKEN_LEN = 16
PROFILES = ("dev", "prod")
TOKEN_ENV = "MICROCO_CONSOLE_TOKEN"
VIEW_TOKEN_ENV = "MICROCO_CONSOLE_VIEW_TOKEN"
TOKEN_FILE_NAME = "console-token"
INSECURE_ENV = "MICROCO_CONSOLE_INSECURE_DEV_TOKEN"
TOKEN_COMMAND = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only this machine (127.0.0.0/8, ::1, localhost); "" and 0.0.0.0 do not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything: treated as published


@dataclass(frozen=True)
class ConsoleConfig:
    """Everything the console process needs; ``__post_init__`` refuses unsafe combinations."""

    etcd: str = "127.0.0.1:2379"
    redis: str = "redis://127.0.0.1:6379/0"
    profile: str = "dev"
    token: str = ""  # admin: read and change ("" in dev means DEFAULT_DEV_TOKEN)
    view_token: str = ""  # optional read-only token
    host: str = "127.0.0.1"
    http_port: int = 8080
    advertise_host: str = ""
    instance_id: str = field(default_factory=lambda: f"console-{uuid.uuid4().hex[:6]}")
    node: str = field(default_factory=socket.gethostname)
    data_dir: str = ""
    rpc_timeout_s: float = 5.0
    health_timeout_s: float = 1.0
    sample_every_s: float = 2.0  # how often the recorder samples jobs and caches for the plots
    history_limit: int = 2000  # samples kept per series in Redis
    lease_ttl_s: int = 5
    log_level: str = "info"
    log_format: str = "json"
    # Serve the well-known development token on a non-loopback address anyway (a lab network
    # with nobody else on it); refused without this, and warned about on every start with it.
    insecure_dev_token: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.profile not in PROFILES:
            problems.append(f"profile {self.profile!r} is not one of {', '.join(PROFILES)}")
        if not 0 <= self.http_port <= 65535:
            problems.append(f"HTTP port {self.http_port} is not in 0..65535")
        if not self.token and self.profile == "dev":
            object.__setattr__(self, "token", DEFAULT_DEV_TOKEN)
        if self.profile != "dev":
            if not self.token:
                problems.append(
                    f"an admin token is required outside the dev profile (set {TOKEN_ENV} or --token-file)"
                )
            elif self.token == DEFAULT_DEV_TOKEN:
                problems.append("the default development token is refused outside the dev profile")
            elif len(self.token) < MIN_PROD_TOKEN_LEN:
                problems.append(f"the admin token must be at least {MIN_PROD_TOKEN_LEN} characters")
            if self.view_token == DEFAULT_DEV_TOKEN:
                problems.append("the default development token is refused outside the dev profile")
        if (
            DEFAULT_DEV_TOKEN in (self.token, self.view_token)
            and not is_loopback(self.host)
            and not self.insecure_dev_token
        ):
            problems.append(
                f"the default development token is refused on {self.host or 'all interfaces'} (not a "
                f"loopback address: anyone who reaches it could run jobs); set a token "
                f"({TOKEN_ENV} or --token-file, e.g. from `{TOKEN_COMMAND}`), bind 127.0.0.1, or pass "
                "--insecure-dev-token for a network where that is acceptable"
            )
        if self.view_token and self.view_token == self.token:
            problems.append("the viewer token must differ from the admin token")
        if any(c.isspace() for c in self.token + self.view_token):
            problems.append("tokens must not contain whitespace")
        if self.rpc_timeout_s <= 0 or self.health_timeout_s <= 0:
            problems.append("timeouts must be positive")
        if self.sample_every_s <= 0:
            problems.append("the sampling interval must be positive")
        if self.history_limit < 10:
            problems.append("history limit must be at least 10")
        if not self.redis.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"redis URL {self.redis!r} must start with redis://, rediss:// or unix://")
        try:
            parse_endpoints(self.etcd)
        except InvalidArgument as exc:
            problems.append(str(exc))
        if problems:
            raise InvalidArgument("invalid console settings: " + "; ".join(problems))

    @property
    def uses_default_token(self) -> bool:
        return self.token == DEFAULT_DEV_TOKEN

    def start_warnings(self) -> list[str]:
        """What the console says on every start about its token (logged and printed)."""
        out = []
        if self.uses_default_token and not is_loopback(self.host):
            out.append(
                f"INSECURE: serving the well-known development token on {self.host or 'all interfaces'} "
                "(--insecure-dev-token): anyone who reaches this port can submit jobs, i.e. run code"
            )
        elif self.uses_default_token:
            out.append(
                f"using the default development token on {self.host}; set {TOKEN_ENV} for anything shared"
            )
        return out

    def with_port(self, port: int) -> ConsoleConfig:
        return replace(self, http_port=port)


def add_console_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m microco.services.console`` (the common service flags are added too)."""
    g = parser.add_argument_group("console options")
    g.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ.get("MICROCO_CONSOLE_PORT", "8080")),
        help="HTTP port of the REST API and web page; 0 picks a free one (MICROCO_CONSOLE_PORT)",
    )
    g.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file holding the admin token (else {TOKEN_ENV}; in the dev profile the default dev token)",
    )
    g.add_argument(
        "--view-token-file",
        type=Path,
        default=None,
        help=f"file holding a read-only token (else {VIEW_TOKEN_ENV})",
    )
    g.add_argument(
        "--insecure-dev-token",
        action="store_true",
        default=os.environ.get(INSECURE_ENV, "") in ("1", "true", "yes"),
        help=(
            "allow the well-known development token on a non-loopback address (refused without it; "
            f"warned about on every start) ({INSECURE_ENV}=1)"
        ),
    )
    g.add_argument(
        "--sample-every-s",
        type=float,
        default=2.0,
        help="how often job and cache figures are sampled for the plots (default 2 s)",
    )


def _read_token(path: Path | None, env: str) -> str:
    if path is not None:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read token file {path}: {exc}") from exc
    return os.environ.get(env, "").strip()


def config_from_args(args: argparse.Namespace) -> ConsoleConfig:
    """Build and validate the configuration from parsed flags (common flags plus console flags)."""
    return ConsoleConfig(
        etcd=args.etcd,
        redis=args.redis,
        profile=args.profile,
        token=_read_token(args.token_file, TOKEN_ENV),
        view_token=_read_token(args.view_token_file, VIEW_TOKEN_ENV),
        host=args.host,
        http_port=args.http_port,
        advertise_host=args.advertise_host,
        node=args.node,
        data_dir=args.data_dir,
        lease_ttl_s=args.lease_ttl_s,
        log_level=args.log_level,
        log_format=args.log_format,
        sample_every_s=args.sample_every_s,
        insecure_dev_token=bool(getattr(args, "insecure_dev_token", False)),
        **({"instance_id": args.instance_id} if args.instance_id else {}),
    )
