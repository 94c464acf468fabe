"""The scheduler's job record: frozen, typed, and the JSON it is stored as in etcd.

One ``JobRecord`` per job, under ``/microco/scheduler/jobs/<id>``. The record never changes in
place: a state transition is ``dataclasses.replace`` (or one of the explicit methods below,
``with_state`` / ``noted`` / ``released``), which returns a new record. ``to_json`` writes the
canonical JSON of ``common.kv.dumps`` (sorted keys, so equal records are equal bytes in a
compare-and-swap); ``from_json`` reads it back, filling the optional parts an older scheduler did
not write with their defaults, and refusing a record that is not one with ``InvalidArgument``.

The nested parts are typed too: ``JobSpec`` (what the user asked for, validated), ``StateChange``
(the bounded history), ``Rank`` (a spread job's processes), ``Pending`` (an operation under way
on the job's process), ``OperatorRequest`` (an operator's command the leader has yet to carry
out), ``GrowTrial`` (a grow being judged) and ``ProfileRef`` (the job's identity for profiles).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from microco.common.errors import InvalidArgument
from microco.common.kv import dumps

# States of a job record (a superset of the policy's JobPhase: CANCELLED is the user's doing).
QUEUED, RUNNING, SUSPENDED, PACKED, MIGRATING = "queued", "running", "suspended", "packed", "migrating"
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
STATES = (QUEUED, RUNNING, SUSPENDED, PACKED, MIGRATING, FINISHED, FAILED, CANCELLED)
TERMINAL = frozenset({FINISHED, FAILED, CANCELLED})
HOLDING = frozenset({RUNNING, PACKED, MIGRATING})

HISTORY_LEN = 50  # state changes kept per job (the oldest go first)


def _strs(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in values or ())


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _trend(value: Any) -> tuple[float, float, float, float] | None:
    return None if not value else (float(value[0]), float(value[1]), float(value[2]), float(value[3]))


def _block(value: Any) -> tuple[float, float, float, float, float, float, float, float]:
    a, b, c, d, e, f, g, h = (float(x) for x in value)
    return (a, b, c, d, e, f, g, h)


def _float(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    """``d[key]`` as a float (exactly: -0.0 stays -0.0), ``default`` when absent or null."""
    value = d.get(key)
    return default if value is None else float(value)


def _int(d: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = d.get(key)
    return default if value is None else int(value)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user asked for, as ``validate_spec`` cleaned it."""

    name: str = ""
    command: tuple[str, ...] = ()
    devices: int = 0
    elastic: bool = False
    priority: int = 0
    user: str = ""
    tenant: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    workdir: str = ""
    total_steps: int = 0
    model: str = ""
    max_devices: int = 0
    gpu_share: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", _strs(self.command))
        object.__setattr__(self, "env", MappingProxyType({str(k): str(v) for k, v in self.env.items()}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": list(self.command),
            "devices": self.devices,
            "elastic": self.elastic,
            "priority": self.priority,
            "user": self.user,
            "tenant": self.tenant,
            "env": dict(self.env),
            "workdir": self.workdir,
            "total_steps": self.total_steps,
            "model": self.model,
            "max_devices": self.max_devices,
            "gpu_share": self.gpu_share,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobSpec:
        return cls(
            name=str(d.get("name") or ""),
            command=_strs(d.get("command")),
            devices=_int(d, "devices"),
            elastic=bool(d.get("elastic", False)),
            priority=_int(d, "priority"),
            user=str(d.get("user") or ""),
            tenant=str(d.get("tenant") or ""),
            env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
            workdir=str(d.get("workdir") or ""),
            total_steps=_int(d, "total_steps"),
            model=str(d.get("model") or ""),
            max_devices=_int(d, "max_devices"),
            gpu_share=_float(d, "gpu_share", 1.0),
        )


@dataclass(frozen=True, slots=True)
class StateChange:
    at: float
    state: str
    message: str


@dataclass(frozen=True, slots=True)
class Rank:
    """One process of a spread job: its node and devices (rank 0 first in ``JobRecord.ranks``)."""

    node: str
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pending:
    """An operation under way on the job's process: ``op`` (suspend, resume, resize, stop) sent
    with control sequence ``seq`` at ``since``; a stop ``then`` suspends or moves (to
    ``devices``); ``reason`` is the decision's, for the history."""

    op: str
    seq: int = 0
    since: float = 0.0
    then: str = ""
    devices: tuple[str, ...] = ()
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "seq": self.seq, "since": self.since}
        if self.then:
            out["then"] = self.then
        if self.devices:
            out["devices"] = list(self.devices)
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pending:
        return cls(
            op=str(d["op"]),
            seq=_int(d, "seq"),
            since=_float(d, "since"),
            then=str(d.get("then") or ""),
            devices=_strs(d.get("devices")),
            reason=str(d.get("reason") or ""),
        )


@dataclass(frozen=True, slots=True)
class OperatorRequest:
    """An operator's suspend / resume / migrate / resize, recorded by the API for the leader."""

    action: str
    devices: tuple[str, ...] = ()
    count: int = 0
    at: float = 0.0


# The linear trend of a job's recent mini-batch times (session 43): (the step they are centred
# on, their mean (the fitted time at that step), the slope in ms per step, its standard error).
Trend = tuple[float, float, float, float]
# What a ``Trend`` is fitted from (``_reconcile.fit_reading``): the step_at_change it belongs
# to, the running sums (timed steps, ms, ms squared) at the latest reading, then three blocks of
# readings (the first since the change, the one before the current one, the current one), each
# the sums over the intervals between its readings: their count, their mini-batches, ms, ms
# squared, and, weighted by each interval's mini-batches, its middle step (from
# step_at_change), that squared, its mean ms times its middle step, and its mean ms squared.
FitBlock = tuple[float, float, float, float, float, float, float, float]
TimingFit = tuple[int, int, float, float, FitBlock, FitBlock, FitBlock]


@dataclass(frozen=True, slots=True)
class GrowTrial:
    """A grow being judged: the devices it grew from and the settled mini-batch time before;
    the step it was grown at and the trend of the time before it (``Trend``), when measured
    (session 43: a job's own drift is not charged to the grow)."""

    from_devices: tuple[str, ...]
    ms_before: float | None
    at_step: int | None = None
    trend: Trend | None = None


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """The job's identity for the profiles of earlier jobs like it (``_profiles``)."""

    key: str
    identity: str


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    spec: JobSpec
    state: str = QUEUED
    devices: tuple[str, ...] = ()
    node: str = ""
    attempt: int = 0
    step: int = 0
    checkpoint_step: int = -1
    submitted_at: float = 0.0
    first_step_at: float = 0.0
    finished_at: float = 0.0
    last_change_at: float = 0.0
    minibatch_ms: float = 0.0
    minibatch_ms_alone: float = 0.0
    utilization: float | None = None  # busy fraction of its devices alone, as the job measured it
    attained_service_s: float = 0.0
    packed_with: tuple[str, ...] = ()
    ranks: tuple[Rank, ...] = ()  # a spread job: one per process, rank 0 first
    parked: bool = False  # a SUSPENDED job whose process waits parked on ``node``
    pending: Pending | None = None
    cancel_requested: bool = False
    restarts: int = 0
    message: str = ""
    history: tuple[StateChange, ...] = ()
    # Written by the mechanism as it learns about the job:
    operator: OperatorRequest | None = None
    held: bool = False  # suspended by an operator: not the policy's to resume
    no_hook: bool = False  # its process never reported through the hook: not preemptible
    grow_trial: GrowTrial | None = None
    max_useful_devices: int | None = None  # a grow past this did not pay
    settled_ms: tuple[int, float] | None = None  # (step_at_change, mini-batch ms) once settled
    step_at_change: int = 0  # the step at the job's last change of devices or packing
    # The job's running sums (timed steps, ms, ms squared) at the first reading a few steps
    # after its last change, keyed by ``step_at_change``: ``settled_ms`` is the mean since.
    timing_mark: tuple[int, int, float, float] | None = None
    # Set with ``settled_ms``: the trend of the job's latest mini-batch times and that of the
    # first ones since its last change; and the sums they are fitted from (see ``_reconcile``).
    settled_trend: Trend | None = None
    early_trend: Trend | None = None
    timing_fit: TimingFit | None = None
    profile: ProfileRef | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise InvalidArgument(f"job {self.id}: unknown state {self.state!r}")

    # ------------------------------------------------------------------ predicates
    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def holding(self) -> bool:
        return self.state in HOLDING

    @property
    def has_process(self) -> bool:
        """Whether a process of the job should exist (holding devices, or parked)."""
        return self.state in HOLDING or (self.state == SUSPENDED and self.parked)

    @property
    def rank_nodes(self) -> list[str]:
        """The nodes of the job's processes: rank 0's (``node``) first; one unless spread."""
        return [r.node for r in self.ranks] or ([self.node] if self.node else [])

    # ------------------------------------------------------------------ transitions
    def with_state(self, state: str, message: str, now: float, **changes: Any) -> JobRecord:
        """The record moved to ``state`` (with ``changes``), the move appended to its bounded
        history.

        ``now`` is the caller's clock reading, which may predate the record: the leader reads
        the clock when its tick starts, and a job submitted during the tick's node calls is
        placed in that same tick. A change never comes before the previous one, so its time is
        clamped to it and the history stays in order (the console's timeline starts with the
        job's queued period)."""
        if self.state != state:
            at = max(now, self.last_change_at or now)
            changes.update(history=self._history_plus(at, state, message), last_change_at=at)
        return replace(self, state=state, message=message, **changes)

    def noted(self, message: str, now: float, **changes: Any) -> JobRecord:
        """An event that keeps the job's state (e.g. a resize), in its history."""
        at = max(now, self.last_change_at or now)
        return replace(self, history=self._history_plus(at, self.state, message), message=message, **changes)

    def released(self, **changes: Any) -> JobRecord:
        """The record with no devices, partners, parked process, ranks or pending operation."""
        return replace(self, devices=(), packed_with=(), parked=False, pending=None, ranks=(), **changes)

    def _history_plus(self, at: float, state: str, message: str) -> tuple[StateChange, ...]:
        return (*self.history[-(HISTORY_LEN - 1) :], StateChange(at, state, message))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict stored in etcd (its layout predates the typed record)."""
        return {
            "id": self.id,
            "spec": self.spec.to_dict(),
            "state": self.state,
            "devices": list(self.devices),
            "node": self.node,
            "attempt": self.attempt,
            "step": self.step,
            "checkpoint_step": self.checkpoint_step,
            "submitted_at": self.submitted_at,
            "first_step_at": self.first_step_at,
            "finished_at": self.finished_at,
            "last_change_at": self.last_change_at,
            "minibatch_ms": self.minibatch_ms,
            "minibatch_ms_alone": self.minibatch_ms_alone,
            "utilization": self.utilization,
            "attained_service_s": self.attained_service_s,
            "packed_with": list(self.packed_with),
            "ranks": [{"node": r.node, "devices": list(r.devices)} for r in self.ranks],
            "parked": self.parked,
            "pending": None if self.pending is None else self.pending.to_dict(),
            "cancel_requested": self.cancel_requested,
            "restarts": self.restarts,
            "message": self.message,
            "history": [[h.at, h.state, h.message] for h in self.history],
            "operator": None
            if self.operator is None
            else {
                "action": self.operator.action,
                "devices": list(self.operator.devices),
                "count": self.operator.count,
                "at": self.operator.at,
            },
            "held": self.held,
            "no_hook": self.no_hook,
            "grow_trial": None
            if self.grow_trial is None
            else {
                "from": list(self.grow_trial.from_devices),
                "ms_before": self.grow_trial.ms_before,
                "at_step": self.grow_trial.at_step,
                "trend": None if self.grow_trial.trend is None else list(self.grow_trial.trend),
            },
            "max_useful_devices": self.max_useful_devices,
            "settled_ms": None if self.settled_ms is None else list(self.settled_ms),
            "step_at_change": self.step_at_change,
            "timing_mark": None if self.timing_mark is None else list(self.timing_mark),
            "settled_trend": None if self.settled_trend is None else list(self.settled_trend),
            "early_trend": None if self.early_trend is None else list(self.early_trend),
            "timing_fit": None
            if self.timing_fit is None
            else [*self.timing_fit[:4], *(list(b) for b in self.timing_fit[4:])],
            "profile": None
            if self.profile is None
            else {"key": self.profile.key, "identity": self.profile.identity},
        }

    def to_json(self) -> bytes:
        """Canonical JSON bytes (``common.kv.dumps``): equal records, equal bytes."""
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobRecord:
        try:
            op = d.get("operator")
            trial = d.get("grow_trial")
            settled = d.get("settled_ms")
            mark = d.get("timing_mark")
            fit = d.get("timing_fit")
            prof = d.get("profile")
            useful = d.get("max_useful_devices")
            return cls(
                id=str(d["id"]),
                spec=JobSpec.from_dict(d["spec"]),
                state=str(d["state"]),
                devices=_strs(d.get("devices")),
                node=str(d.get("node") or ""),
                attempt=_int(d, "attempt"),
                step=_int(d, "step"),
                checkpoint_step=_int(d, "checkpoint_step", -1),
                submitted_at=_float(d, "submitted_at"),
                first_step_at=_float(d, "first_step_at"),
                finished_at=_float(d, "finished_at"),
                last_change_at=_float(d, "last_change_at"),
                minibatch_ms=_float(d, "minibatch_ms"),
                minibatch_ms_alone=_float(d, "minibatch_ms_alone"),
                utilization=_opt_float(d.get("utilization")),
                attained_service_s=_float(d, "attained_service_s"),
                packed_with=_strs(d.get("packed_with")),
                ranks=tuple(Rank(str(r["node"]), _strs(r.get("devices"))) for r in d.get("ranks") or ()),
                parked=bool(d.get("parked", False)),
                pending=Pending.from_dict(d["pending"]) if d.get("pending") else None,
                cancel_requested=bool(d.get("cancel_requested", False)),
                restarts=_int(d, "restarts"),
                message=str(d.get("message") or ""),
                history=tuple(
                    StateChange(float(at), str(st), str(msg)) for at, st, msg in d.get("history") or ()
                ),
                operator=None
                if not op
                else OperatorRequest(
                    str(op.get("action") or ""),
                    _strs(op.get("devices")),
                    _int(op, "count"),
                    _float(op, "at"),
                ),
                held=bool(d.get("held", False)),
                no_hook=bool(d.get("no_hook", False)),
                grow_trial=None
                if not trial
                else GrowTrial(
                    _strs(trial.get("from")),
                    _opt_float(trial.get("ms_before")),
                    None if trial.get("at_step") is None else int(trial["at_step"]),
                    _trend(trial.get("trend")),
                ),
                max_useful_devices=None if useful is None else int(useful),
                settled_ms=None if not settled else (int(settled[0]), float(settled[1])),
                step_at_change=_int(d, "step_at_change"),
                timing_mark=None
                if not mark
                else (int(mark[0]), int(mark[1]), float(mark[2]), float(mark[3])),
                settled_trend=_trend(d.get("settled_trend")),
                early_trend=_trend(d.get("early_trend")),
                timing_fit=None
                if not fit
                else (
                    int(fit[0]),
                    int(fit[1]),
                    float(fit[2]),
                    float(fit[3]),
                    _block(fit[4]),
                    _block(fit[5]),
                    _block(fit[6]),
                ),
                profile=None
                if not prof
                else ProfileRef(str(prof.get("key") or ""), str(prof.get("identity") or "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise InvalidArgument(f"not a job record: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, raw: str | bytes) -> JobRecord:
        try:
            d = json.loads(raw)
        except ValueError as exc:
            raise InvalidArgument(f"not a job record: {exc}") from None
        if not isinstance(d, dict):
            raise InvalidArgument(f"not a job record: a JSON {type(d).__name__}")
        return cls.from_dict(d)
