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


# (devices tuple, its ids, each device's rank in id order): the simulator passes one
# devices tuple to every decision
_dev_names: tuple = (None, [], np.zeros(0, dtype=np.int64))


def _names(devices) -> tuple[list[str], np.ndarray]:
    """The ids of ``devices`` (view order) and each one's rank in id (string) order."""
    global _dev_names
    seen, ids, rank = _dev_names
    if seen is not devices:
        ids = [d.id for d in devices]
        rank = np.empty(len(ids), dtype=np.int64)
        rank[sorted(range(len(ids)), key=ids.__getitem__)] = np.arange(len(ids))
        _dev_names = (devices, ids, rank)
    return ids, rank


class SlotList:
    """Pack slots fullest first (busy fraction descending, then device id): a list of
    ``(busy fraction, device, holder ids)`` as ``GandivaPolicy._pack_slots`` returns it,
    sorted by array operations and built on demand. A contended decision usually reads
    only whether there is one and the emptiest (``slots[-1]``: no waiting job fits even
    there); the whole list is built the first time anything else is read or deleted, and
    is then the list itself. Supports what the policy does with its slots: ``len``,
    truth, indexing, iteration and ``del``."""

    __slots__ = ("_busy", "_dpos", "_ids", "_list", "_n", "_shared", "_src", "_views")

    def __init__(
        self,
        busy: np.ndarray,
        dpos: np.ndarray,
        src: np.ndarray,
        shared: list[tuple[str, ...]],
        views: list[JobView],
        ids: list[str],
    ) -> None:
        self._busy, self._dpos, self._src = busy, dpos, src  # sorted, fullest first
        self._shared, self._views, self._ids = shared, views, ids
        self._n = len(busy)
        self._list: list[tuple[float, str, tuple[str, ...]]] | None = None

    def _item(self, k: int) -> tuple[float, str, tuple[str, ...]]:
        r = int(self._src[k])
        hs = (self._views[r].id,) if r >= 0 else self._shared[-1 - r]
        return float(self._busy[k]), self._ids[int(self._dpos[k])], hs

    def _all(self) -> list[tuple[float, str, tuple[str, ...]]]:
        out = self._list
        if out is None:
            views, ids, shared = self._views, self._ids, self._shared
            out = self._list = [
                (b, ids[d], (views[r].id,) if r >= 0 else shared[-1 - r])
                for b, d, r in zip(self._busy.tolist(), self._dpos.tolist(), self._src.tolist(), strict=True)
            ]
        return out

    def __len__(self) -> int:
        return self._n if self._list is None else len(self._list)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, i: int) -> tuple[float, str, tuple[str, ...]]:
        if self._list is None and (i == -1 or i == self._n - 1) and self._n:
            return self._item(self._n - 1)
        return self._all()[i]

    def __delitem__(self, i: int) -> None:
        del self._all()[i]

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return list(self) == other

    __hash__ = None  # type: ignore[assignment]


def single_slots_sorted(
    tab: HolderTable,
    now: float,
    observe_s: float,
    limit: float,
    acted: Set[str],
    holders: Mapping[str, tuple[str, ...]],
    count: np.ndarray,
    changed: Set[str],
    devices,
    position: Mapping[str, int],
    shared: list[tuple[float, str, tuple[str, ...]]],
) -> SlotList:
    """The pack slots of :func:`single_slots` and the slots ``shared`` (on devices held by
    two or more jobs), fullest first (busy fraction descending, then device id), with no
    pass over the rows in Python: the rows are filtered and sorted by array operations.

    ``count`` is the index's ``holder_count`` (holders per device position) and ``changed``
    the devices the caller's occupancy changed since it was copied from the index: a row on
    an unchanged device is alone on it iff its count is 1 (it holds the device); a row on a
    changed device is checked against ``holders`` as :func:`single_slots` does."""
    ids, rank = _names(devices)
    n = tab.n
    extra = list(shared)
    rows = np.zeros(0, dtype=np.int64)
    if n:
        busy = tab.busy[:n]
        d0 = tab.dev0[:n]
        mask = (
            (tab.state[:n] == RUNNING)
            & (tab.ndev[:n] == 1.0)
            & ((now - tab.last_change[:n]) >= observe_s)
            & (busy < limit)
        )
        if acted:
            row = tab.row
            for jid in acted:
                i = row.get(jid)
                if i is not None:
                    mask[i] = False
        if changed:
            views = tab.views
            ch = np.zeros(len(count), dtype=bool)
            ch[[position[d] for d in changed]] = True
            on_changed = mask & ch[d0]
            mask &= ~ch[d0]
            for i in np.flatnonzero(on_changed).tolist():
                r = views[i]
                dev = r.devices[0]
                hs = holders.get(dev)
                if hs is None or len(hs) != 1 or hs[0] != r.id:
                    continue
                extra.append((float(busy[i]), dev, hs))
        mask &= count[d0] == 1
        rows = np.flatnonzero(mask)
    # the other slots take negative sources: -1 - their place in ``extra``
    e_busy = np.array([x[0] for x in extra], dtype=np.float64)
    e_dpos = np.array([position[x[1]] for x in extra], dtype=np.int64)
    all_busy = np.concatenate((tab.busy[rows], e_busy))
    all_dpos = np.concatenate((tab.dev0[rows], e_dpos))
    src = np.concatenate((rows, -1 - np.arange(len(extra), dtype=np.int64)))
    order = np.lexsort((rank[all_dpos], -all_busy))
    return SlotList(all_busy[order], all_dpos[order], src[order], [x[2] for x in extra], tab.views, ids)
