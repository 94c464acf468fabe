"""Background sampling for the plots.

Every ``sample_every_s`` the recorder asks the scheduler for its jobs and every cache server for
its counters (through their gRPC APIs, like any other client) and appends what changed to the
console's series in Redis. It also follows the scheduler's ``WatchJobs`` stream when the scheduler
offers one, so that short states (a migration of a few hundred milliseconds) are not missed
between samples. Failures are logged and retried on the next tick: a plot with a gap is fine.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from microco.common.errors import MicrocoError

from ._gateway import Gateway
from ._proto import to_dict
from ._series import SeriesStore
from ._views import (
    STORE_RECOVERY_SERIES,
    cache_samples,
    jobs_snapshot,
    record_job,
    store_recovery_sample,
)

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, gw: Gateway, series: SeriesStore, every_s: float) -> None:
        self.gw, self.series, self.every_s = gw, series, every_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_seen: dict[str, Any] = {}
        self._seen_lock = threading.Lock()
        self._watch_call: Any = None
        self.tracker: Any = None  # a _wall.ServiceTracker: services that leave the registry

    def start(self) -> Recorder:
        for target, name in ((self._sample_loop, "console-sampler"), (self._watch_loop, "console-watch")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        call = self._watch_call
        if call is not None:
            call.cancel()
        for t in self._threads:
            t.join(timeout=2.0)

    # -- one tick, also called directly by tests
    def sample_once(self) -> None:
        now = time.time()
        if self.tracker is not None:
            try:
                self.tracker.observe(self.gw.services(), now)
            except MicrocoError as exc:
                log.debug("registry sample failed: %s", exc)
        if self.gw.availability("scheduler")[0]:
            try:
                jobs = jobs_snapshot(self.gw)
            except MicrocoError as exc:
                log.debug("job sample failed: %s", exc)
            else:
                # Stamped when the answer came: a job submitted (and placed) while the call was
                # under way must not appear to have run before its submission.
                at = time.time()
                with self._seen_lock:
                    for job in jobs:
                        record_job(self.series, job, at, self._last_seen)
        if self.gw.availability("cache")[0]:
            for name, sample in cache_samples(self.gw):
                self.series.append(name, {"at": now, **sample})
        if self.gw.availability("store")[0]:
            try:
                recovery = store_recovery_sample(self.gw)
            except MicrocoError as exc:
                log.debug("store recovery sample failed: %s", exc)
            else:
                if recovery is not None:
                    self.series.append(STORE_RECOVERY_SERIES, {"at": now, **recovery})

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let the sampler die; the next tick retries
                log.exception("console sampling failed")
            self._stop.wait(self.every_s)

    def _watch_loop(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if not self.gw.availability("scheduler")[0]:
                    self._stop.wait(self.every_s)
                    continue
                self._watch_call = self.gw.scheduler().watch_call()
                for event in self._watch_call:
                    job = to_dict(event.job)
                    at = float(getattr(event, "at", 0.0) or time.time())
                    with self._seen_lock:
                        record_job(self.series, job, at, self._last_seen)
                    backoff = 1.0
            except Exception as exc:  # noqa: BLE001 - stream ended or scheduler failover: reconnect
                if self._stop.is_set():
                    return
                log.debug("job watch ended: %s", exc)
            finally:
                self._watch_call = None
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)
