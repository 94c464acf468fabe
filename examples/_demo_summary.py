"""The demo's one-screen summary: for every mechanism, whether this run showed it and the
evidence, read from what the systems recorded (the scheduler's job histories, the cache's
index, the store's query plans, the compiler's graphs), never from what the demo hoped for.

A mechanism this run did not show says why (e.g. never more jobs than devices, so nothing had
to be time-sliced): the scheduler decides, and a small run may not need it.
"""

from __future__ import annotations

from typing import Any

MECHANISMS = (
    "time-slicing",
    "packing",
    "migration",
    "grow-shrink",
    "cache shared",
    "store routing",
    "store recovery",
    "compiler commit",
)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _entries(jobs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(job name, state, message) of every history entry of the demo's jobs."""
    return [(j["name"], str(h[1]), str(h[2])) for j in jobs for h in j.get("history") or []]


def _jobs_with(entries: list[tuple[str, str, str]]) -> str:
    names = sorted({e[0] for e in entries})
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def scheduler_rows(jobs: list[dict[str, Any]], devices: int) -> list[dict[str, Any]]:
    """Time-slicing, packing, migration and grow-shrink, from the jobs' histories."""
    entries = _entries(jobs)
    crowded = len(jobs) > devices
    rows = []
    sliced = [e for e in entries if e[1] == "suspended" and "time-slice" in e[2]]
    rows.append(
        {
            "mechanism": "time-slicing",
            "seen": bool(sliced),
            "evidence": f"{len(sliced)} suspend(s) at a mini-batch boundary when a quantum ended "
            f"({_jobs_with(sliced)}), each resumed later"
            if sliced
            else (
                "no quantum ended while a job waited"
                if crowded
                else f"never more jobs than devices ({_n(len(jobs), 'job')} on {_n(devices, 'device')})"
            ),
        }
    )
    packed = [e for e in entries if e[1] == "packed"]
    undone = [e for e in entries if "interference" in e[2] or "below time-slicing" in e[2]]
    rows.append(
        {
            "mechanism": "packing",
            "seen": bool(packed),
            "evidence": f"{len(packed)} pack(s) ({_jobs_with(packed)})"
            + (f", {len(undone)} undone when packed progress fell below time-slicing" if undone else ", kept")
            if packed
            else (
                "no waiting job whose busy fraction fit beside a running one"
                if crowded
                else "every job had a device of its own"
            ),
        }
    )
    moved = [e for e in entries if e[1] == "migrating" or e[2].startswith("migrated in place")]
    rows.append(
        {
            "mechanism": "migration",
            "seen": bool(moved),
            "evidence": f"{len(moved)} move(s) onto other devices at a mini-batch boundary ({_jobs_with(moved)})"
            if moved
            else "no device was free while a job had work left",
        }
    )
    resized = [e for e in entries if e[2].startswith("resized from")]
    rows.append(
        {
            "mechanism": "grow-shrink",
            "seen": bool(resized),
            "evidence": "; ".join(sorted({f"{e[0]} {e[2].split(':')[0]}" for e in resized})[:3])
            if resized
            else "no device went idle while the elastic job had steps left",
        }
    )
    return rows


def cache_row(shared_index: bool, digest: str, hit_rates: list[float | None]) -> dict[str, Any]:
    rates = [r for r in hit_rates if r is not None]
    shown = ", ".join(f"{100 * r:.0f}%" for r in rates) or "none reported"
    return {
        "mechanism": "cache shared",
        "seen": shared_index and any(r > 0 for r in rates),
        "evidence": f"one index for alice and bob ({digest[:12]}); the jobs' hit rates {shown}",
    }


def store_row(plans: dict[str, dict[str, Any]], layouts: list[str] | None = None) -> dict[str, Any]:
    """``plans``: by query label, the store's plan (``kind``: ``agg_local`` when the group-by
    ran shuffle-free on the replica partitioned by its key, ``agg_shuffle`` otherwise;
    ``replicas``: table -> replica index; ``moved_bytes``). ``layouts``: each replica's
    partitioning column, by index."""
    routed = [label for label, p in plans.items() if "shuffle" not in str(p.get("kind", "shuffle"))]
    parts = [
        f"{label}: {p.get('kind')} on {_replicas(p, layouts or [])}"
        + (f", {int(p['moved_bytes']):,} bytes shuffled" if p.get("moved_bytes") else "")
        for label, p in plans.items()
    ]
    return {
        "mechanism": "store routing",
        "seen": bool(routed),
        "evidence": "; ".join(parts) or "no query ran",
    }


def recovery_row(rec: dict[str, Any]) -> dict[str, Any]:
    """A store node killed and what the coordinator rebuilt (``step_store_recovery``)."""
    if rec.get("node") is None:
        return {"mechanism": "store recovery", "seen": False, "evidence": rec.get("why") or "not tried"}
    evidence = (
        f"killed {rec['node']}: {rec.get('rebuilt', 0)}/{rec.get('lost', 0)} extents rebuilt "
        f"({rec.get('state')}); same answer after: {'yes' if rec.get('same_answer') else 'no'}"
    )
    return {"mechanism": "store recovery", "seen": bool(rec.get("done")), "evidence": evidence}


def _replicas(plan: dict[str, Any], layouts: list[str]) -> str:
    reps = plan.get("replicas") or {}
    if not isinstance(reps, dict):
        return str(reps)
    named = []
    for table, index in reps.items():
        column = layouts[index] if isinstance(index, int) and 0 <= index < len(layouts) else ""
        prefix = f"{table} " if len(reps) > 1 else ""
        named.append(f"{prefix}replica {index}" + (f" ({column})" if column else ""))
    return ", ".join(named) or "-"


def compiler_row(graphs: list[dict[str, Any]]) -> dict[str, Any]:
    """``graphs``: name, trials, committed, best (the compiler's graph records)."""
    done = [g for g in graphs if g["committed"]]
    if done:
        evidence = "; ".join(
            f"{g['name']} committed after {_n(g['trials'], 'trial')}: " + _settings(g["best"])
            for g in done[:2]
        )
    elif graphs:
        evidence = "; ".join(f"{g['name']}: still exploring after {g['trials']} trials" for g in graphs[:2])
    else:
        evidence = "no graph was registered"
    return {"mechanism": "compiler commit", "seen": bool(done), "evidence": evidence}


def _settings(best: dict[str, Any]) -> str:
    """The committed configuration, the thread count first (the rest is per-layer knobs)."""
    items = sorted(best.items(), key=lambda kv: (kv[0] != "threads", kv[0]))
    return ", ".join(f"{k}={v}" for k, v in items) or "its defaults"


def summary_lines(rows: list[dict[str, Any]], width: int = 120) -> list[str]:
    """The rows as one screen: ``mechanism  seen  evidence`` (evidence cut to the width)."""
    name_w = max(len("mechanism"), *(len(r["mechanism"]) for r in rows))
    lines = [f"{'mechanism'.ljust(name_w)}  seen  evidence"]
    for r in rows:
        text = f"{r['mechanism'].ljust(name_w)}  {'yes ' if r['seen'] else 'no  '}  {r['evidence']}"
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return lines
