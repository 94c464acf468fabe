"""An index a mechanism may keep between decisions so that a policy need not pass over
every job and every device at every call (issue 23: a simulator deciding tens of thousands
of times over thousands of jobs).

The contract stays a pure function of the view: an :class:`IndexedClusterView` is a
:class:`ClusterView` whose ``index`` describes exactly its ``jobs`` and ``devices``
(the same job view objects, partitioned and counted). A policy may answer from the index
instead of scanning ``jobs``; it must decide exactly as it would from the plain view (a
policy that ignores the index is correct as it is). The index is kept by the mechanism,
changed only for what changed since its last view: it is valid while the policy is being
called (a mechanism does not change its state during the call); a caller that keeps a view
for later copies it (``cluster_view_to_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import numpy as np

from ._types import ClusterView, JobPhase, JobView

# ``HolderTable.state`` codes
RUNNING, PACKED, MIGRATING = 0, 1, 2
_STATE_CODE = {JobPhase.RUNNING: RUNNING, JobPhase.PACKED: PACKED, JobPhase.MIGRATING: MIGRATING}


class HolderTable:
    """The holding jobs of a view as columns, one row per job (rows in no particular
    order), kept by the mechanism between decisions like the rest of the index: a row is
    written when the job's view is (re)built and removed when the job stops holding, so a
    policy can answer a question about every holder with a few array operations instead of
    a pass over their views (issue 23: ~600 holders at every contended decision).

    For a row ``i < n`` of the job whose view is ``views[i]`` (``row[job_id] == i``):

    * ``attained[i] + (now - hold_since[i]) * ndev[i]`` is ``views[i].attained_service_s``
      at the view's clock, the same float (a mechanism whose views are snapshots writes the
      snapshot's value and ``hold_since = now``);
    * ``last_change`` = ``last_change_at``, ``priority``, ``state`` (``RUNNING``,
      ``PACKED``, ``MIGRATING``), ``ndev`` = ``len(devices)`` (float), ``dev0`` = the
      position of ``devices[0]`` in the view's devices, ``busy`` = the observed
      ``utilization`` if known else ``gpu_share``, ``preemptible``, ``spread`` = whether
      its devices lie on two or more nodes.

    Columns are numpy arrays of a capacity >= ``n``: read ``col[:n]``.
    """

    __slots__ = (
        "_cap",
        "attained",
        "busy",
        "dev0",
        "hold_since",
        "last_change",
        "n",
        "ndev",
        "preemptible",
        "priority",
        "row",
        "spread",
        "state",
        "views",
    )

    attained: np.ndarray
    hold_since: np.ndarray
    last_change: np.ndarray
    ndev: np.ndarray
    busy: np.ndarray
    priority: np.ndarray
    state: np.ndarray
    dev0: np.ndarray
    preemptible: np.ndarray
    spread: np.ndarray

    _FLOATS = ("attained", "hold_since", "last_change", "ndev", "busy")
    _INTS = ("priority", "state", "dev0")
    _BOOLS = ("preemptible", "spread")

    def __init__(self, capacity: int = 64) -> None:
        self._cap = max(1, capacity)
        self.n = 0
        self.views: list[JobView] = []
        self.row: dict[str, int] = {}
        for name in self._FLOATS:
            setattr(self, name, np.zeros(self._cap, dtype=np.float64))
        for name in self._INTS:
            setattr(self, name, np.zeros(self._cap, dtype=np.int64))
        for name in self._BOOLS:
            setattr(self, name, np.zeros(self._cap, dtype=bool))

    def put(
        self,
        view: JobView,
        *,
        attained: float,
        hold_since: float,
        dev0: int,
        spread: bool,
    ) -> None:
        """Write (or rewrite) the row of ``view``'s job (a holding job)."""
        i = self.row.get(view.id)
        if i is None:
            i = self.n
            if i == self._cap:
                self._grow()
            self.n += 1
            self.row[view.id] = i
            self.views.append(view)
        else:
            self.views[i] = view
        u = view.utilization
        self.attained[i] = attained
        self.hold_since[i] = hold_since
        self.last_change[i] = view.last_change_at
        self.ndev[i] = len(view.devices)
        self.busy[i] = view.gpu_share if u is None else u
        self.priority[i] = view.priority
        self.state[i] = _STATE_CODE[view.state]
        self.dev0[i] = dev0
        self.preemptible[i] = view.preemptible
        self.spread[i] = spread

    def drop(self, job_id: str) -> None:
        """Remove a job's row (no-op if it has none): the last row takes its place."""
        i = self.row.pop(job_id, None)
        if i is None:
            return
        last = self.n - 1
        if i != last:
            moved = self.views[last]
            self.views[i] = moved
            self.row[moved.id] = i
            for name in self._FLOATS + self._INTS + self._BOOLS:
                col = getattr(self, name)
                col[i] = col[last]
        self.views.pop()
        self.n = last

    def _grow(self) -> None:
        self._cap *= 2
        for name in self._FLOATS + self._INTS + self._BOOLS:
            col = getattr(self, name)
            new = np.zeros(self._cap, dtype=col.dtype)
            new[: len(col)] = col
            setattr(self, name, new)

    def attained_at(self, now: float) -> np.ndarray:
        """Every row's attained service at ``now`` (the views' values, bit for bit)."""
        n = self.n
        return self.attained[:n] + (now - self.hold_since[:n]) * self.ndev[:n]


class ClusterIndex:
    """Jobs of a view partitioned by phase, and the devices' holders.

    * ``jobs``: every job of the view by id, in the view's order;
    * ``waiting``: the QUEUED and SUSPENDED ones; ``holding``: RUNNING, PACKED, MIGRATING
      (any order: iterate ``jobs`` or sort by ``order`` where the order matters);
    * ``elastic``: RUNNING elastic jobs; ``multi``: RUNNING jobs on two or more devices;
      ``n_packed``: how many jobs are PACKED;
    * ``holders``: every device of the view, in device order, to the ids of the jobs
      holding it, in the view's job order (what :class:`Occupancy` builds from a view);
      ``shared``: the devices with two or more holders; ``n_held``: devices held;
    * ``order``: a job's position key in the view (increasing along ``jobs``);
    * ``table``: the holding jobs as columns (:class:`HolderTable`), or None where the
      mechanism keeps none (a policy then reads ``holding``);
    * ``free_by_node``: the free devices by node, nodes in device order, those with none
      left out (what ``Occupancy.free_by_node`` builds), or None; read it, do not change it.
    * ``holder_count``: how many jobs hold each device (``len(holders[d])``), a numpy
      integer array by the device's position in the view's devices, or None (session 28).
    """

    __slots__ = (
        "elastic",
        "free_by_node",
        "holder_count",
        "holders",
        "holding",
        "jobs",
        "multi",
        "n_held",
        "n_packed",
        "order",
        "shared",
        "table",
        "waiting",
    )

    def __init__(
        self,
        *,
        jobs: Mapping[str, JobView],
        waiting: Mapping[str, JobView],
        holding: Mapping[str, JobView],
        elastic: Mapping[str, JobView],
        multi: Mapping[str, JobView],
        n_packed: int,
        holders: Mapping[str, tuple[str, ...]],
        shared: Set[str],
        n_held: int,
        order: Mapping[str, int],
        table: HolderTable | None = None,
        free_by_node: Mapping[str, list[str]] | None = None,
        holder_count: np.ndarray | None = None,
    ) -> None:
        self.jobs = jobs
        self.waiting = waiting
        self.holding = holding
        self.elastic = elastic
        self.multi = multi
        self.n_packed = n_packed
        self.holders = holders
        self.shared = shared
        self.n_held = n_held
        self.order = order
        self.table = table
        self.free_by_node = free_by_node
        self.holder_count = holder_count

    def in_view_order(self, jobs: Mapping[str, JobView]) -> list[JobView]:
        """``jobs``' views in the view's order."""
        order = self.order
        return sorted(jobs.values(), key=lambda j: order[j.id])


@dataclass(frozen=True, slots=True)
class IndexedClusterView(ClusterView):
    """A :class:`ClusterView` with the mechanism's :class:`ClusterIndex` of it."""

    index: ClusterIndex | None = None


def index_of(view: ClusterView) -> ClusterIndex | None:
    """The view's index, or None for a plain view."""
    return getattr(view, "index", None)
