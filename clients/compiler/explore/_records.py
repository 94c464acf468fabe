"""What an exploration tried and why it decided as it did, as plain JSON-ready records.

``trial_records(state)`` reads an :class:`~._core.Exploration` (what ``microco compiler show KEY``
prints) and gives, per candidate configuration, the trials that ran it (steps spent, fastest and
median step, compile seconds, runnable threads), the interleaved A/B measurements that judged it
(ratio, sign test wins/pairs and p, the measure used) and one verdict with its reason:

* ``baseline``: the configuration every other is measured against (plain eager);
* ``committed``: in force at the end (for a configuration other than the baseline: shown faster
  interleaved, with the confidence of that test);
* ``not significant``: measured interleaved against the baseline (or the best), and the sign
  test did not show it faster at the policy's significance;
* ``rejected: slower``: its trial's fastest step did not beat the best's by ``min_gain``;
* ``lost re-timing``: beaten in an interleaved re-timing;
* ``abandoned at deadline``, ``refused``, ``failed``: its trial did not finish as a measurement;
* ``pending``: planned or running when the state was read.

Candidates that never ran are listed apart (``pruned``), each with the reason the core logged:
``priced out`` (its compile cannot repay), ``budget spent``, ``cannot beat the best``,
``dropped while compiling``, ``too few steps``.
"""

from __future__ import annotations

import math
from typing import Any

from ._core import INTERLEAVED, Exploration, ExplorationPolicy, TrialRecord, _median, _values_id


def _r(x: float, nd: int = 3) -> float | None:
    return round(x, nd) if math.isfinite(x) else None


def _measured(t: TrialRecord) -> list[float]:
    return t.steps[1:] if len(t.steps) > 1 else list(t.steps)


def _failure(t: TrialRecord) -> str:
    err = t.error or "failed"
    low = err.lower()
    if "deadline" in low:
        return "abandoned at deadline"
    if "idle cores" in low:
        return "refused"
    return "failed"


def pruned_verdict(reason: str) -> str:
    """The kind of a ``state.pruned`` entry (the core's own wording, read back)."""
    if "cannot repay" in reason:
        return "priced out"
    if "budget is spent" in reason:
        return "budget spent"
    if "cannot beat the best" in reason:
        return "cannot beat the best"
    if "dropped while compiling" in reason:
        return "dropped while compiling"
    if "too few steps" in reason:
        return "too few steps"
    return "pruned"


def trial_records(state: Exploration, policy: ExplorationPolicy | None = None) -> dict[str, Any]:
    """Every candidate the exploration ran, with its trials, its interleaved measurements and its
    verdict; the candidates it priced out or dropped; the committed configuration."""
    policy = policy or ExplorationPolicy()
    base = {v.name: v.choices[0] for v in state.spec.variables}
    base_vid = _values_id(base)
    best_vid = _values_id(state.best_values) if state.best is not None else base_vid
    changed = {}
    by_vid: dict[str, list[TrialRecord]] = {}
    for t in state.trials:
        vid = _values_id(t.values)
        by_vid.setdefault(vid, []).append(t)
        changed[vid] = {k: v for k, v in t.values.items() if base.get(k) != v}

    # Interleaved measurements, per configuration involved.
    inter: dict[str, list[dict[str, Any]]] = {}
    for r in state.confirm_log:
        rec = {
            "kind": "confirm",
            "against": "baseline",
            "ratio": _r(float(r["ratio"])),  # baseline median / this one's, by ``measure``: > 1 is faster
            "wall_ratio": _r(float(r.get("wall_ratio", r["ratio"]))),
            # the sign test on wall times (wins, pairs, p), kept where CPU time judged
            "wall_sign": r.get("wall_sign"),
            "ms": _r(float(r["best_ms"])),
            "other_ms": _r(float(r["baseline_ms"])),
            "wins": r["wins"],
            "pairs": r["pairs"],
            "p": _r(float(r["p"]), 4),
            "significant": bool(r["confirmed"]),
            "alpha": r.get("alpha", policy.confirm_alpha),
            "measure": r.get("measure", "wall"),
        }
        inter.setdefault(r["values"], []).append(rec)
    lost_retime: dict[str, dict[str, Any]] = {}
    for r in state.retime_log:
        a, b = state.trials[r["best"]], state.trials[r["runner_up"]]
        cpu = r.get("best_cpu_ms") is not None
        for me, other, my_ms, other_ms, mine, theirs in (
            (b, a, r["runner_up_ms"], r["best_ms"], "runner_up", "best"),
            (a, b, r["best_ms"], r["runner_up_ms"], "best", "runner_up"),
        ):
            # the ratio by the measure that judged (thread CPU medians where it did)
            num, den = (r[f"{theirs}_cpu_ms"], r[f"{mine}_cpu_ms"]) if cpu else (other_ms, my_ms)
            rec = {
                "kind": "retime",
                "against": changed.get(_values_id(other.values)) or "baseline",
                "ratio": _r(num / den) if den and math.isfinite(num) else None,
                "wall_ratio": _r(other_ms / my_ms) if my_ms and math.isfinite(other_ms) else None,
                "ms": _r(my_ms),
                "other_ms": _r(other_ms),
                "wins": r["wins"] if me is b else r["pairs"] - r["wins"],
                "pairs": r["pairs"],
                # the test that the challenger is faster (for both sides: it is the pair's test)
                "p": _r(float(r["p"]), 4),
                "challenger": me is b,
                "significant": r["winner"] == me.trial and me is b,
                "measure": r.get("measure", "wall"),
            }
            vid = _values_id(me.values)
            inter.setdefault(vid, []).append(rec)
            if r["winner"] != me.trial:
                lost_retime[vid] = rec

    candidates = []
    best_min = math.inf
    for vid, trials in by_vid.items():
        runs = [t for t in trials if t.kind not in INTERLEAVED]
        blocks = [t for t in trials if t.kind in INTERLEAVED]
        done = [t for t in runs if t.done and not t.failed]
        failed = [t for t in runs if t.done and t.failed]
        steps = sum(len(t.steps) for t in trials)
        fastest = min((t.step_ms for t in done), default=math.inf)
        measured = [s for t in done for s in _measured(t)]
        compile_s = max((t.compile_ms for t in runs if t.done), default=0.0) / 1e3
        background_s = max((t.background_ms for t in runs), default=0.0) / 1e3
        runnable = [t.runnable for t in runs if t.runnable > 0]
        tests = inter.get(vid, [])
        if vid == best_vid and state.committed:
            verdict = "committed"
            conf = [x for x in tests if x["kind"] == "confirm" and x["significant"]]
            if vid == base_vid:
                reason = "nothing else was shown faster than the baseline"
            elif conf:
                c = conf[-1]
                reason = (
                    f"faster than the baseline interleaved: {c['ratio']}x ({c['measure']}), "
                    f"sign test {c['wins']}/{c['pairs']} pairs, p={c['p']}"
                )
            else:
                reason = "committed without an interleaved measurement against the baseline"
        elif vid == best_vid and not state.committed:
            verdict, reason = "best so far", "exploration not committed yet"
        elif vid == base_vid:
            verdict, reason = "baseline", "plain eager: what every candidate is measured against"
        elif not done and failed:
            verdict = _failure(failed[-1])
            reason = failed[-1].error or "the trial's step raised"
        elif not done:
            verdict, reason = "pending", "planned or running"
        elif any(x["kind"] == "confirm" and not x["significant"] for x in tests):
            c = [x for x in tests if x["kind"] == "confirm"][-1]
            verdict = "not significant"
            reason = (
                f"interleaved against the baseline: {c['ratio']}x ({c['measure']}), sign test "
                f"{c['wins']}/{c['pairs']} pairs, p={c['p']} > {c['alpha']}"
            )
        elif vid in lost_retime:
            c = lost_retime[vid]
            verdict = "lost re-timing"
            reason = f"interleaved against {c['against']}: {c['ms']} vs {c['other_ms']} ms ({c['measure']})"
        else:
            verdict = "rejected: slower"
            reason = (
                f"fastest step {fastest:.2f} ms, not {policy.min_gain:.0%} under the best's "
                f"{best_min:.2f} ms (trial minima)"
            )
        if done and math.isfinite(fastest):
            best_min = min(best_min, fastest)
        candidates.append(
            {
                "config": changed.get(vid) or "baseline",
                "kinds": sorted({t.kind for t in trials}),
                "trials": [t.trial for t in runs],
                "steps": steps,
                "interleaved_blocks": len(blocks),
                "step_ms": _r(fastest),
                "median_ms": _r(_median(measured)) if measured else None,
                "compile_s": _r(compile_s),
                "background_s": _r(background_s),
                "runnable": _r(sum(runnable) / len(runnable), 2) if runnable else None,
                "interleaved": tests,
                "verdict": verdict,
                "reason": reason[:300],
            }
        )
    return {
        "candidates": candidates,
        "pruned": [{"verdict": pruned_verdict(p), "reason": p[:300]} for p in state.pruned],
        "committed": changed.get(best_vid) or "baseline" if state.committed else None,
        "explore_steps": state.explore_steps,
        "wait_steps": state.wait_steps,
        "revalidations": list(state.revalidations),
    }
