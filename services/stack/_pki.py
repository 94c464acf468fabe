"""The local stack's identities: its CA, one certificate per service, the administrator's
credentials file (``<home>/credentials.pem``, which the CLI and SDK find by themselves).

The CA lives in ``$MICROCO_CA_DIR`` when that is set (an organisation's own, or the test
suite's), else in ``<home>/pki`` (created on the first ``microco up``; its key readable by its
owner only). Only the scheduler is given the CA, to issue its jobs' credentials.
"""

from __future__ import annotations

import getpass
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microco.common import identity
from microco.common.errors import MicrocoError
from microco.common.etcd_roles import ENV_ETCD_ROLES
from microco.common.hotstate import ENV_REDIS_PASSWORD
from microco.common.identity import CertificateAuthority
from microco.common.redis_acl import ENV_REDIS_USER, service_redis_env

#: The console's admin token (``services/console/_config.TOKEN_ENV``; not imported: the stack
#: does not load the console's FastAPI application).
CONSOLE_TOKEN_ENV = "MICROCO_CONSOLE_TOKEN"

log = logging.getLogger(__name__)

ISSUES_JOBS = frozenset({"scheduler"})  # the services given the CA, to issue job credentials
#: The umask of every process the stack starts: what a service writes (store extents, cache
#: state, logs, etcd's and Redis's data) is readable by the stack's owner only, unless the
#: service sets a mode of its own (the cache's chunk files: see docs/cache.md).
PRIVATE_UMASK = 0o077


def private_dirs(home: Path) -> None:
    """The stack's home and what it keeps there (logs, data, PKI): directories only its owner
    may enter (0700), made so when they exist already."""
    for d in (home, home / "logs", home / "data", home / "pki", home / "pki" / "services"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
    job = job_user()
    if job is not None:
        # The agent's jobs run as a user of their own (services/agent/_runas.py), which must
        # reach its directories under <home>/data: that user's group passes through (0710),
        # nobody else; logs/ and pki/ stay 0700.
        for d in (home, home / "data"):
            os.chown(d, -1, job.gid)
            os.chmod(d, 0o710)


def job_user() -> Any:
    """The user the stack's agents run jobs as (``MICROCO_RUN_AS``, default ``auto``), or None."""
    from microco.services.agent import ENV_RUN_AS, resolve_run_as

    try:
        return resolve_run_as(os.environ.get(ENV_RUN_AS, "auto"))
    except MicrocoError:
        return None  # the agent refuses it itself, saying why


def ca_dir(home: Path) -> Path:
    return Path(os.environ.get(identity.ENV_CA_DIR) or home / "pki")


def admin_name() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "admin"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "admin"


@dataclass
class StackPki:
    home: Path
    insecure: bool
    ca: CertificateAuthority | None = None
    ca_dir: Path | None = None
    redis_password: str = ""  # the stack's Redis requires it (not in insecure mode)
    # The console's admin token (``<home>/pki/console-token``, made once): never the well-known
    # development token, which every local user and every job (on loopback) could sign in with.
    console_token: str = ""
    etcd_roles: bool = False  # the etcd the stack started has authentication and roles on
    admins: list[str] = field(default_factory=list)  # etcd's root users: the administrators
    _files: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def set_up(cls, home: Path, insecure: bool, progress: Callable[[str], None]) -> StackPki:
        private_dirs(home)
        if insecure:
            os.environ[identity.ENV_INSECURE] = "1"  # this process's health checks too
            progress(
                "WARNING: INSECURE development stack: no TLS, no authentication, no authorisation; "
                "anyone who reaches its ports owns it"
            )
            return cls(home, True, console_token=_console_token(home))
        d = ca_dir(home)
        ca = CertificateAuthority.load_or_create(d)
        pki = cls(home, False, ca, d)
        admin_file = home / "credentials.pem"
        current = _read(admin_file)
        if current is None or current.ca_pem != ca.cert_pem or _expiring(current):
            ca.issue(f"user:{admin_name()}", admin=True, days=365).write(admin_file)
            progress(f"administrator credentials: {admin_file}")
        pki.admins = [f"user:{admin_name()}"]
        try:  # the administrator starting the stack with credentials of their own
            starter = identity.current()
        except Exception:  # noqa: BLE001 - none, or unreadable: the home's administrator only
            starter = None
        if starter is not None and starter.kind == "user" and starter.admin and starter.ca_pem == ca.cert_pem:
            pki.admins.append(starter.name)
        identity.use(ca.issue("service:stack"))  # the supervisor's own health checks
        pki.redis_password = _redis_password(home / "pki" / "redis.password")
        pki.console_token = _console_token(home)
        os.environ[ENV_REDIS_PASSWORD] = pki.redis_password  # this process's clients (the demo)
        return pki

    def etcd_identity(self) -> identity.Identity | None:
        """The certificate of the etcd the stack starts (it listens on loopback)."""
        if self.ca is None:
            return None
        return self.ca.issue("service:etcd", hosts=("127.0.0.1", "localhost"))

    def redis_identity(self) -> identity.Identity | None:
        """The certificate of the Redis TLS front the stack starts (it listens on loopback)."""
        if self.ca is None:
            return None
        return self.ca.issue("service:redis", hosts=("127.0.0.1", "localhost"))

    def set_up_etcd_roles(self, endpoint: str, services: list[str]) -> None:
        """Turn on the authentication of the etcd the stack started, with a user per service
        and for the administrator, each in its role (``microco.common.etcd_roles``)."""
        if self.insecure or self.ca is None:
            return
        from microco.common.etcd_roles import EtcdAuth

        auth = EtcdAuth(endpoint, self.ca.issue("service:stack"))
        try:
            auth.set_up(sorted(set(services) | {"stack"}), sorted(set(self.admins)), self._users())
        finally:
            auth.close()
        self.etcd_roles = True

    def _users(self) -> tuple[str, ...]:
        """The users `microco user add` made in this home (``<home>/users/NAME.pem``); an
        administrator among them is left to be added while the stack runs."""
        out = []
        for f in sorted((self.home / "users").glob("*.pem")):
            ident = _read(f)
            if ident is not None and ident.kind == "user" and not ident.admin:
                out.append(ident.name)
        return tuple(out)

    def child_env(self, name: str, service: str) -> dict[str, str]:
        """What a service process needs to find its own credentials."""
        console = {CONSOLE_TOKEN_ENV: self.console_token if service == "console" else ""}
        if self.insecure:
            return {identity.ENV_INSECURE: "1", **console}
        assert self.ca is not None and self.ca_dir is not None
        path = self._files.get(name)
        if path is None:
            path = self.ca.issue(f"service:{service}").write(self.home / "pki" / "services" / f"{name}.pem")
            self._files[name] = path
        user, password = service_redis_env(self.redis_password, service)
        return {
            # Redis only to its clients, each as its own ACL user (common/redis_acl.py)
            ENV_REDIS_PASSWORD: password,
            ENV_REDIS_USER: user,
            identity.ENV_CREDENTIALS: str(path),
            identity.ENV_CREDENTIALS_PEM: "",
            identity.ENV_INSECURE: "",
            identity.ENV_CA_DIR: str(self.ca_dir) if service in ISSUES_JOBS else "",
            ENV_ETCD_ROLES: "1" if self.etcd_roles else "",
            **console,  # the console's admin token to the console alone (not the development token)
        }


def _console_token(home: Path) -> str:
    """The console's admin token: an operator's own (``MICROCO_CONSOLE_TOKEN``, docs/console.md),
    else the stack's, made once."""
    return os.environ.get(CONSOLE_TOKEN_ENV, "").strip() or _redis_password(console_token_file(home))


def console_token_file(home: Path) -> Path:
    """Where the stack keeps its console's admin token (readable by the stack's owner only);
    ``microco console token`` prints it."""
    return home / "pki" / "console-token"


def _redis_password(path: Path) -> str:
    """A secret of the stack (Redis's password, the console's token): made once, kept in a file
    only its owner reads."""
    try:
        text = path.read_text().strip()
        if text:
            return text
    except OSError:
        pass
    text = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return text


def _expiring(ident: identity.Identity, within_s: float = 30 * 86400) -> bool:
    """Whether ``ident`` has expired or will within ``within_s`` (the administrator's credentials
    are renewed then: they were kept until they expired, and the CLI then failed)."""
    import time

    start, end = identity.validity(ident.cert_pem)
    return not start <= time.time() <= end - within_s


def _read(path: Path) -> identity.Identity | None:
    try:
        return identity.Identity.from_pem(path.read_bytes(), where=str(path))
    except (OSError, Exception):  # noqa: BLE001 - unreadable or not ours: issued anew
        return None
