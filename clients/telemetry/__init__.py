"""One job-side telemetry stream: each mini-batch measured once, published once.

A training process that embeds the scheduler hook, the cache loader and the compiler wrapper
used to time every mini-batch three times, each library with its own clock and its own idea of
where a step starts. Here the scheduler hook owns one :class:`StepTelemetry` for the process
and installs it (:func:`install`); the other libraries find it with :func:`current` and, when
there is one, stop timing steps themselves:

* the stream reads the step clock once per mini-batch, at the hook's ``step_end`` (the end of
  one step is the start of the next; a park or a checkpoint between them restarts it), and the
  process CPU time there too (a virtual device's busy time);
* the cache loader *adds* what it alone sees, the time the step waited for data
  (:meth:`StepTelemetry.add_data_wait`), and the compiler wrapper the time spent in its
  compiled regions (:meth:`StepTelemetry.add_region`);
* at ``step_end`` the stream closes the step into one immutable :class:`StepRecord` and hands
  the same object to every subscriber: the hook's introspection (mini-batch time,
  utilisation), the loader's stall/benefit estimate (wait and compute of the batch it
  delivered) and the compiler's trial timings (the step's compute time and region times).

Each library still works alone: with no stream installed it times steps as before.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["StepRecord", "StepTelemetry", "current", "install", "uninstall"]


@dataclass(frozen=True)
class StepRecord:
    """One mini-batch as the stream measured it (seconds)."""

    step: int
    step_s: float  # boundary to boundary: the whole mini-batch
    data_wait_s: float  # of which the loop waited for data (reported by the data loader)
    compiled_s: float  # of which in compiled regions (reported by the compiler wrapper)
    cpu_s: float  # process CPU time in the step (on a virtual device: its busy time)
    regions_s: dict[str, float] = field(default_factory=dict)

    @property
    def compute_s(self) -> float:
        """The step without its wait for data: what the devices (and the framework) took."""
        return max(0.0, self.step_s - self.data_wait_s)


Subscriber = Callable[[StepRecord], None]


class StepTelemetry:
    """The stream. ``clock`` / ``cpu_clock`` are read once per step (``reads`` counts them)."""

    def __init__(
        self,
        clock: Callable[[], float] | None = None,  # default: time.perf_counter
        cpu_clock: Callable[[], float] | None = None,  # default: time.process_time
    ) -> None:
        self._clock, self._cpu_clock = clock, cpu_clock
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self.reads = 0  # clock readings taken (one per step, one per restart of the boundary)
        self.published = 0
        self.last: StepRecord | None = None
        self._t0, self._cpu0 = self._read()
        self._wait = 0.0
        self._regions: dict[str, float] = {}

    def _read(self) -> tuple[float, float]:
        self.reads += 1
        # (looked up at each reading, so that a test patching the time module is obeyed)
        t = self._clock() if self._clock is not None else time.perf_counter()
        return t, self._cpu_clock() if self._cpu_clock is not None else time.process_time()

    # -- what the libraries add during a step
    def add_data_wait(self, seconds: float) -> None:
        with self._lock:
            self._wait += max(0.0, seconds)

    def add_region(self, name: str, seconds: float) -> None:
        with self._lock:
            self._regions[name] = self._regions.get(name, 0.0) + max(0.0, seconds)

    # -- the boundary (the hook's)
    def mark(self) -> None:
        """Restart the step here (after a park, a checkpoint, a restore): what passed since the
        last boundary belongs to no mini-batch."""
        with self._lock:
            self._t0, self._cpu0 = self._read()
            self._wait, self._regions = 0.0, {}

    def end_step(self, step: int) -> StepRecord:
        """Close the step: one clock reading, one record, handed to every subscriber."""
        with self._lock:
            t, cpu = self._read()
            rec = StepRecord(
                step=step,
                step_s=max(0.0, t - self._t0),
                data_wait_s=self._wait,
                compiled_s=sum(self._regions.values()),
                cpu_s=max(0.0, cpu - self._cpu0),
                regions_s=dict(self._regions),
            )
            self._t0, self._cpu0 = t, cpu
            self._wait, self._regions = 0.0, {}
            self.last = rec
            self.published += 1
            subscribers = list(self._subscribers)
        for fn in subscribers:
            fn(rec)
        return rec

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(record)`` after every step; returns the function that stops it."""
        with self._lock:
            self._subscribers.append(fn)

        def cancel() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return cancel


# Held weakly: the hook that drives the stream owns it, and a hook dropped without ``finish``
# (a test, an aborted loop) must not leave the other libraries waiting for records.
_current: weakref.ref[StepTelemetry] | None = None


def install(stream: StepTelemetry) -> StepTelemetry:
    """Make ``stream`` the process's stream (the scheduler hook does, when it is made)."""
    global _current
    _current = weakref.ref(stream)
    return stream


def uninstall(stream: StepTelemetry) -> None:
    global _current
    if _current is not None and _current() is stream:
        _current = None


def current() -> StepTelemetry | None:
    """The process's stream, or None when no hook drives one (each library then times alone)."""
    return _current() if _current is not None else None
