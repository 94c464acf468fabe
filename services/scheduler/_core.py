"""The scheduler's mechanism: the job store (etcd) and the leader's control loop.

Every instance serves the API straight from etcd (submit writes a new record, cancel sets a
flag), so a standby answers too and nothing is lost when the leader dies. Only the leader
runs ``tick``: it reads the nodes and their processes, reconciles every job record with what
its process reports (progress, exits, lost nodes), asks the policy for decisions on a
``ClusterView`` and carries them out through the node agents, refusing any that went stale.
Records are written with compare-and-swap; the only field the API changes on an existing job
is ``cancel_requested``, so a lost race is merged exactly (see ``_save``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from microco.api.agent.v1 import agent_pb2
from microco.clients.agent import AgentDirectory
from microco.clients.cache import job_datasets
from microco.clients.scheduler import EXIT_CHECKPOINTED, PhasePublisher
from microco.common.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    MicrocoError,
    NotFound,
)
from microco.common.etcd_roles import add_job_user
from microco.common.identity import job_credentials_env
from microco.common.kv import KV, dumps

from . import _jobs as J
from . import _metrics as M
from . import _operator
from ._profiles import PROFILES_PREFIX as PROFILES_PREFIX
from ._profiles import Profiles
from .policy import (
    Decision,
    JobFacts,
    JobPhase,
    Migrate,
    Pack,
    Policy,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
    check,
    cluster_view_from_dicts,
)

log = logging.getLogger(__name__)

# Mini-batches after a change before the job's reported mean (over its last 20, the hook's
# window, plus the boundary the change waited for) is wholly a measurement of the new setup.
_SETTLE_STEPS = 25


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
    ) -> None:
        self.kv, self.policy = kv, policy
        # A job process that has not reported through the scheduler's hook this long after
        # its start is taken to run without it: not preemptible (see ``_check_hook``).
        self.hook_grace_s = hook_grace_s
        self.agents = agents or AgentDirectory(kv)
        self.clock = clock
        self.op_wait_s, self.op_timeout_s = op_wait_s, op_timeout_s
        self.max_restarts = max_restarts
        self.check_commands = check_commands
        self.is_leader = is_leader
        self.failed_retention_s, self.gc_interval_s = failed_retention_s, gc_interval_s
        self.log_retention_s = log_retention_s
        # May a multi-device job run as one process per node when no node has room? (Its
        # consolidation onto one node later is the policy's Migrate.)
        self.allow_spread = allow_spread
        self._last_gc: float | None = None
        self._raw: dict[str, bytes] = {}
        self.profiles = Profiles(kv, clock)  # what earlier jobs of the same identity measured
        self._last_tick: float | None = None
        self._lock = threading.Lock()  # one tick at a time
        self.decisions_applied: list[dict[str, Any]] = []  # recent, for tests and the log
        # What the other systems see of the jobs (the cache follows it): see clients/scheduler/_phases.
        self.phases = PhasePublisher(kv)

    # ================================================================== API (any instance)
    def cluster_devices(self) -> list[dict[str, Any]]:
        devs = []
        for _, node in sorted(self.agents.nodes().items()):
            devs.extend(node.get("devices", []))
        return devs

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        n_devices = len(self.cluster_devices())
        if n_devices == 0 and int(spec.get("devices", 0)) > 0 and spec.get("command"):
            raise FailedPrecondition("no node agent is registered: the cluster has no devices yet")
        clean = J.validate_spec(spec, n_devices, check_command=self.check_commands)
        rec = J.new_record(clean, self.clock())
        if not self.kv.compare_and_swap(J.job_key(rec["id"]), None, dumps(rec)):
            raise MicrocoError("job id collision; submit again")
        log.info("job submitted", extra={"job": rec["id"], "devices": clean["devices"]})
        return rec

    def get(self, job_id: str) -> dict[str, Any]:
        if not job_id:
            raise InvalidArgument("job id is required")
        rec = self.kv.get_json(J.job_key(job_id))
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        return rec

    def list_jobs(self, states: list[str] | None = None, owner: str = "") -> list[dict[str, Any]]:
        out = [rec for _, rec in self.kv.get_prefix_json(J.JOBS_PREFIX)]
        if states:
            out = [r for r in out if r["state"] in states]
        if owner:
            out = [r for r in out if r["spec"]["user"] == owner]
        return sorted(out, key=lambda r: (r["submitted_at"], r["id"]))

    def control(self, job_id: str, action: str, devices: list[str], count: int = 0) -> dict[str, Any]:
        """An operator's suspend / resume / migrate / resize (see ``_operator``)."""
        return _operator.request(self, job_id, action, devices, count)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Ask for cancellation; the leader stops the process within a tick. Idempotent."""
        key = J.job_key(job_id)
        while True:
            raw = self.kv.get(key)
            if raw is None:
                raise NotFound(f"no job {job_id!r}")
            rec = json.loads(raw)
            if rec["state"] in J.TERMINAL or rec["cancel_requested"]:
                return rec
            rec["cancel_requested"] = True
            rec["message"] = "cancel requested"
            if self.kv.compare_and_swap(key, raw, dumps(rec)):
                return rec

    def watch(
        self, job_ids: list[str], active: Callable[[], bool], poll_s: float = 0.5
    ) -> Iterator[dict[str, Any]]:
        """Every record change of the selected jobs (all when empty), starting with their current state."""
        wanted = set(job_ids)
        q: queue.Queue[dict[str, Any]] = queue.Queue()

        def on_event(ev: Any) -> None:
            if ev.kind == "put" and ev.value:
                rec = json.loads(ev.value)
                if not wanted or rec["id"] in wanted:
                    q.put(rec)

        cancel = self.kv.watch_prefix(J.JOBS_PREFIX, on_event)
        try:
            for rec in self.list_jobs():
                if not wanted or rec["id"] in wanted:
                    yield rec
            missing = wanted - {r["id"] for r in self.list_jobs()}
            if missing:
                raise NotFound(f"no job {min(missing)!r}")
            while active():
                try:
                    yield q.get(timeout=poll_s)
                except queue.Empty:
                    continue
        finally:
            cancel()

    # ================================================================== leader: the loop
    def tick(self) -> list[Decision]:
        with self._lock, M.TICK.time():
            return self._tick()

    def _tick(self) -> list[Decision]:
        now = self.clock()
        dt = 0.0 if self._last_tick is None else min(max(now - self._last_tick, 0.0), 5.0)
        self._last_tick = now
        nodes = self.agents.nodes()
        procs: dict[str, dict[str, Any]] = {}
        for name, node in nodes.items():
            try:
                procs[name] = {p.job_id: p for p in self.agents.list_processes(node["address"])}
            except MicrocoError as exc:
                log.warning("node %s unreachable this tick: %s", name, exc)
        self._nodes, self._procs = nodes, procs
        self.profiles.refresh(now)
        jobs: dict[str, dict[str, Any]] = {}
        self._raw = {}
        for _key, raw in self.kv.get_prefix(J.JOBS_PREFIX):
            rec = json.loads(raw)
            self._raw[rec["id"]] = raw
            jobs[rec["id"]] = rec
        self._jobs = jobs
        ended = False
        for rec in list(jobs.values()):
            before = copy.deepcopy(rec)
            self.profiles.identify(rec, now)
            self._reconcile(rec, now, dt)
            if rec != before:
                self._save(rec)
                ended = ended or (rec["state"] in J.TERMINAL and before["state"] not in J.TERMINAL)
        counts: dict[str, int] = {}
        for rec in jobs.values():
            counts[rec["state"]] = counts.get(rec["state"], 0) + 1
        for state in J._STATE_TO_PB:
            M.JOBS.labels(state).set(counts.get(state, 0))
        self._refresh_packing(now)
        self._stop_orphans()
        if ended or self._last_gc is None or now - self._last_gc >= self.gc_interval_s:
            self._collect_garbage(now)

        for rec in list(jobs.values()):
            if rec.get("operator") and self.is_leader():
                _operator.carry_out(self, rec, now)  # before the policy: it sees the result
                self._save(rec)
        view = self._view(now)
        decisions = list(self.policy.decide(view))
        applied = []
        for d in decisions:
            if not self.is_leader():
                log.warning("lost leadership mid-tick; leaving the remaining decisions")
                break
            try:
                if self._apply(d, now):
                    M.DECISIONS.labels(type(d).__name__, "done").inc()
                    applied.append(d)
                    self.decisions_applied = (
                        self.decisions_applied
                        + [
                            {
                                "at": now,
                                "decision": type(d).__name__,
                                "job": d.job_id,
                                "devices": list(getattr(d, "devices", ())),
                                "reason": d.reason,
                            }
                        ]
                    )[-200:]
            except Aborted:
                raise
            except MicrocoError as exc:
                M.DECISIONS.labels(type(d).__name__, "refused").inc()
                log.warning("decision %s refused: %s", d, exc)
            self._refresh_packing(now)
        self._publish_phases(now)
        return applied

    def _publish_phases(self, now: float) -> None:
        if not self.is_leader():
            return
        try:
            self.phases.publish(self._jobs.values(), now)
        except MicrocoError as exc:  # the phases are advice to the cache: never fail a tick
            log.warning("cannot publish job phases: %s", exc)

    # ------------------------------------------------------------------ store
    def _save(self, rec: dict[str, Any]) -> None:
        key = J.job_key(rec["id"])
        while True:
            new = dumps(rec)
            old = self._raw.get(rec["id"])
            if self.kv.compare_and_swap(key, old, new):
                self._raw[rec["id"]] = new
                return
            # Lost a race. The API changes only cancel_requested: merge that exactly. Anything
            # else means another leader wrote (we lost leadership mid-tick): give up the tick.
            fresh = self.kv.get(key)
            if fresh is None:
                return
            theirs = json.loads(fresh)
            mine_before = json.loads(old) if old else None
            if mine_before is None or {
                **theirs,
                "cancel_requested": False,
                "message": "",
                "operator": None,
            } != {
                **mine_before,
                "cancel_requested": False,
                "message": "",
                "operator": None,
            }:
                raise Aborted(f"job {rec['id']} was changed by another scheduler; abandoning this tick")
            rec["cancel_requested"] = rec["cancel_requested"] or theirs["cancel_requested"]
            if not mine_before.get("operator") and theirs.get("operator"):
                rec["operator"] = theirs["operator"]  # an operator's command, also from the API
            self._raw[rec["id"]] = fresh

    # ------------------------------------------------------------------ reconcile
    def _address(self, node: str) -> str:
        n = self._nodes.get(node)
        if not n:
            raise FailedPrecondition(f"node {node} is not registered")
        return str(n["address"])

    def _proc(self, rec: dict[str, Any]) -> Any:
        p = self._procs.get(rec["node"], {}).get(rec["id"])
        return p if p is not None and p.attempt == rec["attempt"] else None

    @staticmethod
    def _rank_nodes(rec: dict[str, Any]) -> list[str]:
        """The nodes of a job's processes: rank 0's (``node``) first; one unless spread."""
        return [r["node"] for r in rec.get("ranks") or []] or ([rec["node"]] if rec["node"] else [])

    def _stop_ranks(self, rec: dict[str, Any], skip: str = "") -> None:
        """Stop the job's processes (every rank, but ``skip``'s) on the nodes still reachable."""
        for node in self._rank_nodes(rec):
            if node == skip or node not in self._procs:
                continue
            try:
                self.agents.stop(self._address(node), rec["id"])
            except MicrocoError as exc:
                log.warning("stopping %s on %s: %s", rec["id"], node, exc)

    def _control_ranks(self, rec: dict[str, Any], action: str) -> Any:
        """Send ``action`` to every rank; returns rank 0's status (its seq is the one awaited)."""
        first = None
        for node in self._rank_nodes(rec):
            st = self.agents.control(self._address(node), rec["id"], action)
            first = first or st
        return first

    def _has_process(self, rec: dict[str, Any]) -> bool:
        return rec["state"] in J.HOLDING or (rec["state"] == J.SUSPENDED and rec["parked"])

    def _release(self, rec: dict[str, Any]) -> None:
        rec["devices"], rec["packed_with"], rec["parked"], rec["pending"] = [], [], False, None
        rec["ranks"] = []

    def _lost(self, rec: dict[str, Any], why: str, now: float) -> None:
        M.LOST.inc()
        self._release(rec)
        rec["restarts"] += 1
        if rec["restarts"] > self.max_restarts:
            J.set_state(rec, J.FAILED, f"{why}; gave up after {self.max_restarts} restarts", now)
            rec["finished_at"] = now
            return
        if rec["checkpoint_step"] >= 0:
            J.set_state(
                rec, J.SUSPENDED, f"{why}; will resume from checkpoint step {rec['checkpoint_step']}", now
            )
        else:
            J.set_state(rec, J.QUEUED, f"{why}; no checkpoint yet, will restart from the beginning", now)
        log.warning("job lost", extra={"job": rec["id"], "why": why})

    def _reconcile(self, rec: dict[str, Any], now: float, dt: float) -> None:
        if rec["state"] in J.TERMINAL:
            return
        if rec["cancel_requested"]:
            if self._has_process(rec):
                self._stop_ranks(rec)
            self._release(rec)
            J.set_state(rec, J.CANCELLED, "cancelled by the user", now)
            rec["finished_at"] = now
            return
        if not self._has_process(rec):
            return
        node = rec["node"]
        if rec.get("ranks") and not self._reconcile_ranks(rec, now):
            return
        if node not in self._nodes:
            self._lost(rec, f"node {node} was lost", now)
            return
        if node not in self._procs:
            return  # unreachable this tick; its lease decides
        p = self._proc(rec)
        if p is None:
            self._lost(rec, f"process of attempt {rec['attempt']} is gone from node {node}", now)
            return
        if p.state != agent_pb2.PROCESS_STATE_EXITED:
            self._check_hook(rec, p, now)
        if p.job_state:
            rec["step"] = int(p.step)
        rec["checkpoint_step"] = max(rec["checkpoint_step"], int(p.checkpoint_step))
        if p.first_step_at and not rec["first_step_at"]:
            rec["first_step_at"] = p.first_step_at
        if p.minibatch_ms > 0 and p.job_state == "running":
            rec["minibatch_ms"] = p.minibatch_ms
            if p.step - rec.get("step_at_change", 0) > _SETTLE_STEPS:
                # the job's window of recent mini-batches now lies wholly after the change
                rec["settled_ms"] = [rec.get("step_at_change", 0), p.minibatch_ms]
            # Alone-time: only once the job ran a few mini-batches on its own devices.
            # The fastest time seen alone: load from outside the job only ever inflates it.
            if rec["state"] == J.RUNNING and p.step - rec.get("step_at_change", 0) >= 5:
                best = min(rec["minibatch_ms_alone"] or p.minibatch_ms, p.minibatch_ms)
                rec["minibatch_ms_alone"] = best
                # How much of its devices the job keeps busy alone (the job measures it): what
                # gandiva's packing reads (``JobView.utilization``). Measured while packed, it
                # would be the share the partner leaves, so only alone; the latest counts.
                if p.HasField("utilization"):
                    rec["utilization"] = float(p.utilization)
                self.profiles.learn_alone(rec)
        if rec["state"] in J.HOLDING:
            rec["attained_service_s"] += dt * max(1, len(rec["devices"]))
        pending = rec["pending"]
        if p.state == agent_pb2.PROCESS_STATE_EXITED:
            code = p.exit_code
            if code == 0:
                self._release(rec)
                rec["finished_at"] = now
                done = f"finished at step {rec['step']}"
                if rec.get("no_hook") and not p.job_state:
                    done = "finished (its steps were not reported: it ran without the scheduler's hook)"
                J.set_state(rec, J.FINISHED, done, now)
            elif code == EXIT_CHECKPOINTED:
                then = (pending or {}).get("then")
                devices = (pending or {}).get("devices") or []
                self._release(rec)
                J.set_state(rec, J.SUSPENDED, f"checkpointed at step {rec['checkpoint_step']}", now)
                if then == "move" and devices:
                    self._start_process(rec, devices, now, "moved")
            elif code < 0:
                # the agent's line says more when a launcher's rank vanished (see ``_ranks``)
                why = p.message if p.message and not p.message.startswith("killed by") else ""
                self._lost(rec, why or f"process killed by signal {-code}", now)
            else:
                self._release(rec)
                rec["finished_at"] = now
                J.set_state(rec, J.FAILED, p.message or f"process exited with {code}", now)
            return
        if pending:
            done = p.seq_done >= pending.get("seq", 0)
            if pending["op"] == "suspend" and done:
                self._parked(rec, now)
            elif pending["op"] in ("resume", "resize") and done:
                rec["pending"] = None
            elif now - pending.get("since", now) > max(self.op_timeout_s, 10 * rec["minibatch_ms"] / 1000.0):
                log.warning(
                    "job %s did not carry out %s in %.0fs; stopping it",
                    rec["id"],
                    pending["op"],
                    self.op_timeout_s,
                )
                try:
                    self.agents.stop(self._address(node), rec["id"])
                except MicrocoError:
                    pass

    def _check_hook(self, rec: dict[str, Any], p: Any, now: float) -> None:
        """A job whose process has not reported through the hook ``hook_grace_s`` after it
        started runs without it: it cannot obey suspend, migrate or resize at a boundary, so
        the policy is told it is not preemptible (no wasted suspend attempts every tick) and
        the user reads why in the job's history."""
        if p.job_state or p.first_step_at:
            if rec.get("no_hook"):
                rec["no_hook"] = False
                J.note(rec, "the job's hook reports now: preemptible again", now)
            return
        started = float(p.started_at or 0.0)
        if not rec.get("no_hook") and started and now - started >= self.hook_grace_s:
            rec["no_hook"] = True
            J.note(
                rec,
                f"no report from the scheduler's hook {self.hook_grace_s:.0f} s after the start: "
                "not preemptible (it keeps its devices until it ends; add TorchHook or "
                "SchedulerCallback to make it so)",
                now,
            )

    def _reconcile_ranks(self, rec: dict[str, Any], now: float) -> bool:
        """A spread job's other ranks: all must live while rank 0 does (a missing rank would
        leave the others waiting in an all-reduce). False when the job was handled here."""
        for r in rec["ranks"][1:]:
            node = r["node"]
            if node not in self._nodes:
                self._stop_ranks(rec, skip=node)
                self._lost(rec, f"node {node} (a rank of this spread job) was lost", now)
                return False
            if node not in self._procs:
                continue  # unreachable this tick; its lease decides
            p = self._procs[node].get(rec["id"])
            if p is None or p.attempt != rec["attempt"]:
                self._stop_ranks(rec, skip=node)
                self._lost(rec, f"rank process on {node} is gone", now)
                return False
            if p.state == agent_pb2.PROCESS_STATE_EXITED and p.exit_code not in (0, EXIT_CHECKPOINTED):
                self._stop_ranks(rec, skip=node)
                if p.exit_code < 0:
                    self._lost(rec, f"rank process on {node} killed by signal {-p.exit_code}", now)
                else:
                    self._release(rec)
                    rec["finished_at"] = now
                    J.set_state(rec, J.FAILED, p.message or f"rank on {node} exited with {p.exit_code}", now)
                return False
        return True

    def _parked(self, rec: dict[str, Any], now: float) -> None:
        # The decision's reason rides on the pending operation, so the history says why.
        reason = (rec["pending"] or {}).get("reason", "")
        rec["devices"], rec["packed_with"], rec["pending"], rec["parked"] = [], [], None, True
        msg = f"suspended at step {rec['step']} (parked on {rec['node']})"
        J.set_state(rec, J.SUSPENDED, f"{msg}: {reason}" if reason else msg, now)

    def _refresh_packing(self, now: float) -> None:
        by_dev: dict[str, list[str]] = {}
        for rec in self._jobs.values():
            if rec["state"] in (J.RUNNING, J.PACKED):
                for d in rec["devices"]:
                    by_dev.setdefault(d, []).append(rec["id"])
        for rec in self._jobs.values():
            if rec["state"] not in (J.RUNNING, J.PACKED):
                continue
            partners = sorted({j for d in rec["devices"] for j in by_dev.get(d, []) if j != rec["id"]})
            state = J.PACKED if partners else J.RUNNING
            if state != rec["state"] or partners != rec["packed_with"]:
                rec["packed_with"] = partners
                if state != rec["state"]:
                    rec["step_at_change"] = rec["step"]
                    J.set_state(
                        rec,
                        state,
                        f"packed with {', '.join(partners)}"
                        if partners
                        else f"running alone on {', '.join(rec['devices'])}",
                        now,
                    )
                self._save(rec)

    def _stop_orphans(self) -> None:
        """A process the records do not expect (an older attempt, a cancelled job) is stopped."""
        for node, procs in self._procs.items():
            for job_id, p in procs.items():
                if p.state == agent_pb2.PROCESS_STATE_EXITED:
                    continue
                rec = self._jobs.get(job_id)
                if rec is None:
                    continue  # not ours (started by someone else through the agent)
                if node in self._rank_nodes(rec) and rec["attempt"] == p.attempt and self._has_process(rec):
                    continue
                log.warning(
                    "stopping orphan process", extra={"job": job_id, "node": node, "attempt": p.attempt}
                )
                try:
                    self.agents.stop(self._nodes[node]["address"], job_id)
                except MicrocoError as exc:
                    log.warning("orphan stop failed: %s", exc)

    def _collect_garbage(self, now: float) -> None:
        """Ask every reachable node to delete the data of jobs that need none any more
        (finished, cancelled, failed past retention, unknown), keeping the logs of jobs that
        ended within ``log_retention_s``. Runs in the tick, after reconciliation and before any
        start, so no job this leader starts can be missing from the keep set; agents never
        delete the data of a job with a live process."""
        self._last_gc = now
        records = list(self._jobs.values())
        keep = sorted(J.retained_job_ids(records, now, self.failed_retention_s))
        keep_logs = sorted(J.log_job_ids(records, now, self.log_retention_s))
        for name in self._procs:
            try:
                resp = self.agents.collect_garbage(self._nodes[name]["address"], keep, keep_logs)
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

    # ------------------------------------------------------------------ policy input
    def observe(self, now: float | None = None) -> Any:
        """The ``ClusterView`` the policy would be given from the node and job records in etcd
        as they stand (no agent is contacted, nothing is written): for tools and for checking
        that the simulator and the live scheduler show a policy the same state."""
        now = self.clock() if now is None else now
        jobs = {rec["id"]: rec for _, rec in self.kv.get_prefix_json(J.JOBS_PREFIX)}
        return self._view(now, self.agents.nodes(), jobs)

    def _view(
        self,
        now: float,
        nodes: dict[str, dict[str, Any]] | None = None,
        jobs: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        nodes = self._nodes if nodes is None else nodes
        jobs = self._jobs if jobs is None else jobs
        devices = []
        for name in sorted(nodes):
            for d in nodes[name].get("devices", []):
                devices.append(
                    {"id": d["id"], "node": name, "kind": d.get("kind", "gpu"), "model": d.get("model", "")}
                )
        views = []
        # the dataset each job reads, as the cache servers registered it (issue 21: affinity)
        datasets = job_datasets(self.kv) if getattr(self.policy, "reads_datasets", False) else {}
        for r in jobs.values():
            if r["state"] in J.TERMINAL or r["cancel_requested"]:
                continue
            if r.get("held") and r["state"] not in J.HOLDING:
                continue  # suspended by an operator: not the policy's to resume
            v = J.record_to_view(r)
            trial = r.get("grow_trial")
            if trial:
                v["grown_from"] = trial["from"]
                v["minibatch_ms_before_grow"] = trial["ms_before"]
            v["minibatch_ms_settled"] = self._settled_ms(r)
            v["max_useful_devices"] = r.get("max_useful_devices")
            self.profiles.fill_view(r, v)  # what it has not measured yet, from earlier jobs like it
            v["preemptible"] = not r.get("no_hook")
            v["dataset"] = datasets.get(r["id"], "")
            views.append(v)
        return cluster_view_from_dicts(now, devices, views)

    # ------------------------------------------------------------------ decisions
    def _occupied(self, exclude: set[str] = frozenset()) -> dict[str, set[str]]:  # type: ignore[assignment]
        occ: dict[str, set[str]] = {}
        for rec in self._jobs.values():
            if rec["id"] in exclude or rec["state"] in J.TERMINAL:
                continue
            held = list(rec["devices"]) if rec["state"] in J.HOLDING else []
            held += list((rec["pending"] or {}).get("devices") or [])
            for d in held:
                occ.setdefault(d, set()).add(rec["id"])
        return occ

    def _placement(self, devices: list[str]) -> list[tuple[str, list[str]]]:
        """The devices grouped by node, rank 0's node (the one with most of them) first. More
        than one node only when spreading is allowed."""
        owners = self._owners(devices)
        groups: dict[str, list[str]] = {}
        for d in devices:
            groups.setdefault(owners[d], []).append(d)
        if len(groups) > 1 and not self.allow_spread:
            raise FailedPrecondition(
                f"devices {devices} span nodes {sorted(groups)}; spreading a job is off (allow_spread)"
            )
        return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))

    def _owners(self, devices: list[str]) -> dict[str, str]:
        """Device id -> node over every live node; refuses `devices` unless all are on live nodes."""
        owners: dict[str, str] = {}
        for name, node in self._nodes.items():
            for d in node.get("devices", []):
                owners[d["id"]] = name
        if not devices or any(d not in owners for d in devices):
            raise FailedPrecondition(f"devices {devices} are not all on live nodes")
        return owners

    def _node_of(self, devices: list[str]) -> str:
        owners = self._owners(devices)
        nodes = {owners[d] for d in devices}
        if len(nodes) != 1:
            raise FailedPrecondition(f"devices {devices} span nodes {sorted(nodes)}; a job runs on one node")
        return nodes.pop()

    def _at_boundary(self, rec: dict[str, Any]) -> None:
        """Control acts at mini-batch boundaries: a process still starting (no mini-batch done
        since its start) has none yet, so it is not suspended or moved until it reports."""
        p = self._proc(rec)
        if p is None or not p.first_step_at:  # the hook's first_step_at is per process
            raise FailedPrecondition(f"job {rec['id']} has not reached a mini-batch boundary yet")

    def _job(self, job_id: str) -> dict[str, Any]:
        rec = self._jobs.get(job_id)
        if rec is None or rec["state"] in J.TERMINAL or rec["cancel_requested"]:
            raise FailedPrecondition(f"job {job_id} is not schedulable now")
        if rec["pending"]:
            raise FailedPrecondition(f"job {job_id} is busy with {rec['pending']['op']}")
        return rec

    def _apply(self, d: Decision, now: float) -> bool:
        rec = self._job(d.job_id)
        spec = rec["spec"]
        facts = JobFacts(JobPhase(rec["state"]), tuple(rec["devices"]), spec["devices"], spec["elastic"])
        rejection = check(d, facts, self._occupied(), self._device_known)
        if rejection is not None:
            raise FailedPrecondition(str(rejection))
        if isinstance(d, Start | Resume | Pack):
            self._launch(rec, list(d.devices), now, type(d).__name__.lower())
            return True
        if isinstance(d, Suspend | Unpack):
            self._at_boundary(rec)
            self._suspend(rec, now, d.reason)
            return True
        assert isinstance(d, Migrate | Resize)  # check() refused every other kind
        devices = list(d.devices)
        target = self._node_of(devices)
        if isinstance(d, Resize):
            self._resized(rec, devices, now, d.reason)
        if target == rec["node"] and not rec.get("ranks"):
            # Same node: re-pin at the next boundary, no restart (a virtual device is a CPU set).
            action = "resize" if isinstance(d, Resize) else "resume"
            st = self.agents.control(self._address(rec["node"]), rec["id"], action, devices)
            rec["devices"] = devices
            rec["pending"] = {"op": action, "seq": st.control_seq, "since": now}
            rec["step_at_change"] = rec["step"]
            rec["last_change_at"] = now
            rec["message"] = f"{action} onto {', '.join(devices)}: {d.reason}"
            if isinstance(d, Migrate):  # (a resize is in the history already: ``_resized``)
                J.note(
                    rec,
                    f"migrated in place onto {', '.join(devices)} (same node, re-pinned): {d.reason}",
                    now,
                )
            self._save(rec)
        else:
            self._at_boundary(rec)
            self._move(rec, devices, now, d.reason)
        return True

    def _device_known(self, device: str) -> bool:
        return any(dv["id"] == device for node in self._nodes.values() for dv in node.get("devices", []))

    def _resized(self, rec: dict[str, Any], devices: list[str], now: float, reason: str) -> None:
        """A resize's bookkeeping: a grow is judged later against the mini-batch time measured
        before it; a shrink back to where a grow started undoes it (the job is not grown that
        far again); every resize goes into the job's history."""
        old = list(rec["devices"])
        trial = rec.get("grow_trial")
        if len(devices) > len(old):
            rec["grow_trial"] = {
                "from": old,
                "ms_before": self._settled_ms(rec) or rec["minibatch_ms"] or None,
            }
        else:
            if trial and sorted(trial["from"]) == sorted(devices) and len(old) > len(devices):
                rec["max_useful_devices"] = len(old)
                self.profiles.learn_max_useful(rec)
            rec["grow_trial"] = None
        J.note(rec, f"resized from {len(old)} to {len(devices)} devices: {reason}", now)

    @staticmethod
    def _settled_ms(rec: dict[str, Any]) -> float | None:
        """The mini-batch time measured wholly since the job's last change, if there is one."""
        settled = rec.get("settled_ms")
        if settled and settled[0] == rec.get("step_at_change", 0):
            return float(settled[1])
        return None

    def _launch(self, rec: dict[str, Any], devices: list[str], now: float, how: str) -> None:
        placement = self._placement(devices)
        node = placement[0][0]
        p = self._proc(rec) if rec["parked"] else None
        if (
            p is not None
            and p.state != agent_pb2.PROCESS_STATE_EXITED
            and rec["node"] == node
            and len(placement) == 1
        ):
            # A parked process on the same node: resume in place (fast: no restart).
            st = self.agents.control(self._address(node), rec["id"], "resume", devices)
            rec.update(devices=devices, parked=False, step_at_change=rec["step"])
            rec["pending"] = {"op": "resume", "seq": st.control_seq, "since": now}
            J.set_state(rec, J.RUNNING, f"resumed in place on {', '.join(devices)} ({how})", now)
            self._save(rec)
            return
        if p is not None and p.state != agent_pb2.PROCESS_STATE_EXITED:
            # Parked elsewhere: let it exit (its checkpoint is on disk), then start it here.
            self._stop_then_start(rec, devices, now, f"resume on {node}")
            return
        self._start_process(rec, devices, now, how)

    def _start_process(self, rec: dict[str, Any], devices: list[str], now: float, how: str) -> None:
        placement = self._placement(devices)
        node = placement[0][0]
        world = len(placement)
        rec["attempt"] += 1
        rec.update(node=node, devices=devices, parked=False, pending=None, step_at_change=rec["step"])
        rec["ranks"] = [{"node": n, "devices": ds} for n, ds in placement] if world > 1 else []
        where = ", ".join(devices) + (f" ({world} processes, one per node)" if world > 1 else "")
        J.set_state(rec, J.RUNNING, f"{how} on {where} (attempt {rec['attempt']})", now)
        # Record first, then start: a leader dying in between leaves a record whose process is
        # missing (rescheduled next tick), never a process nobody knows about.
        self._save(rec)
        spec = rec["spec"]
        started: list[str] = []
        try:
            add_job_user(self.kv, rec["id"])  # its etcd user, when etcd has roles (docs/security.md)
            for rank, (n, ds) in enumerate(placement):
                env = {**dict(spec["env"]), **job_credentials_env(rec["id"])}
                if world > 1:
                    env.update(MICROCO_RANK=str(rank), MICROCO_WORLD_SIZE=str(world))
                self.agents.start(
                    self._address(n), rec["id"], spec["command"], env, ds, spec["workdir"], rec["attempt"]
                )
                started.append(n)
        except MicrocoError as exc:
            for n in started:  # ranks already started would wait for the missing one forever
                try:
                    self.agents.stop(self._address(n), rec["id"])
                except MicrocoError:
                    pass
            self._release(rec)
            if isinstance(exc, InvalidArgument):
                rec["finished_at"] = now
                J.set_state(rec, J.FAILED, f"cannot start on {node}: {exc}", now)
            else:
                J.set_state(
                    rec,
                    J.SUSPENDED if rec["checkpoint_step"] >= 0 else J.QUEUED,
                    f"start on {node} failed, will retry: {exc}",
                    now,
                )
            self._save(rec)

    def _suspend(self, rec: dict[str, Any], now: float, reason: str) -> None:
        if rec.get("ranks"):
            # The ranks of a spread job cannot park one by one: they checkpoint and exit
            # together (exit 75), and the job resumes from the checkpoint.
            st = self._control_ranks(rec, "stop")
            rec["pending"] = {
                "op": "stop",
                "then": "suspend",
                "seq": st.control_seq,
                "since": now,
                "reason": reason,
            }
            rec["message"] = f"suspending (checkpoint and exit): {reason}"
            self._save(rec)
            return
        st = self.agents.control(self._address(rec["node"]), rec["id"], "suspend")
        rec["pending"] = {"op": "suspend", "seq": st.control_seq, "since": now, "reason": reason}
        rec["message"] = f"suspending: {reason}"
        self._save(rec)
        # Wait for the next mini-batch boundary so the devices are really free for what follows.
        p = self._wait_proc(
            rec, lambda p: p.seq_done >= st.control_seq or p.state == agent_pb2.PROCESS_STATE_EXITED
        )
        if p is not None and p.state != agent_pb2.PROCESS_STATE_EXITED:
            rec["checkpoint_step"] = max(rec["checkpoint_step"], int(p.checkpoint_step))
            rec["step"] = int(p.step)
            self._parked(rec, now)
            self._save(rec)

    def _move(self, rec: dict[str, Any], devices: list[str], now: float, reason: str) -> None:
        J.set_state(rec, J.MIGRATING, f"migrating to {', '.join(devices)}: {reason}", now)
        with contextlib.suppress(MicrocoError):  # the new host's cache warms while the job stops
            self.phases.moving(rec["id"], rec["node"], self._node_of(devices), now)
        self._stop_then_start(rec, devices, now, "migrated")

    def _stop_then_start(self, rec: dict[str, Any], devices: list[str], now: float, how: str) -> None:
        st = self._control_ranks(rec, "stop")
        rec["pending"] = {
            "op": "stop",
            "then": "move",
            "devices": devices,
            "seq": st.control_seq,
            "since": now,
        }
        self._save(rec)
        p = self._wait_proc(rec, lambda p: p.state == agent_pb2.PROCESS_STATE_EXITED)
        if p is not None and p.exit_code == EXIT_CHECKPOINTED:
            rec["checkpoint_step"] = max(rec["checkpoint_step"], int(p.checkpoint_step))
            rec["step"] = int(p.step)
            self._release(rec)
            self._start_process(rec, devices, now, how)
        # Otherwise the next ticks see the exit and finish the move (see _reconcile).

    def _wait_proc(self, rec: dict[str, Any], pred: Callable[[Any], bool]) -> Any:
        deadline = time.monotonic() + self.op_wait_s
        address = self._address(rec["node"])
        while time.monotonic() < deadline:
            try:
                for p in self.agents.list_processes(address):
                    if p.job_id == rec["id"] and p.attempt == rec["attempt"] and pred(p):
                        return p
            except MicrocoError:
                return None
            time.sleep(0.01)
        return None
