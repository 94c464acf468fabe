"""etcd roles: which identity may read and write which keys (docs/security.md).

etcd serves mutual TLS with ``--client-cert-auth``; once its authentication is on, a request
that carries no token is made as the etcd *user named by the client certificate's common
name*. So every identity of the platform is an etcd user of its own name (``service:cache``,
``user:alice``, ``job:j-1``) holding one role, and each role may touch only some key prefixes:

- ``root`` (etcd's superuser): the stack's supervisor, the scheduler (which adds its jobs' users)
  and administrators;
- ``service-<name>``: the registry, elections and the deny-list, the job records' owners (read),
  and that service's own prefixes (:data:`SERVICE_PREFIXES`);
- ``platform-user`` (users and jobs): discovery (read) and the compiler's exploration store;
  never the job records (their environments), the store's catalog or another service's state;
- ``user-<name>`` (user ``name`` and the jobs they own): ``name``'s dataset registrations
  (``/microco/cache/datasets/<name>/``), no other user's.

Managed through etcd's Auth API over gRPC (``pyetcd``'s generated stubs, on a channel of the
platform's TLS); users have no password (``no_password``): they log in with their certificate
only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .identity import Identity, split_name

#: Set (by ``microco up``) in the environment of every service when its etcd has roles on: the
#: scheduler then adds each job's etcd user before starting it.
ENV_ETCD_ROLES = "MICROCO_ETCD_ROLES"

log = logging.getLogger(__name__)

READ, WRITE, READWRITE = 0, 1, 2  # etcd's authpb.Permission.Type

REGISTRY = "/microco/services/"
LEADERS = "/microco/leader/"
REVOKED = "/microco/security/revoked/"
JOBS = "/microco/scheduler/jobs/"
NODES = "/microco/nodes/"
DATASETS = "/microco/cache/datasets/"
COMPILER = "/microco/compiler/"
PHASES = "/microco/scheduler/phases/"

#: Every service: register, elect, follow the deny-list, find the owner of a job and the nodes.
COMMON = [
    (REGISTRY, READWRITE),
    (LEADERS, READWRITE),
    (REVOKED, READ),
    (JOBS, READ),
    (NODES, READ),
    (PHASES, READ),
]
#: Each service's own prefixes, beyond :data:`COMMON`.
SERVICE_PREFIXES: dict[str, list[tuple[str, int]]] = {
    "agent": [(NODES, READWRITE), (PHASES, READWRITE)],
    "cache": [("/microco/cache/", READWRITE)],
    "store": [("/microco/store/", READWRITE)],
    "store-node": [("/microco/store/", READ)],
    "compiler": [(COMPILER, READWRITE)],
    "console": [("/microco/", READ)],
    "etcd": [],
}
#: Users and jobs: discovery, reading the compiler's exploration store (not the job phases: every
#: job's id and node, which only the services read). Not writing it: the records are shared by
#: graph, and a user could commit a slow configuration for another user's model or delete one
#: (session 40); the compiler service writes them, each user's runs in a scope of their own.
USER_PREFIXES = [
    (REGISTRY, READ),
    (LEADERS, READ),
    (NODES, READ),
    (COMPILER, READ),
]
ROOT_SERVICES = frozenset({"stack", "scheduler"})
USER_ROLE = "platform-user"


def _end(prefix: str) -> bytes:
    """etcd's range end of a prefix: the prefix with its last byte incremented."""
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b)


def owner_role(user: str) -> str:
    """The role that reaches ``user``'s own data (their dataset registrations)."""
    return f"user-{user}"


def owner_prefixes(user: str) -> list[tuple[str, int]]:
    return [(f"{DATASETS}{user}/", READWRITE)]


def role_of(name: str, admin: bool = False) -> str:
    """The etcd role of a platform identity."""
    kind, subject = split_name(name)
    if kind == "service":
        return "root" if subject in ROOT_SERVICES else f"service-{subject}"
    if kind == "user" and admin:
        return "root"
    return USER_ROLE


class EtcdAuth:
    """etcd's Auth API on ``address`` as ``ident`` (a ``root`` identity once auth is on)."""

    def __init__(self, address: str, ident: Identity) -> None:
        from pyetcd.etcdrpc import rpc_pb2_grpc

        from .channel import dial

        self._channel = dial(address, identity=ident)
        self._stub = rpc_pb2_grpc.AuthStub(self._channel)
        from pyetcd.etcdrpc import rpc_pb2

        self._user_add = self._channel.unary_unary(  # takes the request encoded (see add_user)
            "/etcdserverpb.Auth/UserAdd",
            request_serializer=lambda raw: raw,
            response_deserializer=rpc_pb2.AuthUserAddResponse.FromString,
        )

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any, exists_ok: bool = True, missing_ok: bool = False) -> Any:
        import grpc

        from .errors import Unavailable

        try:
            rpc = self._user_add if method == "UserAdd" else getattr(self._stub, method)
            return rpc(request, timeout=10)
        except grpc.RpcError as exc:
            detail = exc.details() or ""
            if exists_ok and ("already exists" in detail or "already granted" in detail):
                return None
            if missing_ok and "not found" in detail:
                return None
            raise Unavailable(f"etcd {method}: {exc.code().name} {detail}") from None

    def add_role(self, role: str, prefixes: list[tuple[str, int]]) -> None:
        from pyetcd.etcdrpc import auth_pb2, rpc_pb2

        self._call("RoleAdd", rpc_pb2.AuthRoleAddRequest(name=role))
        for prefix, perm in prefixes:
            p = auth_pb2.Permission(permType=perm, key=prefix.encode(), range_end=_end(prefix))
            self._call("RoleGrantPermission", rpc_pb2.AuthRoleGrantPermissionRequest(name=role, perm=p))

    def add_user(self, name: str, role: str) -> None:
        from pyetcd.etcdrpc import rpc_pb2

        # ``options.no_password`` (field 3, {1: true}) is newer than pyetcd's copy of the
        # message: appended as its encoding. Such a user cannot log in with a password at all
        # (the certificate is the login), and etcd spends no bcrypt on it.
        raw = rpc_pb2.AuthUserAddRequest(name=name).SerializeToString() + b"\x1a\x02\x08\x01"
        self._call("UserAdd", raw)
        self._call("UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role=role))

    def grant(self, name: str, role: str) -> None:
        from pyetcd.etcdrpc import rpc_pb2

        self._call("UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role=role))

    def users(self) -> list[str]:
        from pyetcd.etcdrpc import rpc_pb2

        return list(self._call("UserList", rpc_pb2.AuthUserListRequest()).users)

    def delete_user(self, name: str) -> None:
        """Remove etcd user ``name`` (nothing when there is none)."""
        from pyetcd.etcdrpc import rpc_pb2

        self._call("UserDelete", rpc_pb2.AuthUserDeleteRequest(name=name), missing_ok=True)

    def enable(self) -> None:
        from pyetcd.etcdrpc import rpc_pb2

        self._call("AuthEnable", rpc_pb2.AuthEnableRequest())

    def set_up(self, services: list[str], admins: list[str], users: tuple[str, ...] = ()) -> None:
        """The roles, the users of ``services`` (``service:<name>``), ``admins`` and ``users``
        (``user:<name>``), and etcd's authentication switched on. Idempotent."""
        self.add_role("root", [])
        self.add_user("root", "root")
        for svc, prefixes in SERVICE_PREFIXES.items():
            self.add_role(f"service-{svc}", COMMON + prefixes)
        self.add_role(USER_ROLE, USER_PREFIXES)
        for svc in services:
            name = f"service:{svc}"
            role = role_of(name)
            if role != "root" and svc not in SERVICE_PREFIXES:
                self.add_role(role, COMMON)
            self.add_user(name, role)
        for admin in admins:
            self.add_user(admin, "root")
        for user in users:
            self.add_identity(user)
        self.enable()
        log.info("etcd authentication on: %d service users, %d administrators", len(services), len(admins))

    def add_identity(self, name: str, admin: bool = False, owner: str = "") -> None:
        """A user or a job as an etcd user of its certificate's name (auth already on); a user
        also reaches their own data, a job its ``owner``'s."""
        role = role_of(name, admin)
        self.add_user(name, role)
        kind, subject = split_name(name)
        user = subject if kind == "user" else owner if kind == "job" else ""
        if role != "root" and user:
            self.add_role(owner_role(user), owner_prefixes(user))
            self.grant(name, owner_role(user))


def _auth_for(kv: Any) -> EtcdAuth | None:
    """An ``EtcdAuth`` on ``kv``'s etcd as this process, when that etcd has roles
    (``MICROCO_ETCD_ROLES``); else ``None``."""
    if not os.environ.get(ENV_ETCD_ROLES) or not hasattr(kv, "address"):
        return None
    from .identity import current

    me = current()
    if me is None:
        return None
    return EtcdAuth(kv.address.split(",")[0], me)


def remove_job_users(kv: Any, keep: set[str] | frozenset[str]) -> list[str]:
    """Delete the etcd users of jobs not in ``keep`` (the scheduler's garbage collection, with
    the ids of the jobs that have not ended): a job's etcd user goes when the job ends, and one
    left behind (a scheduler that died in between) on the next collection. Returns the names
    deleted; nothing without roles."""
    auth = _auth_for(kv)
    if auth is None:
        return []
    gone = []
    try:
        for name in auth.users():
            kind, _, subject = name.partition(":")
            if kind == "job" and subject not in keep:
                auth.delete_user(name)
                gone.append(name)
    finally:
        auth.close()
    if gone:
        log.info("removed the etcd users of %d ended jobs", len(gone))
    return gone


def remove_revoked_user(address: str, name: str) -> bool:
    """Delete the etcd user of ``name`` (``user:<name>``, ``job:<id>``), revoked: etcd knows a
    certificate by its common name alone and never reads the platform's deny-list, so a revoked
    key kept its etcd role (an administrator's, ``root``: enough to take itself off the
    deny-list). As this process (an administrator); True when there was one. A service's etcd
    user stays (its other instances need it): restart the service with new credentials."""
    from .identity import current

    kind, _ = split_name(name)
    me = current()
    if kind not in ("user", "job") or me is None:
        return False
    auth = EtcdAuth(address.split(",")[0], me)
    try:
        if name not in auth.users():
            return False
        auth.delete_user(name)
    finally:
        auth.close()
    log.info("removed the etcd user of revoked %s", name)
    return True


def add_job_user(kv: Any, job_id: str, owner: str = "") -> None:
    """Make ``job:<job_id>`` an etcd user (the scheduler, before it starts the job), reaching
    its ``owner``'s data, when this process runs against an etcd with roles
    (``MICROCO_ETCD_ROLES``); else nothing."""
    auth = _auth_for(kv)
    if auth is None:
        return
    try:
        auth.add_identity(f"job:{job_id}", owner=owner)
    finally:
        auth.close()
