"""Quiver benchmark: ``microco bench cache [--quick] [--json]``.

Everything real: etcd, Redis and cache server processes (``--in-process``: servers in this
process, to check the benchmark's code quickly, not for figures); the backing store is a directory
behind a token bucket (``ThrottledStore``) with a set bandwidth, shared by every reader, like
a remote blob store's link. The dataset is about twice the cache (samples of DLIO's image
shape, ~110 KB). One run measures, side by side:

* one job, epochs with no cache, with an LRU cache (plain random order, read-through per
  sample; O(1) admission and eviction) and with Quiver (substitutable hits, co-ordinated
  eviction, prefetch) of the same capacity, their epochs interleaved (none, LRU, Quiver,
  none, ...) so that load on the machine falls on all three alike: steady-state epoch time
  and hit rate;
* the reader ahead of the step (``prefetch``): an I/O-bound epoch's share of the backing
  store's bandwidth, and a compute-bound epoch's time over its pure compute;
* allocation (``allocation``): an I/O-bound and a compute-bound job on one cache the size of
  one dataset, the share of it the I/O-bound job's dataset is given;
* data-parallel ranks (``ddp``): one rank on one host (its own link to the store, its own
  cache server) against 2 ranks on two hosts (a link and a cache server each; the two servers
  one cache spread over both hosts, each chunk on its owner), in step as DDP ranks are:
  exactly once across ranks, aggregate throughput against one rank;
* two jobs on one dataset: one shared Quiver cache against one cache per job (bytes cached,
  aggregate throughput);
* one cache server serving one client (gRPC stream, and same-host direct read of granted
  files) against reading the same bytes from local files.

Prints JSON; figures are measured in this run, nothing is assumed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from microco.common.identity import private_ca

MB = 1e6


def _make_dataset(root: Path, n: int, size: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    for i in range(n):
        # Random bytes (incompressible, like JPEG), sizes varying around ``size`` as real images do.
        s = max(1, int(size * rng.uniform(0.8, 1.2)))
        d = root / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:06d}.jpg").write_bytes(rng.randbytes(s))
    return sum(f.stat().st_size for f in root.rglob("*.jpg"))


class _Salted:
    """A store whose every sample is ``salt`` + the inner store's bytes: the same files as
    other bytes (other digests), for a round of the benchmark on cold caches."""

    def __init__(self, inner: Any, salt: bytes) -> None:
        self.inner, self.salt, self.url = inner, salt, inner.url

    def list_files(self) -> list[tuple[str, int]]:
        return [(p, n + len(self.salt)) for p, n in self.inner.list_files()]

    def read(self, path: str) -> bytes:
        return self.salt + self.inner.read(path)

    def write(self, path: str, data: bytes) -> None:
        raise OSError("read-only")


class _Server:
    def __init__(
        self, tmp: Path, name: str, etcd: str, redis: str, capacity: int, policy: str, extra: tuple = ()
    ) -> None:
        from microco.services.stack import free_port

        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data = tmp / f"server-{name}"
        self.log = open(tmp / f"server-{name}.log", "wb")
        cmd = [
            sys.executable,
            "-m",
            "microco.services.cache",
            "--port",
            str(self.port),
            "--etcd",
            etcd,
            "--redis",
            redis,
            "--data-dir",
            str(self.data),
            "--capacity",
            str(capacity),
            "--policy",
            policy,
            "--metrics-port",
            "-1",
            "--grace-s",
            "0.5",
            "--log-level",
            os.environ.get("QB_LOG", "warning"),
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 240) -> None:
        from microco.clients.cache import CacheClient

        deadline = time.monotonic() + timeout
        with CacheClient(self.address, timeout=2) as c:
            while True:
                if self.proc.poll() is not None:
                    self.log.flush()
                    tail = Path(self.log.name).read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"cache server exited with {self.proc.returncode}; {self.log.name} ends:\n{tail}"
                    )
                try:
                    c.stats(timeout=1)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    def stats(self) -> Any:
        from microco.clients.cache import CacheClient

        with CacheClient(self.address) as c:
            return c.stats()


class _InProcessServer:
    """A cache server in this process (``--in-process``): the same core and servicer, no etcd
    or Redis, no process to start. For a check of the benchmark's code, not for its figures
    (the server then shares this process's interpreter with the loaders)."""

    def __init__(self, tmp: Path, name: str, capacity: int, policy: str) -> None:
        import socket

        from microco.services.cache import CacheCore, CacheServicer, ChunkStore, serve_in_process

        node = os.environ.get("MICROCO_NODE", socket.gethostname())  # (the loaders' default)
        core = CacheCore(ChunkStore(str(tmp / f"server-{name}")), capacity, policy, node=node)
        self._server, self.address = serve_in_process(CacheServicer(core))

    def wait_ready(self) -> None:
        pass

    def stop(self) -> None:
        self._server.stop(0)

    def stats(self) -> Any:
        from microco.clients.cache import CacheClient

        with CacheClient(self.address) as c:
            return c.stats()


def _run_epoch(loader: Any, e: int, compute_s: float, seen: list[int] | None = None) -> dict[str, float]:
    """Run epoch ``e``, sleeping ``compute_s`` per batch (the training step): its wall time,
    hit rate and backing-store bytes (``seen`` collects the indices read)."""
    h0, m0, b0 = loader.stats.hits, loader.stats.misses, loader.stats.backing_bytes
    t0 = time.perf_counter()
    n = 0
    for indices, _samples in loader.epoch(e):
        n += len(indices)
        if seen is not None:
            seen += indices
        if compute_s:
            time.sleep(compute_s)
    dt = time.perf_counter() - t0
    hits, misses = loader.stats.hits - h0, loader.stats.misses - m0
    assert n == loader.sampler.shard_size and hits + misses >= n, "every sample exactly once"
    backing = loader.stats.backing_bytes - b0
    total = loader.index.total_bytes * n / len(loader.index)
    # Hit rate by bytes: the share of the epoch's data not read from the backing store in
    # it (a chunk fetched whole on a miss counts as read). sample_hit_rate: samples served
    # from the cache (those of a chunk fetched whole on a miss count as misses).
    return {
        "epoch_s": dt,
        "hit_rate": max(0.0, 1 - backing / total),
        "sample_hit_rate": hits / n,
        "backing_mb": backing / MB,
    }


def _run_epochs(loader: Any, epochs: int, compute_s: float) -> list[dict[str, float]]:
    return [_run_epoch(loader, e, compute_s) for e in range(epochs)]


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    from microco.clients.cache import QuiverLoader
    from microco.services.cache import LocalStore, ThrottledStore, build_index, simulate
    from microco.services.stack import EtcdServer, RedisServer

    n = args.samples or (192 if quick else 768)
    sample = args.sample_kb * 1000
    bw = args.bandwidth_mb_s * MB
    batch = args.batch_size
    epochs = 2 if quick else 3
    compute_s = args.compute_ms / 1000
    # 16 samples per chunk, but no chunk over 4 MB unless a sample is (multi-MB volumes: one each).
    chunk_bytes = int(min(16 * sample, max(sample, 4e6)))
    result: dict[str, Any] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as tmpname, ExitStack() as stack:
        tmp = Path(tmpname)
        data = tmp / "data"
        total = _make_dataset(data, n, sample)
        capacity = total // 2
        private_ca(tmp / "pki")  # the servers it starts are its own: so are their identities
        if not args.in_process:
            etcd = EtcdServer(tmp / "etcd").start()
            stack.callback(etcd.stop)
            redis = RedisServer(tmp / "redis").start()
            stack.callback(redis.stop)
        names = {
            "lru": ("lru", capacity),
            "quiver": ("coordinated", capacity),
            "shared": ("coordinated", capacity),
            "job0": ("coordinated", capacity),
            "job1": ("coordinated", capacity),
            "half0": ("coordinated", capacity // 2),
            "half1": ("coordinated", capacity // 2),
            "serve": ("coordinated", 2 * total),
            "alloc": ("coordinated", total),
            "ddp1": ("coordinated", capacity),
            # Two hosts' cache servers, one spread cache per pool (told apart by a label):
            # each the size of the one-rank host's, and, for comparison, half of it each.
            "ddp2a": ("coordinated", capacity),
            "ddp2b": ("coordinated", capacity),
            "ddp2ha": ("coordinated", capacity // 2),
            "ddp2hb": ("coordinated", capacity // 2),
            "ddp2sa": ("coordinated", capacity),  # (two ranks on one shared link)
            "ddp2sb": ("coordinated", capacity),
            # The same for the I/O-bound run (cold caches of their own).
            "io1": ("coordinated", capacity),
            "io2a": ("coordinated", capacity),
            "io2b": ("coordinated", capacity),
            "io2ha": ("coordinated", capacity // 2),
            "io2hb": ("coordinated", capacity // 2),
            "io2sa": ("coordinated", capacity),
            "io2sb": ("coordinated", capacity),
        }
        uses = {
            "one_job": ("lru", "quiver"),
            "two_jobs": ("shared", "job0", "job1", "half0", "half1"),
            "allocation": ("alloc",),
            "ddp": tuple(
                f"{p}{k}" for p in ("ddp", "io") for k in ("1", "2a", "2b", "2ha", "2hb", "2sa", "2sb")
            ),
            "serving": ("serve",),
        }
        only = set(args.only or uses.keys() | {"prefetch"})

        def want(section: str) -> bool:
            return section in only

        names = {k: v for k, v in names.items() if any(k in uses[s] for s in only if s in uses)}
        extra = {
            k: ("--node", f"host-{k[-1]}", "--label", f"pool={k[:-1]}")
            for p in ("ddp", "io")
            for k in (f"{p}2a", f"{p}2b", f"{p}2ha", f"{p}2hb", f"{p}2sa", f"{p}2sb")
        }
        servers: dict[str, _Server | _InProcessServer] = {
            k: _InProcessServer(tmp, k, cap, pol)
            if args.in_process
            else _Server(tmp, k, etcd.endpoint, redis.url, cap, pol, extra.get(k, ()))
            for k, (pol, cap) in names.items()
        }
        for s in servers.values():
            stack.callback(s.stop)
        for s in servers.values():
            s.wait_ready()
        phases = {"setup": time.perf_counter() - t_start}
        local = LocalStore(str(data))
        files = local.list_files()
        index = build_index(files, local.read, chunk_bytes)
        per_sample = build_index(files, local.read, 1)  # the LRU baseline caches samples, not chunks
        result.update(
            cache_to_dataset_ratio=capacity / total,
            dataset_mb=total / MB,
            cache_mb=capacity / MB,
            samples=n,
            sample_kb=sample / 1000,
            chunk_mb=chunk_bytes / MB,
            backing_mb_s=bw / MB,
            compute_ms_per_batch=args.compute_ms,
            batch_size=batch,
            epochs=epochs,
        )

        def loader(idx: Any, store: Any, server: str | None | bool, job: str, **kw: Any) -> QuiverLoader:
            return QuiverLoader(
                idx,
                store,
                batch_size=batch,
                dataset="bench",
                job_id=job,
                server=server,
                seed=hash(job) % 97,
                **kw,
            )

        batch_read_s = batch * sample / bw
        cb_compute = 2 * batch_read_s  # compute takes twice the batch's read: I/O can hide
        t_phase = time.perf_counter()
        if want("one_job"):
            # -- one job: none, LRU, Quiver, epochs interleaved
            one = {
                "none": loader(index, ThrottledStore(local, bw), None, "none", prefetch=False),
                "lru": loader(
                    per_sample,
                    ThrottledStore(local, bw),
                    servers["lru"].address,
                    "lru",
                    prefetch=False,
                    substitutable=False,
                    insert_misses=True,
                    probe_batches=0,
                ),
                "quiver": loader(index, ThrottledStore(local, bw), servers["quiver"].address, "quiver"),
            }
            policies: dict[str, list[dict[str, float]]] = {k: [] for k in one}
            for e in range(epochs):
                for name, ld in one.items():
                    policies[name].append(_run_epoch(ld, e, compute_s))
            quiver_stats = one["quiver"].stats
            for ld in one.values():
                ld.close()
            for name, runs in policies.items():
                steady = runs[1:]  # the first epoch warms the cache
                result[name] = {
                    "epoch_s": sum(r["epoch_s"] for r in steady) / len(steady),
                    "hit_rate": sum(r["hit_rate"] for r in steady) / len(steady),
                    "sample_hit_rate": sum(r["sample_hit_rate"] for r in steady) / len(steady),
                    "backing_mb_per_epoch": sum(r["backing_mb"] for r in steady) / len(steady),
                    "first_epoch_s": runs[0]["epoch_s"],
                    "per_epoch": runs,
                }
            result["quiver"]["prefetched_chunks"] = quiver_stats.prefetched_chunks
            result["quiver_vs_lru_speedup"] = result["lru"]["epoch_s"] / result["quiver"]["epoch_s"]
            result["quiver_vs_none_speedup"] = result["none"]["epoch_s"] / result["quiver"]["epoch_s"]
            # LRU's hit rate under random order without I/O (the same policy code), as a cross-check.
            result["simulated_lru_hit_rate"] = simulate(
                "lru", len(per_sample), 1, int(len(per_sample) * capacity / total), epochs=epochs
            ).hit_rate_per_epoch[-1]

            phases["one_job"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        if want("two_jobs"):
            # -- two jobs on one dataset: one shared cache vs one cache per job (same link)
            def two_jobs(addresses: list[str]) -> float:
                link = ThrottledStore(local, bw)  # both jobs behind one link to the store
                loaders = [loader(index, link, addresses[j], f"pair{j}-{addresses[j]}") for j in range(2)]

                def go(ld: QuiverLoader) -> None:
                    _run_epochs(ld, epochs, compute_s)

                t0 = time.perf_counter()
                threads = [threading.Thread(target=go, args=(ld,)) for ld in loaders]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                for ld in loaders:
                    ld.close()
                return 2 * epochs * total / wall / MB

            shared_tput = two_jobs([servers["shared"].address] * 2)
            per_job_tput = two_jobs([servers["job0"].address, servers["job1"].address])
            half_tput = two_jobs([servers["half0"].address, servers["half1"].address])
            # Shared: one cache of capacity C for both jobs. Per job: a cache of C each (what two
            # users with separate caches hold: the same data twice). Per job, half: C/2 each, the
            # same total budget as the shared cache.
            result["shared_bytes_cached"] = servers["shared"].stats().used_bytes
            result["per_job_bytes_cached"] = (
                servers["job0"].stats().used_bytes + servers["job1"].stats().used_bytes
            )
            result["shared_throughput_mb_s"] = shared_tput
            result["per_job_throughput_mb_s"] = per_job_tput
            result["per_job_half_capacity_bytes_cached"] = (
                servers["half0"].stats().used_bytes + servers["half1"].stats().used_bytes
            )
            result["per_job_half_capacity_throughput_mb_s"] = half_tput
            result["shared_vs_per_job_half_capacity_speedup"] = shared_tput / half_tput

            phases["two_jobs"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        if want("prefetch"):
            # -- the reader ahead of the step, no cache: I/O-bound and compute-bound epochs
            ld = loader(index, ThrottledStore(local, bw), False, "pf-io", prefetch=False)
            io_run = _run_epoch(ld, 0, 0.0)
            ld.close()
            ld = loader(index, ThrottledStore(local, bw), False, "pf-cpu", prefetch=False)
            cb_run = _run_epoch(ld, 0, cb_compute)
            ld.close()
            n_batches = -(-n // batch)
            result["prefetch"] = {
                "batches_ahead": 2,
                "io_bound_fraction_of_bandwidth": total / io_run["epoch_s"] / bw,
                "compute_bound_overhead": cb_run["epoch_s"] / (n_batches * cb_compute) - 1,
                "compute_bound_compute_s_per_batch": cb_compute,
            }
            phases["prefetch"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        if want("allocation"):
            # -- allocation: an I/O-bound and a compute-bound job share a cache one dataset large
            other = tmp / "data2"
            _make_dataset(other, n, sample, seed=1)
            local2 = LocalStore(str(other))
            index2 = build_index(local2.list_files(), local2.read, chunk_bytes)
            jobs = {
                "io": QuiverLoader(
                    index,
                    ThrottledStore(local, bw),
                    batch_size=batch,
                    dataset="io-data",
                    job_id="io-job",
                    server=servers["alloc"].address,
                ),
                "cpu": QuiverLoader(
                    index2,
                    ThrottledStore(local2, bw),
                    batch_size=batch,
                    dataset="cpu-data",
                    job_id="cpu-job",
                    server=servers["alloc"].address,
                ),
            }
            work = {"io": 0.0, "cpu": cb_compute}

            def alloc_job(name: str) -> None:
                for e in range(2):  # the probe batches run in the first two epochs
                    _run_epoch(jobs[name], e, work[name])

            threads = [threading.Thread(target=alloc_job, args=(k,)) for k in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            from microco.clients.cache import CacheClient

            with CacheClient(servers["alloc"].address) as c:
                got_alloc = c.allocations()
            for ld in jobs.values():
                ld.close()
            shares = {a.dataset: a.bytes / got_alloc.capacity_bytes for a in got_alloc.allocations}
            result["allocation"] = {
                "io_bound_share": shares.get("io-data", 0.0),
                "compute_bound_share": shares.get("cpu-data", 0.0),
                # Each job's own measurement: the share of an all-miss batch's time that all
                # hits save (the loader's paired points), and its reads for the cache's fill.
                "measured_saving": {k: ld.stats.cache_saving for k, ld in jobs.items()},
                "fill_mb": {k: ld.stats.fill_bytes / MB for k, ld in jobs.items()},
                "reasons": {a.dataset: a.reason for a in got_alloc.allocations},
            }
            phases["allocation"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()

        if want("ddp"):
            # -- data-parallel: one rank on one host against 2 ranks on two hosts. A host has its
            # own link to the backing store and its own cache server; the 2-rank run's servers are
            # one cache spread over both hosts (each chunk on its owner, found in etcd), each rank
            # reading its own host's server directly and the other's by streaming. Ranks step
            # together (a barrier per batch stands in for DDP's all-reduce).
            from microco.clients.cache import SpreadCache, ThreadExchange
            from microco.common.kv import EtcdKV

            kv = EtcdKV(etcd.endpoint)
            stack.callback(kv.close)
            trials = max(1, args.ddp_trials)

            def ddp(
                world: int,
                pool: str,
                idx: Any,
                src: Any,
                link_bw: float,
                name: str,
                compute: float,
                shared_link: bool = False,
            ) -> dict[str, Any]:
                caches: list[Any] = (
                    [servers[pool].address]
                    if world == 1
                    else [SpreadCache(kv, labels={"pool": pool}) for _ in range(world)]
                )
                group = ThreadExchange(world) if world > 1 else None  # the ranks trade hits
                link = ThrottledStore(src, link_bw)
                ranks = [
                    QuiverLoader(
                        idx,
                        link if shared_link else ThrottledStore(src, link_bw),  # a link per rank
                        batch_size=batch,
                        dataset=name,
                        job_id=f"{name}-{pool or world}",
                        server=caches[r],
                        node=f"host-{'ab'[r]}" if world > 1 else None,
                        world_size=world,
                        rank=r,
                        exchange=group.member(r) if group is not None else None,
                    )
                    for r in range(world)
                ]
                steps = max(len(ld) for ld in ranks)
                step = threading.Barrier(world)
                seen: list[list[int]] = [[] for _ in range(epochs)]
                runs: list[list[dict[str, float]]] = [[] for _ in range(world)]
                ends: list[float] = [0.0] * epochs

                def go(r: int) -> None:
                    ld = ranks[r]
                    for e in range(epochs):
                        h0, m0, b0 = ld.stats.hits, ld.stats.misses, ld.stats.backing_bytes
                        k = 0
                        for indices, _samples in ld.epoch(e):
                            seen[e].extend(indices)
                            step.wait()
                            time.sleep(compute)
                            k += 1
                        for _ in range(steps - k):  # (a rank with a batch less waits for the others)
                            step.wait()
                        ends[e] = time.perf_counter()
                        runs[r].append(
                            {
                                "hits": ld.stats.hits - h0,
                                "misses": ld.stats.misses - m0,
                                "backing_mb": (ld.stats.backing_bytes - b0) / MB,
                            }
                        )

                t0 = time.perf_counter()
                threads = [threading.Thread(target=go, args=(r,)) for r in range(world)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                for ld in ranks:
                    ld.close()
                for c in caches:
                    if isinstance(c, SpreadCache):
                        c.close()
                epoch_s = [ends[0] - t0] + [ends[e] - ends[e - 1] for e in range(1, epochs)]
                backing = [sum(runs[r][e]["backing_mb"] for r in range(world)) for e in range(epochs)]
                steady = range(1, epochs)
                return {
                    "exactly_once": all(sorted(x) == list(range(n)) for x in seen),
                    "mb_s": epochs * idx.total_bytes / wall / MB,
                    "steady_mb_s": (epochs - 1) * idx.total_bytes / sum(epoch_s[1:]) / MB,
                    "epoch_s": epoch_s,
                    "backing_mb_per_epoch": backing,
                    "steady_hit_rate": sum(max(0.0, 1 - backing[e] * MB / idx.total_bytes) for e in steady)
                    / len(steady),
                    "misses_per_epoch": [
                        sum(runs[r][e]["misses"] for r in range(world)) for e in range(epochs)
                    ],
                    "hits_per_epoch": [sum(runs[r][e]["hits"] for r in range(world)) for e in range(epochs)],
                }

            def section(p: str, link_bw: float, compute: float) -> dict[str, Any]:
                """``trials`` rounds of one rank, two ranks, two ranks at the same total cache and
                two ranks on one shared link, interleaved (the order rotates each round), each on
                cold caches: a round's dataset is the bench's with a salt of its own in front of
                every sample (other bytes, other digests), so nothing a server holds from an
                earlier round is a hit; earlier rounds' chunks belong to finished jobs and are
                evicted first."""
                variants = {
                    "one_rank": (1, f"{p}1", False),
                    "two_ranks": (2, f"{p}2", False),
                    "two_ranks_same_total_cache": (2, f"{p}2h", False),
                    "two_ranks_shared_link": (2, f"{p}2s", True),
                }
                runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
                loads: list[float] = []
                for t in range(trials):
                    keys = list(variants)
                    for k in keys[t % len(keys) :] + keys[: t % len(keys)]:
                        world, pool, shared = variants[k]
                        salted = _Salted(local, f"{p}-{k}-{t}\n".encode())
                        idx = build_index(files, salted.read, chunk_bytes)
                        loads.append(os.getloadavg()[0])
                        runs[k].append(
                            ddp(world, pool, idx, salted, link_bw, f"{p}-{k}-{t}", compute, shared)
                        )
                one = runs["one_rank"]

                def ratios(k: str, field: str = "mb_s") -> list[float]:
                    return [b[field] / a[field] for a, b in zip(one, runs[k], strict=True)]

                def median(xs: list[float]) -> float:
                    return sorted(xs)[len(xs) // 2]

                held = {k: servers[p + k].stats().used_bytes / MB for k in ("2a", "2b", "2ha", "2hb")}
                return {
                    "link_mb_s": link_bw / MB,
                    "compute_ms_per_batch": compute * 1000,
                    "trials": trials,
                    "exactly_once": all(r["exactly_once"] for rs in runs.values() for r in rs),
                    # The median of the trials' ratios, each against the one rank of its round.
                    "speedup_vs_one_rank": median(ratios("two_ranks")),
                    "speedup_trials": ratios("two_ranks"),
                    "steady_speedup_vs_one_rank": median(ratios("two_ranks", "steady_mb_s")),
                    "same_total_cache_speedup": median(ratios("two_ranks_same_total_cache")),
                    "same_total_cache_trials": ratios("two_ranks_same_total_cache"),
                    "shared_link_speedup": median(ratios("two_ranks_shared_link")),
                    "shared_link_trials": ratios("two_ranks_shared_link"),
                    # Share of the one-rank runs' time their link was busy: near 1 is I/O-bound.
                    "one_rank_link_busy": median(
                        [sum(r["backing_mb_per_epoch"]) * MB / link_bw / sum(r["epoch_s"]) for r in one]
                    ),
                    "one_rank_mb_s": median([r["mb_s"] for r in one]),
                    "two_ranks_mb_s": median([r["mb_s"] for r in runs["two_ranks"]]),
                    "load_average": [min(loads), max(loads)],
                    "held_mb_after": held,
                    **{k: rs[0] for k, rs in runs.items()},  # the first round's details
                    "rounds": runs,
                }

            at_bench = section("ddp", bw, compute_s)
            # I/O-bound: servers of its own (cold), a slower link per rank, no compute.
            io = section("io", args.ddp_bandwidth_mb_s * MB, 0.0)
            result["ddp"] = {
                "ranks": 2,
                "exactly_once": io["exactly_once"] and at_bench["exactly_once"],
                "speedup_vs_one_rank": io["speedup_vs_one_rank"],
                "setup": (
                    "1 rank: one host, one link, one cache server of C; 2 ranks (threads, a barrier "
                    "per step, hits exchanged): two hosts, a link and a cache server of C each "
                    "(same_total_cache: C/2 each; shared_link: both ranks on one link), the two "
                    "servers one spread cache; io_bound: links of --ddp-bandwidth-mb-s, no compute; "
                    "at_bench_bandwidth: the bench's link and compute; each variant --ddp-trials "
                    "times, interleaved, on cold caches; ratios are the median of the rounds'"
                ),
                "io_bound": io,
                "at_bench_bandwidth": at_bench,
            }
            phases["ddp"] = time.perf_counter() - t_phase
        t_phase = time.perf_counter()
        if want("serving"):
            # -- serving: one server, one client, warm, against local files
            srv = servers["serve"]
            warm = loader(index, local, srv.address, "serve-warm", prefetch=False)
            warm.warm()
            warm.close()
            reads = [(index.chunks[s.chunk].digest, s.offset, s.size, s.digest) for s in index.samples]
            from microco.clients.cache import CacheClient

            reps = 2 if quick else 4
            with CacheClient(srv.address, timeout=120) as c:
                c.read_samples(reads[:batch])
                t0 = time.perf_counter()
                got = 0
                for _ in range(reps):
                    for i in range(0, len(reads), 256):
                        got += sum(len(x or b"") for x in c.read_samples(reads[i : i + 256]))
                serve = got / (time.perf_counter() - t0) / MB
            direct = loader(index, local, srv.address, "serve-direct", prefetch=False)
            idx_all = list(range(len(index)))
            direct.read(idx_all, idx_all)
            t0 = time.perf_counter()
            got = 0
            for _ in range(reps):
                for i in range(0, len(idx_all), 256):
                    got += sum(map(len, direct.read(idx_all[i : i + 256], idx_all[i : i + 256])))
            serve_direct = got / (time.perf_counter() - t0) / MB
            direct.close()
            for p, _ in files:  # page-cache warm, as the server's files are
                local.read(p)
            t0 = time.perf_counter()
            got = 0
            for _ in range(reps):
                for p, _ in files:
                    got += len(local.read(p))
            local_mb_s = got / (time.perf_counter() - t0) / MB
            result["serve_mb_s"] = serve
            result["serve_direct_mb_s"] = serve_direct
            result["local_read_mb_s"] = local_mb_s
            result["serve_vs_local"] = serve / local_mb_s
            result["serve_direct_vs_local"] = serve_direct / local_mb_s
            phases["serving"] = time.perf_counter() - t_phase
        result["phase_s"] = phases
        shutil.rmtree(data, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="microco bench cache", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small dataset, 2 epochs: a few minutes")
    p.add_argument("--json", action="store_true", help="JSON only on stdout (the default output is JSON too)")
    p.add_argument("--samples", type=int, default=0, help="number of samples (default 192 quick, 768 full)")
    p.add_argument("--sample-kb", type=float, default=110, help="mean sample size in KB (DLIO image: ~110)")
    p.add_argument("--bandwidth-mb-s", type=float, default=20, help="backing store bandwidth, MB/s")
    p.add_argument("--batch-size", type=int, default=16, help="samples per mini-batch")
    p.add_argument("--compute-ms", type=float, default=5, help="simulated training step per batch, ms")
    p.add_argument(
        "--ddp-bandwidth-mb-s",
        type=float,
        default=5,
        help="each host's link in the I/O-bound data-parallel run, MB/s",
    )
    p.add_argument(
        "--ddp-trials",
        type=int,
        default=3,
        help="rounds of the data-parallel variants, interleaved (ratios: the median round's)",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=["one_job", "two_jobs", "prefetch", "allocation", "ddp", "serving"],
        help="run only this section (repeatable); default all",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="cache servers in this process, no etcd or Redis: a check of the benchmark, not its figures (not ddp)",
    )
    args = p.parse_args(argv)
    if args.in_process and (args.only is None or "ddp" in args.only):
        p.error(
            "--in-process cannot run the ddp section (its spread cache needs etcd): name the others with --only"
        )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args.quick, args)
    print(json.dumps(result, indent=None if args.json else 2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
