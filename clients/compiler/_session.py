"""Client-side trial bookkeeping, framework-neutral: which configuration is in force, when a
trial's mini-batches are done, and what to do when the explorer cannot be reached."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from statistics import median as _median
from typing import Any, Protocol

from microco.clients.compiler.explore.types import (
    HOLD_TRIAL,
    LOAD_DEPENDENT,
    Config,
    GraphSpec,
    TrialReport,
    excess_ms,
)

log = logging.getLogger(__name__)


class Explorer(Protocol):
    """Where configurations come from: the compiler service (``RemoteExplorer``) or the same
    exploration core in-process (``microco.clients.compiler.explore.LocalExplorer``)."""

    def register(self, spec: GraphSpec) -> Config: ...

    def report(self, key: str, report: TrialReport) -> Config: ...


class Warmer(Protocol):
    """Compiles a configuration off the critical path (``_background.BackgroundCompiler``)."""

    def ready(self, values: dict[str, str]) -> bool: ...

    def start(self, values: dict[str, str]) -> None: ...

    def busy(self) -> bool: ...

    def cancel(self) -> None: ...


def compiled_choices(spec: GraphSpec, values: dict[str, str]) -> list[str]:
    """The compiled (non-baseline) choices of a configuration."""
    return [
        f"{v.name}={values[v.name]}"
        for v in spec.variables
        if v.compiles and values.get(v.name, v.choices[0]) != v.choices[0]
    ]


def runnable_threads() -> int:
    """Threads runnable on this machine right now, this one included (Linux' ``/proc/loadavg``,
    its fourth field; 0 where it cannot be read). An instant count, not the lagging load average:
    what competes with a training step for the CPU while it runs."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0


# cgroup v2's CPU limit for this process's container: "QUOTA PERIOD", or "max PERIOD" for none.
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cpus() -> int:
    """The CPUs this process may run on: the machine's, less those its affinity mask leaves out
    (a job the node agent pinned to its cores, ``services/agent``) and beyond its cgroup's CPU
    quota (a container's CPU limit), at least one.

    Held out, issue 18, session 43: the machine's count (``os.cpu_count``) was taken for this
    process's. A training job pinned to 2 of a 16-core host's cores found 14 idle, so its
    background compiles were on (``AstraTorch(background=None)``) and ran 13 compile threads
    on the job's own 2 cores, beside its training steps."""
    cpus = os.cpu_count() or 1
    with contextlib.suppress(AttributeError, OSError):  # (no affinity masks on macOS)
        cpus = min(cpus, len(os.sched_getaffinity(0)))
    with contextlib.suppress(OSError, ValueError):
        with open(CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    return max(1, cpus)


def idle_cores() -> float:
    """Cores with nothing to run beside this process's running thread: the cores this process may
    use (``usable_cpus``) less the larger of the 1-minute load average and the threads runnable
    now (both count this process's running thread). Negative on an oversubscribed machine."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return float(usable_cpus()) - max(load, float(runnable_threads()))


def baseline(spec: GraphSpec) -> Config:
    """Every variable at its first choice: what plain eager execution does."""
    return Config(
        spec.key, {v.name: v.choices[0] for v in spec.variables}, trial=-1, committed=False, steps=0
    )


class ExplorationSession:
    """Runs trials as the explorer hands them out; never blocks training on the explorer.

    When a call to the explorer fails the session keeps the configuration in force, marks the
    explorer lost, and tries to register again every ``retry_every`` steps (the service, with
    its state in etcd, then resumes where the exploration was).
    """

    # A trial whose steps run this many times slower than the best trial measured so far is cut
    # short after two steps (its warm-up and one measurement), or after one when it compiles
    # nothing: e.g. a thread count that oversubscribes a loaded machine was measured at 50-400x
    # the best step (0.5 to 4.7 s a step).
    abort_factor = 4.0
    # What exploration may cost the run, as a share of the run's time at the baseline's speed
    # (the core's ``ExplorationPolicy.max_explore_cost``, same default): a trial is cut short
    # once its measured steps' excess over the baseline's typical step would take the run's
    # exploration past it (the excess of a compile's warm-up step is not cut: the compile is
    # paid once it ran, and the core priced it against what it can save). 0: off.
    cost_share = 0.03

    def __init__(
        self, explorer: Explorer | None, retry_every: int = 50, warmer: Warmer | None = None
    ) -> None:
        self.explorer = explorer
        # Compiles a trial's configuration in the background before the trial runs: the trial is
        # reported pending (the explorer defers it and answers a hold: the best configuration)
        # and runs once its compile is done, as a warm load. None: compiles happen in line.
        self.warmer = warmer
        self.wait_steps = 0  # steps run under a hold while trials waited for background compiles
        # The configurations handed to the warmer and not run yet: a hold ends as soon as one of
        # them is ready, not when the warmer's whole queue is done (Llama, 2026-12-03: the
        # rewrite's compile done at 38 s waited 30 s more for a second compile of the plain
        # step, which was then priced out without running).
        self._deferred: list[dict[str, str]] = []
        self.retry_every = retry_every
        self.best_ms = math.inf  # fastest measured step of any finished trial this session ran
        self.best_cpu_ms = math.inf  # ... in thread CPU time (where its trial carried it)
        self.spec: GraphSpec | None = None
        self.current: Config | None = None
        self.lost = False
        self.explore_steps = 0
        self.steps = 0
        self.trials_run = 0
        self._times: list[float] = []
        self._regions: list[dict[str, float]] = []
        # Runnable threads on the machine at the end of each trial step: a trial measured
        # beside more runnable work than the best's ran beside other processes (the explorer
        # re-times it rather than trust its slowdown).
        self._runnable: list[int] = []
        self._cpu: list[float] = []  # each step's thread CPU time (ms; NaN: not measured)
        self._failed = ""
        self._since_lost = 0
        # A run that starts from a committed configuration with compiled choices reports its
        # first two steps once (trial -1): what the recompile cost this time (a warm cache is
        # far cheaper than the first compile), so the explorer prices compiles by real costs.
        self._warm_report = False
        # The baseline's typical step (median of its measured steps) and what the trials run
        # since cost beyond it: the run's exploration cost, as the core counts it (by thread CPU
        # time where the steps carry it: ``types.excess_ms``).
        # The baseline's reading is its latest trial as long as its first (the first, then the
        # core's re-readings after other trials, ``REBASE``: the first steps of a run read slow
        # for reasons of their own; an interleaved block is shorter and does not count); the
        # trials' cost so far is then counted again against that later reading.
        self.base_ms: float | None = None
        self.base_cpu_ms: float | None = None
        self.excess_ms = 0.0
        self._base_steps = 0  # steps of the baseline's first trial (0: not read yet)
        self._excess_trials: list[tuple[list[float], list[float]]] = []

    @property
    def values(self) -> dict[str, str]:
        return dict(self.current.values) if self.current else {}

    @property
    def committed(self) -> bool:
        return bool(self.current and self.current.committed)

    @property
    def settled(self) -> bool:
        """Committed, with nothing left to tell the explorer: no run-start report of the commit
        pending (``_warm_report``) and the explorer not lost (a lost one is registered again).
        From here on the explorer hands this process nothing else, and ``record`` does nothing
        but count the step."""
        return self.committed and not self.lost and not self._warm_report

    def register(self, spec: GraphSpec) -> Config:
        self.spec = spec
        cfg = self._accept(self._call_register())
        self.current = cfg if cfg is not None else baseline(spec)
        self._reset_trial()
        # Also where a committed choice depends on the machine's load (a thread count): the
        # report carries the load found now, and the explorer re-validates the choice when it
        # differs from the load it was committed at (``_core.load_changed``).
        load_dependent = any(v.name in LOAD_DEPENDENT and len(v.choices) > 1 for v in spec.variables)
        self._warm_report = (
            cfg is not None and cfg.committed and (bool(compiled_choices(spec, cfg.values)) or load_dependent)
        )
        return self.current

    def _call_register(self) -> Config | None:
        if self.explorer is None or self.spec is None:
            return None
        try:
            cfg = self.explorer.register(self.spec)
        except Exception as exc:  # noqa: BLE001 - whatever the failure, training must go on
            self._lose(exc)
            return None
        self.lost = False
        return cfg

    def _accept(self, cfg: Config | None) -> Config | None:
        """A configuration from the explorer, before it runs: a trial whose compile is not done
        is handed to the background compiler and reported pending (the explorer defers it and
        answers what to run instead: another trial, or a hold on the best configuration)."""
        for _ in range(64):  # each deferral moves the explorer on; this only bounds a bad peer
            if cfg is None or self.warmer is None or self.explorer is None:
                return cfg
            if cfg.committed:
                self.warmer.cancel()  # nothing left to compile for
                self._deferred = []
                return cfg
            if cfg.hold or cfg.trial < 0 or self.warmer.ready(cfg.values):
                return cfg
            self.warmer.start(cfg.values)
            if cfg.values not in self._deferred:
                self._deferred.append(dict(cfg.values))
            try:
                cfg = self.explorer.report(cfg.key, TrialReport(cfg.trial, [], pending=True))
            except Exception as exc:  # noqa: BLE001 - training goes on under the trial's configuration
                self._lose(exc)
                return cfg
        return cfg

    def _record_hold(self, cur: Config, step_ms: float) -> Config | None:
        """A step under a hold: counted as waiting, reported every ``cur.steps`` steps or as soon
        as one of the deferred trials' compiles is done (the explorer then hands the deferred
        trials out again: the ready one runs, the others wait again)."""
        self.wait_steps += 1
        if not math.isnan(step_ms):
            self._times.append(step_ms)
        busy = self.warmer.busy() if self.warmer is not None else False
        if self.warmer is not None:
            ready = [v for v in self._deferred if self.warmer.ready(v)]
            self._deferred = [v for v in self._deferred if v not in ready]
            busy = busy and not ready
        if busy and len(self._times) < cur.steps:
            return None
        rep = TrialReport(trial=HOLD_TRIAL, step_ms=list(self._times), pending=busy)
        self._reset_trial()
        return self._send(cur.key, rep)

    def _send(self, key: str, report: TrialReport) -> Config | None:
        """Report to the explorer and take the configuration it hands back; a failing explorer
        is lost (training goes on under the configuration in force)."""
        assert self.explorer is not None
        try:
            nxt = self._accept(self.explorer.report(key, report))
        except Exception as exc:  # noqa: BLE001 - whatever the failure, training must go on
            self._lose(exc)
            return None
        if nxt is None:
            return None
        self.current = nxt
        return nxt

    def _lose(self, exc: Exception) -> None:
        if not self.lost:
            log.warning(
                "compiler explorer unreachable (%s); training continues with the current configuration", exc
            )
        self.lost = True
        self._since_lost = 0

    def _report_warm(self, cur: Config, step_ms: float, failed: str) -> Config | None:
        if failed or math.isnan(step_ms):
            self._warm_report = False
            self._reset_trial()
            return None
        self._times.append(step_ms)
        self._runnable.append(runnable_threads())
        if len(self._times) < 2:
            return None
        self._warm_report = False
        rep = TrialReport(trial=-1, step_ms=list(self._times), runnable=self._mean_runnable())
        self._reset_trial()
        assert self.explorer is not None
        try:
            nxt = self.explorer.report(cur.key, rep)
        except Exception as exc:  # noqa: BLE001 - training goes on with the committed configuration
            self._lose(exc)
            return None
        if nxt.committed and nxt.values == cur.values:
            return None
        self.current = nxt  # a candidate that now pays back: one trial, then commit the best
        return nxt

    def _reset_trial(self) -> None:
        self._times, self._regions, self._failed = [], [], ""
        self._runnable = []
        self._cpu = []

    def _mean_runnable(self) -> float:
        """Mean runnable threads over the trial's measured steps (0: unknown)."""
        measured = self._runnable[1:] or self._runnable
        if not measured or min(measured) <= 0:
            return 0.0
        return sum(measured) / len(measured)

    def record(
        self,
        step_ms: float,
        region_ms: dict[str, float],
        failed: str = "",
        may_compile: bool = True,
        cpu_ms: float = math.nan,
    ) -> Config | None:
        """Account one finished mini-batch; returns a new configuration when it changes.

        ``may_compile=False`` says the configuration compiles nothing, so its first step is a
        measurement like the others (not a warm-up) and a hopeless trial can stop after it.
        ``cpu_ms``: the step's CPU time on the one thread that ran it (NaN: not measured, e.g.
        more than one intra-op thread); reported when every step of the trial has it.
        """
        self.steps += 1
        cur = self.current
        if cur is None:
            return None
        if self.lost:
            self._since_lost += 1
            if self._since_lost < self.retry_every:
                return None
            cfg = self._accept(self._call_register())
            if cfg is None:
                self._since_lost = 0
                return None
            self.current = cfg
            self._reset_trial()
            return cfg
        if cur.committed and self._warm_report:
            return self._report_warm(cur, step_ms, failed)
        if cur.hold:
            return self._record_hold(cur, step_ms)
        if cur.committed or cur.steps <= 0:
            return None
        self.explore_steps += 1
        self._times.append(step_ms)
        self._cpu.append(cpu_ms)
        self._regions.append(region_ms)
        self._runnable.append(runnable_threads())
        if failed:
            self._failed = failed
        judged = len(self._times) >= (1 if not may_compile else 2)
        # (not for a stall: where every step carries its thread CPU time, that must say so too)
        cpu_known = all(math.isfinite(c) for c in self._cpu) and math.isfinite(self.best_cpu_ms)
        hopeless = (
            judged
            and min(self._times) > self.abort_factor * self.best_ms
            and (not cpu_known or min(self._cpu) > self.abort_factor * self.best_cpu_ms)
        )
        if len(self._times) < cur.steps and not (
            failed or math.isnan(step_ms) or hopeless or self._over_cost(cur, may_compile)
        ):
            return None
        measured = self._regions[1:] or self._regions
        regions: dict[str, float] = {}
        for r in measured:
            for k, v in r.items():
                regions[k] = regions.get(k, 0.0) + v / len(measured)
        bad = bool(self._failed) or any(math.isnan(t) for t in self._times)
        report = TrialReport(
            trial=cur.trial,
            step_ms=[t for t in self._times if not math.isnan(t)],
            region_ms=regions,
            failed=bad,
            error=self._failed or ("step raised" if bad else ""),
            runnable=self._mean_runnable(),
            step_cpu_ms=list(self._cpu) if not bad and all(math.isfinite(c) for c in self._cpu) else [],
        )
        if not bad and len(report.step_ms) > 1:
            self.best_ms = min(self.best_ms, min(report.step_ms[1:]))
            if len(report.step_cpu_ms) > 1:
                self.best_cpu_ms = min(self.best_cpu_ms, min(report.step_cpu_ms[1:]))
        self._account_cost(cur, report)
        self._reset_trial()
        self.trials_run += 1
        return self._send(cur.key, report)

    # -- what exploration costs the run (issue 18)
    def _is_baseline(self, values: dict[str, str]) -> bool:
        spec = self.spec
        return spec is not None and values == {v.name: v.choices[0] for v in spec.variables}

    def cost_budget_ms(self) -> float:
        """What this run's exploration may cost beyond the baseline (inf until it is measured)."""
        if self.base_ms is None or self.spec is None or self.cost_share <= 0:
            return math.inf
        return self.cost_share * max(1, self.spec.total_steps) * self.base_ms

    def _over_cost(self, cur: Config, may_compile: bool) -> bool:
        """Would this trial's measured steps so far take the run's exploration past its budget?"""
        if self.base_ms is None or self._is_baseline(cur.values):
            return False
        compiles = may_compile or (self.spec is not None and bool(compiled_choices(self.spec, cur.values)))
        skip = 1 if compiles else 0
        measured = self._times[skip:]
        if not measured or any(math.isnan(t) for t in measured):
            return False
        cpu = self._cpu[skip:] if all(math.isfinite(c) for c in self._cpu) else []
        trial = excess_ms(measured, cpu, self.base_ms, self.base_cpu_ms)
        return trial > 0 and self.excess_ms + trial > self.cost_budget_ms()

    def _account_cost(self, cur: Config, report: TrialReport) -> None:
        steps = report.step_ms
        if report.failed or not steps:
            return
        if self._is_baseline(cur.values):
            first = self.base_ms is None
            if first or (self._base_steps > 1 and len(steps) >= self._base_steps):
                if first:
                    self._base_steps = len(steps)
                self.base_ms = _median(steps[1:] if len(steps) > 1 else steps)
                cpu = report.step_cpu_ms
                self.base_cpu_ms = _median(cpu[1:] if len(cpu) > 1 else cpu) if cpu else None
                self.excess_ms = sum(
                    excess_ms(ms, cpu_ms, self.base_ms, self.base_cpu_ms)
                    for ms, cpu_ms in self._excess_trials
                )
            return
        if self.base_ms is not None:
            # a compile's warm-up is priced by what it can save (the core)
            skip = 1 if self.spec is not None and compiled_choices(self.spec, cur.values) else 0
            self._excess_trials.append((list(steps[skip:]), list(report.step_cpu_ms[skip:])))
            self.excess_ms += excess_ms(
                steps[skip:], report.step_cpu_ms[skip:], self.base_ms, self.base_cpu_ms
            )


class SessionBacked:
    """What every Astra wrapper (PyTorch module, ``torch.compile`` backend, TF step) reports
    about its exploration; the wrapper holds its ``ExplorationSession`` as ``self.session``."""

    session: ExplorationSession

    def _explored_state(self) -> Any:
        """This graph's exploration state (``explore._core.Exploration``), where the explorer runs
        in this process (``LocalExplorer.core``); None where it does not show it (a remote one)
        or keeps none."""
        core, spec = getattr(self.session.explorer, "core", None), self.session.spec
        if core is None or spec is None:
            return None
        try:
            return core.get(spec.key)
        except Exception:  # noqa: BLE001 - no state kept
            return None

    @property
    def config(self) -> dict[str, str]:
        """The configuration in force."""
        return dict(self.session.values)

    @property
    def committed(self) -> bool:
        return self.session.committed

    @property
    def explore_steps(self) -> int:
        return self.session.explore_steps


def failure(exc: BaseException) -> str:
    """A compiled variant's failure in one line, either framework's: its type and the message's
    first line (with the next where the first only introduces it: dynamo's "backend=...
    raised:"), at most 300 characters (a dispatcher error lists every backend: 10 kB, in the log
    and the state)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else "".join(lines[:1])
    return f"{type(exc).__name__}: {first}"[:300]
