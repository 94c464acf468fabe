"""Every compiler test gets an empty record of this host's compile costs (``_compile_costs``):
the estimates a test sees come from what it records, never from earlier runs on the machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _host_compile_costs(tmp_path, monkeypatch):
    monkeypatch.setenv("MICROCO_COMPILE_COSTS", str(tmp_path / "compile_costs.json"))
    # and an empty record of tuned configurations (the wrappers' default explorer is on disk)
    monkeypatch.setenv("MICROCO_COMPILER_STATE", str(tmp_path / "compiler_state.json"))
    # and of XLA's compile rates and module sizes (``_tf_cost.default_cost_file``) per test, not
    # per session (the root conftest's): a TF test's first steps (the plain pre-steps where the
    # model's XLA module was never counted) depended on which test ran before it in the worker
    monkeypatch.setenv("MICROCO_XLA_COST_FILE", str(tmp_path / "xla_compile_rate.json"))


@pytest.fixture(autouse=True)
def _steady_load(monkeypatch):
    """One machine load for the whole test: a committed thread count is re-validated when the
    load read from /proc/loadavg moves between runs, which on a shared CI machine depends on what
    runs beside the test. Tests of that re-validation set the load themselves."""
    from microco.clients.compiler import _session

    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    # and idle cores for every thread-count trial (tests of the refusal set it themselves)
    monkeypatch.setattr(_session, "idle_cores", lambda: 64.0)
    # and compile prices at the load they were measured at (tests of the scaling set it)
    from microco.clients.compiler import _compile_costs

    monkeypatch.setattr(_compile_costs, "contention", lambda: 1.0)


def _intra_op_threads(n):
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (the count is process-wide), the old count after it."""
    yield from _intra_op_threads(1)


@pytest.fixture
def two_threads():
    """Two intra-op threads for the test, the old count after it."""
    yield from _intra_op_threads(2)


class ScriptedExplorer:
    """An explorer that hands out ``base`` for ``steps`` steps, then each of ``trials`` (changes
    from ``base``; {} the baseline again) in turn, ``steps`` steps each, then commits ``base``;
    keeps the reports it gets. For tests of the client's session (``ExplorationSession``)."""

    def __init__(self, steps, trials, base):
        self.steps, self.trials, self.base, self.reports = steps, trials, dict(base), []

    def register(self, spec):
        from microco.clients.compiler.explore import _core

        return _core.Config(spec.key, dict(self.base), 0, steps=self.steps)

    def report(self, key, rep):
        from microco.clients.compiler.explore import _core

        self.reports.append(rep)
        n = len(self.reports)
        if n <= len(self.trials):
            return _core.Config(key, {**self.base, **self.trials[n - 1]}, n, steps=self.steps)
        return _core.Config(key, dict(self.base), -1, True)


@pytest.fixture
def scripted_explorer():
    """``ScriptedExplorer``, the class (a test builds one with its own steps, trials, base)."""
    return ScriptedExplorer


class WholeCompileTrial:
    """An explorer that hands out the whole model compiled as trial 0 (three steps), then
    commits ``commit`` (``model.compile``'s choice); keeps the reports it gets."""

    def __init__(self, commit="eager"):
        self.commit, self.reports = commit, []

    def register(self, spec):
        from microco.clients.compiler.explore import Config

        values = {v.name: v.choices[0] for v in spec.variables}
        values["model.compile"] = "inductor"
        return Config(spec.key, values, trial=0, steps=3)

    def report(self, key, report):
        from microco.clients.compiler.explore import Config

        self.reports.append(report)
        return Config(key, {"model.compile": self.commit}, trial=-1, committed=True)


@pytest.fixture
def whole_compile_trial():
    """``WholeCompileTrial``, the class (a test builds one with what it commits)."""
    return WholeCompileTrial


@pytest.fixture
def deep_probe(monkeypatch):
    """The probe counts and profiles its second step whatever the run's length: its gate
    (``AstraTorch._whole_could_pay``, judged by the first probe step's time) pinned open, for
    tests of what those reads find (the gate has tests of its own: test_compiler_probe_cost)."""
    from microco.clients.compiler._torch import AstraTorch

    monkeypatch.setattr(AstraTorch, "_whole_could_pay", lambda self, step_ms: True)
