"""The leader's side of the node agents: what the nodes and their processes are this tick, the
calls that start, control and stop a job's processes, and where devices are.

``NodeIO.refresh`` takes one snapshot per tick (the registered nodes and, for each reachable
one, its processes); every other method reads that snapshot or talks to an agent. Nothing here
changes a job record: the callers (``_reconcile``, ``_actions``) do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from microco.api.agent.v1 import agent_pb2
from microco.clients.agent import AgentDirectory
from microco.common.errors import FailedPrecondition, MicrocoError

from . import _jobs as J
from . import _metrics as M
from ._record import JobRecord

log = logging.getLogger(__name__)

EXITED = agent_pb2.PROCESS_STATE_EXITED


class NodeIO:
    def __init__(self, agents: AgentDirectory, op_wait_s: float = 3.0) -> None:
        self.agents = agents
        self.op_wait_s = op_wait_s
        self.nodes: dict[str, dict[str, Any]] = {}
        self.procs: dict[str, dict[str, Any]] = {}  # node -> job id -> process status (reachable nodes)

    # ------------------------------------------------------------------ the tick's snapshot
    def refresh(self) -> None:
        nodes = self.agents.nodes()
        procs: dict[str, dict[str, Any]] = {}
        for name, node in nodes.items():
            try:
                procs[name] = {p.job_id: p for p in self.agents.list_processes(node["address"])}
            except MicrocoError as exc:
                log.warning("node %s unreachable this tick: %s", name, exc)
        self.nodes, self.procs = nodes, procs

    def cluster_devices(self) -> list[dict[str, Any]]:
        """Every device of the registered nodes, as etcd has them now (not the snapshot)."""
        devs = []
        for _, node in sorted(self.agents.nodes().items()):
            devs.extend(node.get("devices", []))
        return devs

    def address(self, node: str) -> str:
        n = self.nodes.get(node)
        if not n:
            raise FailedPrecondition(f"node {node} is not registered")
        return str(n["address"])

    def proc(self, rec: JobRecord) -> Any:
        """The status of the job's rank-0 process of its current attempt, or None."""
        p = self.procs.get(rec.node, {}).get(rec.id)
        return p if p is not None and p.attempt == rec.attempt else None

    # ------------------------------------------------------------------ where devices are
    def owners(self, devices: Iterable[str]) -> dict[str, str]:
        """Device id -> node over every live node; refuses `devices` unless all are on live nodes."""
        devices = list(devices)
        owners: dict[str, str] = {}
        for name, node in self.nodes.items():
            for d in node.get("devices", []):
                owners[d["id"]] = name
        if not devices or any(d not in owners for d in devices):
            raise FailedPrecondition(f"devices {devices} are not all on live nodes")
        return owners

    def placement(self, devices: list[str], allow_spread: bool) -> list[tuple[str, list[str]]]:
        """The devices grouped by node, rank 0's node (the one with most of them) first. More
        than one node only when spreading is allowed."""
        owners = self.owners(devices)
        groups: dict[str, list[str]] = {}
        for d in devices:
            groups.setdefault(owners[d], []).append(d)
        if len(groups) > 1 and not allow_spread:
            raise FailedPrecondition(
                f"devices {devices} span nodes {sorted(groups)}; spreading a job is off (allow_spread)"
            )
        return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))

    def node_of(self, devices: list[str]) -> str:
        owners = self.owners(devices)
        nodes = {owners[d] for d in devices}
        if len(nodes) != 1:
            raise FailedPrecondition(f"devices {devices} span nodes {sorted(nodes)}; a job runs on one node")
        return nodes.pop()

    def device_known(self, device: str) -> bool:
        return any(dv["id"] == device for node in self.nodes.values() for dv in node.get("devices", []))

    # ------------------------------------------------------------------ process control
    def stop_ranks(self, rec: JobRecord, skip: str = "") -> None:
        """Stop the job's processes (every rank, but ``skip``'s) on the nodes still reachable."""
        for node in rec.rank_nodes:
            if node == skip or node not in self.procs:
                continue
            try:
                self.agents.stop(self.address(node), rec.id)
            except MicrocoError as exc:
                log.warning("stopping %s on %s: %s", rec.id, node, exc)

    def control_ranks(self, rec: JobRecord, action: str) -> Any:
        """Send ``action`` to every rank; returns rank 0's status (its seq is the one awaited)."""
        first = None
        for node in rec.rank_nodes:
            st = self.agents.control(self.address(node), rec.id, action)
            first = first or st
        return first

    def wait_proc(self, rec: JobRecord, pred: Callable[[Any], bool]) -> Any:
        """The job's process once ``pred`` holds for it, or None after ``op_wait_s``."""
        deadline = time.monotonic() + self.op_wait_s
        address = self.address(rec.node)
        while time.monotonic() < deadline:
            try:
                for p in self.agents.list_processes(address):
                    if p.job_id == rec.id and p.attempt == rec.attempt and pred(p):
                        return p
            except MicrocoError:
                return None
            time.sleep(0.01)
        return None

    def stop_orphans(self, jobs: dict[str, JobRecord]) -> None:
        """A process the records do not expect (an older attempt, a cancelled job) is stopped."""
        for node, procs in self.procs.items():
            for job_id, p in procs.items():
                if p.state == EXITED:
                    continue
                rec = jobs.get(job_id)
                if rec is None:
                    continue  # not ours (started by someone else through the agent)
                if node in rec.rank_nodes and rec.attempt == p.attempt and rec.has_process:
                    continue
                log.warning(
                    "stopping orphan process", extra={"job": job_id, "node": node, "attempt": p.attempt}
                )
                try:
                    self.agents.stop(self.nodes[node]["address"], job_id)
                except MicrocoError as exc:
                    log.warning("orphan stop failed: %s", exc)

    def collect_garbage(
        self, records: list[JobRecord], now: float, failed_retention_s: float, log_retention_s: float
    ) -> None:
        """Ask every reachable node to delete the data of jobs that need none any more
        (finished, cancelled, failed past retention, unknown), keeping the logs of jobs that
        ended within ``log_retention_s``. The tick runs it after reconciliation and before any
        start, so no job this leader starts can be missing from the keep set; agents never
        delete the data of a job with a live process."""
        keep = sorted(J.retained_job_ids(records, now, failed_retention_s))
        keep_logs = sorted(J.log_job_ids(records, now, log_retention_s))
        for name in self.procs:
            try:
                resp = self.agents.collect_garbage(self.nodes[name]["address"], keep, keep_logs)
            except MicrocoError as exc:
                log.warning("garbage collection on %s failed: %s", name, exc)
                continue
            if resp.deleted_job_ids:
                M.GC_JOBS.inc(len(resp.deleted_job_ids))
                M.GC_BYTES.inc(resp.bytes_freed)
                log.info(
                    "deleted job data",
                    extra={"node": name, "jobs": list(resp.deleted_job_ids), "bytes": resp.bytes_freed},
                )
