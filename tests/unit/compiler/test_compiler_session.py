"""Client-side trial bookkeeping: a hopeless trial is cut short, and what it measured is reported."""

from __future__ import annotations

import pytest

from microco.clients.compiler import ExplorationSession
from microco.clients.compiler.explore import (
    STAGE_FINE,
    STAGE_STRUCTURE,
    ExplorationPolicy,
    GraphSpec,
    LocalExplorer,
    Variable,
)
from microco.common import MemoryKV


@pytest.mark.parametrize("may_compile, cut_after", [(True, 2), (False, 1)])
def test_a_trial_far_slower_than_the_best_is_cut_short_and_never_committed(may_compile, cut_after):
    policy = ExplorationPolicy(measure_steps=3, retime_rounds=0)  # counts each trial's steps
    explorer = LocalExplorer(MemoryKV(), policy)
    spec = GraphSpec(
        "fp",
        "(2,)",
        "cpu",
        (
            Variable("r.hoist", ("off", "on"), "r", STAGE_STRUCTURE),
            Variable("threads", ("1", "2"), "", STAGE_FINE),
        ),
        total_steps=10_000,
    )
    session = ExplorationSession(explorer)
    cfg = session.register(spec)
    steps_per_config: dict[str, int] = {}
    for _ in range(40):
        if session.committed:
            break
        values = session.values
        key = f"{values['r.hoist']}/{values['threads']}"
        steps_per_config[key] = steps_per_config.get(key, 0) + 1
        ms = 10.0 if values["r.hoist"] == "on" else 12.0
        if values["threads"] == "2":
            ms = 500.0  # oversubscribed cores: hopeless
        session.record(ms, {"r": ms / 3}, may_compile=may_compile)
    assert session.committed and cfg.key == spec.key
    assert steps_per_config["off/1"] == 4 and steps_per_config["on/1"] >= 4  # full trials
    # Cut short: after the warm-up and one measurement, or after one step when nothing compiles.
    assert steps_per_config["on/2"] == cut_after
    assert session.values == {"r.hoist": "on", "threads": "1"}
    state = explorer.core.get(spec.key)
    slow = [t for t in state.trials if t.values["threads"] == "2"]
    assert slow and slow[0].steps == [500.0] * cut_after


def test_a_run_starting_compiled_reports_its_recompile_once_and_only_then():
    from microco.clients.compiler.explore import STAGE_COMPILE

    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0)
    kv = MemoryKV()
    spec = GraphSpec(
        "fp",
        "(2,)",
        "cpu",
        (Variable("r.compile", ("eager", "inductor"), "r", STAGE_COMPILE, compiles=True),),
        total_steps=100_000,
    )
    first = ExplorationSession(LocalExplorer(kv, policy))
    first.register(spec)
    while not first.committed:
        compiled = first.values["r.compile"] == "inductor"
        warm = not first._times  # the trial's first step compiles
        first.record((9000.0 if compiled and warm else 0.0) + (5.0 if compiled else 10.0), {"r": 3.0})
    assert first.values == {"r.compile": "inductor"}
    explorer = LocalExplorer(kv, policy)
    assert explorer.core.get(spec.key).compile_costs == {"r.compile=inductor": 9000.0}
    # The next run starts compiled: its first step recompiles (warm cache: 0.2 s), its second
    # measures; the two are reported once, as trial -1, and the cost is what it measured.
    second = ExplorationSession(explorer)
    assert second.register(spec).committed
    for ms in (205.0, 5.0, 5.0, 5.0):
        assert second.record(ms, {}) is None  # nothing pays back more: the commit stays in force
    assert explorer.core.get(spec.key).compile_costs == {"r.compile=inductor": 200.0}
    assert second.explore_steps == 0 and second.committed


def test_each_trial_reports_how_much_runnable_work_its_measured_steps_ran_beside(monkeypatch):
    """Each trial reports the runnable-thread count its measured steps ran beside (read per step
    from Linux' instant count). The count is injected here: a real machine's own load, which other
    processes move at will, must not decide whether the test passes."""
    from microco.clients.compiler import _session

    seen = {"now": 1}
    monkeypatch.setattr(_session, "runnable_threads", lambda: seen["now"])
    policy = ExplorationPolicy(measure_steps=5, retime_rounds=0)
    explorer = LocalExplorer(MemoryKV(), policy)
    spec = GraphSpec(
        "fp", "(2,)", "cpu", (Variable("r.hoist", ("off", "on"), "r", STAGE_STRUCTURE),), total_steps=10_000
    )
    session = ExplorationSession(explorer)
    session.register(spec)
    for _ in range(40):
        if session.committed:
            break
        # two other processes keep the CPU busy while "on" is measured
        seen["now"] = 3 if session.values["r.hoist"] == "on" else 1
        session.record(5.0, {"r": 1.0}, may_compile=False)
    state = explorer.core.get(spec.key)
    runnable = {t.values["r.hoist"]: t.runnable for t in state.trials if t.kind not in ("retime", "confirm")}
    assert runnable == {"off": 1.0, "on": 3.0}


def test_the_runnable_thread_count_is_read_from_the_machine():
    import sys

    from microco.clients.compiler._session import runnable_threads

    if not sys.platform.startswith("linux"):
        pytest.skip("the runnable-thread count is read from /proc/loadavg")
    assert runnable_threads() >= 1  # this test's own thread runs


class _FifoWarmer:
    """Stands in for ``BackgroundCompiler``: one compile at a time, in the order started; each
    takes ``polls[i]`` calls of ``busy()`` (one per waiting step)."""

    def __init__(self, polls):
        self.polls, self.queue, self.done, self.left = list(polls), [], [], 0

    def ready(self, values):
        return "inductor" not in values.values() or values in self.done

    def start(self, values):
        if values not in self.queue and values not in self.done:
            self.queue.append(dict(values))
            if len(self.queue) == 1:
                self.left = self.polls.pop(0) if self.polls else 5

    def busy(self):
        if self.queue:
            self.left -= 1
            if self.left <= 0:
                self.done.append(self.queue.pop(0))
                self.left = (self.polls.pop(0) if self.polls else 5) if self.queue else 0
        return bool(self.queue)

    def cancel(self):
        self.queue = []


def test_a_trial_whose_background_compile_is_done_runs_without_waiting_for_the_next_compile():
    # Llama at 15,000 steps (2026-12-03): two whole-step compiles deferred; the first done after
    # 38 s, but the hold reported pending until the second was done too (30 s more), and the
    # first trial, 1.7x faster, waited ~5,000 steps. Here the first compile takes 5 waiting
    # steps and the second 500: the first trial must run while the second still compiles.
    from microco.clients.compiler.explore import STAGE_COMPILE

    policy = ExplorationPolicy(measure_steps=2, max_explore_fraction=1.0, retime_rounds=0)
    explorer = LocalExplorer(MemoryKV(), policy)
    whole = dict(compiles=True, compile_prior_ms=100.0, prior_calibrated=True)
    spec = GraphSpec(
        "fp",
        "(2,)",
        "cpu",
        (
            Variable("model.rewrite", ("eager", "inductor"), "", STAGE_COMPILE, **whole),
            Variable("model.compile", ("eager", "inductor"), "", STAGE_COMPILE, **whole),
        ),
        total_steps=1_000_000,
    )
    warmer = _FifoWarmer([5, 500])
    session = ExplorationSession(explorer, warmer=warmer)
    session.register(spec)
    first_compiled_at = None
    for i in range(2_000):
        if session.committed:
            break
        values = session.values
        compiled = "inductor" in values.values()
        if compiled and first_compiled_at is None and not session.current.hold:
            first_compiled_at = i
        session.record(5.0 if compiled else 10.0, {})
    assert first_compiled_at is not None
    assert first_compiled_at < 100, first_compiled_at  # before: after the second compile, ~505
    assert session.committed
