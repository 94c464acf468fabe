"""The scheduler's mechanism: the job store (etcd) and the leader's control loop.

Every instance serves the API straight from etcd (submit writes a new record, cancel sets a
flag), so a standby answers too and nothing is lost when the leader dies. Only the leader
runs ``tick``: it reads the nodes and their processes, reconciles every job record with what
its process reports (progress, exits, lost nodes), asks the policy for decisions on a
``ClusterView`` and carries them out through the node agents, refusing any that went stale.
Records are frozen ``JobRecord``s written with compare-and-swap; the only fields the API changes
on an existing job are ``cancel_requested`` and ``operator``, so a lost race is merged exactly.

``SchedulerCore`` composes one part per concern, each in its own module:

- ``_store.JobStore``: the job table in etcd (API reads and writes, the tick's table, saves);
- ``_nodes.NodeIO``: the node agents (the tick's snapshot of nodes and processes, process
  control, placement of devices on nodes, orphans, garbage collection);
- ``_reconcile.Reconciler``: each record brought in line with what its processes report;
- ``_actions.DecisionApplier``: a decision checked (``policy.check``) and carried out;
- ``_view``: the policy's ``ClusterView`` from the records;
- ``_history``: decisions applied, jobs per state, the phases the cache follows;
- ``_transitions``: the pure state transitions of a record; ``_operator``: operator commands.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from microco.clients.agent import AgentDirectory
from microco.clients.cache import job_datasets
from microco.clients.scheduler import PhasePublisher
from microco.common.errors import Aborted, FailedPrecondition, MicrocoError
from microco.common.etcd_roles import remove_job_users
from microco.common.kv import KV
from microco.services.runtime.auth import revoke_ended_jobs

from . import _history as H
from . import _jobs as J
from . import _metrics as M
from . import _operator
from ._actions import DecisionApplier, MechanismSettings
from ._nodes import NodeIO
from ._profiles import PROFILES_PREFIX as PROFILES_PREFIX
from ._profiles import Profiles
from ._reconcile import Reconciler
from ._record import JobRecord
from ._store import JobStore
from ._view import build_view
from .policy import ClusterView, Decision, Policy, next_to_run

__all__ = ["PROFILES_PREFIX", "SchedulerCore"]

log = logging.getLogger(__name__)


class SchedulerCore:
    """Job store and control loop, independent of gRPC (the servicer is a thin adapter)."""

    def __init__(
        self,
        kv: KV,
        policy: Policy,
        agents: AgentDirectory | None = None,
        *,
        clock: Callable[[], float] = time.time,
        op_wait_s: float = 3.0,
        op_timeout_s: float = 30.0,
        max_restarts: int = 5,
        check_commands: bool = True,
        is_leader: Callable[[], bool] = lambda: True,
        failed_retention_s: float = 86400.0,
        gc_interval_s: float = 60.0,
        allow_spread: bool = False,
        log_retention_s: float = 86400.0,
        hook_grace_s: float = 120.0,
        warm_wait_s: float = 5.0,
    ) -> None:
        self.kv, self.policy, self.clock, self.is_leader = kv, policy, clock, is_leader
        self.check_commands = check_commands
        self.failed_retention_s, self.gc_interval_s = failed_retention_s, gc_interval_s
        self.log_retention_s = log_retention_s
        # May a multi-device job run as one process per node when no node has room? (Its
        # consolidation onto one node later is the policy's Migrate.) A job process that has
        # not reported through the hook ``hook_grace_s`` after its start is taken to run
        # without it: not preemptible (see ``Reconciler``). A job migrated to another node
        # restarts once that node's cache is warm for it, or ``warm_wait_s`` after its checkpoint.
        self.settings = MechanismSettings(
            op_timeout_s=op_timeout_s,
            max_restarts=max_restarts,
            hook_grace_s=hook_grace_s,
            allow_spread=allow_spread,
            warm_wait_s=warm_wait_s,
        )
        self.store = JobStore(kv)
        self.io = NodeIO(agents or AgentDirectory(kv), op_wait_s)
        self.profiles = Profiles(kv, clock)  # what earlier jobs of the same identity measured
        # What the other systems see of the jobs (the cache follows it): see clients/scheduler/_phases.
        self.phases = PhasePublisher(kv)
        self.actions = DecisionApplier(self.store, self.io, self.profiles, self.phases, self.settings)
        self.reconciler = Reconciler(self.store, self.io, self.profiles, self.actions, self.settings)
        self.history = H.DecisionLog()
        self._last_gc: float | None = None
        self._last_tick: float | None = None
        self._lock = threading.Lock()  # one tick at a time

    @property
    def agents(self) -> AgentDirectory:
        return self.io.agents

    @property
    def decisions_applied(self) -> list[dict[str, Any]]:
        """The recent decisions applied, oldest first (for tests and the log)."""
        return self.history.recent

    # ================================================================== API (any instance)
    def cluster_devices(self) -> list[dict[str, Any]]:
        return self.io.cluster_devices()

    def submit(self, spec: dict[str, Any]) -> JobRecord:
        n_devices = len(self.cluster_devices())
        if n_devices == 0 and int(spec.get("devices", 0)) > 0 and spec.get("command"):
            raise FailedPrecondition("no node agent is registered: the cluster has no devices yet")
        clean = J.validate_spec(spec, n_devices, check_command=self.check_commands)
        rec = J.new_record(clean, self.clock())
        self.store.create(rec)
        log.info("job submitted", extra={"job": rec.id, "devices": clean.devices})
        return rec

    def get(self, job_id: str) -> JobRecord:
        return self.store.get(job_id)

    def list_jobs(self, states: list[str] | None = None, owner: str = "") -> list[JobRecord]:
        return self.store.select(states, owner)

    def control(self, job_id: str, action: str, devices: list[str], count: int = 0) -> JobRecord:
        """An operator's suspend / resume / migrate / resize (see ``_operator``)."""
        cluster = {d["id"] for d in self.cluster_devices()}
        return _operator.request(self.store, cluster, self.clock, job_id, action, devices, count)

    def cancel(self, job_id: str) -> JobRecord:
        """Ask for cancellation; the leader stops the process within a tick. Idempotent."""

        def ask(rec: JobRecord) -> JobRecord | None:
            if rec.terminal or rec.cancel_requested:
                return None
            return replace(rec, cancel_requested=True, message="cancel requested")

        return self.store.change(job_id, ask)

    def watch(
        self, job_ids: list[str], active: Callable[[], bool], poll_s: float = 0.5
    ) -> Iterator[JobRecord]:
        """Every record change of the selected jobs (all when empty), starting with their current state."""
        return self.store.watch(job_ids, active, poll_s)

    def _remove_job_users(self, jobs: dict[str, JobRecord]) -> None:
        """The etcd users of ended jobs go (docs/security.md; nothing without etcd roles), and
        their certificates go on the deny-list every service follows."""
        try:
            remove_job_users(self.store.kv, {j for j, rec in jobs.items() if not rec.terminal})
        except MicrocoError as exc:
            log.warning("removing the etcd users of ended jobs failed: %s", exc)
        try:
            revoke_ended_jobs(self.store.kv, {j for j, rec in jobs.items() if rec.terminal})
        except MicrocoError as exc:
            log.warning("revoking the credentials of ended jobs failed: %s", exc)

    # ================================================================== leader: the loop
    def tick(self) -> list[Decision]:
        with self._lock, M.TICK.time():
            return self._tick()

    def _tick(self) -> list[Decision]:
        now = self.clock()
        dt = 0.0 if self._last_tick is None else min(max(now - self._last_tick, 0.0), 5.0)
        self._last_tick = now
        self.io.refresh()
        self.profiles.refresh(now)
        jobs = self.store.load()
        ended = False
        for job_id in list(jobs):
            before = jobs[job_id]
            rec = self.store.keep(self.profiles.identify(before, now))
            rec = self.reconciler.reconcile(rec, now, dt)
            if rec != before:
                rec = self.store.save(rec)
                ended = ended or (rec.terminal and not before.terminal)
        H.count_states(jobs.values())
        self.reconciler.refresh_packing(now)
        self.io.stop_orphans(jobs)
        if ended or self._last_gc is None or now - self._last_gc >= self.gc_interval_s:
            self._last_gc = now
            self.io.collect_garbage(list(jobs.values()), now, self.failed_retention_s, self.log_retention_s)
            self._remove_job_users(jobs)

        for job_id in list(jobs):
            before = jobs[job_id]
            if before.operator is not None and self.is_leader():
                # before the policy: it sees the result (a command waiting for the job's first
                # mini-batch boundary comes back unchanged: nothing to write)
                after = _operator.carry_out(self.actions, before, now)
                if after != before:
                    self.store.save(after)
        view = self._view(now)
        decisions = list(self.policy.decide(view))
        applied = []
        for d in decisions:
            if not self.is_leader():
                log.warning("lost leadership mid-tick; leaving the remaining decisions")
                break
            try:
                if self.actions.apply(d, now):
                    applied.append(d)
                    self.history.applied(d, now)
            except Aborted:
                raise
            except MicrocoError as exc:
                self.history.refused(d, exc)
            self.reconciler.refresh_packing(now)
        if self.is_leader():
            datasets = {j.id: j.dataset for j in view.jobs if j.dataset}  # (read once a tick)
            H.publish_phases(self.phases, self.store.jobs.values(), now, self._next_jobs(now, datasets))
        return applied

    def _next_jobs(self, now: float, datasets: dict[str, str]) -> tuple[str, ...] | None:
        """The jobs the policy will run at its next decision point, seen from the state the
        tick's decisions left (what the caches prefetch for); None (the phases' default
        order) when it cannot say."""
        if not hasattr(self.policy, "wakeup_at"):
            return None  # (no decision point to forecast at: not worth a view)
        try:
            view = build_view(now, self.io.nodes, self.store.jobs.values(), self.profiles, datasets)
            return next_to_run(self.policy, view)
        except (MicrocoError, ValueError) as exc:  # advice only: never fail a tick
            log.warning("cannot forecast the next jobs: %s", exc)
            return None

    # ------------------------------------------------------------------ policy input
    def observe(self, now: float | None = None) -> ClusterView:
        """The ``ClusterView`` the policy would be given from the node and job records in etcd
        as they stand (no agent is contacted, nothing is written): for tools and for checking
        that the simulator and the live scheduler show a policy the same state."""
        now = self.clock() if now is None else now
        return build_view(now, self.agents.nodes(), self.store.read_all(), self.profiles, self._datasets())

    def _view(self, now: float) -> ClusterView:
        return build_view(now, self.io.nodes, self.store.jobs.values(), self.profiles, self._datasets())

    def _datasets(self) -> dict[str, str]:
        """The dataset each job reads, as the cache servers registered it (issue 21: dataset
        affinity); read only for a policy that asks for it."""
        return job_datasets(self.store.kv) if getattr(self.policy, "reads_datasets", False) else {}
