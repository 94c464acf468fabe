"""Benefit-aware allocation: capacity goes to the datasets whose jobs gain most per byte.

Each job reports mini-batch times together with the fraction of the batch that came from
the cache (the loader prices every batch at both ends, all misses and all hits, from its
counted reads: ``clients/cache/_stall.py``). A least-squares line through (hit fraction,
seconds) gives the batch time with all hits and with all misses, and the job's *gain*, the
share of its all-miss step time that all hits save. With substitutable hits, caching a
fraction ``f`` of a dataset makes ``f`` of each epoch's samples hits, so it saves about
``f x gain`` of the job's running time: the benefit per cached byte is ``gain /
dataset_bytes``, summed over every job sharing the dataset (one copy serves them all).

The gain is a ratio of the job's own times, so jobs are compared on the same footing: a
job with long steps is not preferred for saving more seconds per batch (it saves them less
often), and a job measured while the machine was busier is not preferred for its longer
seconds. Capacity is then a fractional knapsack: fill datasets in order of that density,
each up to its size. A compute-bound job (no measurable gain) gets only room nobody else
wants; a job not yet measured gets a probe-sized share first so that it can be measured.

*The shared link* (``shared_link=True``; off by default: in the co-design benchmark it did not
reduce the backing store's bytes, docs/codesign.md). The jobs reporting to one cache server
read their misses from a backing store over a link they share. A job whose reader hides its
misses behind its compute gains little itself, but the time its misses hold the link is
time the other jobs' misses wait for it. So a job's benefit adds what its misses cost the
others: ``link_share x others_wait``, where ``link_share = miss_read_s / t_miss`` is the
share of its all-miss running time its misses hold the backing store (``miss_read_s``: the
loader's measured read of one all-miss batch, hidden or not) and ``others_wait`` the sum of
the other measured jobs' gains (the share of their step time spent waiting for reads: a
second of link taken from them is a second each of those waiting loses). Both are shares of
running time, so it is on the gain's footing, and the 5% rule applies to the sum: a job is
compute-bound when neither its own steps nor the others' would move. A job alone, or beside
jobs that do not wait, is valued as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BenefitEstimate:
    """Mini-batch seconds with every sample a hit and with every sample a miss."""

    t_hit: float
    t_miss: float
    observations: int

    @property
    def gain(self) -> float:
        """Relative saving of an all-hit batch over an all-miss one (0 = no benefit)."""
        return max(0.0, (self.t_miss - self.t_hit) / self.t_miss) if self.t_miss > 0 else 0.0


def estimate_benefit(
    observations: Iterable[tuple[float, float]], min_spread: float = 0.3
) -> BenefitEstimate | None:
    """Fit ``seconds = t_miss - (t_miss - t_hit) * hit_fraction`` to (hit_fraction, seconds).

    None when the hit fractions span less than ``min_spread`` (the probe has not run yet).
    """
    pts = [(float(h), float(t)) for h, t in observations if t >= 0]
    if len(pts) < 2:
        return None
    hs = [h for h, _ in pts]
    if max(hs) - min(hs) < min_spread:
        return None
    n = len(pts)
    mh = sum(hs) / n
    mt = sum(t for _, t in pts) / n
    sxx = sum((h - mh) ** 2 for h in hs)
    sxy = sum((h - mh) * (t - mt) for h, t in pts)
    slope = sxy / sxx
    t_miss = mt - slope * mh
    t_hit = t_miss + slope
    return BenefitEstimate(t_hit=max(0.0, t_hit), t_miss=max(0.0, t_miss), observations=n)


@dataclass(frozen=True)
class JobDemand:
    """What the manager knows of a job: its dataset, bytes per mini-batch, and its estimate."""

    job_id: str
    dataset: str
    batch_bytes: int
    estimate: BenefitEstimate | None = None
    miss_read_s: float = 0.0  # backing-store seconds to read one all-miss batch (0: not measured)

    @property
    def link_share(self) -> float:
        """Share of its all-miss running time the job's misses hold the backing store."""
        est = self.estimate
        if est is None or est.t_miss <= 0 or self.miss_read_s <= 0:
            return 0.0
        return min(1.0, self.miss_read_s / est.t_miss)


def link_costs(jobs: Sequence[JobDemand]) -> dict[str, float]:
    """Per job, what its misses cost the other jobs on the shared link, as a share of its own
    running time: ``link_share x`` the other measured jobs' gains (module doc)."""
    gains = {j.job_id: j.estimate.gain for j in jobs if j.estimate is not None}
    waiting = sum(gains.values())
    return {j.job_id: j.link_share * (waiting - gains.get(j.job_id, 0.0)) for j in jobs}


@dataclass(frozen=True)
class Allocation:
    """Bytes of cache given to one dataset, and why."""

    dataset: str
    bytes: int
    dataset_bytes: int
    benefit_s_per_gb: float  # seconds saved per epoch per cached GB (shown; ranked by share of time)
    jobs: tuple[str, ...]
    reason: str


def allocate(
    capacity: int,
    dataset_bytes: Mapping[str, int],
    jobs: Sequence[JobDemand],
    *,
    min_gain: float = 0.05,
    probe_bytes: int = 64 << 20,
    shared_link: bool = False,
) -> list[Allocation]:
    """Divide ``capacity`` among the datasets of ``jobs``; one entry per dataset, largest first.
    ``shared_link``: a job's benefit includes what its misses cost the others (module doc)."""
    ext = link_costs(jobs) if shared_link else {}
    by_ds: dict[str, list[JobDemand]] = {}
    for j in jobs:
        by_ds.setdefault(j.dataset, []).append(j)
    density: dict[str, float] = {}  # share of the jobs' running time saved per cached byte
    seconds: dict[str, float] = {}  # seconds saved per epoch per cached byte (shown)
    unmeasured: list[str] = []
    why: dict[str, str] = {}
    for ds, js in by_ds.items():
        measured = [j for j in js if j.estimate is not None]
        if not measured:
            unmeasured.append(ds)
            continue
        d = 0.0
        s_per_byte = 0.0
        parts = []
        size = dataset_bytes.get(ds, 0)
        for j in measured:
            est = j.estimate
            assert est is not None
            if size <= 0:
                parts.append(f"{j.job_id} gain {est.gain:.0%}, dataset size not reported")
                continue
            others = ext.get(j.job_id, 0.0)
            if est.gain + others < min_gain:
                parts.append(f"{j.job_id} compute-bound (gain {est.gain:.0%})")
                continue
            d += (est.gain + others) / size
            if j.batch_bytes > 0:
                s_per_byte += (est.t_miss - est.t_hit + others * est.t_miss) / j.batch_bytes
            why_j = f"{j.job_id} saves {est.t_miss - est.t_hit:.3g}s/batch ({est.gain:.0%})"
            if others > 0:
                why_j += f" and the others {others:.0%} of its time on the shared link"
            parts.append(why_j)
        density[ds] = d
        seconds[ds] = s_per_byte
        why[ds] = "; ".join(parts)
    left = capacity
    out: dict[str, int] = {}
    reasons: dict[str, str] = {}
    # Unmeasured datasets first get enough to be probed: a measurement is worth a little room,
    # but never so much that one name's probe leaves another's nothing (at most half the
    # capacity, split evenly, goes to probes).
    probe_cap = capacity // (2 * max(1, len(by_ds)))
    for ds in sorted(unmeasured):
        give = min(probe_bytes, probe_cap, dataset_bytes.get(ds, 0), left)
        out[ds] = give
        left -= give
        reasons[ds] = "not yet measured: probe-sized share until its hit/miss batch times are known"
    ranked = sorted((ds for ds in density if density[ds] > 0), key=lambda ds: (-density[ds], ds))
    for rank, ds in enumerate(ranked, 1):
        give = min(dataset_bytes.get(ds, 0), left)
        out[ds] = give
        left -= give
        reasons[ds] = (
            f"rank {rank} by benefit per byte (gain {density[ds] * dataset_bytes.get(ds, 0):.0%}"
            f" over {dataset_bytes.get(ds, 0) / (1 << 30):.3g} GB): {why[ds]}"
        )
    # Capacity nobody can use well still helps the unmeasured datasets, then (it costs them
    # nothing) those without measured benefit: priority, not starvation of free room.
    for ds in sorted(unmeasured):
        extra = min(dataset_bytes.get(ds, 0) - out[ds], left)
        if extra > 0:
            out[ds] += extra
            left -= extra
    for ds in sorted(d for d in density if density[d] <= 0):
        out[ds] = min(dataset_bytes.get(ds, 0), left)
        left -= out[ds]
        what = "only room no one else needs" if out[ds] else "nothing"
        reasons[ds] = f"no benefit from caching, gets {what}: {why[ds]}"
    result = [
        Allocation(
            dataset=ds,
            bytes=out[ds],
            dataset_bytes=dataset_bytes.get(ds, 0),
            benefit_s_per_gb=seconds.get(ds, 0.0) * (1 << 30),
            jobs=tuple(sorted(j.job_id for j in by_ds[ds])),
            reason=reasons[ds],
        )
        for ds in by_ds
    ]
    result.sort(key=lambda a: (-a.bytes, a.dataset))
    return result
