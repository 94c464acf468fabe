"""What a console left on a wall screen needs (issue 17), as pure functions over what the views
already gather: one timeline lane per device (finished jobs dropped after a while), a per-device
utilisation heatmap, series cut to a time window and marked where samples are missing (so plots
break their lines there rather than join across), and the services that left the registry."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ._timeline import TERMINAL

# States in which a job holds its devices and computes: what "utilised" means on the heatmap.
BUSY = frozenset({"running", "packed", "migrating"})
GAP_FACTOR = 3.0  # a gap is more than this many sampling intervals without a sample
MAX_TRACKED = 1000  # services remembered for the "gone" banner


def in_window(points: Iterable[dict[str, Any]], start: float) -> list[dict[str, Any]]:
    """The points at or after ``start`` (by their ``at``)."""
    return [p for p in points if float(p.get("at", 0.0)) >= start]


def mark_gaps(points: list[dict[str, Any]], max_step_s: float) -> list[dict[str, Any]]:
    """The points in time order, each after a stretch of more than ``max_step_s`` without a sample
    marked ``gap: true``: a plot starts a new line there instead of drawing across the gap."""
    out = []
    prev: float | None = None
    for p in sorted(points, key=lambda p: float(p.get("at", 0.0))):
        at = float(p.get("at", 0.0))
        q = dict(p)
        if prev is not None and at - prev > max_step_s:
            q["gap"] = True
        out.append(q)
        prev = at
    return out


def _finished_at(job: dict[str, Any]) -> float:
    fin = float(job.get("finished_at") or 0.0)
    if fin:
        return fin
    return max((float(p.get("end", 0.0)) for p in job.get("timeline") or []), default=0.0)


def device_lanes(
    jobs: Iterable[dict[str, Any]],
    devices: Iterable[dict[str, Any]],
    *,
    now: float,
    window_s: float,
    hide_finished_s: float | None,
) -> list[dict[str, Any]]:
    """One lane per device (every device the scheduler reports, and any a job ran on), each with
    the periods jobs spent on it inside the window ``[now - window_s, now]``. A job that ended more
    than ``hide_finished_s`` ago is left out (None keeps every job)."""
    start = now - window_s
    lanes: dict[str, dict[str, Any]] = {}
    for d in devices:
        dev = str(d.get("id", ""))
        if dev:
            lanes[dev] = {"device": dev, "node": str(d.get("node", "")), "periods": []}
    for job in jobs:
        if (
            hide_finished_s is not None
            and job.get("state") in TERMINAL
            and _finished_at(job) < now - hide_finished_s
        ):
            continue
        name = str((job.get("spec") or {}).get("name", "")) if isinstance(job.get("spec"), dict) else ""
        for p in job.get("timeline") or []:
            s, e = max(float(p["start"]), start), min(float(p["end"]), now)
            if e <= s or not p.get("devices"):
                continue
            for dev in p["devices"]:
                lane = lanes.setdefault(
                    str(dev), {"device": str(dev), "node": str(p.get("node", "")), "periods": []}
                )
                lane["periods"].append(
                    {
                        "job_id": str(job.get("id", "")),
                        "name": name,
                        "state": str(p["state"]),
                        "start": s,
                        "end": e,
                        "migrated": bool(p.get("migrated", False)),
                    }
                )
    out = sorted(lanes.values(), key=lambda lane: (lane["node"], lane["device"]))
    for lane in out:
        lane["periods"].sort(key=lambda p: (p["start"], p["job_id"]))
    return out


def utilisation(
    lanes: Iterable[dict[str, Any]], *, now: float, window_s: float, buckets: int
) -> list[dict[str, Any]]:
    """Per device, the fraction of each of ``buckets`` equal slices of the window during which at
    least one job was busy on it (packed jobs overlapping count once)."""
    start = now - window_s
    width = window_s / buckets
    out = []
    for lane in lanes:
        spans = sorted((p["start"], p["end"]) for p in lane["periods"] if p["state"] in BUSY)
        merged: list[list[float]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        busy = [0.0] * buckets
        for s, e in merged:
            first = max(0, int((s - start) // width))
            last = min(buckets - 1, int((e - start) // width))
            for b in range(first, last + 1):
                b0 = start + b * width
                overlap = min(e, b0 + width) - max(s, b0)
                if overlap > 0:
                    busy[b] += overlap / width
        out.append(
            {"device": lane["device"], "node": lane["node"], "busy": [round(min(1.0, x), 4) for x in busy]}
        )
    return out


class ServiceTracker:
    """Remembers the instances seen in the registry, so that one that leaves it (killed, or its
    lease expired) is reported as gone for ``keep_s`` instead of silently dropping from a count."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self.keep_s = keep_s
        self._seen: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def observe(self, records: Iterable[Any], now: float | None = None) -> list[dict[str, Any]]:
        """Record the instances registered now; return those seen before (within ``keep_s``) that
        are not registered any more, oldest first."""
        now = time.time() if now is None else now
        current = {(r.name, r.instance_id): r for r in records}
        with self._lock:
            for key, r in current.items():
                self._seen[key] = {
                    "name": r.name,
                    "instance_id": r.instance_id,
                    "address": r.address,
                    "last_seen": now,
                    "gone_at": None,
                }
            gone = []
            for key, entry in list(self._seen.items()):
                if key in current:
                    continue
                if entry["gone_at"] is None:
                    entry["gone_at"] = now
                if now - entry["last_seen"] > self.keep_s:
                    del self._seen[key]
                    continue
                gone.append(dict(entry))
            if len(self._seen) > MAX_TRACKED:  # forget the longest gone first
                for key, _ in sorted(self._seen.items(), key=lambda kv: kv[1]["last_seen"])[
                    : len(self._seen) - MAX_TRACKED
                ]:
                    del self._seen[key]
        return sorted(gone, key=lambda g: (g["gone_at"], g["name"], g["instance_id"]))
