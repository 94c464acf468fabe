"""Hyper-parameter search scenario (Gandiva's 'AutoML' experiment): many jobs of one model
with different settings, submitted together, searched with **ASHA** (asynchronous
successive halving, Li et al., MLSys'20) in the stopping form users run (Ray Tune's
``ASHAScheduler``), identical under every policy:

* rungs at ``r_min * eta**k`` of the full training ``R`` (``r_min`` = ``R / eta**s``; with
  the published setting ``eta=3``, ``r_min = R/27``: rungs at 1/27, 1/9 and 1/3 of R);
* when a configuration reaches a rung it reports its loss there; it is stopped unless that
  loss is within the best ``1/eta`` of the losses recorded at that rung so far (the first
  to arrive at a rung always continues, as in ASHA);
* a configuration that survives rung ``k`` gets priority ``k + 1`` (``promote_priority``):
  the searcher asks the scheduler to run the promising ones first, as a user of a shared
  cluster would, so that the best configuration is also *trained* early.

Losses: each configuration has a final loss drawn in [0.2, 1.0]; its loss at fraction ``f``
of training is ``final + gap * (1 - f) + noise``, noise Gaussian with deviation
``noise * (1 - f)`` (early measurements are less reliable; deterministic in ``seed``).

Figures: ``time_to_identify_s`` is when the best configuration is identified: every
configuration has been stopped or has passed the last rung, so the finalists are known
and the best of them (by its last-rung loss) is the search's answer;
``time_to_best_trained_s`` is when the true best configuration has finished training
(if ASHA cut it, when the last survivor finished); ``found_best`` says whether it survived.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from microco.services.scheduler.policy import Policy

from ._engine import ClusterSpec, SimResult, Simulator
from ._perf import CostModel, PerfModel
from ._trace import TraceJob


@dataclass(frozen=True)
class HPSearchResult:
    policy: str
    configs: int
    gpus: int
    eta: int
    rungs: tuple[float, ...]
    time_to_identify_s: float
    time_to_best_trained_s: float
    time_to_finish_s: float
    found_best: bool
    identified_best: bool
    stopped_early: int
    avg_time_to_first_feedback_s: float
    makespan_s: float
    sim: SimResult
    accounting: dict | None = None  # where the device-seconds up to identification went
    model: str = ""  # the model every configuration trains
    # issue 23, the paper's metric: when a configuration whose final loss reaches the target
    # (``target_loss``) has finished training (inf: none did)
    time_to_target_s: float = math.inf
    target_loss: float = 0.0

    def to_dict(self) -> dict:
        d = {
            "policy": self.policy,
            "model": self.model,
            "configs": self.configs,
            "gpus": self.gpus,
            "eta": self.eta,
            "rungs": [round(r, 5) for r in self.rungs],
            "time_to_identify_s": round(self.time_to_identify_s, 3),
            "time_to_best_trained_s": round(self.time_to_best_trained_s, 3),
            "time_to_finish_s": round(self.time_to_finish_s, 3),
            "found_best": self.found_best,
            "identified_best": self.identified_best,
            "stopped_early": self.stopped_early,
            "avg_time_to_first_feedback_s": round(self.avg_time_to_first_feedback_s, 3),
            "makespan_s": round(self.makespan_s, 3),
            "preemptions": self.sim.preemptions,
            "packs": self.sim.packs,
            "time_to_target_s": round(self.time_to_target_s, 3)
            if math.isfinite(self.time_to_target_s)
            else None,
            "target_loss": round(self.target_loss, 5),
        }
        if self.accounting is not None:
            d["accounting"] = self.accounting
        return d


def asha_rungs(eta: int = 3, min_fraction: float = 1.0 / 27.0) -> tuple[float, ...]:
    """Rung positions as fractions of full training: ``min_fraction * eta**k`` below 1."""
    if eta < 2:
        raise ValueError("eta must be >= 2")
    if not 0 < min_fraction < 1:
        raise ValueError("min_fraction must be in (0, 1)")
    s = round(math.log(1.0 / min_fraction, eta))
    if not math.isclose(min_fraction * eta**s, 1.0, rel_tol=1e-6):
        # not a power of eta: rungs min, min*eta, ... while below 1
        out, f = [], min_fraction
        while f < 1 - 1e-9:
            out.append(f)
            f *= eta
        return tuple(out)
    return tuple(min_fraction * eta**k for k in range(s))


# The model every configuration trains, by default: it keeps a V100 busy alone (Gavel's self
# pair), so the search's speed-up comes from time-slicing and ASHA's early stopping only.
HP_MODEL = "ResNet-50 (batch size 64)"

#: The target quality of the search's "time to target" (the Gandiva paper's metric): the
#: final loss the best ``TARGET_QUANTILE`` of the configurations reach (the best 5%: 4 of
#: 81). A property of the configurations drawn, the same under every policy and searcher.
TARGET_QUANTILE = 0.05


def hp_search_trace(
    n_configs: int = 32,
    *,
    model: str = HP_MODEL,
    duration_s: float = 3600.0,
    seed: int = 0,
) -> tuple[list[TraceJob], dict[str, float]]:
    """The jobs and their final losses (uniform in [0.2, 1.0]); deterministic in ``seed``."""
    rng = random.Random(seed)
    jobs, final = [], {}
    for i in range(n_configs):
        jid = f"hp-{i:03d}"
        final[jid] = rng.uniform(0.2, 1.0)
        jobs.append(TraceJob(job_id=jid, submit_time=0.0, devices=1, duration_s=duration_s, model=model))
    return jobs, final


def _quantile(xs: list[float], q: float) -> float:
    """``numpy.percentile(xs, 100 q)`` (linear interpolation) of sorted ``xs``."""
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class AshaSearcher:
    """ASHA in stopping form over a fixed set of configurations (a pure bookkeeper: the
    simulator calls :meth:`on_rung`; it says stop or continue and sets priorities)."""

    def __init__(
        self,
        final: dict[str, float],
        rungs: Sequence[float],
        eta: int,
        *,
        seed: int = 0,
        noise: float = 0.02,
        gap: float = 0.5,
        promote_priority: bool = True,
    ) -> None:
        self.final, self.rungs, self.eta = final, tuple(rungs), eta
        self.promote_priority = promote_priority
        rng = random.Random(seed + 1)
        # loss at each rung, drawn up front so it is the same whatever the policy
        self.loss = {
            jid: [f + gap * (1 - r) + rng.gauss(0.0, noise * (1 - r)) for r in self.rungs]
            for jid, f in sorted(final.items())
        }
        self.recorded: list[list[float]] = [[] for _ in self.rungs]
        self.rung_of = {jid: 0 for jid in final}  # rungs reached so far
        self.stopped: set[str] = set()
        self.decided_at: dict[str, float] = {}  # stopped, or passed the last rung
        self.set_priority: Callable[[str, int], None] | None = None  # bound to the simulator's once it exists
        # called once (now) when every configuration is decided
        self.on_identified: Callable[[float], None] | None = None

    def on_rung(self, job_id: str, now: float) -> bool:
        k = self.rung_of[job_id]
        self.rung_of[job_id] = k + 1
        x = self.loss[job_id][k]
        rec = self.recorded[k]
        stop = False
        if rec:
            # continue only within the best 1/eta of what this rung has recorded so far:
            # Ray Tune's ASHA cut-off (the 1/eta quantile, linear interpolation), taken
            # before this result is added
            stop = x > _quantile(sorted(rec), 1.0 / self.eta)
        rec.append(x)
        if stop:
            self.stopped.add(job_id)
            self.decided_at[job_id] = now
            self._maybe_identified(now)
            return True
        if k + 1 == len(self.rungs):
            self.decided_at[job_id] = now
            # a finalist: ask the scheduler to train it first (earlier rungs keep the
            # default priority, else every early promotion would run to the end first and
            # the search would be depth-first whatever the policy)
            if self.promote_priority and self.set_priority is not None:
                self.set_priority(job_id, 1)
            self._maybe_identified(now)
        return False

    def _maybe_identified(self, now: float) -> None:
        if len(self.decided_at) == len(self.final) and self.on_identified is not None:
            self.on_identified(now)
            self.on_identified = None


def run_hp_search(
    policy: Policy,
    *,
    gpus: int = 8,
    per_node: int = 8,
    n_configs: int = 81,
    eta: int = 3,
    min_fraction: float = 1.0 / 81.0,
    duration_s: float = 3600.0,
    seed: int = 0,
    noise: float = 0.02,
    promote_priority: bool = True,
    perf: PerfModel | None = None,
    costs: CostModel | None = None,
    tick_s: float = 30.0,
    model: str = HP_MODEL,
    target_quantile: float = TARGET_QUANTILE,
) -> HPSearchResult:
    """Run the ASHA search of ``n_configs`` configurations of ``model`` under ``policy``."""
    trace, final = hp_search_trace(n_configs, model=model, duration_s=duration_s, seed=seed)
    target = target_loss(final, target_quantile)
    rungs = asha_rungs(eta, min_fraction)
    search = AshaSearcher(final, rungs, eta, seed=seed, noise=noise, promote_priority=promote_priority)
    sim = Simulator(
        policy,
        trace,
        ClusterSpec.for_gpus(gpus, per_node),
        perf=perf,
        costs=costs,
        tick_s=tick_s,
        probe_fraction=rungs,
        on_probe=search.on_rung,
    )
    search.set_priority = sim.set_priority
    snap: dict = {}

    def identified(now: float) -> None:
        # the device-seconds up to this moment: held (allocation integral), and the work
        # (training seconds) every configuration has done by now
        snap["t"] = now
        snap["held_device_s"] = sim._int_alloc
        snap["done"] = {
            jid: j.done + (j.rate * (now - j.last_update) if j.rate > 0 else 0.0)
            for jid, j in sim.jobs.items()
        }
        snap["rung_of"] = dict(search.rung_of)

    search.on_identified = identified
    res = sim.run()
    best = min(final, key=final.__getitem__)
    pj = res.per_job[best]
    fin = pj["finished"]
    found = not pj["stopped_early"] and fin is not None
    t_end = max(f for v in res.per_job.values() if (f := v["finished"]) is not None)
    t_best = fin if found and fin is not None else t_end
    finalists = [j for j in final if j not in search.stopped]
    t_identify = max(search.decided_at.values()) if len(search.decided_at) == n_configs else float("inf")
    answer = min(finalists, key=lambda j: search.loss[j][-1]) if finalists else None
    return HPSearchResult(
        policy=res.policy,
        configs=n_configs,
        gpus=res.gpus,
        eta=eta,
        rungs=rungs,
        time_to_identify_s=t_identify,
        time_to_best_trained_s=t_best,
        time_to_finish_s=t_end,
        found_best=found,
        identified_best=answer == best,
        stopped_early=res.stopped_early,
        avg_time_to_first_feedback_s=res.avg_time_to_first_feedback_s,
        makespan_s=res.makespan_s,
        sim=res,
        accounting=_accounting(snap, rungs, eta, n_configs, duration_s, res.gpus) if snap else None,
        model=model,
        time_to_target_s=_time_to_target(res.per_job, final, target),
        target_loss=target,
    )


def target_loss(final: dict[str, float], quantile: float = TARGET_QUANTILE) -> float:
    """The final loss at ``quantile`` of the configurations' final losses (linear
    interpolation): a configuration at or below it reaches the target."""
    if not 0 < quantile <= 1:
        raise ValueError("target quantile must be in (0, 1]")
    return _quantile(sorted(final.values()), quantile)


def _time_to_target(per_job: dict, final: dict[str, float], target: float) -> float:
    """When the first configuration whose final loss reaches ``target`` finished training
    in full (not stopped early); inf if none did."""
    times = [
        v["finished"]
        for jid, v in per_job.items()
        if jid in final and final[jid] <= target and v["finished"] is not None and not v["stopped_early"]
    ]
    return min(times, default=math.inf)


@dataclass(frozen=True)
class PromotionSearchResult:
    """ASHA in its promotion form (the algorithm as Li et al. wrote it, for workers on a
    plain cluster): each configuration trains one segment (to its next rung) at a time."""

    policy: str
    configs: int
    gpus: int
    eta: int
    rungs: tuple[float, ...]
    time_to_target_s: float
    time_to_best_trained_s: float
    target_loss: float
    segments: int
    trained_in_full: int
    avg_time_to_first_feedback_s: float
    sim: SimResult

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "searcher": "asha-promotion",
            "configs": self.configs,
            "gpus": self.gpus,
            "eta": self.eta,
            "rungs": [round(r, 5) for r in self.rungs],
            "time_to_target_s": round(self.time_to_target_s, 3)
            if math.isfinite(self.time_to_target_s)
            else None,
            "time_to_best_trained_s": round(self.time_to_best_trained_s, 3)
            if math.isfinite(self.time_to_best_trained_s)
            else None,
            "target_loss": round(self.target_loss, 5),
            "segments": self.segments,
            "trained_in_full": self.trained_in_full,
            "avg_time_to_first_feedback_s": round(self.avg_time_to_first_feedback_s, 3),
        }


class AshaPromotion:
    """ASHA's promotion form over a fixed set of configurations: every configuration's
    first segment (to the first rung) is submitted at once; when a segment ends at rung
    ``k`` the configuration reports its loss there, and every configuration of rung ``k``
    that is within the best ``1/eta`` of the results rung ``k`` has (``floor(n_k / eta)``
    of them, best first) and not yet promoted gets its next segment submitted, at priority
    ``k + 1`` (a scheduler runs promotions before fresh configurations: ASHA's worker rule,
    "promote if possible, else start a new configuration"). A configuration past the last
    rung trains to the end. Losses as :class:`AshaSearcher` (same draw for the same seed)."""

    def __init__(self, final: dict[str, float], rungs: Sequence[float], eta: int, *, seed: int = 0,
                 noise: float = 0.02, gap: float = 0.5) -> None:  # fmt: skip
        base = AshaSearcher(final, rungs, eta, seed=seed, noise=noise, gap=gap)
        self.loss, self.rungs, self.eta = base.loss, tuple(rungs), eta
        self.results: list[list[tuple[float, str]]] = [[] for _ in self.rungs]
        self.promoted: list[set[str]] = [set() for _ in self.rungs]
        self.trained: dict[str, float] = {}  # configuration -> when it finished in full
        self.submit = None  # bound to the simulator's

    @staticmethod
    def segment_id(config: str, k: int) -> str:
        return f"{config}@{k}"

    def on_segment_end(self, job_id: str, now: float) -> list[tuple[str, int]]:
        """A segment ended: the (configuration, next segment) pairs to submit."""
        config, seg = job_id.rsplit("@", 1)
        k = int(seg)
        if k == len(self.rungs):  # the last segment: trained in full
            self.trained[config] = now
            return []
        self.results[k].append((self.loss[config][k], config))
        ranked = sorted(self.results[k])
        quota = len(ranked) // self.eta
        out = []
        for _loss, c in ranked[:quota]:
            if c not in self.promoted[k]:
                self.promoted[k].add(c)
                out.append((c, k + 1))
        return out


def run_asha_promotion(
    policy: Policy,
    *,
    gpus: int = 8,
    per_node: int = 8,
    n_configs: int = 81,
    eta: int = 3,
    min_fraction: float = 1.0 / 81.0,
    duration_s: float = 3600.0,
    seed: int = 0,
    noise: float = 0.02,
    perf: PerfModel | None = None,
    costs: CostModel | None = None,
    tick_s: float = 30.0,
    model: str = HP_MODEL,
    target_quantile: float = TARGET_QUANTILE,
) -> PromotionSearchResult:
    """The same search as :func:`run_hp_search` (same configurations, losses, rungs and
    target) with ASHA's promotion form (:class:`AshaPromotion`): the stronger searcher for
    a plain cluster, where a configuration holds a device only for one segment at a time."""
    _, final = hp_search_trace(n_configs, model=model, duration_s=duration_s, seed=seed)
    target = target_loss(final, target_quantile)
    rungs = asha_rungs(eta, min_fraction)
    bounds = (0.0, *rungs, 1.0)
    search = AshaPromotion(final, rungs, eta, seed=seed, noise=noise)

    def segment(config: str, k: int, at: float, priority: int) -> TraceJob:
        return TraceJob(
            job_id=AshaPromotion.segment_id(config, k),
            submit_time=at,
            devices=1,
            duration_s=(bounds[k + 1] - bounds[k]) * duration_s,
            model=model,
            priority=priority,
        )

    first = [segment(c, 0, 0.0, 0) for c in sorted(final)]
    sim = Simulator(
        policy, first, ClusterSpec.for_gpus(gpus, per_node), perf=perf, costs=costs, tick_s=tick_s
    )

    def ended(job_id: str, now: float) -> None:
        for c, k in search.on_segment_end(job_id, now):
            sim.submit(segment(c, k, now, k))

    sim.on_finish = ended
    res = sim.run()
    best = min(final, key=final.__getitem__)
    reached = [t for c, t in search.trained.items() if final[c] <= target]
    # first feedback of a configuration: its first segment's
    ttff = [
        ff - sub
        for jid, v in res.per_job.items()
        if jid.endswith("@0") and (ff := v["first_feedback"]) is not None and (sub := v["submit"]) is not None
    ]
    return PromotionSearchResult(
        policy=res.policy,
        configs=n_configs,
        gpus=res.gpus,
        eta=eta,
        rungs=rungs,
        time_to_target_s=min(reached, default=math.inf),
        time_to_best_trained_s=search.trained.get(best, math.inf),
        target_loss=target,
        segments=len(res.per_job),
        trained_in_full=len(search.trained),
        avg_time_to_first_feedback_s=sum(ttff) / len(ttff) if ttff else 0.0,
        sim=res,
    )


def _accounting(snap: dict, rungs: Sequence[float], eta: int, n: int, duration_s: float, gpus: int) -> dict:
    """Where the device-seconds up to the moment of identification went, against what a
    synchronous successive-halving search (the least work ASHA's rungs can need) would
    take. ``work_*`` are training seconds on the reference device (one device-second each
    for the one-device jobs of this scenario when alone)."""
    t = snap["t"]
    cap = gpus * t
    held = snap["held_device_s"]
    done = snap["done"]
    R = duration_s
    # synchronous SH: n, n/eta, n/eta^2, ... configurations train each rung's segment
    counts = [n]
    for _ in rungs[1:]:
        counts.append(max(1, counts[-1] // eta))
    seg = [(rungs[i] - (rungs[i - 1] if i else 0.0)) * R for i in range(len(rungs))]
    sync_work = sum(c * s for c, s in zip(counts, seg, strict=True))
    # fluid time of that synchronous search on `gpus` devices with free switching: a rung's
    # segment needs its work spread over min(configs, devices) devices (a configuration
    # trains on one device at a time, so a rung with fewer configurations than devices
    # leaves devices idle)
    sync_time = sum(c * s / min(c, gpus) for c, s in zip(counts, seg, strict=True))
    reached = [0] * len(rungs)
    up_to_rungs = beyond_last = 0.0
    for jid, w in done.items():
        k = snap["rung_of"][jid]
        for i in range(k):
            reached[i] += 1
        last = rungs[k - 1] * R if k else 0.0
        up_to_rungs += min(w, last) if k else w
        beyond_last += max(0.0, w - last) if k == len(rungs) else 0.0
        if 0 < k < len(rungs):
            up_to_rungs += max(0.0, w - last)  # decided jobs stop at a rung: 0 here
    work = sum(done.values())
    return {
        "time_to_identify_s": round(t, 1),
        "device_s": round(cap, 1),
        "idle_device_s": round(cap - held, 1),
        "held_without_progress_device_s": round(held - work, 1),
        "work_s": round(work, 1),
        "work_sync_minimum_s": round(sync_work, 1),
        "work_extra_promotions_s": round(up_to_rungs - sync_work, 1),
        "work_past_last_rung_s": round(beyond_last, 1),
        "configs_reached_rung": reached,
        "configs_reached_rung_sync": counts,
        "bound_work_s": round(sync_work / gpus, 1),
        "bound_sync_rungs_s": round(sync_time, 1),
    }
