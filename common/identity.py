"""Identities and mutual TLS: the platform's small PKI.

Every party holds a certificate from the stack's own CA; its subject's common name is its
identity: ``service:<name>`` (a platform service), ``user:<name>`` (a person; the subject's
organisational unit ``admin`` marks an administrator) or ``job:<id>`` (one job's processes).
Only service certificates carry the DNS name :data:`SERVICE_NAME`, which every client checks the
server against, so a user's or a job's certificate cannot serve.

A process finds its credentials (one PEM file: its certificate, its key, the CA certificate) in
this order: set by :func:`use`; ``MICROCO_CREDENTIALS_PEM`` (the file's text: how a job gets
its own); ``MICROCO_CREDENTIALS`` (a path); ``<stack home>/credentials.pem`` (written by
``microco up`` for the local administrator). ``MICROCO_INSECURE=1`` turns TLS off everywhere:
a development flag, logged loudly. ``MICROCO_CA_DIR`` names a CA directory whose key this process
may use: a service then issues itself ``service:<name>`` (tests, development) and the scheduler
issues its jobs' credentials.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

ENV_CREDENTIALS = "MICROCO_CREDENTIALS"
ENV_CREDENTIALS_PEM = "MICROCO_CREDENTIALS_PEM"
ENV_INSECURE = "MICROCO_INSECURE"
ENV_CA_DIR = "MICROCO_CA_DIR"
#: The user a job acts for, set by the scheduler in every job's environment (a job's bare
#: dataset names are its owner's: ``clients/cache``).
ENV_JOB_OWNER = "MICROCO_JOB_OWNER"
SERVICE_NAME = "microco.service"  # the DNS name in every service certificate, checked by clients
ADMIN_UNIT = "admin"
KINDS = ("service", "user", "job")
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
_VALID_DAYS = 825
_MAX_NAME = 128


def split_name(name: str) -> tuple[str, str]:
    """``"user:alice"`` -> ``("user", "alice")``; a clear error for anything else."""
    kind, sep, subject = name.partition(":")
    if not sep or kind not in KINDS or not subject or len(name) > _MAX_NAME:
        raise InvalidArgument(
            f"identity must be one of {', '.join(k + ':<name>' for k in KINDS)} (got {name[:80]!r})"
        )
    if any(c.isspace() or c in '/,=+\\"<>;' for c in subject):
        raise InvalidArgument(f"identity name {subject[:80]!r} contains a character it may not")
    return kind, subject


@dataclass(frozen=True)
class Identity:
    """One party's credentials: certificate, private key and the CA certificate (all PEM)."""

    name: str
    admin: bool
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @property
    def kind(self) -> str:
        return self.name.partition(":")[0]

    @property
    def subject(self) -> str:
        return self.name.partition(":")[2]

    def to_pem(self) -> bytes:
        return self.cert_pem + self.key_pem + self.ca_pem

    @classmethod
    def from_pem(cls, data: bytes, where: str = "credentials") -> Identity:
        blocks = _pem_blocks(data)
        certs = [b for kind, b in blocks if kind == "CERTIFICATE"]
        keys = [b for kind, b in blocks if kind.endswith("PRIVATE KEY")]
        if len(certs) < 2 or len(keys) != 1:
            raise FailedPrecondition(
                f"{where}: a credentials file holds a certificate, its private key and the CA certificate"
            )
        name, admin = peer_name(certs[0])
        return cls(name=name, admin=admin, cert_pem=certs[0], key_pem=keys[0], ca_pem=b"".join(certs[1:]))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the credentials file, readable by its owner only."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.to_pem())
        os.chmod(p, 0o600)
        return p


def _pem_blocks(data: bytes) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    kind = ""
    lines: list[bytes] = []
    for line in data.splitlines(keepends=True):
        s = line.strip()
        if s.startswith(b"-----BEGIN ") and s.endswith(b"-----"):
            kind, lines = s[11:-5].decode(), [line]
        elif s.startswith(b"-----END ") and kind:
            lines.append(line if line.endswith(b"\n") else line + b"\n")
            out.append((kind, b"".join(lines)))
            kind = ""
        elif kind:
            lines.append(line)
    return out


@functools.lru_cache(maxsize=1024)
@functools.lru_cache(maxsize=4096)
def peer_name(cert_pem: bytes) -> tuple[str, bool]:
    """The identity in a certificate (its subject's common name) and whether it is an admin."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cns:
        raise FailedPrecondition("certificate has no common name")
    name = str(cns[0].value)
    units = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)}
    return name, ADMIN_UNIT in units


# --------------------------------------------------------------------------- revocation
# A revoked identity's certificates are refused by every server (docs/security.md): etcd keeps
# ``REVOKED_PREFIX + <name>`` -> {"at": <unix time>}; a certificate of that name issued before
# then is refused, one issued afterwards (the user added again) is not. Servers keep the list
# in memory (``set_revoked``, fed by ``services/runtime/auth.watch_revocations``).

REVOKED_PREFIX = "/microco/security/revoked/"
BACKDATE = datetime.timedelta(minutes=5)  # a certificate's validity starts this long before its issue
_revoked: dict[str, float] = {}


def set_revoked(entries: dict[str, float]) -> None:
    """Replace this process's deny-list: identity name -> revocation time (unix seconds)."""
    global _revoked
    _revoked = dict(entries)


@functools.lru_cache(maxsize=4096)
def _issued_at(cert_pem: bytes) -> float:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    return (cert.not_valid_before_utc + BACKDATE).timestamp()


def revoked(name: str, cert_pem: bytes) -> bool:
    """Whether the certificate ``cert_pem`` of ``name`` was revoked (issued before its name was)."""
    at = _revoked.get(name)
    return at is not None and _issued_at(cert_pem) <= at


def check_not_revoked(name: str, cert_pem: bytes) -> None:
    if revoked(name, cert_pem):
        from .errors import Unauthenticated

        raise Unauthenticated(
            f"the certificate of {name} was revoked: ask an administrator for new credentials"
        )


def revoke(kv: object, name: str, at: float | None = None) -> float:
    """Revoke every certificate of ``name`` issued until now (``at``); returns that time."""
    import json
    import time

    split_name(name)
    when = time.time() if at is None else at
    kv.put(REVOKED_PREFIX + name, json.dumps({"at": when}).encode())  # type: ignore[attr-defined]
    return when


class CertificateAuthority:
    """The stack's CA: its certificate and key, and what it issues."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        self.cert_pem = cert_pem
        self._cert = x509.load_pem_x509_certificate(cert_pem)
        self._key = serialization.load_pem_private_key(key_pem, password=None)
        self._key_pem = key_pem
        self._lock = threading.Lock()
        self._issued: dict[tuple[str, bool, tuple[str, ...], int], Identity] = {}

    @classmethod
    def create(cls, common_name: str = "microco CA") -> CertificateAuthority:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CertificateAuthority:
        d = Path(directory)
        try:
            return cls((d / CA_CERT).read_bytes(), (d / CA_KEY).read_bytes())
        except FileNotFoundError:
            raise FailedPrecondition(f"no CA in {d} (it is created by `microco up`)") from None

    @classmethod
    def load_or_create(cls, directory: str | os.PathLike[str]) -> CertificateAuthority:
        d = Path(directory)
        if (d / CA_CERT).exists() and (d / CA_KEY).exists():
            return cls.load(d)
        ca = cls.create()
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        fd = os.open(d / CA_KEY, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(ca._key_pem)
        (d / CA_CERT).write_bytes(ca.cert_pem)
        return ca

    def issue(
        self, name: str, admin: bool = False, days: int = _VALID_DAYS, hosts: tuple[str, ...] = ()
    ) -> Identity:
        """A new certificate and key for ``name`` (``service:x``, ``user:x``, ``job:x``); a
        service's also names ``hosts`` (for servers other programs dial by address: etcd)."""
        kind, _ = split_name(name)
        if admin and kind != "user":
            raise InvalidArgument("only a user can be an administrator")
        if hosts and kind != "service":
            raise InvalidArgument("only a service's certificate names hosts")
        kept = (name, admin, hosts, days)
        with self._lock:
            cached = self._issued.get(kept)
        if cached is not None and _young(cached):
            return cached
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
        if admin:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ADMIN_UNIT))
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if kind == "service":
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            import ipaddress

            names: list[x509.GeneralName] = [x509.DNSName(SERVICE_NAME)]
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())  # type: ignore[arg-type]
        ident = Identity(
            name=name,
            admin=admin,
            cert_pem=cert.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            ca_pem=self.cert_pem,
        )
        with self._lock:
            self._issued.pop(kept, None)
            while len(self._issued) >= _KEPT_IDENTITIES:  # the oldest go (a dict keeps its order)
                self._issued.pop(next(iter(self._issued)))
            self._issued[kept] = ident
        return ident


# A CA keeps what it issued, to hand the same identity to a process asking again (a service's
# own, a job's restarts), at most this many, each only while ``_young``
_KEPT_IDENTITIES = 1024


def _young(ident: Identity) -> bool:
    """Whether a kept identity may be handed out again: in the first half of its life (a job
    restarted 31 days after its first start got its expired 30-day certificate again: session
    41) and not revoked since (a revoked job's restart got the revoked one)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(ident.cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    now = datetime.datetime.now(datetime.timezone.utc)
    return start <= now < start + (end - start) / 2 and not revoked(ident.name, ident.cert_pem)


# --------------------------------------------------------------------------- this process

_lock = threading.Lock()
_used: Identity | None = None
_warned = False


def insecure() -> bool:
    """Whether TLS is off (``MICROCO_INSECURE=1``: development only)."""
    global _warned
    on = os.environ.get(ENV_INSECURE, "").strip().lower() in ("1", "true", "yes", "on")
    if on and not _warned:
        _warned = True
        log.warning(
            "INSECURE MODE (%s=1): no TLS, no authentication, no authorisation; "
            "anyone who reaches a port owns the platform. Development only.",
            ENV_INSECURE,
        )
    return on


def use(identity: Identity | None) -> None:
    """Make ``identity`` this process's own (a service does so at start-up)."""
    global _used
    with _lock:
        _used = identity


@functools.lru_cache(maxsize=8)
def validity(cert_pem: bytes) -> tuple[float, float]:
    """A certificate's validity: (not before, not after), in unix seconds."""
    return _validity(cert_pem)


@functools.lru_cache(maxsize=1024)
def _validity(cert_pem: bytes) -> tuple[float, float]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def check_valid(ident: Identity, where: str, now: float | None = None) -> Identity:
    """``ident`` when its certificate is valid now; else a clear error (session 40: expired
    credentials, or a clock set back before their issue, read "cannot reach etcd ... connection
    failed", every server refusing them in the TLS handshake)."""
    import time

    now = time.time() if now is None else now
    start, end = _validity(ident.cert_pem)
    if start <= now <= end:
        return ident

    def utc(t: float) -> str:
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    renew = (
        "`microco up` renews the administrator's; `microco user add NAME --force` issues a user's anew"
        if ident.kind == "user"
        else "ask for new credentials"
    )
    if now > end:
        raise FailedPrecondition(f"the credentials in {where} ({ident.name}) expired at {utc(end)}; {renew}")
    raise FailedPrecondition(
        f"the credentials in {where} ({ident.name}) are not valid before {utc(start)}, and this machine's "
        f"clock reads {utc(now)}: is the clock right?"
    )


def _from_file(path: str, mtime: float) -> Identity:
    return Identity.from_pem(Path(path).read_bytes(), where=path)


@functools.lru_cache(maxsize=8)
def _from_text(text: str) -> Identity:
    return Identity.from_pem(text.encode(), where=ENV_CREDENTIALS_PEM)


def current() -> Identity | None:
    """This process's identity; ``None`` in insecure mode. A clear error when there is none."""
    if insecure():
        return None
    if _used is not None:
        return _used
    text = os.environ.get(ENV_CREDENTIALS_PEM)
    if text:
        return check_valid(_from_text(text), ENV_CREDENTIALS_PEM)
    from .discovery import stack_home

    path = os.environ.get(ENV_CREDENTIALS) or str(stack_home() / "credentials.pem")
    try:
        return check_valid(_from_file(path, os.stat(path).st_mtime), path)
    except FileNotFoundError:
        raise FailedPrecondition(
            f"no credentials: {path} does not exist; `microco up` writes the administrator's, "
            f"`microco user add NAME` a user's (then set {ENV_CREDENTIALS}=<file>); "
            f"{ENV_INSECURE}=1 turns TLS off for development"
        ) from None


@functools.lru_cache(maxsize=4)
def _ca_at(directory: str) -> CertificateAuthority:
    return CertificateAuthority.load(directory)


def local_ca() -> CertificateAuthority | None:
    """The CA this process may issue from (``MICROCO_CA_DIR``), if any."""
    d = os.environ.get(ENV_CA_DIR)
    return _ca_at(d) if d else None


def service_identity(name: str) -> Identity | None:
    """The identity a service named ``name`` serves with: its own credentials when they are a
    service's, else one issued from ``MICROCO_CA_DIR``; ``None`` in insecure mode."""
    if insecure():
        return None
    ca = local_ca()
    try:
        own = current()
    except FailedPrecondition:
        if ca is None:
            raise
        own = None
    if own is not None and own.kind == "service":
        return own
    if ca is not None:
        return ca.issue(f"service:{name}")
    raise FailedPrecondition(
        f"{name}: the credentials found are {own.name if own else 'none'}, not a service's; "
        f"give the service its own ({ENV_CREDENTIALS}) or a CA to issue from ({ENV_CA_DIR})"
    )


def job_identity(job_id: str) -> Identity | None:
    """Credentials for one job's processes, from this process's CA; ``None`` in insecure mode
    or when this process has no CA (the job then runs without platform credentials)."""
    if insecure():
        return None
    ca = local_ca()
    return ca.issue(f"job:{job_id}", days=30) if ca is not None else None


# --------------------------------------------------------------------------- gRPC


def server_credentials(identity: Identity) -> object:
    import grpc

    return grpc.ssl_server_credentials(
        [(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem, require_client_auth=True
    )


def channel_credentials(identity: Identity) -> object:
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=identity.ca_pem, private_key=identity.key_pem, certificate_chain=identity.cert_pem
    )


def job_credentials_env(job_id: str, owner: str = "") -> dict[str, str]:
    """The environment entries that hand a job's processes their credentials (none when this
    process cannot issue them) and name the user it acts for (``owner``, when known)."""
    ident = job_identity(job_id)
    env = {ENV_CREDENTIALS_PEM: ident.to_pem().decode()} if ident is not None else {}
    return {**env, ENV_JOB_OWNER: owner} if owner else env


@contextlib.contextmanager
def private_ca_scope(
    directory: str | os.PathLike[str], who: str = "user:local-admin"
) -> Iterator[CertificateAuthority | None]:
    """:func:`private_ca` for the span of a block: on leaving it, ``MICROCO_CA_DIR`` and this
    process's identity are what they were. For a program that starts clusters one after another,
    each under a directory it removes: the second found the first's CA named (its directory
    removed, the CA still cached) and its servers could not load it (session 30)."""
    before_dir, before_used = os.environ.get(ENV_CA_DIR), _used
    try:
        yield private_ca(directory, who)
    finally:
        if before_dir is None:
            os.environ.pop(ENV_CA_DIR, None)
        else:
            os.environ[ENV_CA_DIR] = before_dir
        use(before_used)


def private_ca(
    directory: str | os.PathLike[str], who: str = "user:local-admin"
) -> CertificateAuthority | None:
    """For a program that starts servers of its own (benchmarks, local clusters): the CA named
    by ``MICROCO_CA_DIR``, else a new one in ``directory`` (then named there, for the servers
    this process starts); this process acts as administrator ``who`` of it. ``None`` in
    insecure mode."""
    if insecure():
        return None
    ca = local_ca()
    if ca is None:
        ca = CertificateAuthority.load_or_create(directory)
        os.environ[ENV_CA_DIR] = str(directory)
    try:
        own = current()
    except FailedPrecondition:
        own = None
    if own is None or own.ca_pem != ca.cert_pem:
        use(ca.issue(who, admin=True))
    return ca
