"""Baselines as the source clusters ran them (issue 23): fractional-GPU sharing.

The Alibaba cluster the default trace comes from shares a GPU among pods that ask for a
fraction of one (its GPU-sharing scheduler bin-packs fractional requests onto a device
while they add up to at most one device). Giving such pods whole devices, as the plain
``fifo`` and ``las`` do, makes the baseline weaker than the cluster the trace was taken on
and credits gandiva's packing with what the cluster already had.

:class:`FractionalSharing` wraps a policy: after the wrapped policy's decisions, every
waiting one-device job that asks for a fraction of a device (``gpu_share < 1``) and was
not started is placed, in the wrapped policy's order of preference (arrival order for
``fifo``, its ranking for ``las``), onto the *fullest* device whose holders are all
one-device fractional jobs and whose shares leave room for it (best fit; ties on device
order), as a ``Pack`` with those holders. A fractional job that finds a free device
first is started there by the wrapped policy as usual (it holds the device alone until
others join it). Nothing is judged or undone: the shares are requests, as in the source
cluster, not measurements; interference is the simulator's (``PerfModel.packed_speed``).
The wrapped policy never preempts a shared job here: ``las`` treats PACKED jobs as not
preemptible (protected), and ``fifo`` never preempts.

Tiresias' own two-queue LAS is ``las`` with one threshold (``TIRESIAS_TWO_QUEUES``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from microco.services.scheduler.policy import (
    HOLDING_PHASES,
    WAITING_PHASES,
    ClusterView,
    Decision,
    JobPhase,
    JobView,
    Migrate,
    Pack,
    Policy,
    Resize,
    Resume,
    Start,
    Suspend,
    Unpack,
    make_policy,
)

#: ``las`` as Tiresias evaluated it: two queues (one threshold, here 1 h of device time,
#: the first threshold of the three-queue default).
TIRESIAS_TWO_QUEUES = {"thresholds_s": (3600.0,)}

_EPS = 1e-9


@dataclass(frozen=True)
class SharingConfig:
    max_jobs_per_device: int = 4  # processes (GPU memory contexts) on one device

    def __post_init__(self) -> None:
        if self.max_jobs_per_device < 2:
            raise ValueError("max_jobs_per_device must be >= 2")


class FractionalSharing:
    """``inner`` plus fractional-GPU sharing of one-device jobs (see the module)."""

    def __init__(self, inner: Policy, config: SharingConfig | None = None) -> None:
        self.inner = inner
        self.config = config or SharingConfig()
        self.name = f"{inner.name}+share"
        self.time_driven = getattr(inner, "time_driven", True)
        if hasattr(inner, "wakeup_at"):
            self.wakeup_at = inner.wakeup_at

    def decide(self, view: ClusterView) -> list[Decision]:
        jobs = {j.id: j for j in view.jobs}
        holders: dict[str, list[str]] = {d.id: [] for d in view.devices}
        for j in view.jobs:
            if j.state in HOLDING_PHASES:
                for dev in j.devices:
                    if dev in holders:
                        holders[dev].append(j.id)
        # 1. fractional requests join shared devices first (bin-packing, as the source
        #    cluster's GPU-sharing scheduler), so they do not take a free device
        out = self._share(view, jobs, holders, set(), set())
        if out:
            packs = [d for d in out if isinstance(d, Pack)]  # (_share returns packs only)
            packed = {p.job_id: p.devices for p in packs}
            joined = {h for p in packs for h in p.with_jobs}
            # the wrapped policy sees the new sharers as holders: not waiting, and the jobs
            # they joined as PACKED (so that las does not preempt them under the newcomer)
            inner_jobs = []
            for j in view.jobs:
                if j.id in packed:
                    j = replace(j, state=JobPhase.PACKED, devices=packed[j.id])
                elif j.id in joined:
                    j = replace(j, state=JobPhase.PACKED)
                inner_jobs.append(j)
            inner_view = ClusterView(now=view.now, devices=view.devices, jobs=tuple(inner_jobs))
        else:
            inner_view = view
        inner = list(self.inner.decide(inner_view))
        # 2. then those the wrapped policy did not start may join what it started
        placed = {d.job_id for d in out}
        suspended: set[str] = set()
        for dec in inner:
            if isinstance(dec, (Suspend, Unpack, Migrate, Resize)):
                was = jobs.get(dec.job_id)
                for dev in was.devices if was is not None else ():
                    if dev in holders and dec.job_id in holders[dev]:
                        holders[dev].remove(dec.job_id)
                if isinstance(dec, (Suspend, Unpack)):
                    suspended.add(dec.job_id)
            if isinstance(dec, (Start, Resume, Pack, Migrate, Resize)):
                for dev in dec.devices:
                    holders.setdefault(dev, []).append(dec.job_id)
                placed.add(dec.job_id)
        return out + inner + self._share(view, jobs, holders, placed, suspended)

    def _share(
        self,
        view: ClusterView,
        jobs: dict[str, JobView],
        holders: dict[str, list[str]],
        placed: set[str],
        suspended: set[str],
    ) -> list[Decision]:
        """Pack waiting fractional one-device jobs onto devices whose holders are all
        fractional one-device jobs with room left (best fit); updates ``holders``."""
        max_n = self.config.max_jobs_per_device

        def share_of(jid: str) -> float | None:
            j = jobs.get(jid)
            if j is None or j.devices_wanted != 1 or not j.gpu_share < 1.0:
                return None
            return j.gpu_share

        slots: dict[str, float] = {}
        for dev, hs in holders.items():
            if not hs or len(hs) >= max_n or any(h in suspended for h in hs):
                continue
            shares = [share_of(h) for h in hs]
            if all(x is not None for x in shares):
                slots[dev] = sum(x for x in shares if x is not None)
        out: list[Decision] = []
        if not slots:
            return out
        order = {d.id: i for i, d in enumerate(view.devices)}
        for w in self._preference(view):
            if w.id in placed or w.devices_wanted != 1 or not w.gpu_share < 1.0:
                continue
            s = w.gpu_share
            best = None
            for dev, used in slots.items():
                if used + s <= 1.0 + _EPS and (best is None or (-used, order[dev]) < best[0]):
                    best = ((-used, order[dev]), dev)
            if best is None:
                continue
            dev = best[1]
            out.append(
                Pack(
                    w.id, (dev,), tuple(holders[dev]), f"{self.name}: fractional GPU request shares a device"
                )
            )
            holders[dev].append(w.id)
            placed.add(w.id)
            slots[dev] += s
            if len(holders[dev]) >= max_n:
                del slots[dev]
        return out

    def _preference(self, view: ClusterView) -> list[JobView]:
        """Waiting jobs in the wrapped policy's order: its ranking key when it has one
        (``las``), else arrival order (priority first)."""
        key = getattr(self.inner, "_key", None)
        waiting = [j for j in view.jobs if j.state in WAITING_PHASES]
        if key is not None:
            return sorted(waiting, key=key)
        return sorted(waiting, key=lambda j: (-j.priority, j.submitted_at, j.id))


def sharing_policy(name: str, **options) -> FractionalSharing:
    """``fifo`` / ``las`` (or any registered policy) with fractional-GPU sharing."""
    return FractionalSharing(make_policy(name, **options))


def baseline_policies() -> dict[str, Policy]:
    """The baselines a utilisation figure is judged against, by label: the plain ones,
    the same with fractional sharing (as the Alibaba cluster ran them) and Tiresias'
    two-queue LAS with and without sharing."""
    return {
        "fifo": make_policy("fifo"),
        "fifo+share": sharing_policy("fifo"),
        "las": make_policy("las"),
        "las+share": sharing_policy("las"),
        "las[2 queues]": make_policy("las", **TIRESIAS_TWO_QUEUES),
        "las[2 queues]+share": sharing_policy("las", **TIRESIAS_TWO_QUEUES),
    }


__all__ = [
    "TIRESIAS_TWO_QUEUES",
    "FractionalSharing",
    "SharingConfig",
    "baseline_policies",
    "sharing_policy",
]
