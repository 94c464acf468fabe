"""Issue 18: what the in-process explorer learned stays on the host (the second run of a model
starts tuned), beside the host's measured compile times, which price compiles not measured yet."""

from __future__ import annotations

import json

import pytest

from microco.clients.compiler import ExplorationSession
from microco.clients.compiler._compile_costs import HostCompileCosts, default_path
from microco.clients.compiler.explore import ExplorationPolicy, GraphSpec, LocalExplorer, Variable
from microco.clients.compiler.explore._filekv import FileKV, default_state_path
from microco.common import InvalidArgument


def test_file_kv_round_trip_and_two_writers(tmp_path):
    path = tmp_path / "state.json"
    a, b = FileKV(path), FileKV(path)
    a.put_json("/k/1", {"x": 1})
    b.put_json("/k/2", {"x": 2})  # b re-reads the file before writing: a's key survives
    assert FileKV(path).get_json("/k/1") == {"x": 1}
    assert a.get_json("/k/2") == {"x": 2}  # a sees b's write (reloaded on change)
    assert [k for k, _ in a.get_prefix("/k/")] == ["/k/1", "/k/2"]
    assert b.delete("/k/1") and FileKV(path).get("/k/1") is None
    assert a.delete_prefix("/k/") == 1 and json.loads(path.read_text()) == {}
    with pytest.raises(InvalidArgument):
        a.put("/bin", b"\xff\xfe")


def test_file_kv_corrupt_file_is_empty(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{nope")
    kv = FileKV(path)
    assert kv.get("/x") is None
    kv.put_json("/x", 1)
    assert FileKV(path).get_json("/x") == 1


def test_state_and_compile_costs_live_together(tmp_path, monkeypatch):
    monkeypatch.delenv("MICROCO_COMPILE_COSTS", raising=False)
    monkeypatch.delenv("MICROCO_COMPILER_STATE", raising=False)
    monkeypatch.setenv("MICROCO_COMPILER_HOME", str(tmp_path))
    assert default_state_path().parent == default_path().parent == tmp_path


SPEC = GraphSpec(
    fingerprint="fp",
    input_shapes="(4, 4)",
    hardware="cpu-x",
    variables=(Variable("r.hoist", ("off", "on"), "r"), Variable("threads", ("1", "2"))),
    model_name="m",
    total_steps=1000,
)

# A fake cost model: ms per step of each configuration (hoisting helps, 2 threads hurt).
COST = {"r.hoist=off;threads=1": 10.0, "r.hoist=on;threads=1": 7.0, "r.hoist=off;threads=2": 30.0}


def _ms(values):
    key = ";".join(f"{k}={v}" for k, v in sorted(values.items()))
    return COST.get(key, 7.0 if values.get("r.hoist") == "on" else 30.0)


def _run(explorer, steps=300):
    """A run of the model: (steps spent exploring, the values it ended under)."""
    s = ExplorationSession(explorer)
    s.register(SPEC)
    for _ in range(steps):
        s.record(_ms(s.values), {}, may_compile=False)
        if s.committed and s.explore_steps:
            break
    return s


def test_second_run_on_the_same_host_starts_tuned(tmp_path, monkeypatch):
    from microco.clients.compiler import _session

    # The same machine at the same load (a load that moved between the runs re-validates a
    # thread count: the next test); read from /proc/loadavg it moves with whatever runs beside.
    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    path = str(tmp_path / "state.json")
    first = _run(LocalExplorer.on_disk(path))
    assert first.committed and first.explore_steps > 0
    assert first.values["r.hoist"] == "on"
    # A new process (a new explorer over the same file): committed at registration.
    second = ExplorationSession(LocalExplorer.on_disk(path))
    cfg = second.register(SPEC)
    assert cfg.committed and cfg.values == first.values
    for _ in range(5):
        second.record(_ms(second.values), {}, may_compile=False)
    assert second.explore_steps == 0
    # In memory (the former default), the next run explored again.
    assert _run(LocalExplorer()).explore_steps > 0


def test_second_run_revalidates_a_thread_count_at_another_load(tmp_path, monkeypatch):
    from microco.clients.compiler import _session

    path = str(tmp_path / "state.json")
    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    first = _run(LocalExplorer.on_disk(path))
    assert first.values["threads"] == "1"
    monkeypatch.setattr(_session, "runnable_threads", lambda: 12)  # the machine got busy
    second = ExplorationSession(LocalExplorer.on_disk(path))
    assert second.register(SPEC).committed
    for _ in range(60):
        second.record(_ms(second.values), {}, may_compile=False)
    state = LocalExplorer.on_disk(path).core.list()[0]
    assert state.revalidations and state.revalidations[-1]["now"] == 12
    assert state.committed and state.best_values["threads"] == "1"


def test_a_kind_not_compiled_here_is_priced_by_this_hosts_rate_for_other_kinds(tmp_path):
    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record("cpu", "torch:region:inductor", 4_000.0, size=40)  # 100 ms per node here
    costs.record("cpu", "torch:region:inductor", 9_000.0, size=60)  # 150 ms per node
    # The whole step was never compiled on this host: its 600 nodes at the host's measured rate
    # (the median of 100 and 150 ms per node), not a constant of the code.
    assert costs.estimate("cpu", "torch:whole:plain", size=600) == pytest.approx(75_000.0)
    assert costs.estimate("cpu", "torch:whole:plain") is None  # size unknown: the caller's prior
    assert costs.estimate("cpu", "tf:xla", size=600) is None  # another framework's compiles
    # Once the kind itself is measured, its own figures decide.
    costs.record("cpu", "torch:whole:plain", 30_000.0, size=600)
    assert costs.estimate("cpu", "torch:whole:plain", size=600) == pytest.approx(30_000.0)


def test_the_measured_price_reaches_the_core_and_prunes_by_it(tmp_path):
    """A whole-step compile priced by this host's measurements: pruned in a short run where it
    cannot repay, tried in a long one (no compile runs: the core's decision on the price)."""
    from microco.clients.compiler.explore import _core

    costs = HostCompileCosts(tmp_path / "c.json", host="h1")
    costs.record("cpu", "torch:whole:plain", 20_000.0)
    est = costs.estimate("cpu", "torch:whole:plain")
    assert est is not None
    whole = Variable("model.compile", ("eager", "inductor"), "", 1, compiles=True,
                     compile_prior_ms=est, prior_calibrated=True)  # fmt: skip
    policy = ExplorationPolicy(measure_steps=2, retime_rounds=0)

    def tried(total):
        spec = GraphSpec("fp2", "(1,)", "cpu", (whole,), total_steps=total)
        state = _core.start(spec, policy)
        cfg = _core.next_config(state, policy)
        while not cfg.committed:
            ms = 20.0 if cfg.values["model.compile"] == "eager" else 10.0
            cfg = _core.report(state, _core.TrialReport(cfg.trial, [ms] * cfg.steps), policy)
        return any(t.values["model.compile"] == "inductor" for t in state.trials)

    # best case 20 ms x 1/2 saved per step, half of it expected: 5 ms x steps against 20 s
    assert not tried(1_000)
    assert tried(10_000)


def test_an_exploration_in_progress_is_written_at_its_commit_not_after_every_trial(tmp_path, monkeypatch):
    """Issue 18, session 31: the in-process explorer wrote the whole exploration to the state file
    after every trial's report (the state as JSON, the file replaced: 4-65 ms of torch-lstm's
    300-step run). Its progress is now held in memory and written at the commit, at ``flush``
    or at exit; the commit itself is on disk at once, as before."""
    from microco.clients.compiler import _session
    from microco.clients.compiler.explore import EXPLORATIONS
    from microco.clients.compiler.explore._filekv import FileKV

    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    path = tmp_path / "state.json"
    explorer = LocalExplorer.on_disk(str(path))
    writes = []
    real = FileKV._write
    monkeypatch.setattr(FileKV, "_write", lambda self: writes.append(1) or real(self))
    s = ExplorationSession(explorer)
    s.register(SPEC)
    for _ in range(3):  # a few trial steps, not yet committed
        s.record(_ms(s.values), {}, may_compile=False)
    assert not s.committed and s.explore_steps > 0
    assert not writes and FileKV(path).get_prefix(EXPLORATIONS) == []  # nothing written per trial
    assert explorer.core.get(SPEC.key).trials  # (held in memory)
    explorer.flush()  # (what exit does)
    stored = LocalExplorer.on_disk(str(path)).core.get(SPEC.key)
    assert [t.values for t in stored.trials] == [t.values for t in explorer.core.get(SPEC.key).trials]
    for _ in range(300):
        s.record(_ms(s.values), {}, may_compile=False)
        if s.committed:
            break
    assert s.committed
    # Committed: on disk at once, without a flush (a process that dies now loses nothing).
    again = ExplorationSession(LocalExplorer.on_disk(str(path)))
    cfg = again.register(SPEC)
    assert cfg.committed and cfg.values == s.values
