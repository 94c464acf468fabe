"""Carrying out a decision: placement, and starting, suspending, resizing and moving a job's
processes through the node agents.

``DecisionApplier.apply`` first checks the decision against the job's record and the devices the
other records hold (``policy.check``, the validator the simulator uses too), refusing one that
went stale, then acts: a start or resume places the job's processes (one per node when spreading
is allowed), a suspend parks the process at its next mini-batch boundary, a migrate or resize
re-pins in place on the same node or checkpoints and restarts elsewhere. A job migrated to
another node restarts there once that node's cache server reports the job's working set warm
(``clients/cache`` ``warm_report``), or ``warm_wait_s`` after its checkpoint, whichever comes
first: the record waits (``Pending("warm")``) and each tick looks again, so no tick blocks on
it. Every change of a record goes through the tick's table (``JobStore.keep`` / ``save``): the
record is frozen.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from microco.clients.cache import forget_warm, warm_report
from microco.clients.scheduler import ENV_TOTAL_STEPS, EXIT_CHECKPOINTED, PhasePublisher
from microco.common.errors import FailedPrecondition, InvalidArgument, MicrocoError
from microco.common.etcd_roles import add_job_user
from microco.common.identity import job_credentials_env
from microco.common.registry import discover

from . import _transitions as T
from ._nodes import EXITED, NodeIO
from ._profiles import Profiles
from ._record import MIGRATING, QUEUED, RUNNING, SUSPENDED, GrowTrial, JobRecord, Pending, Rank
from ._store import JobStore
from ._view import settled_ms, settled_trend
from .policy import Decision, JobFacts, JobPhase, Migrate, Pack, Resize, Resume, Start, Suspend, Unpack, check


@dataclass(frozen=True)
class MechanismSettings:
    """How the mechanism carries out decisions and reconciles (``SchedulerCore``'s arguments)."""

    op_timeout_s: float = 30.0  # an operation the process did not carry out this long: stop it
    max_restarts: int = 5  # restarts after a lost process before the job fails
    hook_grace_s: float = 120.0  # no report through the hook this long after its start: no hook
    allow_spread: bool = False  # may a multi-device job run one process per node?
    # A job migrated to another node restarts there once its cache reports the job's working
    # set warm, or this long after its checkpoint (0: at once, as before).
    warm_wait_s: float = 5.0


class DecisionApplier:
    def __init__(
        self,
        store: JobStore,
        io: NodeIO,
        profiles: Profiles,
        phases: PhasePublisher,
        settings: MechanismSettings,
    ) -> None:
        self.store, self.io, self.profiles, self.phases = store, io, profiles, phases
        self.settings = settings

    # ------------------------------------------------------------------ what is free
    def occupied(self, exclude: frozenset[str] = frozenset()) -> dict[str, set[str]]:
        """Device -> the jobs holding it or about to (a pending move's target)."""
        occ: dict[str, set[str]] = {}
        for rec in self.store.jobs.values():
            if rec.id in exclude or rec.terminal:
                continue
            held = list(rec.devices) if rec.holding else []
            held += list(rec.pending.devices if rec.pending is not None else ())
            for d in held:
                occ.setdefault(d, set()).add(rec.id)
        return occ

    def schedulable(self, job_id: str) -> JobRecord:
        rec = self.store.jobs.get(job_id)
        if rec is None or rec.terminal or rec.cancel_requested:
            raise FailedPrecondition(f"job {job_id} is not schedulable now")
        if rec.pending is not None:
            raise FailedPrecondition(f"job {job_id} is busy with {rec.pending.op}")
        return rec

    def reached_boundary(self, rec: JobRecord) -> bool:
        """Has the job's current process finished a mini-batch since it started (so it has a
        boundary to stop at)? The hook's ``first_step_at`` is per process."""
        p = self.io.proc(rec)
        return p is not None and bool(p.first_step_at)

    def at_boundary(self, rec: JobRecord) -> None:
        """Control acts at mini-batch boundaries: a process still starting (no mini-batch done
        since its start) has none yet, so it is not suspended or moved until it reports."""
        if not self.reached_boundary(rec):
            raise FailedPrecondition(f"job {rec.id} has not reached a mini-batch boundary yet")

    # ------------------------------------------------------------------ decisions
    def apply(self, d: Decision, now: float) -> bool:
        rec = self.schedulable(d.job_id)
        facts = JobFacts(JobPhase(rec.state), rec.devices, rec.spec.devices, rec.spec.elastic)
        rejection = check(d, facts, self.occupied(), self.io.device_known)
        if rejection is not None:
            raise FailedPrecondition(str(rejection))
        if isinstance(d, Start | Resume | Pack):
            self.launch(rec, list(d.devices), now, type(d).__name__.lower())
            return True
        if isinstance(d, Suspend | Unpack):
            self.at_boundary(rec)
            self.suspend(rec, now, d.reason)
            return True
        assert isinstance(d, Migrate | Resize)  # check() refused every other kind
        devices = list(d.devices)
        target = self.io.node_of(devices)
        if isinstance(d, Resize):
            rec = self.store.keep(self.resized(rec, devices, now, d.reason))
        if target == rec.node and not rec.ranks:
            # Same node: re-pin at the next boundary, no restart (a virtual device is a CPU set).
            action = "resize" if isinstance(d, Resize) else "resume"
            st = self.io.agents.control(self.io.address(rec.node), rec.id, action, devices)
            rec = replace(
                rec,
                devices=tuple(devices),
                pending=Pending(action, st.control_seq, now),
                step_at_change=rec.step,
                last_change_at=now,
                message=f"{action} onto {', '.join(devices)}: {d.reason}",
            )
            if isinstance(d, Migrate):  # (a resize is in the history already: ``resized``)
                rec = rec.noted(
                    f"migrated in place onto {', '.join(devices)} (same node, re-pinned): {d.reason}", now
                )
            self.store.save(rec)
        else:
            self.at_boundary(rec)
            self.move(rec, devices, now, d.reason)
        return True

    def resized(self, rec: JobRecord, devices: list[str], now: float, reason: str) -> JobRecord:
        """A resize's bookkeeping: a grow is judged later against the mini-batch time measured
        before it (and its trend then, at the step of the grow); a shrink back to where a grow started undoes it (the job is not grown that
        far again); every resize goes into the job's history."""
        old = rec.devices
        trial = rec.grow_trial
        if len(devices) > len(old):
            before = settled_ms(rec) or rec.minibatch_ms or None
            rec = replace(rec, grow_trial=GrowTrial(old, before, rec.step, settled_trend(rec)))
        else:
            if trial and sorted(trial.from_devices) == sorted(devices) and len(old) > len(devices):
                rec = replace(rec, max_useful_devices=len(old))
                self.profiles.learn_max_useful(rec)
            rec = replace(rec, grow_trial=None)
        return rec.noted(f"resized from {len(old)} to {len(devices)} devices: {reason}", now)

    # ------------------------------------------------------------------ processes
    def launch(self, rec: JobRecord, devices: list[str], now: float, how: str) -> None:
        placement = self.io.placement(devices, self.settings.allow_spread)
        node = placement[0][0]
        p = self.io.proc(rec) if rec.parked else None
        if p is not None and p.state != EXITED and rec.node == node and len(placement) == 1:
            # A parked process on the same node: resume in place (fast: no restart).
            st = self.io.agents.control(self.io.address(node), rec.id, "resume", devices)
            rec = rec.with_state(
                RUNNING,
                f"resumed in place on {', '.join(devices)} ({how})",
                now,
                devices=tuple(devices),
                parked=False,
                step_at_change=rec.step,
                pending=Pending("resume", st.control_seq, now),
            )
            self.store.save(rec)
            return
        if p is not None and p.state != EXITED:
            # Parked elsewhere: let it exit (its checkpoint is on disk), then start it here.
            self.stop_then_start(rec, devices, now, f"resume on {node}")
            return
        self.start_process(rec, devices, now, how)

    def start_process(self, rec: JobRecord, devices: list[str], now: float, how: str) -> JobRecord:
        placement = self.io.placement(devices, self.settings.allow_spread)
        node = placement[0][0]
        world = len(placement)
        attempt = rec.attempt + 1
        where = ", ".join(devices) + (f" ({world} processes, one per node)" if world > 1 else "")
        rec = rec.with_state(
            RUNNING,
            f"{how} on {where} (attempt {attempt})",
            now,
            attempt=attempt,
            node=node,
            devices=tuple(devices),
            parked=False,
            pending=None,
            step_at_change=rec.step,
            ranks=tuple(Rank(n, tuple(ds)) for n, ds in placement) if world > 1 else (),
        )
        # Record first, then start: a leader dying in between leaves a record whose process is
        # missing (rescheduled next tick), never a process nobody knows about.
        rec = self.store.save(rec)
        spec = rec.spec
        started: list[str] = []
        try:
            # its etcd user (reaching its owner's datasets), when etcd has roles (docs/security.md)
            add_job_user(self.store.kv, rec.id, spec.user)
            for rank, (n, ds) in enumerate(placement):
                env = {**dict(spec.env), **job_credentials_env(rec.id, spec.user)}
                if spec.total_steps > 0:  # the compiler's exploration is a share of the run
                    env.setdefault(ENV_TOTAL_STEPS, str(spec.total_steps))
                if world > 1:
                    env.update(MICROCO_RANK=str(rank), MICROCO_WORLD_SIZE=str(world))
                self.io.agents.start(
                    self.io.address(n), rec.id, list(spec.command), env, ds, spec.workdir, rec.attempt
                )
                started.append(n)
        except MicrocoError as exc:
            for n in started:  # ranks already started would wait for the missing one forever
                with contextlib.suppress(MicrocoError):
                    self.io.agents.stop(self.io.address(n), rec.id)
            if isinstance(exc, InvalidArgument):
                rec = T.failed(rec, f"cannot start on {node}: {exc}", now)
            else:
                rec = rec.released().with_state(
                    SUSPENDED if rec.checkpoint_step >= 0 else QUEUED,
                    f"start on {node} failed, will retry: {exc}",
                    now,
                )
            rec = self.store.save(rec)
        return rec

    def suspend(self, rec: JobRecord, now: float, reason: str) -> None:
        if rec.ranks:
            # The ranks of a spread job cannot park one by one: they checkpoint and exit
            # together (exit 75), and the job resumes from the checkpoint.
            st = self.io.control_ranks(rec, "stop")
            rec = replace(
                rec,
                pending=Pending("stop", st.control_seq, now, then="suspend", reason=reason),
                message=f"suspending (checkpoint and exit): {reason}",
            )
            self.store.save(rec)
            return
        st = self.io.agents.control(self.io.address(rec.node), rec.id, "suspend")
        rec = replace(
            rec,
            pending=Pending("suspend", st.control_seq, now, reason=reason),
            message=f"suspending: {reason}",
        )
        rec = self.store.save(rec)
        # Wait for the next mini-batch boundary so the devices are really free for what follows.
        p = self.io.wait_proc(rec, lambda p: p.seq_done >= st.control_seq or p.state == EXITED)
        if p is not None and p.state != EXITED:
            rec = replace(
                rec, checkpoint_step=max(rec.checkpoint_step, int(p.checkpoint_step)), step=int(p.step)
            )
            self.store.save(T.parked(rec, now))

    def move(self, rec: JobRecord, devices: list[str], now: float, reason: str) -> None:
        rec = self.store.keep(rec.with_state(MIGRATING, f"migrating to {', '.join(devices)}: {reason}", now))
        with contextlib.suppress(MicrocoError):  # the new host's cache warms while the job stops
            forget_warm(self.store.kv, rec.id)  # (a report from now on is for this move)
            self.phases.moving(rec.id, rec.node, self.io.node_of(devices), now)
        self.stop_then_start(rec, devices, now, "migrated")

    def stop_then_start(self, rec: JobRecord, devices: list[str], now: float, how: str) -> None:
        st = self.io.control_ranks(rec, "stop")
        rec = replace(rec, pending=Pending("stop", st.control_seq, now, then="move", devices=tuple(devices)))
        rec = self.store.save(rec)
        p = self.io.wait_proc(rec, lambda p: p.state == EXITED)
        if p is not None and p.exit_code == EXIT_CHECKPOINTED:
            rec = replace(
                rec, checkpoint_step=max(rec.checkpoint_step, int(p.checkpoint_step)), step=int(p.step)
            )
            self.restart_moved(self.store.keep(rec), devices, now, how)
        # Otherwise the next ticks see the exit and finish the move (see ``Reconciler``).

    def restart_moved(self, rec: JobRecord, devices: list[str], now: float, how: str) -> JobRecord:
        """A job whose process checkpointed and exited to move to ``devices``: started there,
        or, when it is migrating to another node, once that node's cache server reports the
        job's working set warm or ``warm_wait_s`` after the checkpoint (until then the record
        waits with ``Pending("warm")``, and the job's history says so; the reconciler calls
        this again each tick). With no cache server registered on the new node it does not
        wait; one that does not report, or a failed warm, only costs the wait."""
        wait = self.settings.warm_wait_s
        try:
            target = self.io.node_of(devices)
        except MicrocoError:
            target = ""  # (the start refuses it, as before)
        if rec.state == MIGRATING and wait > 0 and target and target != rec.node:
            pending = rec.pending
            held = pending is not None and pending.op == "warm"
            try:
                report = warm_report(self.store.kv, rec.id)
            except MicrocoError:
                report = None
            if report is not None and report.get("node") != target:
                report = None
            since = pending.since if held and pending is not None else now
            if report is not None:
                after = f" after {now - since:.1f} s" if held else ""
                if report.get("ok"):
                    note = f"cache on {target} warm{after} ({report.get('chunks', 0)} chunks of its dataset there)"
                else:
                    note = f"cache on {target} could not warm ({report.get('error', '')}); going on{after}"
            elif not held and not self._cache_on(target):
                note = f"no cache server on {target}: restarting without waiting for a warm cache"
            elif not held:
                rec = replace(rec, pending=Pending("warm", 0, now, then="move", devices=tuple(devices)))
                note = (
                    f"checkpointed at step {rec.checkpoint_step}; waiting for the cache on {target} to warm"
                )
                return self.store.save(rec.noted(f"{note} (at most {wait:g} s)", now))
            elif now - since >= wait:
                note = (
                    f"went on without a warm cache on {target} after {now - since:.1f} s (no report from it)"
                )
            else:
                return rec  # still waiting
            rec = rec.noted(note, now)
        rec = rec.released().with_state(SUSPENDED, f"checkpointed at step {rec.checkpoint_step}", now)
        return self.start_process(self.store.keep(rec), devices, now, how)

    def _cache_on(self, node: str) -> bool:
        """Is a cache server registered on ``node`` (one that may report a warm)?"""
        try:
            return any(r.labels.get("node") == node for r in discover(self.store.kv, "cache"))
        except MicrocoError:
            return True  # (not known: wait, bounded)
