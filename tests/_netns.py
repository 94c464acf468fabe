"""A multi-host test bed on one machine: each "host" is a Linux network namespace with its own
address, all joined by a bridge (a switch) in the root namespace, which has an address of its
own so the test process reaches every host. A host is cut off the network by taking its link
down, and brought back by taking it up.

Needs root (or CAP_NET_ADMIN) and ``ip`` (iproute2); :func:`unavailable` says why not where it
cannot run, for a test to skip with that reason. Names carry the creating process's id, so
parallel test workers do not collide, and :meth:`NetnsBed.close` removes everything it made
(also after a failed test). Traffic stays on addresses the bed creates: 10.<a>.<b>.0/24.

Usage::

    with NetnsBed(["ctl", "b", "c"]) as bed:
        bed.addr("b")                      # "10.x.y.2"
        bed.popen("b", [sys.executable, "-m", ...])  # a process on host b
        bed.cut("b"); bed.heal("b")
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=10)


def unavailable() -> str | None:
    """Why a bed cannot be made here (None when it can)."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"mcprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"ip netns add failed: {r.stderr.strip() or r.returncode}"
        r = _ip("link", "add", f"mcpb{os.getpid() % 100000}", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"cannot create a bridge: {r.stderr.strip() or r.returncode}"
        _ip("link", "del", f"mcpb{os.getpid() % 100000}", check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class NetnsBed:
    """Hosts as network namespaces on one bridge (see the module's doc)."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if not hosts or len(set(hosts)) != len(hosts) or len(hosts) > 200:
            raise ValueError("hosts: 1 to 200 distinct names")
        pid = os.getpid()
        self.tag = f"{pid % 100000}"
        # a /24 per bed from the pid: 10.(200 + pid/256 % 50).(pid % 256).0/24
        self.prefix = f"10.{200 + (pid // 256) % 50}.{pid % 256}"
        self.bridge = f"mcbr{self.tag}"
        self.hosts = list(hosts)
        self.ns = {h: f"mc{self.tag}-{h}" for h in hosts}
        self._veth = {h: f"mcv{self.tag}x{i}" for i, h in enumerate(hosts)}
        self._addr = {h: f"{self.prefix}.{i + 1}" for i, h in enumerate(hosts)}
        self.root_addr = f"{self.prefix}.254"  # the test process's own address on the bridge
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._cut: set[str] = set()

    def addr(self, host: str) -> str:
        return self._addr[host]

    def up(self) -> NetnsBed:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.root_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for h in self.hosts:
                ns, veth = self.ns[h], self._veth[h]
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("addr", "add", f"{self._addr[h]}/24", "dev", "eth0", ns=ns)
                _ip("link", "set", "eth0", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (in its namespace)."""
        return ["ip", "netns", "exec", self.ns[host], *argv]

    def popen(self, host: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """A process on ``host``; stopped by :meth:`close` if still running."""
        p = subprocess.Popen(self.command(host, argv), **kw)
        self._procs.append((host, p))
        return p

    def cut(self, host: str) -> None:
        """Take ``host`` off the network (its link to the switch goes down)."""
        _ip("link", "set", self._veth[host], "down")
        self._cut.add(host)

    def heal(self, host: str) -> None:
        _ip("link", "set", self._veth[host], "up")
        self._cut.discard(host)

    def close(self) -> None:
        # A process on a host still cut off is killed: its graceful stop would wait on a
        # network it cannot reach (an agent revoking its lease in etcd: seconds).
        for host, p in self._procs:
            if p.poll() is None and host in self._cut:
                p.kill()
            elif p.poll() is None:
                p.terminate()
        for _, p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for h in self.hosts:
            _ip("link", "del", self._veth[h], check=False)  # its peer goes with it
            _ip("netns", "del", self.ns[h], check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> NetnsBed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close()
