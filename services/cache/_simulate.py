"""A pure simulation of one cache and its jobs over epochs (no I/O, logical time).

The same sampler, ledger and eviction policies the cache server uses, driven per batch:
``quiver`` uses substitutable hits, co-ordinated eviction and chunk prefetch; ``lru`` reads
samples in plain random order through a read-through LRU of the same capacity; ``none``
reads everything from the backing store. Used by tests to check the policies' hit rates and
by the benchmark as the expected figure beside the measured one.
"""

from __future__ import annotations

from dataclasses import dataclass

from microco.clients.cache import SubstitutableSampler

from ._eviction import ConsumptionTracker, Ledger, make_policy


@dataclass(frozen=True)
class SimResult:
    hit_rate_per_epoch: tuple[float, ...]
    cached_bytes: int


def simulate(
    policy: str,
    num_samples: int,
    samples_per_chunk: int,
    capacity_samples: int,
    *,
    epochs: int = 3,
    batch_size: int = 16,
    jobs: int = 1,
    prefetch_per_batch: int = 1,
    seed: int = 0,
) -> SimResult:
    """Hit rate per epoch (over all jobs) when every sample has size 1."""
    import random

    n_chunks = -(-num_samples // samples_per_chunk)
    chunk_of = [i // samples_per_chunk for i in range(num_samples)]
    members = [
        list(range(c * samples_per_chunk, min(num_samples, (c + 1) * samples_per_chunk)))
        for c in range(n_chunks)
    ]
    ledger, cons = Ledger(), ConsumptionTracker(ttl_s=1e18)
    pol = make_policy("lru" if policy == "lru" else "coordinated")
    rates = []
    for epoch in range(epochs):
        hits = total = 0
        if policy == "lru":
            for j in range(jobs):
                order = list(range(num_samples))
                random.Random(seed * 7919 + epoch * 31 + j).shuffle(order)
                for i in order:
                    total += 1
                    key = f"s{i}"
                    if key in ledger:
                        hits += 1
                        ledger.touch(key)
                        continue
                    adm = pol.admit(ledger, capacity_samples, key, 1, "ds", cons)
                    for v in adm.victims:
                        ledger.remove(v)
                    if adm.admitted:
                        ledger.add(key, 1, "ds")
        elif policy == "quiver":
            samplers = [SubstitutableSampler(num_samples, batch_size, seed=seed + j) for j in range(jobs)]
            seen: list[set[int]] = [set() for _ in range(jobs)]
            left = [[len(m) for m in members] for _ in range(jobs)]
            for s in samplers:
                s.start_epoch(epoch)
            for j in range(jobs):
                cons.report(f"job{j}", "ds", epoch, [], now=0)
            active = True
            while active:
                active = False
                for j, s in enumerate(samplers):
                    b = s.next_batch(lambda cands: {i for i in cands if f"c{chunk_of[i]}" in ledger})
                    if b is None:
                        continue
                    active = True
                    hits += len(b.hits)
                    total += len(b.indices)
                    done = []
                    for i in b.indices:
                        seen[j].add(i)
                        c = chunk_of[i]
                        left[j][c] -= 1
                        if left[j][c] == 0:
                            done.append(f"c{c}")
                    cons.report(f"job{j}", "ds", epoch, done, now=0)
                    # Prefetch: the next chunk none of whose samples this job has seen.
                    fetched = 0
                    for c in range(n_chunks):
                        if fetched >= prefetch_per_batch:
                            break
                        key = f"c{c}"
                        if key in ledger or left[j][c] != len(members[c]):
                            continue
                        adm = pol.admit(ledger, capacity_samples, key, len(members[c]), "ds", cons)
                        if not adm.admitted:
                            break
                        for v in adm.victims:
                            ledger.remove(v)
                        ledger.add(key, len(members[c]), "ds")
                        fetched += 1
        else:
            total = num_samples * jobs
        rates.append(hits / total if total else 0.0)
    return SimResult(tuple(rates), ledger.used)
