"""Derived facts about a view that every policy needs: who holds what, what is free, and
where a job of k devices fits best. Pure helpers, no state."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._index import ClusterIndex
from ._types import HOLDING_PHASES, WAITING_PHASES, ClusterView, JobView


class Occupancy:
    """Mutable scratch copy of device occupancy for one ``decide`` call.

    Policies plan several decisions in a row (suspend a job, start another on its devices);
    this tracks the devices' state as if the earlier decisions had already been applied.

    ``holders`` maps every device, in the view's device order, to the ids of the jobs on it
    (a tuple: packing puts several; replaced, never changed in place, so a caller may keep
    one). Kept alongside by ``take`` / ``release`` (the only writers), so that a query costs
    nothing per device at a simulator's thousands of decisions: the free-device count, the
    devices shared by two or more jobs (``shared``), and the free devices by node (built on
    the first ``free_by_node`` after a change, then reused until the next change).
    """

    __slots__ = (
        "_fbn",
        "_fbn_base",
        "_fbn_dirty",
        "_n_free",
        "_order",
        "_own",
        "changed",
        "holders",
        "node_of",
        "nodes",
        "shared",
        "version",
    )

    def __init__(self, view: ClusterView) -> None:
        # node_of, nodes and _order depend on the devices alone: shared, read-only, between
        # calls that pass the same devices tuple (the simulator's, every decision)
        self.node_of, self.nodes, self._order = _topology(view.devices)
        # device id -> ids of jobs on it, every device in device order (fromkeys: one C call)
        holders: dict[str, tuple[str, ...]] = dict.fromkeys(self._order, ())
        shared: set[str] = set()
        held = 0
        for j in view.jobs:
            if j.state in HOLDING_PHASES:
                jid = j.id
                for dev in j.devices:
                    h = holders.get(dev)
                    if h is not None:
                        if h:
                            shared.add(dev)
                        else:
                            held += 1
                        holders[dev] = (*h, jid)
        self.holders = holders
        self.shared = shared  # devices with two or more holders
        # free devices, counted once here and kept by take/release (the only writers)
        self._n_free = len(holders) - held
        self._fbn: dict[str, list[str]] | None = None
        self._fbn_base: dict[str, list[str]] | None = None  # the last one built, for its clean nodes
        self.version = 0  # bumped by every take/release that changes a device
        self.changed: set[str] = set()  # the devices take/release changed since it was built
        self._fbn_dirty: set[str] = set()  # ... since ``_fbn_base`` was built
        self._own = True  # holders and shared are this occupancy's own (else the index's)

    @classmethod
    def from_index(cls, view: ClusterView, index: ClusterIndex) -> Occupancy:
        """The same occupancy as ``Occupancy(view)``, copied from the mechanism's index of
        the view (no pass over its jobs). The index's holders and shared devices are read
        in place until the first ``take`` / ``release``, which copies them (a decision that
        changes nothing, most of a simulator's, copies nothing: a 10,000-device dict)."""
        occ = cls.__new__(cls)
        occ.node_of, occ.nodes, occ._order = _topology(view.devices)
        occ.holders = index.holders  # type: ignore[assignment]  # (copied before a write)
        occ.shared = index.shared  # type: ignore[assignment]
        occ._own = False
        occ._n_free = len(occ.holders) - index.n_held
        fbn = index.free_by_node
        # (never changed in place: a change builds a new one; the lists are read only)
        occ._fbn = None if fbn is None else fbn  # type: ignore[assignment]
        occ._fbn_base = occ._fbn
        occ.version = 0
        occ.changed = set()
        occ._fbn_dirty = set()
        return occ

    # -- queries
    def free(self) -> list[str]:
        return [d for d, h in self.holders.items() if not h]

    def n_free(self) -> int:
        return self._n_free

    def free_by_node(self) -> dict[str, list[str]]:
        """Free devices by node (nodes with none left out), in topology order. The dict is
        shared until the next change: read it, do not change it."""
        fbn = self._fbn
        if fbn is None:
            fbn = {}
            holders = self.holders
            base = self._fbn_base
            if base is None:
                for node, devs in self.nodes.items():
                    f = [d for d in devs if not holders[d]]
                    if f:
                        fbn[node] = f
            else:
                # only the nodes of the devices changed since ``base`` was built are
                # rescanned; the others keep their (read-only) lists: the same dict
                node_of = self.node_of
                dirty = {node_of[d] for d in self._fbn_dirty}
                get = base.get
                for node, devs in self.nodes.items():
                    got = [d for d in devs if not holders[d]] if node in dirty else get(node)
                    if got:
                        fbn[node] = got
            self._fbn = self._fbn_base = fbn
            self._fbn_dirty.clear()
        return fbn

    def nodes_of(self, devices: Iterable[str]) -> set[str]:
        return {self.node_of[d] for d in devices if d in self.node_of}

    def spread(self, devices: Sequence[str]) -> bool:
        """Whether ``devices`` lie on two or more nodes (``len(nodes_of(devices)) >= 2``)."""
        return _spread(self.node_of, devices)

    def shared_in_order(self) -> list[str]:
        """The devices shared by two or more jobs, in device order."""
        order = self._order
        return sorted(self.shared, key=order.__getitem__)

    # -- updates
    def _make_own(self) -> None:
        self.holders = dict(self.holders)
        self.shared = set(self.shared)
        self._own = True

    def release(self, job_id: str, devices: Iterable[str]) -> None:
        if not self._own:
            self._make_own()
        holders = self.holders
        for d in devices:
            h = holders.get(d)
            if h is not None and job_id in h:
                i = h.index(job_id)
                h = h[:i] + h[i + 1 :]
                holders[d] = h
                self._fbn = None
                self.changed.add(d)
                self._fbn_dirty.add(d)
                self.version += 1
                if not h:
                    self._n_free += 1
                elif len(h) == 1:
                    self.shared.discard(d)

    def take(self, job_id: str, devices: Iterable[str]) -> None:
        if not self._own:
            self._make_own()
        holders = self.holders
        for d in devices:
            h = holders[d]
            if not h:
                self._n_free -= 1
            else:
                self.shared.add(d)
            holders[d] = (*h, job_id)
            self._fbn = None
            self.changed.add(d)
            self._fbn_dirty.add(d)
            self.version += 1


_spread_memo: tuple = (None, {})


def _spread(node_of: dict[str, str], devices: Sequence[str]) -> bool:
    """Whether the known ``devices`` lie on two or more nodes (unknown ones are ignored).
    Remembered per devices tuple for the last topology (a simulator asks it of every
    multi-device job at every decision)."""
    global _spread_memo
    if type(devices) is not tuple:
        return _spread_scan(node_of, devices)
    seen, memo = _spread_memo
    if seen is not node_of or len(memo) > 100_000:
        memo = {}
        _spread_memo = (node_of, memo)
    got = memo.get(devices)
    if got is None:
        got = memo[devices] = _spread_scan(node_of, devices)
    return got


def _spread_scan(node_of: dict[str, str], devices: Sequence[str]) -> bool:
    first = None
    for d in devices:
        n = node_of.get(d)
        if n is None:
            continue
        if first is None:
            first = n
        elif n != first:
            return True
    return False


# The last devices tuple's topology (node_of, nodes, order): a simulator passes the same
# tuple to every decision, and rebuilding it was a fifth of a 1,024-device decision.
_last_topology: tuple = (None, None)


def _topology(devices: Sequence) -> tuple[dict[str, str], dict[str, list[str]], dict[str, int]]:
    global _last_topology
    seen, topo = _last_topology
    if seen is devices:
        return topo
    node_of: dict[str, str] = {}
    nodes: dict[str, list[str]] = {}
    order: dict[str, int] = {}
    for i, d in enumerate(devices):
        node_of[d.id] = d.node
        nodes.setdefault(d.node, []).append(d.id)
        order[d.id] = i
    topo = (node_of, nodes, order)
    _last_topology = (devices, topo)
    return topo


def place(free_by_node: dict[str, list[str]], k: int, *, allow_spread: bool = True) -> tuple[str, ...] | None:
    """Pick ``k`` free devices, on one node if any node has room (best fit: the node with
    the fewest free devices that still fits, keeping big holes for big jobs); otherwise,
    if ``allow_spread``, across the fewest nodes (largest holes first). None if impossible.
    Deterministic: ties break on node name."""
    if k <= 0:
        return ()
    best: tuple[int, str] | None = None
    for node, devs in free_by_node.items():
        n = len(devs)
        if n >= k and (best is None or (n, node) < best):
            best = (n, node)
    if best is not None:
        return tuple(free_by_node[best[1]][:k])
    if not allow_spread:
        return None
    total = sum(len(v) for v in free_by_node.values())
    if total < k:
        return None
    chosen: list[str] = []
    for _node, devs in sorted(free_by_node.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        need = k - len(chosen)
        chosen.extend(devs[:need])
        if len(chosen) == k:
            break
    return tuple(chosen)


def arrival_order(jobs: Iterable[JobView]) -> list[JobView]:
    """First come, first served; priority first (higher first), ties on id for determinism."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.id))


def waiting(view: ClusterView) -> list[JobView]:
    return [j for j in view.jobs if j.state in WAITING_PHASES]


def holding(view: ClusterView) -> list[JobView]:
    return [j for j in view.jobs if j.state in HOLDING_PHASES]


def total_devices(view: ClusterView) -> int:
    return len(view.devices)


def fits_ever(job: JobView, view: ClusterView) -> bool:
    """Whether the cluster could ever run ``job`` (policies skip jobs that never fit)."""
    return 0 < job.devices_wanted <= len(view.devices)


def as_tuple(devs: Sequence[str]) -> tuple[str, ...]:
    return tuple(devs)


def preempt_for(
    occ: Occupancy,
    k: int,
    victims: Sequence[JobView],
    *,
    allow_spread: bool = True,
) -> tuple[tuple[str, ...], list[JobView]] | None:
    """Find ``k`` devices for a waiting job by freeing as few ``victims`` as needed.

    ``victims`` come worst-first (the first is the one a policy would rather stop). Tries
    the free devices alone, then frees victims one by one until a placement appears; if
    none appears, nothing is changed and None is returned. On success the chosen devices
    are *not* yet taken in ``occ``; the victims' devices are released in it.
    """
    devs = place(occ.free_by_node(), k, allow_spread=allow_spread)
    if devs is not None:
        return devs, []
    need, total = k - occ.n_free(), 0
    for v in victims:  # (summed only as far as it matters: lengths are >= 0)
        total += len(v.devices)
        if total >= need:
            break
    if total < need:
        return None  # even stopping every victim would not free enough devices
    used: list[JobView] = []
    for v in victims:
        occ.release(v.id, v.devices)
        used.append(v)
        devs = place(occ.free_by_node(), k, allow_spread=allow_spread)
        if devs is not None:
            # drop victims whose devices the placement does not need (keep them running)
            chosen = set(devs)
            keep = [u for u in used if not chosen.intersection(u.devices)]
            needed = [u for u in used if chosen.intersection(u.devices)]
            for u in keep:
                occ.take(u.id, u.devices)
            return devs, needed
    for u in used:
        occ.take(u.id, u.devices)
    return None
