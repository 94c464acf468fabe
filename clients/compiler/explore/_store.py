"""The compiler's state in the KV store (etcd in production, ``MemoryKV`` in unit tests).

Layout::

    /microco/compiler/explorations/<key>   the whole search state (JSON), written after every change
    /microco/compiler/committed/<key>      the committed configuration: what the next run starts from
    /microco/compiler/compile_costs/<key>  measured compile time (ms) per compiled choice, latest
                                           measurement: survives a forgotten or lost exploration

``<key>`` hashes the graph fingerprint, the input shapes and the hardware.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any

from microco.common import KV, InvalidArgument, NotFound

from . import _core
from ._core import Exploration, ExplorationPolicy
from .types import Config, GraphSpec, TrialReport

log = logging.getLogger(__name__)

PREFIX = "/microco/compiler/"
EXPLORATIONS = PREFIX + "explorations/"
COMMITTED = PREFIX + "committed/"
COMPILE_COSTS = PREFIX + "compile_costs/"


def _check_spec(spec: GraphSpec) -> None:
    if not spec.fingerprint:
        raise InvalidArgument("fingerprint is required")
    if spec.total_steps <= 0:
        raise InvalidArgument("total_steps must be positive")
    names = [v.name for v in spec.variables]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"duplicate variable names in {names}")
    for v in spec.variables:
        unknown = sorted(set(v.subsumes) - set(names))
        if unknown or v.name in v.subsumes:
            raise InvalidArgument(f"variable {v.name!r} subsumes unknown or itself: {unknown or [v.name]}")


class CompilerCore:
    """The compiler's behaviour over a KV store; the gRPC servicer and ``LocalExplorer`` wrap it.

    Every state change is written to the KV before the answer leaves, so a restarted service
    (a new ``CompilerCore`` over the same etcd) resumes each exploration where it was.
    """

    def __init__(self, kv: KV, policy: ExplorationPolicy | None = None, defer_progress: bool = False) -> None:
        self.kv = kv
        self.policy = policy or ExplorationPolicy()
        self._lock = threading.RLock()
        # ``defer_progress`` (the in-process explorer's; issue 18, session 31): an exploration not
        # yet committed lives in memory (``_live``) and is written at its commit, at ``flush`` or
        # at the process's exit, not after every trial. Writing it after every report (the
        # whole state as JSON, then the state file replaced) cost torch-lstm's 300-step run
        # 4-65 ms of its ~0.4 s (8-41 exploration steps). What a dying process loses is the
        # exploration in progress (the next run explores again); the commit is written at once,
        # and so is a compile's measured cost (the seconds it took are not paid twice).
        self.defer_progress = defer_progress
        self._live: dict[str, Exploration] = {}
        self._costs_written: dict[str, dict[str, float]] = {}

    # -- persistence
    def load(self, key: str) -> Exploration | None:
        live = self._live.get(key)
        if live is not None:
            return live
        raw = self.kv.get_json(EXPLORATIONS + key)
        return None if raw is None else Exploration.from_json(raw)

    def _save(self, state: Exploration) -> None:
        if self.defer_progress and not state.committed:
            self._live[state.key] = state
            if state.compile_costs and self._costs_written.get(state.key) != state.compile_costs:
                self.kv.put_json(COMPILE_COSTS + state.key, state.compile_costs)
                self._costs_written[state.key] = dict(state.compile_costs)
            return
        self._live.pop(state.key, None)
        self.kv.put_json(EXPLORATIONS + state.key, state.to_json())
        if state.compile_costs and self.kv.get_json(COMPILE_COSTS + state.key) != state.compile_costs:
            self.kv.put_json(COMPILE_COSTS + state.key, state.compile_costs)
        if state.committed:
            self.kv.put_json(COMMITTED + state.key, committed_record(state))

    def flush(self) -> None:
        """Write the explorations whose progress is held in memory (``defer_progress``)."""
        with self._lock:
            for key, state in list(self._live.items()):
                self.kv.put_json(EXPLORATIONS + key, state.to_json())
                del self._live[key]

    # -- operations
    def register(self, spec: GraphSpec, job_id: str = "") -> Config:
        """Start or resume the exploration of ``spec``; a committed key answers at once.
        ``job_id``: the scheduler job registering it (kept in ``Exploration.jobs``)."""
        _check_spec(spec)
        with self._lock:
            committed = self.kv.get_json(COMMITTED + spec.key)
            state = self.load(spec.key)
            if state is None:
                state = _core.start(spec, self.policy)
                # What compiles cost when earlier runs of this key measured them: the explorer
                # prices them by that, not by the cold-cache prior.
                state.compile_costs = dict(self.kv.get_json(COMPILE_COSTS + spec.key) or {})
                if committed is not None:  # state lost but the commit survived: reuse it
                    state.committed = True
                    state.trials.append(
                        _core.TrialRecord(
                            0,
                            dict(committed["values"]),
                            -1,
                            "committed",
                            done=True,
                            step_ms=committed.get("best_ms") or 0.0,
                        )
                    )
                    state.best = 0
            elif state.committed:
                state.spec = _core.with_run_priors(_core._with_total(state.spec, spec.total_steps), spec)
                # A new run: a candidate pruned for its compile cost may pay back now (a longer
                # run, or a compile measured cheaper since); otherwise zero exploration.
                _core.maybe_reopen(state, self.policy, spec.total_steps)
            state.runs += 1
            cfg = _core.next_config(state, self.policy)
            _core.note_job(state, job_id, time.time())
            self._save(state)
            return cfg

    def next_config(self, key: str) -> Config:
        with self._lock:
            state = self._get(key)
            cfg = _core.next_config(state, self.policy)
            self._save(state)
            return cfg

    def report(self, key: str, rep: TrialReport) -> Config:
        if any(not (s >= 0) for s in rep.step_ms):
            raise InvalidArgument("step times must be non-negative numbers")
        with self._lock:
            state = self._get(key)
            cfg = _core.report(state, rep, self.policy)
            self._save(state)
            return cfg

    def get(self, key: str) -> Exploration:
        return self._get(key)

    def list(self) -> list[Exploration]:
        stored = {
            state.key: state
            for state in (Exploration.from_json(v) for _, v in self.kv.get_prefix_json(EXPLORATIONS))
        }
        return list((stored | self._live).values())

    def _get(self, key: str) -> Exploration:
        state = self.load(key)
        if state is None:
            raise NotFound(f"no graph registered under key {key!r}")
        return state


def committed_record(state: Exploration) -> dict[str, Any]:
    base_ms, best_ms = state.measured_ms()
    return {
        "key": state.key,
        "model_name": state.spec.model_name,
        "framework": state.spec.framework,
        "fingerprint": state.spec.fingerprint,
        "input_shapes": state.spec.input_shapes,
        "hardware": state.spec.hardware,
        "values": state.best_values,
        # Interleaved figures (``Exploration.measured_ms``, ``speedup``): the medians of the
        # alternating A/B of the committed configuration against the baseline.
        "best_ms": best_ms,
        "baseline_ms": base_ms,
        "speedup": state.speedup,
        "interleaved": state.interleaved,
        "explore_steps": state.explore_steps,
        "compile_costs": dict(state.compile_costs),
        "committed_at": time.time(),
    }


class LocalExplorer:
    """The exploration core in-process (same decisions as the service, no network).

    ``LocalExplorer()`` keeps its state in memory (gone with the process);
    :meth:`on_disk` (what the wrappers use when given no explorer) keeps it in a file of this
    host, so the next run of the same model on this machine starts from its committed
    configuration with zero exploration steps."""

    def __init__(self, kv: KV | None = None, policy: ExplorationPolicy | None = None) -> None:
        if kv is None:
            from microco.common import MemoryKV

            kv = MemoryKV()
        # An exploration's progress is written at its commit (``CompilerCore.defer_progress``),
        # and what is still in memory when the process exits, then.
        self.core = CompilerCore(kv, policy, defer_progress=True)
        atexit.register(_flush_at_exit, weakref.ref(self.core))

    def flush(self) -> None:
        """Write the explorations in progress (otherwise written at their commit, or at exit)."""
        self.core.flush()

    @classmethod
    def on_disk(cls, path: str | None = None, policy: ExplorationPolicy | None = None) -> LocalExplorer:
        """The core over ``FileKV(path)`` (default ``_filekv.default_state_path()``:
        ``$MICROCO_COMPILER_STATE``, else ``~/.cache/microco/compiler_state.json``, beside the
        host's record of compile times)."""
        from ._filekv import FileKV, default_state_path

        return cls(FileKV(path or default_state_path()), policy)

    def register(self, spec: GraphSpec) -> Config:
        return self.core.register(spec)

    def report(self, key: str, report: TrialReport) -> Config:
        return self.core.report(key, report)


def _flush_at_exit(ref: weakref.ref[CompilerCore]) -> None:
    core = ref()
    if core is not None:
        try:
            core.flush()
        except Exception as exc:  # noqa: BLE001 - at exit, a state not written is an exploration run again
            log.info("explorations in progress not written at exit (%s)", exc)
