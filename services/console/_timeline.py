"""Pure functions that turn observed samples into what the plots draw.

``job_timeline`` makes the per-job device timeline: contiguous periods in one state on one set of
devices, with a period marked ``migrated`` when the job resumed on other devices or another node
than before. ``hit_rate_series`` turns cumulative hit/miss counters into hit rate per interval.
"""

from __future__ import annotations

from typing import Any

TERMINAL = frozenset({"finished", "failed", "cancelled"})
ON_DEVICE = frozenset({"running", "packed"})


def job_timeline(events: list[dict[str, Any]], now: float, finished_at: float = 0.0) -> list[dict[str, Any]]:
    """Periods ``{state, start, end, node, devices, migrated}`` from state samples
    ``{at, state, node, devices}`` (in any order; repeated samples of one state merge).

    Samples may come without a placement (the scheduler's own state history records only the
    state); such a sample continues the current period of the same state, and a later sample of
    that state with devices fills the placement in. A terminal state ends the timeline at its
    time; otherwise the last period runs to ``now``."""
    ordered = sorted((e for e in events if e.get("state")), key=lambda e: float(e.get("at", 0.0)))
    periods: list[dict[str, Any]] = []
    last_placement: list[tuple[str, tuple[str, ...]]] = []

    def place(period: dict[str, Any], node: str, devices: tuple[str, ...]) -> None:
        period["node"], period["devices"] = node, list(devices)
        if period["state"] in ON_DEVICE and devices:
            placement = (node, devices)
            period["migrated"] = bool(last_placement) and placement != last_placement[-1]
            last_placement[:] = [placement]

    for event in ordered:
        at = float(event.get("at", 0.0))
        state = str(event["state"])
        node = str(event.get("node") or "")
        devices = tuple(str(d) for d in event.get("devices") or ())
        if periods:
            cur = periods[-1]
            if cur["state"] == state:
                if not devices or (cur["node"], tuple(cur["devices"])) == (node, devices):
                    continue  # the same period, sampled again
                if not cur["devices"]:
                    place(cur, node, devices)  # the same period, its placement now known
                    continue
            if cur["state"] in TERMINAL:
                break
            cur["end"] = at
        period = {"state": state, "start": at, "end": None, "node": "", "devices": [], "migrated": False}
        place(period, node, devices)
        periods.append(period)
    if periods and periods[-1]["end"] is None:
        last = periods[-1]
        if last["state"] in TERMINAL:
            last["end"] = last["start"]
        else:
            last["end"] = max(last["start"], finished_at or now)
    return periods


def state_seconds(periods: list[dict[str, Any]]) -> dict[str, float]:
    """Total seconds spent in each state."""
    out: dict[str, float] = {}
    for p in periods:
        out[p["state"]] = out.get(p["state"], 0.0) + max(0.0, float(p["end"]) - float(p["start"]))
    return out


def hit_rate_series(samples: list[dict[str, Any]]) -> list[dict[str, float]]:
    """``[{at, hits, misses}]`` cumulative counters -> ``[{at, hit_rate, lookups}]`` per interval.

    A counter that goes down (the server restarted) starts a new baseline instead of a negative rate;
    intervals without lookups are left out rather than plotted as zero."""
    out = []
    prev: dict[str, Any] | None = None
    for s in sorted(samples, key=lambda s: float(s.get("at", 0.0))):
        if prev is not None:
            dh = int(s.get("hits", 0)) - int(prev.get("hits", 0))
            dm = int(s.get("misses", 0)) - int(prev.get("misses", 0))
            if dh >= 0 and dm >= 0 and dh + dm > 0:
                out.append({"at": float(s["at"]), "hit_rate": dh / (dh + dm), "lookups": float(dh + dm)})
        prev = s
    return out
