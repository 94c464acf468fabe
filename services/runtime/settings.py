"""Process settings: flags and ``MICROCO_*`` environment variables, validated at start-up into a
frozen dataclass. Flags win over the environment, the environment over defaults."""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from microco.common.errors import InvalidArgument
from microco.common.kv import parse_endpoints

PROFILES = ("dev", "prod")


@dataclass(frozen=True)
class ServiceSettings:
    name: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str = ""
    etcd: str = "127.0.0.1:2379"
    redis: str = "redis://127.0.0.1:6379/0"
    metrics_port: int = 0  # 0: pick a free port; -1: no metrics endpoint
    node: str = field(default_factory=socket.gethostname)
    labels: dict[str, str] = field(default_factory=dict)
    data_dir: str = ""
    profile: str = "dev"
    log_level: str = "info"
    log_format: str = "json"
    grace_s: float = 5.0
    lease_ttl_s: int = 5
    max_message_bytes: int = 64 * 1024 * 1024
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is not in 0..65535")
        if not -1 <= self.metrics_port <= 65535:
            problems.append(f"metrics port {self.metrics_port} is not in -1..65535")
        if self.profile not in PROFILES:
            problems.append(f"profile {self.profile!r} is not one of {', '.join(PROFILES)}")
        if self.lease_ttl_s < 1:
            problems.append("lease TTL must be at least 1 second")
        if self.grace_s < 0:
            problems.append("grace period must not be negative")
        if self.max_message_bytes < 1024:
            problems.append("max message size must be at least 1 KiB")
        if self.log_format not in ("json", "text"):
            problems.append("log format must be json or text")
        if not self.redis.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"redis URL {self.redis!r} must start with redis://, rediss:// or unix://")
        try:
            parse_endpoints(self.etcd)
        except InvalidArgument as exc:
            problems.append(str(exc))
        if problems:
            raise InvalidArgument(f"invalid settings for {self.name}: " + "; ".join(problems))

    @property
    def advertised(self) -> str:
        return self.advertise_host or self.host

    def resolved_data_dir(self) -> Path:
        path = Path(self.data_dir or Path.home() / ".microco" / self.name / self.node)
        path.mkdir(parents=True, exist_ok=True)
        return path


def _env(name: str, default: str) -> str:
    return os.environ.get(f"MICROCO_{name}", default)


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every microco service takes."""
    g = parser.add_argument_group("common service options (also from MICROCO_* environment variables)")
    g.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="address to bind (MICROCO_HOST)")
    g.add_argument("--port", type=int, default=int(_env("PORT", "0")), help="gRPC port; 0 picks a free one")
    g.add_argument("--advertise-host", default=_env("ADVERTISE_HOST", ""), help="host others should dial")
    g.add_argument(
        "--etcd", default=_env("ETCD", "127.0.0.1:2379"), help="etcd endpoints host:port[,...] (MICROCO_ETCD)"
    )
    g.add_argument(
        "--redis", default=_env("REDIS", "redis://127.0.0.1:6379/0"), help="Redis URL (MICROCO_REDIS)"
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "0")),
        help="Prometheus /metrics port; 0 picks a free one, -1 disables",
    )
    g.add_argument("--node", default=_env("NODE", socket.gethostname()), help="name of this host")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label to advertise")
    g.add_argument("--data-dir", default=_env("DATA_DIR", ""), help="where this service keeps its files")
    g.add_argument("--profile", default=_env("PROFILE", "dev"), choices=PROFILES, help="dev or prod")
    g.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="the least severe messages logged (MICROCO_LOG_LEVEL)",
    )
    g.add_argument(
        "--log-format",
        default=_env("LOG_FORMAT", "json"),
        choices=["json", "text"],
        help="one JSON object per line, or text for people (MICROCO_LOG_FORMAT)",
    )
    g.add_argument("--grace-s", type=float, default=float(_env("GRACE_S", "5")), help="shutdown grace period")
    g.add_argument("--lease-ttl-s", type=int, default=int(_env("LEASE_TTL_S", "5")), help="etcd lease TTL")
    g.add_argument(
        "--instance-id", default=_env("INSTANCE_ID", ""), help="unique id of this instance (random)"
    )


def settings_from_args(name: str, args: argparse.Namespace) -> ServiceSettings:
    labels = {}
    for item in args.label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidArgument(f"bad --label {item!r}: expected KEY=VALUE")
        labels[k] = v
    return ServiceSettings(
        name=name,
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        etcd=args.etcd,
        redis=args.redis,
        metrics_port=args.metrics_port,
        node=args.node,
        labels=labels,
        data_dir=args.data_dir,
        profile=args.profile,
        log_level=args.log_level,
        log_format=args.log_format,
        grace_s=args.grace_s,
        lease_ttl_s=args.lease_ttl_s,
        **({"instance_id": args.instance_id} if args.instance_id else {}),
    )
