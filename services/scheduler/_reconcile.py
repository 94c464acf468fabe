"""Reconciliation: each job record brought in line with what its processes report.

Once per tick, before the policy decides, the leader reads every node's processes
(``NodeIO.refresh``) and gives each record the job's progress (steps, checkpoint, mini-batch
times, utilisation), its exit (finished, checkpointed, failed, killed), a lost node or process
(back to the queue from its checkpoint), an operation carried out or overdue, and whether its
process reports through the scheduler's hook at all. Then the packing of the running jobs is
refreshed (``PACKED`` while another job shares a device). Each step returns the new record.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

from microco.clients.scheduler import EXIT_CHECKPOINTED
from microco.common.errors import MicrocoError

from . import _transitions as T
from ._actions import DecisionApplier, MechanismSettings
from ._nodes import EXITED, NodeIO
from ._profiles import Profiles
from ._record import PACKED, RUNNING, SUSPENDED, FitBlock, JobRecord, TimingFit, Trend
from ._store import JobStore

log = logging.getLogger(__name__)

# Mini-batches after a change before the job's reported mean (over its last 20, the hook's
# window, plus the boundary the change waited for) is wholly a measurement of the new setup.
SETTLE_STEPS = 25
# From a hook that reports running sums (session 40): the mean of every mini-batch since a
# mark taken MARK_AFTER_STEPS after the change (the boundary the change waited for and the
# first batches on the new setup left out) is settled once it covers SETTLE_MIN_STEPS and
# SETTLE_MIN_S of mini-batches and its standard error is at most SETTLE_REL_SE of it, or it
# covers SETTLE_MAX_STEPS or SETTLE_MAX_S of them. A steady job settles after 20 batches or
# 3 s; one whose batch times vary widely is measured until its mean is known (a grow is
# judged by a 1.1x). The 3 s: a wait every 32 batches of 10 ms was not in the first 20 at
# all (no variance seen: "known"), and a grow worth 1.38x was judged against 10 ms and undone.
MARK_AFTER_STEPS = 5
SETTLE_MIN_STEPS = 20
SETTLE_MIN_S = 3.0
SETTLE_REL_SE = 0.03
SETTLE_MAX_STEPS = 1000
SETTLE_MAX_S = 120.0


# Session 43: a job's mini-batch time may drift of its own accord (a sequence-length warm-up, a
# data phase, heat): a grow judged by the mean before it against the mean after it charged the
# drift between the two means' centres to the grow. So the mechanism fits lines to the times,
# from the same running sums: each pair of readings gives the mean of the mini-batches between
# them, at their middle step, and a least-squares line through those means (weighted by their
# mini-batches) has the slope of one through the mini-batches themselves, unbiased. Its
# standard error takes the larger of two estimates of the noise: the mini-batches' own variance
# about the line (independent noise) and the readings' means' scatter about it (noise that
# wanders slowly, which the first misses). The readings since a change are summed in blocks of
# at most SETTLE_MAX_STEPS mini-batches or SETTLE_MAX_S (as long as a settled mean at most):
# the first block, and the latest two. Two lines come of them: the *early* one, through the
# first block (the times nearest the change: how a grow is judged, however long the job then
# runs grown), and the *recent* one, through the latest one to two blocks (how the time moved
# lately: what a grow is judged against, not a line through hours before it). The policy
# decides whether a trend is real and how to judge with it (``policy.grow_judgement``).
TREND_MIN_READINGS = 3
_NO_BLOCK: FitBlock = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _full(block: FitBlock) -> bool:
    return block[1] >= SETTLE_MAX_STEPS or block[2] >= SETTLE_MAX_S * 1000.0


def fit_reading(fit: TimingFit | None, mark: tuple[int, int, float, float], p: Any) -> TimingFit:
    """``fit`` with the interval from its latest reading to the report ``p`` added (a new fit,
    from the mark, when ``fit`` belongs to another change or process)."""
    timed, ms, sq = int(p.timed_steps), float(p.timed_ms), float(p.timed_sq_ms)
    if fit is None or fit[0] != mark[0] or timed < fit[1]:
        fit = (mark[0], mark[1], mark[2], mark[3], _NO_BLOCK, _NO_BLOCK, _NO_BLOCK)
    key, prev_n, prev_ms, prev_sq, first, old, cur = fit
    dn, ds = timed - prev_n, ms - prev_ms
    if dn <= 0:
        return fit
    if _full(cur):  # the first block is kept; later ones roll
        if first[0] == 0:
            first = cur
        else:
            old = cur
        cur = _NO_BLOCK
    g, w, sy, sqq, sx, sxx, sxy, syy = cur
    mid = float(p.step) - key - (dn - 1) / 2.0  # the interval's middle step, from the change
    cur = (
        g + 1,
        w + dn,
        sy + ds,
        sqq + (sq - prev_sq),
        sx + dn * mid,
        sxx + dn * mid * mid,
        sxy + ds * mid,
        syy + ds * ds / dn,
    )
    return (key, timed, ms, sq, first, old, cur)


def _line(key: int, *blocks: FitBlock) -> Trend | None:
    """The line through ``blocks``' readings: (its centre step, the fitted time there (their
    mean), the slope in ms per step, the slope's standard error). None with fewer than
    ``TREND_MIN_READINGS`` intervals, or no spread of steps."""
    g, w, sy, sqq, sx, sxx, sxy, syy = (sum(v) for v in zip(*blocks, strict=True))
    if g < TREND_MIN_READINGS or w <= 0:
        return None
    cx, y = sx / w, sy / w
    sxx_c = sxx - sx * cx  # sum of dn * (mid - cx)^2
    if not sxx_c > 1e-9 * max(1.0, sxx):
        return None
    sxy_c = sxy - sx * y
    slope = sxy_c / sxx_c
    per_batch = max(0.0, sqq / w - y * y - slope * slope * sxx_c / w)  # about the line
    scatter = max(0.0, (syy - sy * y) - slope * sxy_c) / (g - 2)
    se = math.sqrt(max(per_batch, scatter) / sxx_c)
    return (key + cx, y, slope, se)


def fit_trends(fit: TimingFit | None) -> tuple[Trend | None, Trend | None]:
    """(the early line, the recent line) of ``fit`` (see above)."""
    if fit is None:
        return None, None
    key, first, old, cur = fit[0], fit[4], fit[5], fit[6]
    if first[0] == 0:  # the first block is the current one
        return _line(key, cur), _line(key, cur)
    return _line(key, first), _line(key, old if old[0] else first, cur)


def settle(rec: JobRecord, p: Any) -> JobRecord:
    """``settled_ms`` (and the mark it is measured from) from the job's report ``p``: the mean
    of every mini-batch since its last change, once that mean is known well enough, with the
    trend of those mini-batches' times (``settled_trend``). A report without running sums (an
    older hook) gives the latest 20-batch mean, as before, and no trend."""
    timed = int(getattr(p, "timed_steps", 0) or 0)
    if timed <= 0:
        if p.step - rec.step_at_change > SETTLE_STEPS:
            rec = replace(
                rec,
                settled_ms=(rec.step_at_change, float(p.minibatch_ms)),
                settled_trend=None,
                early_trend=None,
            )
        return rec
    mark = rec.timing_mark
    if mark is None or mark[0] != rec.step_at_change or timed < mark[1]:
        # a new change (or a new process, whose sums start again): mark once past its start
        mark = None
        if p.step - rec.step_at_change >= MARK_AFTER_STEPS:
            mark = (rec.step_at_change, timed, float(p.timed_ms), float(p.timed_sq_ms))
        return replace(rec, timing_mark=mark, timing_fit=None if mark is None else fit_reading(None, mark, p))
    fit = fit_reading(rec.timing_fit, mark, p)
    rec = replace(rec, timing_fit=fit)
    n = timed - mark[1]
    total = float(p.timed_ms) - mark[2]
    if n < SETTLE_MIN_STEPS or total < SETTLE_MIN_S * 1000.0:
        return rec
    mean = total / n
    var = max(0.0, (float(p.timed_sq_ms) - mark[3]) / n - mean * mean)
    known = (var / n) ** 0.5 <= SETTLE_REL_SE * mean
    if known or n >= SETTLE_MAX_STEPS or total >= SETTLE_MAX_S * 1000.0:
        early, recent = fit_trends(fit)
        rec = replace(rec, settled_ms=(rec.step_at_change, mean), settled_trend=recent, early_trend=early)
    return rec


class Reconciler:
    def __init__(
        self,
        store: JobStore,
        io: NodeIO,
        profiles: Profiles,
        actions: DecisionApplier,
        settings: MechanismSettings,
    ) -> None:
        self.store, self.io, self.profiles, self.actions = store, io, profiles, actions
        self.settings = settings

    def _lost(self, rec: JobRecord, why: str, now: float) -> JobRecord:
        return T.lost(rec, why, now, self.settings.max_restarts)

    def reconcile(self, rec: JobRecord, now: float, dt: float) -> JobRecord:
        """The record after what its processes report (``rec`` is the table's latest)."""
        if rec.terminal:
            return rec
        if rec.cancel_requested:
            if rec.has_process:
                self.io.stop_ranks(rec)
            return T.cancelled(rec, now)
        if not rec.has_process:
            return rec
        node = rec.node
        if rec.ranks:
            handled = self._reconcile_ranks(rec, now)
            if handled is not None:
                return handled
        if node not in self.io.nodes:
            return self._lost(rec, f"node {node} was lost", now)
        if node not in self.io.procs:
            return rec  # unreachable this tick; its lease decides
        p = self.io.proc(rec)
        if p is None:
            return self._lost(rec, f"process of attempt {rec.attempt} is gone from node {node}", now)
        if p.state != EXITED:
            rec = self._check_hook(rec, p, now)
        rec = self._progress(rec, p, dt)
        pending = rec.pending
        if p.state == EXITED:
            return self._exited(rec, p, now)
        if pending is not None:
            done = p.seq_done >= pending.seq
            if pending.op == "suspend" and done:
                rec = T.parked(rec, now)
            elif pending.op in ("resume", "resize") and done:
                rec = replace(rec, pending=None)
            elif now - pending.since > max(self.settings.op_timeout_s, 10 * rec.minibatch_ms / 1000.0):
                log.warning(
                    "job %s did not carry out %s in %.0fs; stopping it",
                    rec.id,
                    pending.op,
                    self.settings.op_timeout_s,
                )
                try:
                    self.io.agents.stop(self.io.address(node), rec.id)
                except MicrocoError:
                    pass
        return rec

    def _progress(self, rec: JobRecord, p: Any, dt: float) -> JobRecord:
        """Steps, checkpoint, first step and mini-batch times as the process reports them."""
        changes: dict[str, Any] = {}
        if p.job_state:
            changes["step"] = int(p.step)
        changes["checkpoint_step"] = max(rec.checkpoint_step, int(p.checkpoint_step))
        if p.first_step_at and not rec.first_step_at:
            changes["first_step_at"] = float(p.first_step_at)
        rec = replace(rec, **changes)
        if p.minibatch_ms > 0 and p.job_state == "running":
            rec = replace(rec, minibatch_ms=float(p.minibatch_ms))
            rec = settle(rec, p)
            # Alone-time: only once the job ran a few mini-batches on its own devices.
            # The fastest time seen alone: load from outside the job only ever inflates it.
            if rec.state == RUNNING and p.step - rec.step_at_change >= 5:
                best = min(rec.minibatch_ms_alone or p.minibatch_ms, p.minibatch_ms)
                rec = replace(rec, minibatch_ms_alone=float(best))
                # How much of its devices the job keeps busy alone (the job measures it): what
                # gandiva's packing reads (``JobView.utilization``). Measured while packed, it
                # would be the share the partner leaves, so only alone; the latest counts.
                if p.HasField("utilization"):
                    rec = replace(rec, utilization=float(p.utilization))
                self.profiles.learn_alone(rec)
        if rec.holding:
            rec = replace(rec, attained_service_s=rec.attained_service_s + dt * max(1, len(rec.devices)))
        return rec

    def _exited(self, rec: JobRecord, p: Any, now: float) -> JobRecord:
        code = p.exit_code
        if code == 0:
            done = f"finished at step {rec.step}"
            # no report from this process, and none before it (a hook reports at its restore):
            # whether or not it outlived ``hook_grace_s``, it ran without the hook
            if not p.job_state and (rec.no_hook or (rec.step == 0 and not rec.first_step_at)):
                done = "finished (its steps were not reported: it ran without the scheduler's hook)"
            return T.finished(rec, done, now)
        if code == EXIT_CHECKPOINTED:
            pending = rec.pending
            then = pending.then if pending is not None else ""
            devices = list(pending.devices) if pending is not None else []
            if then == "move" and devices:  # (a migration may wait for its new host's cache)
                return self.actions.restart_moved(rec, devices, now, "moved")
            return rec.released().with_state(SUSPENDED, f"checkpointed at step {rec.checkpoint_step}", now)
        if code < 0:
            # the agent's line says more when a launcher's rank vanished (see ``_ranks``)
            why = p.message if p.message and not p.message.startswith("killed by") else ""
            return self._lost(rec, why or f"process killed by signal {-code}", now)
        return T.failed(rec, p.message or f"process exited with {code}", now)

    def _check_hook(self, rec: JobRecord, p: Any, now: float) -> JobRecord:
        """A job whose process has not reported through the hook ``hook_grace_s`` after it
        started runs without it: it cannot obey suspend, migrate or resize at a boundary, so
        the policy is told it is not preemptible (no wasted suspend attempts every tick) and
        the user reads why in the job's history."""
        if p.job_state or p.first_step_at:
            if rec.no_hook:
                return rec.noted("the job's hook reports now: preemptible again", now, no_hook=False)
            return rec
        started = float(p.started_at or 0.0)
        grace = self.settings.hook_grace_s
        if not rec.no_hook and started and now - started >= grace:
            return rec.noted(
                f"no report from the scheduler's hook {grace:.0f} s after the start: "
                "not preemptible (it keeps its devices until it ends; add TorchHook or "
                "SchedulerCallback to make it so)",
                now,
                no_hook=True,
            )
        return rec

    def _reconcile_ranks(self, rec: JobRecord, now: float) -> JobRecord | None:
        """A spread job's other ranks: all must live while rank 0 does (a missing rank would
        leave the others waiting in an all-reduce). The new record when the job was handled
        here, None when rank 0's reconciliation goes on."""
        for r in rec.ranks[1:]:
            node = r.node
            if node not in self.io.nodes:
                self.io.stop_ranks(rec, skip=node)
                return self._lost(rec, f"node {node} (a rank of this spread job) was lost", now)
            if node not in self.io.procs:
                continue  # unreachable this tick; its lease decides
            p = self.io.procs[node].get(rec.id)
            if p is None or p.attempt != rec.attempt:
                self.io.stop_ranks(rec, skip=node)
                return self._lost(rec, f"rank process on {node} is gone", now)
            if p.state == EXITED and p.exit_code not in (0, EXIT_CHECKPOINTED):
                self.io.stop_ranks(rec, skip=node)
                if p.exit_code < 0:
                    return self._lost(rec, f"rank process on {node} killed by signal {-p.exit_code}", now)
                return T.failed(rec, p.message or f"rank on {node} exited with {p.exit_code}", now)
        return None

    def refresh_packing(self, now: float) -> None:
        """Running jobs sharing a device are PACKED (with whom), one alone RUNNING."""
        jobs = self.store.jobs
        by_dev: dict[str, list[str]] = {}
        for rec in jobs.values():
            if rec.state in (RUNNING, PACKED):
                for d in rec.devices:
                    by_dev.setdefault(d, []).append(rec.id)
        for job_id in list(jobs):
            rec = jobs[job_id]
            if rec.state not in (RUNNING, PACKED):
                continue
            partners = sorted({j for d in rec.devices for j in by_dev.get(d, []) if j != rec.id})
            state = PACKED if partners else RUNNING
            if state != rec.state or tuple(partners) != rec.packed_with:
                self.store.save(T.packing(rec, partners, now))
