"""Run the bundled etcd or Redis in the foreground (containers and Kubernetes use this, so every
image and command of the deployment comes from this repository):

    python -m microco.services.stack etcd --host 0.0.0.0 --port 2379 --advertise-host etcd --data-dir /data
    python -m microco.services.stack redis --host 0.0.0.0 --port 6379 --data-dir /data --password-file /pki/redis.password
    python -m microco.services.stack pki --data-dir /pki --per-container /pki/containers --service scheduler --admin alice
    python -m microco.services.stack etcd-roles --data-dir /pki --etcd etcd:2379 --service scheduler --admin alice

``pki`` creates the CA (``<data-dir>/ca``, once), a credentials file per service
(``<data-dir>/services/<name>.pem``, identity ``service:<name>``), the administrators' credentials
(``<data-dir>/users/<name>.pem``), the Redis password (``<data-dir>/redis.password``) and Redis's
server certificate; it keeps what exists. etcd's and Redis's certificates name the hosts they are
dialled by (etcd, etcd.microco.svc; redis, redis.microco.svc) and are also written as separate
files, ``<data-dir>/{etcd,redis}/{cert,key,ca}.pem``, for the official images. With
``--per-container DIR`` it also writes, for each container, only what that container may hold into
``DIR/<name>/`` (what compose and Kubernetes mount, one directory per container; nothing of anyone
else's, never an administrator's): a service's ``credentials.pem``, plus ``redis.password`` for
Redis's clients (agent, cache, console); etcd's and Redis's ``cert.pem``, ``key.pem``, ``ca.pem``
(etcd also its ``credentials.pem``; Redis its password).

``etcd-roles`` turns on the authentication of a running etcd with the roles ``microco up`` sets up
(``microco.common.etcd_roles``): a user per ``--service`` and ``--admin``, each in its role, as
``service:stack``, issued from the CA in ``<data-dir>/ca`` (or ``--ca-dir``). It waits for etcd (``--timeout``) and
may run again (compose's and Kubernetes' one-shot: docs/security.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._servers import EtcdServer, RedisServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m microco.services.stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "server",
        choices=["etcd", "redis", "pki", "etcd-roles"],
        help="what to run: etcd or Redis in the foreground, or a one-shot (above)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="etcd and redis: required")
    parser.add_argument("--peer-port", type=int, default=2380, help="etcd only")
    parser.add_argument("--advertise-host", default="", help="etcd only: the name clients dial")
    parser.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="etcd's or Redis's data; pki and etcd-roles: the PKI's files",
    )
    parser.add_argument("--password-file", type=Path, default=None, help="redis only: require this password")
    parser.add_argument(
        "--per-container",
        type=Path,
        default=None,
        help="pki only: also write each container's own files into DIR/<name>/",
    )
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        help="pki: issue service:NAME; etcd-roles: its etcd user (repeat)",
    )
    parser.add_argument(
        "--admin",
        action="append",
        default=[],
        help="pki: issue admin user:NAME; etcd-roles: its etcd user (repeat)",
    )
    parser.add_argument(
        "--etcd",
        default=os.environ.get("MICROCO_ETCD", ""),
        help="etcd-roles only: the etcd to set up, host:port (default $MICROCO_ETCD)",
    )
    parser.add_argument(
        "--ca-dir",
        type=Path,
        default=None,
        help="etcd-roles only: the CA's directory (default <data-dir>/ca)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="etcd-roles only: seconds to wait for etcd"
    )
    args = parser.parse_args(argv)
    if args.server == "etcd-roles":
        if not args.etcd:
            parser.error("etcd-roles needs --etcd (or MICROCO_ETCD)")
        ca = args.ca_dir or args.data_dir / "ca"
        return set_up_etcd_roles(args.etcd, ca, args.service, args.admin, args.timeout)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.server == "pki":
        return make_pki(args.data_dir, args.service, args.admin, args.per_container)
    if not args.port:
        parser.error(f"{args.server} needs --port")
    if args.server == "etcd":
        server: EtcdServer | RedisServer = EtcdServer(
            args.data_dir,
            host=args.host,
            port=args.port,
            peer_port=args.peer_port,
            advertise_host=args.advertise_host,
        )
    else:
        password = args.password_file.read_text().strip() if args.password_file else ""
        server = RedisServer(args.data_dir, host=args.host, port=args.port, password=password)
    cmd = server.command()
    os.execv(cmd[0], cmd)
    return 0  # not reached


#: The services that use Redis themselves or hand it on (the agent's jobs read the cache
#: directory): only their containers get Redis's password.
REDIS_CLIENTS = frozenset({"agent", "cache", "console"})
#: The names a server's certificate carries, per server others dial by name.
SERVER_HOSTS = {
    "etcd": ("etcd", "etcd.microco.svc", "localhost", "127.0.0.1"),
    "redis": ("redis", "redis.microco.svc", "localhost", "127.0.0.1"),
}


def make_pki(
    directory: Path, services: list[str], admins: list[str], per_container: Path | None = None
) -> int:
    from microco.common.identity import CertificateAuthority, Identity
    from microco.common.redis_acl import acl_config, service_redis_env

    from ._pki import _redis_password

    ca = CertificateAuthority.load_or_create(directory / "ca")
    own: dict[str, Identity] = {}
    for name in dict.fromkeys([*services, "redis"]):
        path = directory / "services" / f"{name}.pem"
        if path.exists():
            own[name] = Identity.from_pem(path.read_bytes(), where=str(path))
            continue
        if name in SERVER_HOSTS:
            # Others dial etcd and Redis by a host name their certificates must carry (compose:
            # etcd, redis; Kubernetes: etcd.microco.svc, redis.microco.svc). The official images
            # read separate files: <data-dir>/<name>/{cert,key,ca}.pem.
            ident = ca.issue(f"service:{name}", hosts=SERVER_HOSTS[name])
            _write_parts(directory / name, ident)
        else:
            ident = ca.issue(f"service:{name}")
        ident.write(path)
        own[name] = ident
    for name in admins:
        path = directory / "users" / f"{name}.pem"
        if not path.exists():
            ca.issue(f"user:{name}", admin=True, days=365).write(path)
    password = _redis_password(directory / "redis.password")
    if per_container is not None:
        for name, ident in own.items():
            d = per_container / name
            d.mkdir(parents=True, exist_ok=True)
            if name in SERVER_HOSTS:
                _write_parts(d, ident)
            if name != "redis":
                ident.write(d / "credentials.pem")
            if name == "redis":  # the administrator's password, and every client's ACL user
                _write_private(d / "redis.password", (password + "\n").encode())
                _write_private(
                    d / "redis-users.conf", "".join(f"{x}\n" for x in acl_config(password)).encode()
                )
            elif name in REDIS_CLIENTS:  # its own ACL user's password (common/redis_acl.py)
                _write_private(d / "redis.password", (service_redis_env(password, name)[1] + "\n").encode())
    print(f"PKI in {directory}: {len(services)} services, {len(admins)} administrators")
    return 0


def _write_parts(d: Path, ident: object) -> None:
    for part in ("cert", "key", "ca"):
        _write_private(d / f"{part}.pem", getattr(ident, f"{part}_pem"))


def set_up_etcd_roles(
    endpoint: str, ca_dir: Path, services: list[str], admins: list[str], timeout_s: float = 300.0
) -> int:
    """What ``microco up`` does to the etcd it starts (``StackPki.set_up_etcd_roles``), for an
    etcd started by someone else: its users and roles, and authentication on. Idempotent."""
    import time

    from microco.common.errors import MicrocoError
    from microco.common.etcd_roles import EtcdAuth
    from microco.common.identity import CertificateAuthority

    try:
        ca = CertificateAuthority.load(ca_dir)
    except MicrocoError as exc:
        print(f"etcd roles not set up: {exc}", file=sys.stderr)
        return 1
    me = ca.issue("service:stack", days=1)
    deadline = time.monotonic() + timeout_s
    while True:
        auth = EtcdAuth(endpoint.split(",")[0], me)
        try:
            auth.set_up(sorted(set(services) | {"stack"}), sorted({f"user:{a}" for a in admins}))
            break
        except MicrocoError as exc:
            if time.monotonic() >= deadline:
                print(f"etcd roles not set up on {endpoint}: {exc}", file=sys.stderr)
                return 1
            time.sleep(2.0)  # etcd not up yet (a container started first)
        finally:
            auth.close()
    print(f"etcd roles on {endpoint}: {len(services)} services, {len(admins)} administrators")
    return 0


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    sys.exit(main())
