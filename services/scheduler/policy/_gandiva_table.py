"""gandiva's questions about every holding job, answered from the mechanism's
:class:`HolderTable` (issue 23) with array operations instead of a pass over the views.

Each function computes exactly what the pass in ``_gandiva.py`` it replaces computes, with
the same floating-point operations in the same order (numpy's element-wise ``+ - * /`` and
``maximum`` are IEEE operations, as Python's), so a policy reading the table decides
bit for bit as one reading the views (``tests/unit/sim/test_sim_fast_path.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import numpy as np

from ._index import PACKED, RUNNING, HolderTable
from ._types import JobView


def slice_wakeup(
    tab: HolderTable,
    now: float,
    quantum_s: float,
    las: bool,
    slice_packs: bool,
    w_prio: int,
    w_min: Mapping[int, float],
    n_devices: int,
) -> float | None:
    """The earliest time after ``now`` at which a holder may be time-sliced for a waiting
    job (``GandivaPolicy.wakeup_at``'s loop over the holders): a running job's quantum end,
    a pack's quantum end (from its newest member's last change) and, in ``las`` order, the
    time its attained service passes the least-served waiting job's of its class. None if
    there is none."""
    n = tab.n
    if n == 0:
        return None
    st = tab.state[:n]
    lc = tab.last_change[:n]
    nd = tab.ndev[:n]
    t = lc + quantum_s
    valid = st == RUNNING
    if slice_packs:
        pk1 = (st == PACKED) & (nd == 1.0)
        if pk1.any():
            d0 = tab.dev0[:n]
            start = np.full(n_devices, -np.inf)
            np.maximum.at(start, d0[pk1], lc[pk1])
            has = np.zeros(n_devices, dtype=bool)
            has[d0[pk1]] = True
            pk = (st == PACKED) & has[d0]
            if pk.any():
                t = np.where(pk, start[d0] + quantum_s, t)
                valid = valid | pk
    found: list[np.ndarray] = []
    if not las:
        found.append(t[valid])
    else:
        pr = tab.priority[:n]
        found.append(t[valid & (pr < w_prio)])  # a higher-priority waiter takes it at its quantum's end
        for p, same in w_min.items():
            m = valid & (pr == p)
            if not m.any():
                continue
            a = tab.attained[:n][m] + (now - tab.hold_since[:n][m]) * nd[m]
            tm = t[m]
            found.append(np.where(a > same, tm, np.maximum(tm, now + (same - a) / nd[m] + 1e-6)))
    best: float | None = None
    for c in found:
        c = c[c > now]
        if c.size:
            v = float(c.min())
            if best is None or v < best:
                best = v
    return best


def slice_victims(
    tab: HolderTable, now: float, min_run_s: float, acted: Set[str], las: bool
) -> tuple[list[JobView], dict[str, float]]:
    """The running, preemptible holders whose quantum is over (``now - last_change_at >=
    min_run_s``) and not in ``acted``, worst first (``las``: priority, most attained
    service, id; else priority, last change, id), and (``las``) their attained service by
    id. (The finish grace, when on, is applied by the caller.)"""
    n = tab.n
    if n == 0:
        return [], {}
    rows = np.flatnonzero(
        (tab.state[:n] == RUNNING) & tab.preemptible[:n] & ((now - tab.last_change[:n]) >= min_run_s)
    )
    views = tab.views
    pr = tab.priority[rows]
    if las:
        a = tab.attained[rows] + (now - tab.hold_since[rows]) * tab.ndev[rows]
        second = -a
    else:
        second = tab.last_change[rows]
    # (priority, second key) by a stable sort; rows equal on both are then put in id order,
    # so the order is the sort on (priority, second key, id) of the views
    order = np.lexsort((second, pr))
    pr_s, k_s = pr[order], second[order]
    rs = rows[order].tolist()
    vs = [views[i] for i in rs]
    same = np.flatnonzero((pr_s[1:] == pr_s[:-1]) & (k_s[1:] == k_s[:-1]))
    if same.size:
        start = None
        tied = same.tolist()
        for n_i, i in enumerate(tied):
            if start is None:
                start = i
            if n_i + 1 < len(tied) and tied[n_i + 1] == i + 1:
                continue
            vs[start : i + 2] = sorted(vs[start : i + 2], key=lambda v: v.id)
            start = None
    if las:
        att = dict(zip([v.id for v in vs], (-k_s).tolist(), strict=True))
        if acted:
            vs = [v for v in vs if v.id not in acted]
            for jid in acted:
                att.pop(jid, None)
        return vs, att
    if acted:
        vs = [v for v in vs if v.id not in acted]
    return vs, {}


def single_slots(
    tab: HolderTable,
    now: float,
    observe_s: float,
    limit: float,
    acted: Set[str],
    holders: Mapping[str, tuple[str, ...]],
) -> list[tuple[float, str, tuple[str, ...]]]:
    """Pack slots on devices held by one job (``GandivaPolicy._pack_slots``' first part):
    a RUNNING one-device job not in ``acted``, observed for ``observe_s`` (``now -
    last_change_at >= observe_s``), alone on its device per ``holders``, whose busy
    fraction is below ``limit``: (busy fraction, device, (its id,)), in no order."""
    n = tab.n
    if n == 0:
        return []
    busy = tab.busy[:n]
    rows = np.flatnonzero(
        (tab.state[:n] == RUNNING)
        & (tab.ndev[:n] == 1.0)
        & ((now - tab.last_change[:n]) >= observe_s)
        & (busy < limit)
    )
    views = tab.views
    out: list[tuple[float, str, tuple[str, ...]]] = []
    for i, b in zip(rows.tolist(), busy[rows].tolist(), strict=True):
        r = views[i]
        if r.id in acted:
            continue
        dev = r.devices[0]
        hs = holders.get(dev)
        if hs is None or len(hs) != 1 or hs[0] != r.id:
            continue
        out.append((b, dev, hs))
    return out


def spread_running(tab: HolderTable) -> list[JobView]:
    """RUNNING, preemptible holders of two or more devices spread over nodes (the only
    ones ``_consolidate`` can move), in no order."""
    n = tab.n
    if n == 0:
        return []
    rows = np.flatnonzero(
        (tab.state[:n] == RUNNING) & (tab.ndev[:n] >= 2.0) & tab.spread[:n] & tab.preemptible[:n]
    )
    views = tab.views
    return [views[i] for i in rows.tolist()]
