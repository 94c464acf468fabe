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

from ._types import ClusterView, JobView


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
    * ``order``: a job's position key in the view (increasing along ``jobs``).
    """

    __slots__ = (
        "elastic",
        "holders",
        "holding",
        "jobs",
        "multi",
        "n_held",
        "n_packed",
        "order",
        "shared",
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
