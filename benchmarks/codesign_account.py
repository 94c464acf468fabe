"""Where the co-design benchmark's backing-store bytes go: ``microco bench codesign --account``.

One run of each mode, instrumented: every read from the backing store is recorded with who
made it (a job's reads for a batch, its loader's background prefetch, or a cache server's
follower prefetching for the scheduler), when, and on which host; every cache server's
inserts, evictions (and whose insert evicted) and refusals are recorded too. Each chunk read
is then classified by why it was not a hit:

* ``first``: the first read of that chunk in the run (unavoidable once);
* ``evicted``: it had been in this host's cache and was evicted (by an insert of the same or
  of another dataset);
* ``refused``: it was offered to this host's cache and refused (full of chunks some job still
  needs, or over its dataset's allocation);
* ``not_offered``: read before, but never inserted here (read sample by sample: the loader
  fetches a whole chunk only when none of its samples was read this epoch and the cache has
  room);
* ``other_host``: read before, held (or once held) only by the other host's cache (after the
  migration);
* ``cached``: it was in this host's cache when read (a race with an insert, or a chunk read
  whole before its insert was acknowledged).

Reads of one chunk by two jobs within ``overlap_s`` of each other are counted apart as
``overlapping`` (one fetch could have served both). Instrumentation only: the decisions are
the benchmark's own.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

READ_CLASSES = ("first", "evicted", "refused", "not_offered", "other_host", "cached")


@dataclass
class Account:
    """Events of one run (thread-safe appends)."""

    t0: float = field(default_factory=time.monotonic)
    # (t, who, why, host, sample path, bytes)
    reads: list[tuple[float, str, str, str, str, int]] = field(default_factory=list)
    # (t, host, insert | evict | refuse, chunk, the inserting dataset or the refusal)
    cache: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, who: str, host: str, path: str, n: int) -> None:
        name = threading.current_thread().name
        why = "follower" if who.startswith("follower") else "batch"
        if name.startswith("quiver-prefetch"):  # (the loader's own background inserts)
            why = "prefetch"
        with self.lock:
            self.reads.append((time.monotonic() - self.t0, who, why, host, path, n))

    def event(self, host: str, kind: str, chunk: str, detail: str = "") -> None:
        with self.lock:
            self.cache.append((time.monotonic() - self.t0, host, kind, chunk, detail))


class AccountedStore:
    """A backing store (the shared throttled link) whose reads are recorded for ``who``."""

    def __init__(self, inner: Any, account: Account, who: str, host: Any) -> None:
        self.inner, self.account, self.who, self._host = inner, account, who, host
        self.url = inner.url

    def list_files(self) -> list[tuple[str, int]]:
        return self.inner.list_files()

    def read(self, path: str) -> bytes:
        data = self.inner.read(path)
        host = self._host() if callable(self._host) else self._host
        self.account.read(self.who, host, path, len(data))
        return data


def accounted_core(account: Account, *args: Any, **kwargs: Any) -> Any:
    """A ``CacheCore`` whose inserts record what they stored, evicted or were refused."""
    from microco.services.cache import CacheCore

    class _Core(CacheCore):
        def put(self, d: str, data: bytes, dataset: str) -> Any:
            with self._lock:  # (serialises inserts: instrumentation only)
                before = set(self.ledger.entries)
                r = super().put(d, data, dataset)
                after = set(self.ledger.entries)
            for v in before - after:
                account.event(self.node, "evict", v, dataset)
            if r.outcome == "stored":
                account.event(self.node, "insert", d, dataset)
            elif r.outcome != "present":
                account.event(self.node, "refuse", d, r.outcome)
            return r

    return _Core(*args, **kwargs)


def summarise(account: Account, chunk_of: dict[str, str], dataset_of_chunk: dict[str, str]) -> dict:
    """Bytes read from the backing store by class, by reader, and per host and dataset."""
    events = sorted(account.cache)
    reads = sorted(account.reads)
    held: dict[tuple[str, str], bool] = defaultdict(bool)
    ever: dict[tuple[str, str], bool] = defaultdict(bool)
    refused: dict[tuple[str, str], str] = {}
    evicted_by: dict[tuple[str, str], str] = {}
    evicted_at: dict[tuple[str, str], float] = {}
    states: dict[str, list[tuple[float, str]]] = defaultdict(list)  # job -> (t, state)
    for t, _h, kind, job, state in events:
        if kind == "state":
            states[job].append((t, state))

    def ran_at(job: str, t: float) -> bool:
        now = "suspended"
        for when, state in states.get(job, ()):
            if when > t:
                break
            now = state
        return now == "running"

    seen: set[str] = set()
    last_read: dict[str, tuple[float, str]] = {}
    out: dict[str, Any] = {
        "bytes": {k: 0 for k in READ_CLASSES},
        "evicted_by": defaultdict(int),
        "refused_why": defaultdict(int),
        "by_reader": defaultdict(int),
        "by_dataset_class": defaultdict(int),
        "read_while_not_running": defaultdict(int),
        "overlapping_by_class": defaultdict(int),
        "by_host_dataset": defaultdict(int),
        "overlapping_bytes": 0,
        "sample_reads": 0,
    }
    i = 0
    for t, who, why, host, path, n in reads:
        while i < len(events) and events[i][0] <= t:
            _, h, kind, c, detail = events[i]
            if kind == "insert":
                held[h, c] = ever[h, c] = True
            elif kind == "evict":
                held[h, c] = False
                evicted_by[h, c] = detail
                evicted_at[h, c] = events[i][0]
            elif kind == "state":
                pass
            else:
                refused[h, c] = detail
            i += 1
        c = chunk_of.get(path, path)
        other = next(h for h in ("h1", "h2") if h != host) if host in ("h1", "h2") else ""
        if path not in seen:
            cls = "first"
        elif held[host, c]:
            cls = "cached"
        elif ever[host, c]:
            cls = "evicted"
            same = evicted_by[host, c] == dataset_of_chunk.get(c, "")
            out["evicted_by"]["same dataset" if same else "other dataset"] += n
            when = "reader running" if ran_at(who, evicted_at[host, c]) else "reader not running"
            out["evicted_by"][f"while the {when}"] += n
        elif (host, c) in refused:
            cls = "refused"
            out["refused_why"][refused[host, c]] += n
        elif ever[other, c]:
            cls = "other_host"
        else:
            cls = "not_offered"
        out["bytes"][cls] += n
        out["by_dataset_class"][f"{dataset_of_chunk.get(c, '?')}:{cls}"] += n
        out["by_reader"][f"{who}:{why}"] += n
        if why != "follower" and not ran_at(who, t):  # (a parked job's loader threads read on)
            out["read_while_not_running"][why] += n
        out["by_host_dataset"][f"{host}:{dataset_of_chunk.get(c, '?')}"] += n
        prev = last_read.get(path)
        if prev is not None and prev[1] != who and t - prev[0] < account_overlap_s:
            out["overlapping_bytes"] += n
            out["overlapping_by_class"][cls] += n
        last_read[path] = (t, who)
        seen.add(path)
        out["sample_reads"] += 1
    out["total_bytes"] = sum(out["bytes"].values())
    return {k: dict(v) if isinstance(v, defaultdict) else v for k, v in out.items()}


account_overlap_s = 0.5  # two jobs' reads of one chunk this close: one fetch could serve both
