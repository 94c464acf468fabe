"""Start a store cluster on this machine as real processes (a coordinator and N store nodes, each
with its own data directory and fault-domain label): used by the integration tests, the benchmark
and anyone trying the store without a deployment."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from microco.common.channel import pick_instance
from microco.common.election import LEADER_PREFIX
from microco.common.errors import Unavailable
from microco.common.kv import EtcdKV
from microco.common.registry import discover
from microco.services.runtime.launch import kill_after, start_service


class StoreCluster:
    def __init__(
        self,
        etcd: str,
        root: str | Path,
        nodes: Sequence[tuple[str, str]],
        lease_ttl_s: int = 2,
        coordinator_args: Sequence[str] = (),
        log_level: str = "warning",
        node_args: Sequence[str] = (),
    ) -> None:
        self.etcd = etcd
        self.root = Path(root)
        self.node_specs = list(nodes)
        self.lease_ttl_s = lease_ttl_s
        self.coordinator_args = list(coordinator_args)
        self.node_args = list(node_args)  # extra flags of every store node (e.g. --extent-cache-mb)
        self.log_level = log_level
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kv = EtcdKV(etcd)

    def _common(self, name: str) -> list[str]:
        return [
            "--etcd", self.etcd, "--port", "0", "--metrics-port", "-1", "--lease-ttl-s", str(self.lease_ttl_s),
            "--log-level", self.log_level, "--log-format", "text", "--grace-s", "1",
            "--data-dir", str(self.root / name), "--node", name,
        ]  # fmt: skip

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        return start_service(
            "microco.services.store", args, log_path=self.root / f"{name}.log", env={"OMP_NUM_THREADS": "1"}
        )

    def start_node(self, name: str, domain: str) -> None:
        self.procs[name] = self._spawn(
            name, ["node", *self._common(name), "--fault-domain", domain, *self.node_args]
        )

    def start(self, timeout: float = 60.0) -> StoreCluster:
        for name, domain in self.node_specs:
            self.start_node(name, domain)
        self.procs["coordinator"] = self._spawn(
            "coordinator", self._common("coordinator") + self.coordinator_args
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()  # a cluster that never became ready leaves no processes behind
            raise
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        want = {n for n, _ in self.node_specs if n in self.procs and self.procs[n].poll() is None}
        while time.monotonic() < deadline:
            nodes = {r.instance_id for r in discover(self.kv, "store-node")}
            coord = discover(self.kv, "store")
            if want <= nodes and coord:
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise Unavailable(f"{name} exited with {p.returncode}; see {self.root / (name + '.log')}")
            time.sleep(0.2)
        raise Unavailable(f"store cluster not ready after {timeout}s; logs in {self.root}")

    @property
    def coordinator_address(self) -> str:
        """The leading coordinator's address (a standby refuses calls)."""
        return pick_instance(self.kv, "store").address

    def leader(self) -> str | None:
        """The process name (``coordinator``, ``coordinator-standby``) of the coordinator the
        election key names, if it is registered and its process alive; else None."""
        raw = self.kv.get(LEADER_PREFIX + "store")
        for r in discover(self.kv, "store"):
            name = r.labels.get("node", "")
            if raw is not None and r.instance_id == raw.decode() and name in self.procs:
                return name if self.procs[name].poll() is None else None
        return None

    def wait_leader(self, timeout: float = 120.0) -> str:
        """Wait until a live coordinator leads (after a kill: its lease expires and a standby takes
        over); start one when no coordinator process is left. Returns the leader's address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = [n for n in ("coordinator", "coordinator-standby") if n in self.procs]
            if all(self.procs[n].poll() is not None for n in alive):
                self.procs["coordinator"] = self._spawn(
                    "coordinator", self._common("coordinator") + self.coordinator_args
                )
            if self.leader() is not None:
                return self.coordinator_address
            time.sleep(0.1)
        raise Unavailable(f"no live store coordinator leads after {timeout}s; logs in {self.root}")

    def start_standby(self, timeout: float = 60.0, name: str = "coordinator-standby") -> str:
        """Start a second coordinator (``name``: ``coordinator-standby``, or ``coordinator`` again
        once that one was killed): it stands by while the other leads. Returns its address once
        it is registered."""
        self.procs[name] = self._spawn(name, self._common(name) + self.coordinator_args)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in discover(self.kv, "store") if r.labels.get("node") == name]
            if found:
                return found[0].address
            if self.procs[name].poll() is not None:
                raise Unavailable(f"{name} exited with {self.procs[name].returncode}; see {self.root}")
            time.sleep(0.2)
        raise Unavailable(f"{name} did not register")

    def restart_coordinator(self, timeout: float = 60.0) -> None:
        """SIGKILL the coordinator and start a new one: everything it knows comes back from etcd."""
        old = {r.address for r in discover(self.kv, "store")}
        self.kill("coordinator")
        self.procs["coordinator"] = self._spawn(
            "coordinator", self._common("coordinator") + self.coordinator_args
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = discover(self.kv, "store")
            if recs and not ({r.address for r in recs} & old) and self.procs["coordinator"].poll() is None:
                return
            time.sleep(0.2)
        raise Unavailable("the restarted coordinator did not register")

    def kill(self, name: str) -> None:
        """SIGKILL: no goodbye, the node's lease must expire."""
        p = self.procs[name]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process stops answering without closing its connections (a hung process,
        a long GC pause, a host cut off); its lease runs out. ``kill`` ends it (SIGKILL)."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def wait_gone(self, name: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if name not in {r.instance_id for r in discover(self.kv, "store-node")}:
                return
            time.sleep(0.2)
        raise Unavailable(f"{name} still registered after {timeout}s")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            kill_after(p, 10)
        self.kv.close()

    def __enter__(self) -> StoreCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
