"""Discrete-event simulator on a virtual clock that drives the real policy objects.

The simulator is a *mechanism*: it owns the clock, the cluster and the jobs' progress, builds
a :class:`ClusterView` after every batch of same-time events (and every ``tick_s`` while
anyone waits or shares a device), calls ``policy.decide`` and applies the decisions,
refusing any that are stale, exactly as the live scheduler does.

Job progress: a job's *work* is its trace duration (seconds with its requested devices to
itself on the reference device type). It advances at ``rate = device_speed * packed_speed
* spread * scale`` work-seconds per second, and not at all while a mechanism's cost stalls
it (start, resume, migration, resize; see :class:`CostModel`).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from microco.services.scheduler.policy import (
    ClusterIndex,
    ClusterView,
    DeviceView,
    HolderTable,
    IndexedClusterView,
    JobFacts,
    JobPhase,
    JobView,
    Migrate,
    Pack,
    Policy,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
    check,
)

from ._models import UNKNOWN_MODEL_CHOICES, UnknownModelError, check_model_map
from ._perf import CostModel, PerfModel
from ._trace import TraceJob

log = logging.getLogger(__name__)

_ARRIVE, _STALL_END, _PROBE, _FINISH, _TICK = range(5)
_EPS = 1e-9
# Share of a trace's arrivals its load window holds (load_window; reported as
# gpu_utilization_load, the figure the utilisation target is judged on).
LOAD_FRACTION = 0.99
_LOAD = object()  # the load window's key among the named windows (no user name can equal it)


@dataclass(frozen=True)
class ClusterSpec:
    """``nodes`` hosts of ``devices_per_node`` devices each; ``device_models`` cycles over
    the nodes (e.g. ("v100", "p100") alternates), so a heterogeneous cluster is one flag."""

    nodes: int
    devices_per_node: int = 8
    device_models: tuple[str, ...] = ("v100",)

    @classmethod
    def for_gpus(cls, gpus: int, per_node: int = 8, device_models: Sequence[str] = ("v100",)) -> ClusterSpec:
        if gpus < 1 or per_node < 1:
            raise ValueError("a cluster needs at least one device per node and one device")
        # exactly ``gpus`` devices: nodes of the largest size <= per_node that divides gpus
        # (12 GPUs with 8 per node -> 2 nodes of 6), never a silently bigger cluster
        per = max(d for d in range(1, min(per_node, gpus) + 1) if gpus % d == 0)
        return cls(nodes=gpus // per, devices_per_node=per, device_models=tuple(device_models))

    def device_views(self) -> tuple[DeviceView, ...]:
        out = []
        for n in range(self.nodes):
            model = self.device_models[n % len(self.device_models)]
            for g in range(self.devices_per_node):
                out.append(DeviceView(id=f"node{n:03d}/gpu{g}", node=f"node{n:03d}", kind="gpu", model=model))
        return tuple(out)

    @property
    def size(self) -> int:
        return self.nodes * self.devices_per_node


def _job_view(**fields) -> JobView:
    # The simulator builds tens of thousands of views a run; a frozen dataclass's __init__
    # sets each field through object.__setattr__, several times slower than filling the
    # instance dict at once. Same object as JobView(**fields) (a unit test checks it).
    v = object.__new__(JobView)
    v.__dict__.update(fields)
    return v


class _LiveView(JobView):
    """A holding job's view: its attained service and steps done are read from the job at
    the simulator's clock when asked (they move with it), so the view is built once per
    change of the job, not at every decision. Same fields, equality and hash as a
    :class:`JobView`; exact while the policy is called (the clock does not move then).
    ``dataclasses.replace`` on one gives a view with the given values fixed."""

    @property  # type: ignore[override]
    def attained_service_s(self) -> float:
        d = self.__dict__
        j = d.get("_job")
        if j is None:
            return d["_attained"]
        return j.attained + (d["_sim"].now - j.hold_since) * len(j.devices)

    @attained_service_s.setter
    def attained_service_s(self, value: float) -> None:  # (dataclass __init__, via replace)
        self.__dict__["_attained"] = value

    @property  # type: ignore[override]
    def steps_done(self) -> int:
        d = self.__dict__
        j = d.get("_job")
        if j is None:
            return d["_steps"]
        done = j.done + (j.rate * (d["_sim"].now - j.last_update) if j.rate > 0 else 0.0)
        return int(done / j.work * j.total_steps)

    @steps_done.setter
    def steps_done(self, value: int) -> None:
        self.__dict__["_steps"] = value


class _Job:
    __slots__ = (
        "attained",
        "busy_seen",
        "devices",
        "done",
        "finished",
        "first_feedback",
        "first_start",
        "hold_since",
        "id",
        "k",
        "last_change",
        "last_update",
        "mb_alone_ms",
        "migrations",
        "pack_speed",
        "phase",
        "preemptions",
        "priority",
        "probe_work",
        "probed",
        "probes",
        "rate",
        "seq",
        "stall_until",
        "stopped_early",
        "t",
        "total_steps",
        "util",
        "version",
        "view",
        "work",
    )

    def __init__(self, t: TraceJob, mb_alone_ms: float) -> None:
        self.t = t
        self.id = t.job_id
        self.k = t.devices
        self.phase = JobPhase.QUEUED
        self.devices: tuple[str, ...] = ()
        self.work = max(t.duration_s, 1e-3)
        self.done = 0.0
        self.rate = 0.0
        self.util = 0.0  # per-device busy fraction this job contributes
        self.busy_seen: float | None = None  # busy fraction alone, once profiled (has run)
        self.stall_until = 0.0
        self.last_update = t.submit_time
        self.attained = 0.0
        self.hold_since = 0.0
        self.last_change = t.submit_time
        self.first_feedback: float | None = None
        self.first_start: float | None = None
        self.finished: float | None = None
        self.version = 0
        self.mb_alone_ms = mb_alone_ms
        self.pack_speed = 1.0
        self.view: JobView | None = None
        self.seq = 0  # arrival order: the job's position key in the view
        self.probe_work: float | None = None  # work at the next probe point (None: no more)
        self.probes: list[float] = []  # later probe points, in work-seconds
        self.probed = False  # reached at least one probe point
        self.priority = t.priority
        self.stopped_early = False
        self.preemptions = 0
        self.migrations = 0
        self.total_steps = t.iterations if t.iterations else max(1, int(self.work * 1000.0 / mb_alone_ms))


@dataclass
class SimResult:
    """Figures of one run; ``to_dict`` is the JSON the CLI and benchmark print."""

    policy: str
    jobs: int
    gpus: int
    gpu_utilization: float
    gpu_allocation: float
    gpu_utilization_while_queued: float
    gpu_utilization_window: float  # busy device-s of useful work / device-s in util_window
    util_window_s: tuple[float, float]
    avg_jct_s: float
    p50_jct_s: float
    p95_jct_s: float
    avg_time_to_first_feedback_s: float
    p95_time_to_first_feedback_s: float
    makespan_s: float
    avg_queue_len: float
    preemptions: int
    migrations: int
    packs: int
    resizes: int
    decisions_refused: int
    decide_calls: int
    events: int
    sim_wall_s: float
    sim_cpu_s: float = 0.0  # CPU time of the run: what "on one core" means on a shared machine
    jobs_rejected: int = 0
    stopped_early: int = 0
    # trace model names the performance model has no measurement of (run at default speeds)
    unknown_models: list[str] = field(default_factory=list)
    # refused decisions by policy.Refusal code (they add up to decisions_refused)
    refusals: dict[str, int] = field(default_factory=dict)
    gpu_utilization_extra: dict[str, float] = field(default_factory=dict)  # per extra window
    # busy device-s / device-s over the trace's load window (:func:`load_window`; None: none)
    gpu_utilization_load: float | None = None
    load_window_s: tuple[float, float] | None = None
    series: dict[str, list[float]] = field(default_factory=dict, repr=False)
    per_job: dict[str, dict[str, float | None]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("series", "per_job")}
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


class Simulator:
    """One run of ``policy`` over ``trace`` on ``cluster``.

    ``on_probe(job_id, now) -> bool`` (optional) is called when a job reaches a probe point
    (``probe_fraction`` of its work, or each of several fractions in increasing order: the
    hyper-parameter search's rungs); returning True stops the job there, as a user
    cancelling it would. ``on_finish(job_id, now)`` (optional) is called when a job
    completes its work. ``set_priority`` changes a job's priority as a user would (the
    searcher raises the survivors'); ``submit`` adds a job while the run goes on.
    """

    def __init__(
        self,
        policy: Policy,
        trace: Sequence[TraceJob],
        cluster: ClusterSpec,
        *,
        perf: PerfModel | None = None,
        costs: CostModel | None = None,
        tick_s: float = 60.0,
        probe_fraction: float | Sequence[float] | None = None,
        on_probe: Callable[[str, float], bool] | None = None,
        on_finish: Callable[[str, float], None] | None = None,
        series_points: int = 2000,
        check_invariants: bool = False,
        max_time_s: float = float("inf"),
        util_window: tuple[float, float] | None = None,
        extra_windows: dict[str, tuple[float, float]] | None = None,
        observe_utilization: bool = True,
        load_fraction: float = LOAD_FRACTION,
        model_map: Mapping[str, str] | None = None,
        on_unknown_model: str = "error",
    ) -> None:
        if on_unknown_model not in UNKNOWN_MODEL_CHOICES:
            raise ValueError(f"on_unknown_model must be one of {', '.join(UNKNOWN_MODEL_CHOICES)}")
        self.policy = policy
        self.cluster = cluster
        self.devices = cluster.device_views()
        self.dev_model = {d.id: d.model for d in self.devices}
        self.dev_node = {d.id: d.node for d in self.devices}
        self.perf = perf or PerfModel.uniform()
        self.costs = costs or CostModel()
        self.tick_s = tick_s
        self.on_probe = on_probe
        self.on_finish = on_finish
        self.check_invariants = check_invariants
        self.max_time_s = max_time_s
        self.series_points = series_points
        # Fill JobView.utilization (the busy fraction alone, "profiled" once a job has run),
        # as a live scheduler with device telemetry would. False: leave it None, as the live
        # scheduler does until it reports telemetry (the parity test compares views).
        self.observe_utilization = observe_utilization
        ref = self.devices[0].model if self.devices else "v100"
        self.jobs: dict[str, _Job] = {}
        self.rejected = 0
        # trace model names mapped onto measured ones (_models: unknown names are refused
        # unless mapped, or run at default speeds by explicit choice)
        self.model_map = dict(model_map or {})
        known = {m for table in self.perf.alone.values() for m in table}
        check_model_map(self.model_map, known)
        if self.model_map:
            trace = [
                replace(t, model=self.model_map[t.model]) if t.model in self.model_map else t for t in trace
            ]
        for t in trace:
            if t.devices > len(self.devices):
                self.rejected += 1
                continue
            j = _Job(t, self.perf.minibatch_ms(t.model, ref))
            if probe_fraction is not None:
                fr = [probe_fraction] if isinstance(probe_fraction, (int, float)) else list(probe_fraction)
                pts = sorted(f * j.work for f in fr if 0 < f < 1)
                if pts:
                    j.probe_work, j.probes = pts[0], pts[1:]
            self.jobs[j.id] = j
        self.unknown_models = self.perf.unknown_models(j.t.model for j in self.jobs.values())
        if self.unknown_models and on_unknown_model == "error":
            raise UnknownModelError(self.unknown_models, known)
        if self.unknown_models:
            log.warning(
                "the performance model has no measurement of %d trace model(s), run at default speeds: %s",
                len(self.unknown_models),
                ", ".join(self.unknown_models[:5]) + (" ..." if len(self.unknown_models) > 5 else ""),
            )
        self.holders: dict[str, list[_Job]] = {d.id: [] for d in self.devices}
        # Utilisation kept per device (:meth:`_aggregate`): each device's share of busy
        # (min(1, its holders' summed busy fractions); 0.0 when free) by device index, and
        # whether it is held, recomputed only for the devices a change touched (_dirty).
        self._dev_index = {d.id: i for i, d in enumerate(self.devices)}
        self._dev_busy = np.zeros(len(self.devices), dtype=np.float64)
        self._dev_held = [False] * len(self.devices)
        self._n_held = 0
        self._dirty: set[str] = set()
        self.active: dict[str, _Job] = {}  # arrived, not terminal
        self.waiting = 0
        self.now = 0.0
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.counts = {
            "preemptions": 0,
            "migrations": 0,
            "packs": 0,
            "resizes": 0,
            "refused": 0,
            "decide": 0,
            "events": 0,
        }
        # Refused decisions by the check's code (policy.Refusal), as the live scheduler counts them.
        self.refusals: dict[str, int] = {}
        # time integrals
        self._util_now = 0.0
        self._alloc_now = 0
        self._int_util = 0.0
        self._int_alloc = 0.0
        self._int_queue = 0.0
        self._int_util_q = 0.0
        self._time_q = 0.0
        self._t_last = 0.0  # (set by run() to the first arrival)
        # Utilisation over one window common to every policy (default: first to last
        # arrival of the trace; set by run()): a policy's own makespan is no fair yardstick.
        self.util_window = util_window
        self._int_util_w = 0.0
        # more named windows (e.g. the trace's contended period), same integral
        self.extra_windows = dict(extra_windows or {})
        # and over the trace's load window (set by run(): a property of the trace), the same
        # integral under its own key
        self.load_fraction = load_fraction
        self.load_window: tuple[float, float] | None = None
        self._windows: dict[object, tuple[float, float]] = {}
        self._windows.update(self.extra_windows)
        self._int_extra: dict[object, float] = {k: 0.0 for k in self._windows}
        self._series: list[tuple[float, float, int, int]] = []
        self._tick_pending = False
        self._last_n = 0
        self._time_driven = bool(getattr(policy, "time_driven", True))
        self._wakeup = getattr(policy, "wakeup_at", None)
        self._tick_version = 0
        self._tick_at = 0.0
        self._last_view: ClusterView | None = None
        # The view kept between decisions (issue 23): every active job's view by id in
        # arrival order, rebuilt only for the jobs whose state changed (``_stale``), with
        # the index a policy may query instead of passing over every job
        # (policy.ClusterIndex): the jobs by phase, and each device's holders, recomputed
        # only for the devices a change touched (``_idx_dirty``).
        self._views: dict[str, JobView] = {}
        self._stale: set[str] = set()
        self._jobs_tuple: tuple[JobView, ...] | None = ()
        self._ix_waiting: dict[str, JobView] = {}
        self._ix_holding: dict[str, JobView] = {}
        self._ix_elastic: dict[str, JobView] = {}
        self._ix_multi: dict[str, JobView] = {}
        self._ix_packed: set[str] = set()
        self._ix_holders: dict[str, tuple[str, ...]] = {d.id: () for d in self.devices}
        self._ix_shared: set[str] = set()
        self._ix_n_held = 0
        self._ix_order: dict[str, int] = {}
        self._ix_table = HolderTable(len(self.devices) + 16)
        self._ix_count = np.zeros(len(self.devices), dtype=np.int64)  # holders per device
        # free devices by node, as Occupancy.free_by_node builds it (nodes in device order,
        # those with none left out), kept per node for the nodes a change touched
        self._node_devs: dict[str, list[str]] = {}
        for d in self.devices:
            self._node_devs.setdefault(d.node, []).append(d.id)
        self._node_free: dict[str, list[str]] = {n: list(v) for n, v in self._node_devs.items()}
        self._ix_fbn: dict[str, list[str]] = dict(self._node_free)
        self._idx_dirty: set[str] = set()
        self._arrivals = 0
        self.min_tick_s = 1.0
        # Conservation (:meth:`check_conservation`) compares two counters kept apart: the
        # job side (attained service and job_device_s, advanced by _sync) and the device
        # side, each device's timeline of holders (opened by _take, closed by _release and
        # nowhere else). device_busy_s: closed device-seconds per device; _held_by_job: the
        # same closed intervals summed per job; _open: device -> job id -> interval start.
        self.device_busy_s = {d.id: 0.0 for d in self.devices}
        self.job_device_s: dict[str, float] = {}
        self._open: dict[str, dict[str, float]] = {d.id: {} for d in self.devices}
        self._held_by_job: dict[str, float] = {}

    # ------------------------------------------------------------------ events
    def _push(self, when: float, kind: int, jid: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, jid, version))

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        for j in self.jobs.values():
            self._push(j.t.submit_time, _ARRIVE, j.id)
        first_submit = min((j.t.submit_time for j in self.jobs.values()), default=0.0)
        if self.util_window is None:
            last_submit = max((j.t.submit_time for j in self.jobs.values()), default=0.0)
            self.util_window = (first_submit, last_submit)
        self.load_window = load_window([j.t.submit_time for j in self.jobs.values()], self.load_fraction)
        if self.load_window is not None:
            self._windows[_LOAD] = self.load_window
            self._int_extra[_LOAD] = 0.0
        self._t_last = first_submit
        heap = self._heap
        while heap:
            t = heap[0][0]
            if t > self.max_time_s:
                break
            self._advance(t)
            changed = False
            while heap and heap[0][0] <= t + _EPS:
                _, _, kind, jid, ver = heapq.heappop(heap)
                self.counts["events"] += 1
                changed |= self._handle(kind, jid, ver)
            if changed:
                self._decide()
                if not self._heap and self.waiting and not any(self.holders.values()) and not self._last_n:
                    raise RuntimeError(
                        f"policy {self.policy.name!r} leaves {self.waiting} job(s) waiting on an idle cluster"
                    )
            self._maybe_tick()
        self._advance(self.now)
        if self.check_invariants:
            self.assert_invariants()
        return self._result(first_submit, time.perf_counter() - wall0, time.process_time() - cpu0)

    def _handle(self, kind: int, jid: str, ver: int) -> bool:
        if kind == _TICK:
            if self._wakeup is not None and ver != self._tick_version:
                return False  # superseded by a later wake-up
            self._tick_pending = False
            return True
        j = self.jobs[jid]
        if kind == _ARRIVE:
            self.active[jid] = j
            self._arrivals += 1
            j.seq = self._arrivals
            self._stale.add(jid)
            self.waiting += 1
            return True
        if ver != j.version or j.finished is not None:
            return False  # stale prediction
        if kind == _STALL_END:
            self._sync(j)
            self._set_rates([j])
            return True
        if kind == _PROBE:
            self._sync(j)
            j.probed = True
            j.probe_work = j.probes.pop(0) if j.probes else None
            if self.on_probe is not None and self.on_probe(jid, self.now):
                j.stopped_early = True
                self._finish(j)
            else:
                self._set_rates([j])
            return True
        if kind == _FINISH:
            self._sync(j)
            self._finish(j)
            if self.on_finish is not None:
                self.on_finish(jid, self.now)
            return True
        return False

    def _maybe_tick(self) -> None:
        if not self._time_driven:
            return
        if self._wakeup is not None:
            # The policy says when the clock alone could change its answer: sleep till then.
            view = (
                self._last_view
                if self._last_view is not None and self._last_view.now == self.now
                else self.view()
            )
            wake = self._wakeup(view)
            if wake is None:
                self._tick_version += 1  # cancel any pending wake-up
                self._tick_pending = False
                return
            wake = max(wake, self.now + self.min_tick_s)
            if self._tick_pending and self._tick_at <= wake + _EPS:
                return  # an earlier (or the same) wake-up is already booked; it re-asks
            self._tick_version += 1
            self._tick_pending = True
            self._tick_at = wake
            self._push(wake, _TICK, "", self._tick_version)
            return
        if self._tick_pending:
            return
        # A tick is needed only while time passing can change a decision: someone waits
        # (time-slicing quantum, LAS thresholds). Packs are judged at the next event or
        # tick: in the simulator a pack's mini-batch times are known as soon as it starts.
        if self.waiting:
            self._push(self.now + self.tick_s, _TICK)
            self._tick_pending = True

    def _advance(self, t: float) -> None:
        dt = t - self._t_last
        if dt > 0:
            self._int_util += self._util_now * dt
            self._int_alloc += self._alloc_now * dt
            self._int_queue += self.waiting * dt
            if self.waiting:
                self._int_util_q += self._util_now * dt
                self._time_q += dt
            uw = self.util_window
            if uw is not None:  # (set by run())
                overlap = min(t, uw[1]) - max(self._t_last, uw[0])
                if overlap > 0:
                    self._int_util_w += self._util_now * overlap
            for name, (e0, e1) in self._windows.items():
                ov = min(t, e1) - max(self._t_last, e0)
                if ov > 0:
                    self._int_extra[name] += self._util_now * ov
            self._t_last = t
        self.now = t

    # ------------------------------------------------------------------ job state
    def _sync(self, j: _Job) -> None:
        """Bring a job's work done and attained service up to now."""
        now = self.now
        if j.rate > 0:
            j.done = min(j.work, j.done + j.rate * (now - j.last_update))
        j.last_update = now
        if j.devices:
            held = now - j.hold_since
            j.attained += held * len(j.devices)
            self.job_device_s[j.id] = self.job_device_s.get(j.id, 0.0) + held * len(j.devices)
            j.hold_since = now

    def _set_rates(self, jobs: Sequence[_Job]) -> None:
        """Recompute rate and utilisation of ``jobs`` (already synced) and reschedule their
        stall-end / probe / finish events; then the cluster aggregates."""
        now = self.now
        perf = self.perf
        dirty = self._dirty
        for j in jobs:
            j.version += 1
            j.view = None
            self._stale.add(j.id)
            dirty.update(j.devices)
            if not j.devices or j.finished is not None:
                j.rate = 0.0
                j.util = 0.0
                continue
            model = j.t.model
            dev0 = j.devices[0]
            # packed speed: worst over the job's devices (a data-parallel step waits for all)
            pack = 1.0
            for d in j.devices:
                hs = self.holders[d]
                if len(hs) > 1:
                    others = [(o.t.model, o.t.gpu_share) for o in hs if o is not j]
                    pack = min(pack, perf.packed_speed(model, j.t.gpu_share, others, self.dev_model[d]))
            j.pack_speed = pack
            spread = perf.spread_factor if len({self.dev_node[d] for d in j.devices}) > 1 else 1.0
            n = len(j.devices)
            scale = n / j.k if n <= j.k else 1.0 + (n - j.k) / j.k * perf.elastic_efficiency
            eff = 1.0 if n <= j.k else perf.elastic_efficiency
            speed = perf.device_speed(model, self.dev_model[dev0]) * pack * spread * scale
            if now + _EPS < j.stall_until:
                j.rate = 0.0
                j.util = 0.0
                self._push(j.stall_until, _STALL_END, j.id, j.version)
                continue
            # busy fraction alone (request x the model's solo busy fraction, from Gavel's
            # self pair), then how much of it the job keeps while packed / spread / grown
            busy = j.t.gpu_share * perf.solo_busy(model, self.dev_model[dev0])
            j.busy_seen = busy
            j.rate = speed
            j.util = busy * pack * spread * eff
            if j.first_feedback is None:
                j.first_feedback = now + j.mb_alone_ms / 1000.0 / max(speed, 1e-3)
            remaining = j.work - j.done
            if j.probe_work is not None:
                if j.done + _EPS >= j.probe_work:
                    self._push(now, _PROBE, j.id, j.version)
                    continue
                self._push(now + (j.probe_work - j.done) / speed, _PROBE, j.id, j.version)
                continue
            self._push(now + max(0.0, remaining) / speed, _FINISH, j.id, j.version)
        self._aggregate()

    def _aggregate(self) -> None:
        """Cluster utilisation and allocation now: each held device adds min(1, the summed
        busy fractions of its holders), in device order. Only the devices a change touched
        are recomputed; the sum runs over every device's share in device order (a free
        device's 0.0 changes no partial sum), so the figure is the same float as summing
        the held devices afresh."""
        busy, held, index, holders = self._dev_busy, self._dev_held, self._dev_index, self.holders
        for d in self._dirty:
            i = index[d]
            hs = holders[d]
            if hs:
                u = 0.0
                for o in hs:
                    u += o.util
                busy[i] = min(1.0, u)
                if not held[i]:
                    held[i] = True
                    self._n_held += 1
            else:
                busy[i] = 0.0
                if held[i]:
                    held[i] = False
                    self._n_held -= 1
        self._dirty.clear()
        # plain left-to-right float addition, as a loop does: ``accumulate`` adds in order
        # (unlike numpy's pairwise ``sum``), and 0.0 + b0 is b0 (every share is >= 0.0)
        util = float(np.add.accumulate(busy)[-1]) if len(busy) else 0.0
        alloc = self._n_held
        self._util_now = util
        self._alloc_now = alloc
        if self.series_points:
            self._series.append((self.now, util, alloc, self.waiting))

    def _phase_after_change(self, jobs: set[_Job]) -> None:
        for o in jobs:
            if o.finished is not None or not o.devices:
                continue
            if o.phase in (JobPhase.RUNNING, JobPhase.PACKED, JobPhase.MIGRATING):
                shared = any(len(self.holders[d]) > 1 for d in o.devices)
                o.phase = JobPhase.PACKED if shared else JobPhase.RUNNING

    def _take(self, j: _Job, devs: tuple[str, ...]) -> None:
        now = self.now
        self._dirty.update(devs)
        self._idx_dirty.update(devs)
        for d in devs:
            self.holders[d].append(j)
            self._open[d][j.id] = now
        j.devices = devs
        j.hold_since = now

    def _release(self, j: _Job) -> set[_Job]:
        """Free a job's devices; returns the co-holders whose speed may change."""
        touched: set[_Job] = set()
        now = self.now
        held = 0.0
        self._dirty.update(j.devices)
        self._idx_dirty.update(j.devices)
        for d in j.devices:
            hs = self.holders[d]
            hs.remove(j)
            touched.update(hs)
            span = now - self._open[d].pop(j.id)
            self.device_busy_s[d] += span
            held += span
        if j.devices:
            self._held_by_job[j.id] = self._held_by_job.get(j.id, 0.0) + held
        j.devices = ()
        return touched

    def _finish(self, j: _Job) -> None:
        touched = self._release(j)
        j.phase = JobPhase.FINISHED
        j.finished = self.now
        j.rate = 0.0
        j.util = 0.0
        j.version += 1
        self.active.pop(j.id, None)
        j.view = None
        self._stale.add(j.id)
        for o in touched:
            self._sync(o)
        self._phase_after_change(touched)
        self._set_rates(list(touched))

    # ------------------------------------------------------------------ policy loop
    def view(self) -> ClusterView:
        """The ClusterView the policy sees now (also what a live scheduler would build),
        with its index (:class:`ClusterIndex`). Only the jobs whose state changed since the
        last view get a new job view; a holding job's attained service and steps are read
        at the clock (:class:`_LiveView`)."""
        stale = self._stale
        if stale:
            views = self._views
            wt, hd, el, mu, pk = (
                self._ix_waiting,
                self._ix_holding,
                self._ix_elastic,
                self._ix_multi,
                self._ix_packed,
            )
            table = self._ix_table
            for jid in stale:
                for ix in (wt, hd, el, mu):
                    ix.pop(jid, None)
                pk.discard(jid)
                table.drop(jid)
                j = self.jobs[jid]
                if jid not in self.active:
                    views.pop(jid, None)
                    self._ix_order.pop(jid, None)
                    continue
                v = self._build_view(j)
                j.view = v
                views[jid] = v  # (an existing key keeps its place: arrival order)
                self._ix_order[jid] = j.seq
                st = j.phase
                if j.devices:
                    hd[jid] = v
                    table.put(
                        v,
                        attained=j.attained,
                        hold_since=j.hold_since,
                        dev0=self._dev_index[j.devices[0]],
                        spread=len({self.dev_node[d] for d in j.devices}) > 1,
                    )
                    if st is JobPhase.RUNNING:
                        if j.t.elastic:
                            el[jid] = v
                        if len(j.devices) > 1:
                            mu[jid] = v
                    elif st is JobPhase.PACKED:
                        pk.add(jid)
                elif st is JobPhase.QUEUED or st is JobPhase.SUSPENDED:
                    wt[jid] = v
            stale.clear()
            self._jobs_tuple = None
        if self._idx_dirty:
            hx, shared = self._ix_holders, self._ix_shared
            count, dev_index = self._ix_count, self._dev_index
            nodes = {self.dev_node[d] for d in self._idx_dirty}
            for d in self._idx_dirty:
                hs = self.holders[d]
                before = hx[d]
                if len(hs) > 1:
                    # in the view's job order (arrival), as Occupancy builds it from a view
                    hx[d] = tuple(o.id for o in sorted(hs, key=lambda o: o.seq))
                    shared.add(d)
                else:
                    hx[d] = (hs[0].id,) if hs else ()
                    shared.discard(d)
                count[dev_index[d]] = len(hs)
                self._ix_n_held += bool(hx[d]) - bool(before)
            self._idx_dirty.clear()
            nf = self._node_free
            for n in nodes:
                nf[n] = [d for d in self._node_devs[n] if not hx[d]]
            # a new dict (a policy may hold the last one): nodes in order, with free devices
            self._ix_fbn = {n: f for n, f in nf.items() if f}
        jobs = self._jobs_tuple
        if jobs is None:
            jobs = self._jobs_tuple = tuple(self._views.values())
        index = ClusterIndex(
            jobs=self._views,
            waiting=self._ix_waiting,
            holding=self._ix_holding,
            elastic=self._ix_elastic,
            multi=self._ix_multi,
            n_packed=len(self._ix_packed),
            holders=self._ix_holders,
            shared=self._ix_shared,
            n_held=self._ix_n_held,
            order=self._ix_order,
            table=self._ix_table,
            free_by_node=self._ix_fbn,
            holder_count=self._ix_count,
        )
        return IndexedClusterView(now=self.now, devices=self.devices, jobs=jobs, index=index)

    def _build_view(self, j: _Job) -> JobView:
        now = self.now
        held = (now - j.hold_since) * len(j.devices) if j.devices else 0.0
        done = j.done + (j.rate * (now - j.last_update) if j.rate > 0 else 0.0)
        observed = (
            j.mb_alone_ms / j.pack_speed
            if j.devices and j.rate > 0
            else (None if j.first_feedback is None else j.mb_alone_ms / j.pack_speed)
        )
        fields = dict(
            id=j.id,
            devices_wanted=j.k,
            elastic=j.t.elastic,
            priority=j.priority,
            owner=j.t.owner,
            submitted_at=j.t.submit_time,
            state=j.phase,
            devices=j.devices,
            attained_service_s=j.attained + held,
            minibatch_ms=observed,
            # the simulator's mini-batch times are exact: settled as soon as the job runs
            minibatch_ms_settled=observed if j.devices and j.rate > 0 else None,
            minibatch_ms_alone=j.mb_alone_ms if j.first_feedback is not None else None,
            steps_done=int(done / j.work * j.total_steps),
            total_steps=j.total_steps,
            packed_with=self._packed_with(j) if j.phase is JobPhase.PACKED else (),
            last_change_at=j.last_change,
            model=j.t.model,
            gpu_share=j.t.gpu_share,
            max_devices=None,
            utilization=j.busy_seen if self.observe_utilization else None,
        )
        if not j.devices:
            return _job_view(**fields)  # nothing in it moves with the clock
        del fields["attained_service_s"], fields["steps_done"]
        v = object.__new__(_LiveView)
        v.__dict__.update(fields, _job=j, _sim=self)
        return v

    def submit(self, t: TraceJob) -> None:
        """Submit a job while the simulation runs, arriving at ``t.submit_time`` (not
        before now): what a user or a searcher does through the scheduler's API (the
        search scenario's promotion form submits each configuration's next segment)."""
        if t.job_id in self.jobs:
            raise ValueError(f"job {t.job_id!r} already submitted")
        if t.devices > len(self.devices):
            raise ValueError(
                f"job {t.job_id!r} asks for {t.devices} devices, the cluster has {len(self.devices)}"
            )
        ref = self.devices[0].model if self.devices else "v100"
        j = _Job(t, self.perf.minibatch_ms(t.model, ref))
        self.jobs[j.id] = j
        self._push(max(self.now, t.submit_time), _ARRIVE, j.id)

    def set_priority(self, job_id: str, priority: int) -> None:
        """Change a job's priority from now on (what a user or a searcher would do through
        the scheduler's API); the policy sees it at its next decision."""
        j = self.jobs[job_id]
        if j.priority != priority:
            j.priority = priority
            j.view = None
            self._stale.add(j.id)

    def _packed_with(self, j: _Job) -> tuple[str, ...]:
        return tuple(sorted({o.id for d in j.devices for o in self.holders[d] if o is not j}))

    def _decide(self) -> None:
        if not self.active:
            return
        self.counts["decide"] += 1
        view = self.view()
        decisions = self.policy.decide(view)
        self._last_n = len(decisions)
        self._last_view = view
        if decisions:
            self._last_view = None
            self.apply(decisions)
        if self.check_invariants:
            self.assert_invariants()

    def apply(self, decisions: Sequence) -> None:
        """Carry out decisions in order, refusing stale ones (counted in ``decisions_refused``)."""
        now = self.now
        c = self.costs
        touched: set[_Job] = set()
        freed_by_suspend = False
        holder_ids = _HolderIds(self.holders)
        for d in decisions:
            found = self.jobs.get(d.job_id)
            active = found is not None and found.finished is None and found.id in self.active
            facts = (
                JobFacts(found.phase, tuple(found.devices), found.k, found.t.elastic)
                if found and active
                else None
            )
            rejection = check(d, facts, holder_ids, self.holders.__contains__)
            if rejection is not None or found is None:
                self.counts["refused"] += 1
                if rejection is not None:
                    self.refusals[rejection.code.value] = self.refusals.get(rejection.code.value, 0) + 1
                continue
            j = found
            if isinstance(d, (Start, Resume, Pack)):
                devs = tuple(d.devices)
                self._sync(j)
                for dv in devs:
                    touched.update(self.holders[dv])
                self._take(j, devs)
                first = j.phase is JobPhase.QUEUED
                cost = c.start_s if first else c.resume_s
                if freed_by_suspend:
                    cost += c.suspend_s
                j.stall_until = now + cost
                if j.first_start is None:
                    j.first_start = now
                j.phase = JobPhase.RUNNING
                # the job's running phase begins once the cost is paid: a quantum or a
                # minimum run counts running time (else a resume dearer than the quantum
                # would be suspended before its first step, and no job would progress)
                j.last_change = j.stall_until
                self.waiting -= 1
                if isinstance(d, Pack):
                    self.counts["packs"] += 1
                touched.add(j)
            elif isinstance(d, (Suspend, Unpack)):
                self._sync(j)
                touched.update(self._release(j))
                touched.add(j)
                j.phase = JobPhase.SUSPENDED
                j.last_change = now
                j.preemptions += 1
                self.counts["preemptions"] += 1
                self.waiting += 1
                freed_by_suspend = True
            elif isinstance(d, (Migrate, Resize)):
                devs = tuple(d.devices)
                self._sync(j)
                touched.update(self._release(j))
                for dv in devs:
                    touched.update(self.holders[dv])
                self._take(j, devs)
                j.stall_until = now + (c.migrate_s if isinstance(d, Migrate) else c.resize_s)
                j.last_change = j.stall_until
                j.phase = JobPhase.RUNNING
                if isinstance(d, Migrate):
                    j.migrations += 1
                    self.counts["migrations"] += 1
                else:
                    self.counts["resizes"] += 1
                touched.add(j)
        for o in touched:
            if o is not None and o.finished is None:
                self._sync(o)
        live = {o for o in touched if o.finished is None}
        self._phase_after_change(live)
        self._set_rates(sorted(live, key=lambda o: o.id))

    # ------------------------------------------------------------------ checks & results
    def check_conservation(self) -> None:
        """Device-seconds and progress conserved, from counters kept apart (raises
        AssertionError naming the job or device):

        * per job, the device-seconds its devices' timelines record (intervals opened when
          it takes a device and closed when it leaves it) equal its attained service and its
          ``device_s`` (advanced when the job's progress is brought up to date);
        * the devices' timelines and the jobs' attained service add up to the same total;
        * a device's timeline holds exactly its current holders' open intervals;
        * no job has done more work than its devices' time allows at the fastest speed
          any device here gives it (nor more than its work), and a finished job that was
          not stopped early did all of it.
        """
        now = self.now
        tol = 1e-6
        open_by_job: dict[str, float] = {}
        for d, opened in self._open.items():
            ids = sorted(o.id for o in self.holders[d])
            if sorted(opened) != ids:
                raise AssertionError(
                    f"conservation: {d}'s timeline has open intervals for {sorted(opened)} but holders {ids}"
                )
            for jid, t0 in opened.items():
                open_by_job[jid] = open_by_job.get(jid, 0.0) + (now - t0)
        total_dev = sum(self.device_busy_s.values()) + sum(open_by_job.values())
        total_job = 0.0
        for j in self.jobs.values():
            held_open = (now - j.hold_since) * len(j.devices) if j.devices else 0.0
            attained = j.attained + held_open
            recorded = self.job_device_s.get(j.id, 0.0) + held_open
            timeline = self._held_by_job.get(j.id, 0.0) + open_by_job.get(j.id, 0.0)
            scale = max(1.0, abs(timeline))
            if abs(attained - timeline) > tol * scale or abs(recorded - timeline) > tol * scale:
                raise AssertionError(
                    f"conservation: job {j.id} attained {attained:.6f} device-s (device_s {recorded:.6f}) "
                    f"but its devices' timelines record {timeline:.6f}"
                )
            total_job += attained
            if j.done > j.work * (1 + 1e-9) + tol:
                raise AssertionError(f"conservation: job {j.id} did {j.done} of {j.work} work-s")
            limit = self._max_speed(j) * timeline / j.k
            if j.done > limit * (1 + 1e-9) + tol:
                raise AssertionError(
                    f"conservation: job {j.id} did {j.done:.6f} work-s but held devices for only "
                    f"{timeline:.6f} device-s (at most {limit:.6f} work-s)"
                )
            if j.finished is not None and not j.stopped_early and j.done < j.work * (1 - 1e-9) - tol:
                raise AssertionError(f"conservation: job {j.id} finished with {j.done} of {j.work} work-s")
        if abs(total_dev - total_job) > tol * max(1.0, total_dev):
            raise AssertionError(
                f"conservation: devices' timelines record {total_dev:.6f} device-s, jobs attained {total_job:.6f}"
            )

    def _max_speed(self, j: _Job) -> float:
        """The fastest a job's work can advance per device-second of its request: the best
        device speed in the cluster (packing, spreading and growth never raise it: growing
        to n devices scales by at most n / k)."""
        return max([self.perf.device_speed(j.t.model, m) for m in set(self.dev_model.values())] or [1.0])

    def assert_invariants(self) -> None:
        """No job on two places at once; device holders and job device lists agree;
        device-seconds and progress conserved (:meth:`check_conservation`)."""
        self.check_conservation()
        seen: dict[str, tuple[str, ...]] = {}
        for dv, hs in self.holders.items():
            ids = [o.id for o in hs]
            assert len(ids) == len(set(ids)), f"{dv} lists a job twice"
            for o in hs:
                assert dv in o.devices, f"{o.id} on {dv} but its devices are {o.devices}"
                assert o.finished is None, f"finished job {o.id} still on {dv}"
        for j in self.jobs.values():
            if j.devices:
                assert len(set(j.devices)) == len(j.devices)
                assert j.phase in (JobPhase.RUNNING, JobPhase.PACKED, JobPhase.MIGRATING), (j.id, j.phase)
                for dv in j.devices:
                    assert j in self.holders[dv]
                seen[j.id] = j.devices
            else:
                assert j.phase not in (JobPhase.RUNNING, JobPhase.PACKED), (j.id, j.phase)

    def _result(self, first_submit: float, wall: float, cpu: float) -> SimResult:
        done = [j for j in self.jobs.values() if j.finished is not None]
        finished = [(j, f) for j in done if (f := j.finished) is not None]
        jct = sorted(f - j.t.submit_time for j, f in finished)
        ttff = sorted(ff - j.t.submit_time for j in done if (ff := j.first_feedback) is not None)
        end = max((f for _, f in finished), default=first_submit)
        span = max(end - first_submit, _EPS)
        n = max(len(self.devices), 1)

        def pct(xs: list[float], q: float) -> float:
            if not xs:
                return 0.0
            return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]

        uw = self.util_window if self.util_window is not None else (first_submit, first_submit)
        series: dict[str, list[float]] = {}
        if self._series:
            # thin by time, not by index: a sparse quiet period must keep its points
            t_end = self._series[-1][0]
            width = max((t_end - first_submit) / self.series_points, _EPS)
            pts, next_t = [], -math.inf
            for p in self._series:
                if p[0] >= next_t:
                    pts.append(p)
                    next_t = p[0] + width
                elif pts and pts[-1][0] == p[0]:
                    pts[-1] = p  # the last state at one instant is the one that held
            series = {
                "t_s": [p[0] - first_submit for p in pts],
                "utilization": [p[1] / n for p in pts],
                "allocation": [p[2] / n for p in pts],
                "queue_len": [float(p[3]) for p in pts],
            }
        return SimResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            jobs=len(self.jobs),
            gpus=len(self.devices),
            gpu_utilization=self._int_util / (n * span),
            gpu_allocation=self._int_alloc / (n * span),
            gpu_utilization_while_queued=(self._int_util_q / (n * self._time_q)) if self._time_q else 0.0,
            gpu_utilization_window=(self._int_util_w / (n * (uw[1] - uw[0])) if uw[1] > uw[0] else 0.0),
            util_window_s=(float(uw[0]), float(uw[1])),
            gpu_utilization_extra={
                k: (self._int_extra[k] / (n * (e1 - e0)) if e1 > e0 else 0.0)
                for k, (e0, e1) in self.extra_windows.items()
            },
            gpu_utilization_load=(
                self._int_extra[_LOAD] / (n * (self.load_window[1] - self.load_window[0]))
                if self.load_window is not None
                else None
            ),
            load_window_s=(float(self.load_window[0]), float(self.load_window[1]))
            if self.load_window
            else None,
            avg_jct_s=sum(jct) / len(jct) if jct else 0.0,
            p50_jct_s=pct(jct, 0.5),
            p95_jct_s=pct(jct, 0.95),
            avg_time_to_first_feedback_s=sum(ttff) / len(ttff) if ttff else 0.0,
            p95_time_to_first_feedback_s=pct(ttff, 0.95),
            makespan_s=span,
            avg_queue_len=self._int_queue / span,
            preemptions=self.counts["preemptions"],
            migrations=self.counts["migrations"],
            packs=self.counts["packs"],
            resizes=self.counts["resizes"],
            decisions_refused=self.counts["refused"],
            refusals=dict(sorted(self.refusals.items())),
            decide_calls=self.counts["decide"],
            events=self.counts["events"],
            sim_wall_s=wall,
            sim_cpu_s=cpu,
            jobs_rejected=self.rejected,
            stopped_early=sum(1 for j in done if j.stopped_early),
            unknown_models=list(self.unknown_models),
            series=series,
            per_job={
                j.id: {
                    "submit": j.t.submit_time,
                    "first_feedback": j.first_feedback,
                    "finished": j.finished,
                    "work_s": j.work,
                    "done_s": j.done,
                    "device_s": self.job_device_s.get(j.id, 0.0),
                    "stopped_early": float(j.stopped_early),
                }
                for j in self.jobs.values()
            },
        )


def simulate(policy: Policy, trace: Sequence[TraceJob], cluster: ClusterSpec, **kw) -> SimResult:
    """Run one simulation and return its figures."""
    return Simulator(policy, trace, cluster, **kw).run()


def load_window(submit_times: Sequence[float], fraction: float = LOAD_FRACTION) -> tuple[float, float] | None:
    """The window in which a trace's load arrives: from the arrival after which
    ``fraction`` of the jobs are still to come, to the last arrival (the shortest window
    ending at the last arrival that holds that many arrivals). A property of the trace,
    the same for every policy.

    Utilisation over the whole span of arrivals measures mostly where no policy can differ
    when the first jobs trickle in long before the bulk: the Alibaba trace is a snapshot
    whose first 1% of GPU pods arrive over the first 116 of its 149 days (22 of those 70
    run for 12 days or more), and 99% of them in the last 33. None when the window would
    be empty (fewer than two distinct arrival times in it)."""
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    times = sorted(submit_times)
    if not times:
        return None
    t0 = times[int((1.0 - fraction) * len(times))]
    return (t0, times[-1]) if times[-1] > t0 else None


def contended_window(trace: Sequence[TraceJob], gpus: int) -> tuple[float, float] | None:
    """The longest window ``[t0, last arrival]`` in which the device-seconds the trace's jobs
    submit (devices x duration) are at least the cluster's capacity ``gpus x (last - t0)``:
    the period where demand exceeds capacity, taken from the trace alone (so the same for
    every policy). None if there is none."""
    if not trace:
        return None
    js = sorted(trace, key=lambda j: j.submit_time)
    last = js[-1].submit_time
    acc = 0.0
    best = None
    for j in reversed(js):
        acc += j.duration_s * j.devices
        if acc >= gpus * (last - j.submit_time):
            best = j.submit_time
    if best is None or best >= last:
        return None
    return (best, last)


class _HolderIds(Mapping[str, list[str]]):
    """The simulator's device holders as job ids, computed on lookup (the decision check reads a
    few devices per decision; copying every device's holders each time would cost the run)."""

    __slots__ = ("_holders",)

    def __init__(self, holders: dict[str, list[_Job]]) -> None:
        self._holders = holders

    def __getitem__(self, device: str) -> list[str]:
        return [o.id for o in self._holders[device]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._holders)

    def __len__(self) -> int:
        return len(self._holders)
