"""Arrow Flight with the platform's identities: mutual TLS, and who the caller is.

Every store node serves Flight over TLS and requires a client certificate from the platform's CA
(``verify_client``), as the gRPC services do. Flight does not hand a server the client's
certificate, so each call also carries the caller's certificate and a fresh signature made with
its key (headers ``x-microco-cert``, ``x-microco-proof``); the node checks both against the CA
and knows who calls: only the coordinator (``service:store``) may write extents or run actions
such as ``drop_table`` (docs/security.md). In insecure mode (``MICROCO_INSECURE=1``) all of this
is off.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
from typing import Any

from microco.common import identity
from microco.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from microco.common.identity import Identity

CERT_HEADER = "x-microco-cert"
PROOF_HEADER = "x-microco-proof"
MIDDLEWARE = "microco-identity"
PROOF_TTL_S = 300.0  # a proof is re-made after half of this; one older than this is refused
_PROOF_CONTEXT = b"microco-flight-proof|"
_GRANT_CONTEXT = b"microco-flight-grant|"
GRANT_TTL_S = 3600.0  # a read ticket handed out by PlanRead or get_flight_info is valid this long
GRANTORS = ("store", "store-node")  # who signs read tickets: the coordinator, a node's catalog view


def secure_location(location: str, secure: bool) -> str:
    """``grpc://host:port`` as this process dials or serves it: ``grpc+tls://`` with TLS."""
    for scheme in ("grpc+tls://", "grpc+tcp://", "grpc://"):
        if location.startswith(scheme):
            rest = location[len(scheme) :]
            return ("grpc+tls://" if secure else "grpc://") + rest
    return ("grpc+tls://" if secure else "grpc://") + location


def scheme(ident: Identity | None) -> str:
    """The scheme of a Flight server serving as ``ident`` (``None``: plaintext)."""
    return "grpc://" if ident is None else "grpc+tls://"


# --------------------------------------------------------------------------- client side


def _sign(ident: Identity, message: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = serialization.load_pem_private_key(ident.key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise Unauthenticated(f"{ident.name}: the platform's keys are elliptic-curve keys")
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


class _Proof:
    def __init__(self, ident: Identity) -> None:
        self.ident = ident
        self.cert = base64.b64encode(ident.cert_pem).decode()
        self._lock = threading.Lock()
        self._made = 0.0
        self._value = ""

    def headers(self) -> dict[str, str]:
        now = time.time()
        with self._lock:
            if now - self._made > PROOF_TTL_S / 2:
                ts = f"{now:.3f}".encode()
                sig = _sign(self.ident, _PROOF_CONTEXT + ts)
                self._value = ts.decode() + "." + base64.b64encode(sig).decode()
                self._made = now
            return {CERT_HEADER: self.cert, PROOF_HEADER: self._value}


def _client_middleware(proof: _Proof) -> Any:
    import pyarrow.flight as flight

    class _Sender(flight.ClientMiddleware):  # type: ignore[misc]
        def sending_headers(self) -> dict[str, str]:
            return proof.headers()

    class _Factory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
        def start_call(self, info: Any) -> Any:
            return _Sender()

    return _Factory()


def flight_client(address: str, ident: Identity | None = None) -> Any:
    """A Flight client to ``address`` (``grpc://host:port``) as ``ident`` (this process's own
    identity by default; plaintext in insecure mode)."""
    import pyarrow.flight as flight

    ident = ident if ident is not None else identity.current()
    if ident is None:
        return flight.FlightClient(secure_location(address, False))
    return flight.FlightClient(
        secure_location(address, True),
        tls_root_certs=ident.ca_pem,
        cert_chain=ident.cert_pem,
        private_key=ident.key_pem,
        override_hostname=identity.SERVICE_NAME,
        middleware=[_client_middleware(_Proof(ident))],
    )


# --------------------------------------------------------------------------- server side


@functools.lru_cache(maxsize=256)
def _verified(ca_pem: bytes, cert_pem: bytes) -> tuple[str, bool, Any]:
    """The identity in ``cert_pem`` once it is checked to be issued by the CA and valid now."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        ca.public_key().verify(  # type: ignore[call-arg, union-attr]
            cert.signature,
            cert.tbs_certificate_bytes,
            ec.ECDSA(cert.signature_hash_algorithm),  # type: ignore[arg-type]
        )
    except Exception:  # noqa: BLE001 - InvalidSignature, or a key of another type
        raise Unauthenticated("the certificate presented is not the platform CA's") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise Unauthenticated("the certificate presented has expired or is not valid yet")
    name, admin = identity.peer_name(cert_pem)
    return name, admin, cert.public_key()


def verify_headers(ca_pem: bytes, headers: dict[str, Any]) -> tuple[str, bool]:
    """The (name, admin) of the caller whose headers these are, or ``Unauthenticated``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    def one(name: str) -> str:
        v = headers.get(name) or []
        v = v[0] if isinstance(v, list) and v else v
        return v.decode() if isinstance(v, bytes) else str(v or "")

    cert_b64, proof = one(CERT_HEADER), one(PROOF_HEADER)
    if not cert_b64 or "." not in proof:
        raise Unauthenticated("no caller proof: Flight calls need the platform's client credentials")
    try:
        cert_pem = base64.b64decode(cert_b64, validate=True)
        ts, sig_b64 = proof.rsplit(".", 1)  # "<seconds.millis>.<base64>": base64 has no dot
        sig = base64.b64decode(sig_b64, validate=True)
        age = time.time() - float(ts)
    except (ValueError, TypeError):
        raise Unauthenticated("malformed caller proof") from None
    if not -60.0 <= age <= PROOF_TTL_S:
        raise Unauthenticated("stale caller proof")
    name, admin, key = _verified(ca_pem, cert_pem)
    identity.check_not_revoked(name, cert_pem)
    try:
        key.verify(sig, _PROOF_CONTEXT + ts.encode(), ec.ECDSA(hashes.SHA256()))
    except Exception:  # noqa: BLE001 - InvalidSignature
        raise Unauthenticated("the caller proof does not match its certificate") from None
    return name, admin


def server_options(ident: Identity | None) -> dict[str, Any]:
    """The keyword arguments of ``FlightServerBase.__init__`` for a node serving as ``ident``."""
    if ident is None:
        return {}
    import pyarrow.flight as flight

    ca_pem = ident.ca_pem

    class _Caller(flight.ServerMiddleware):  # type: ignore[misc]
        def __init__(self, name: str, admin: bool) -> None:
            self.name, self.admin = name, admin

    class _Factory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
        def start_call(self, info: Any, headers: dict[str, Any]) -> Any:
            try:
                name, admin = verify_headers(ca_pem, headers)
            except Unauthenticated as exc:
                raise flight.FlightUnauthenticatedError(f"Unauthenticated: {exc}") from None
            return _Caller(name, admin)

    return {
        "tls_certificates": [flight.CertKeyPair(ident.cert_pem, ident.key_pem)],
        "verify_client": True,
        "root_certificates": ident.ca_pem,
        "middleware": {MIDDLEWARE: _Factory()},
    }


def flight_caller(context: Any) -> tuple[str, bool]:
    """(name, admin) of a Flight call's caller; ``("", False)`` on a plaintext server."""
    mw = context.get_middleware(MIDDLEWARE)
    if mw is None:
        return "", False
    return mw.name, mw.admin


def require_flight_service(context: Any, services: tuple[str, ...], what: str) -> None:
    """Refuse (``PermissionDenied``) a Flight call not from one of ``services``."""
    mw = context.get_middleware(MIDDLEWARE)
    if mw is None:
        return  # plaintext: insecure development mode
    if mw.name.partition(":")[0] == "service" and mw.name.partition(":")[2] in services:
        return
    allowed = " or ".join(f"service:{s}" for s in services)
    raise PermissionDenied(f"{mw.name} may not {what}: only {allowed} may")


# --------------------------------------------------------------------------- read grants
# A store node serves an extent (``read``, ``fragment`` tickets) to the coordinator and the
# other nodes, and to anyone else only with a grant: the ticket signed, for that caller, by the
# service that decided the caller may read the table (the coordinator's PlanRead, a node's
# get_flight_info). docs/security.md.


# Fields of a ticket its grant does not sign: ``units`` only narrows what a node reads for the
# ticket to some of its sources (``narrow_to_units``: a subset of what was granted), so a
# client may cut one granted fragment into several (the Spark connector: one per partition).
UNSIGNED = ("grant", "units")


def _grant_message(task: dict[str, Any], caller: str, exp: str) -> bytes:
    body = {k: v for k, v in task.items() if k not in UNSIGNED}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return _GRANT_CONTEXT + caller.encode() + b"|" + exp.encode() + b"|" + canonical.encode()


def grant_ticket(ident: Identity | None, task: dict[str, Any], caller: str) -> bytes:
    """The ticket for ``task`` that ``caller`` may present to a store node, signed by ``ident``
    (plain, in insecure mode)."""
    task = json.loads(json.dumps(task, default=str))
    if ident is None or not caller:
        return json.dumps(task).encode()
    exp = f"{time.time() + GRANT_TTL_S:.0f}"
    sig = _sign(ident, _grant_message(task, caller, exp))
    task["grant"] = {
        "for": caller,
        "exp": exp,
        "cert": base64.b64encode(ident.cert_pem).decode(),
        "sig": base64.b64encode(sig).decode(),
    }
    return json.dumps(task).encode()


def narrow_to_units(task: dict[str, Any]) -> dict[str, Any]:
    """A ``fragment`` ticket's ``units`` (``[[replica, partition], ...]``, unsigned) applied: its
    sources cut to those of these units (none may be added). Without ``units``: as it is."""
    units = task.pop("units", None)
    if units is None:
        return task
    if (
        task.get("op") != "fragment"
        or not isinstance(units, list)
        or not all(isinstance(u, list) and len(u) == 2 and all(type(x) is int for x in u) for u in units)
    ):
        raise InvalidArgument("ticket: 'units' must be [[replica, partition], ...] on a fragment")
    left = task.get("left")
    if not isinstance(left, dict) or not isinstance(left.get("sources"), list):
        raise InvalidArgument("ticket: a fragment's 'left' must have 'sources'")
    task["left"] = {
        **left,
        "sources": [s for s in left["sources"] if isinstance(s, dict) and s.get("unit") in units],
    }
    return task


def check_grant(ca_pem: bytes, task: dict[str, Any], caller: str) -> None:
    """Refuse (``PermissionDenied``) a read ticket ``caller`` was not granted."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    g = task.get("grant")
    if not isinstance(g, dict):
        raise PermissionDenied(
            f"{caller} may not read extents without a grant: ask the coordinator (PlanRead) for tickets"
        )
    try:
        who, exp, cert = str(g["for"]), str(g["exp"]), base64.b64decode(str(g["cert"]), validate=True)
        sig = base64.b64decode(str(g["sig"]), validate=True)
        expired = float(exp) < time.time()
    except (KeyError, ValueError, TypeError):
        raise PermissionDenied(f"{caller}: malformed read grant") from None
    if who != caller:
        raise PermissionDenied(f"{caller} may not use a read grant made for another caller")
    if expired:
        raise PermissionDenied(f"{caller}: the read grant has expired; plan the read again")
    try:
        name, _admin, key = _verified(ca_pem, cert)
    except Unauthenticated as exc:
        raise PermissionDenied(f"{caller}: read grant not signed by the platform: {exc}") from None
    if name.partition(":")[0] != "service" or name.partition(":")[2] not in GRANTORS:
        raise PermissionDenied(f"{caller}: a read grant must be signed by the store, not {name}")
    try:
        key.verify(sig, _grant_message(task, caller, exp), ec.ECDSA(hashes.SHA256()))
    except Exception:  # noqa: BLE001 - InvalidSignature
        raise PermissionDenied(f"{caller}: the read grant does not match its ticket") from None
