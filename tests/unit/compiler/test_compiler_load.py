"""Issue 18: process-wide settings are scoped to the step, and a committed choice that depends
on the machine's load is re-validated when a later run finds another load."""

from __future__ import annotations

import pytest

from microco.clients.compiler.explore import (
    STAGE_FINE,
    STAGE_STRUCTURE,
    ExplorationPolicy,
    GraphSpec,
    TrialReport,
    Variable,
    _core,
    next_config,
    report,
    start,
)

POLICY = ExplorationPolicy(measure_steps=2, retime_rounds=0)


@pytest.mark.parametrize(
    ("then", "now", "changed"),
    [
        (2, 12, True),  # the case
        (12, 2, True),
        (4, 8, True),
        (1, 2, False),  # twice, but one thread apart
        (4, 6, False),  # two apart, not twice
        (0, 12, False),  # unknown load: never a change
        (3, 0, False),
    ],
)
def test_load_changed_rule(then, now, changed):
    assert _core.load_changed(then, now) is changed


def _committed(runnable):
    """An exploration of a structure variable and a thread count, committed at ``runnable``."""
    spec = GraphSpec(
        "fp",
        "(4, 8)",
        "cpu",
        (
            Variable("A.hoist", ("off", "on"), "A", STAGE_STRUCTURE),
            Variable("threads", ("4", "2", "1"), "", STAGE_FINE),
        ),
        "m",
        "torch",
        100_000,
    )
    state = start(spec, POLICY)
    cfg = next_config(state, POLICY)
    fast = {"4": 9.0, "2": 7.0, "1": 8.0}  # at that load, 2 threads were best
    while not cfg.committed:
        ms = fast[cfg.values["threads"]] - (1.0 if cfg.values["A.hoist"] == "on" else 0.0)
        cfg = report(state, TrialReport(cfg.trial, [ms] * 3, runnable=runnable), POLICY)
    assert cfg.values == {"A.hoist": "on", "threads": "2"}
    return state


def test_a_thread_count_committed_at_one_load_is_measured_again_at_another():
    state = _committed(runnable=2.0)
    nxt = report(state, TrialReport(-1, [6.0, 6.0], runnable=12.0), POLICY)
    # Reopened: the committed configuration first, then each other thread count on top of it.
    assert not nxt.committed and nxt.values == {"A.hoist": "on", "threads": "2"}
    seen = []
    cfg = nxt
    slow_now = {"4": 90.0, "2": 96.0, "1": 6.0}  # at load 12, one thread is by far the fastest
    while not cfg.committed:
        seen.append(cfg.values["threads"])
        cfg = report(
            state, TrialReport(cfg.trial, [slow_now[cfg.values["threads"]]] * 3, runnable=12.0), POLICY
        )
    assert seen == ["2", "4", "1"]
    assert cfg.values == {"A.hoist": "on", "threads": "1"}  # the structure choice is kept
    assert state.revalidations == [{"then": 2.0, "now": 12.0, "trial": state.revalidations[0]["trial"]}]


def test_the_same_load_keeps_the_commit():
    state = _committed(runnable=2.0)
    nxt = report(state, TrialReport(-1, [6.0, 6.0], runnable=3.0), POLICY)
    assert nxt.committed and not state.revalidations
    # The state round-trips through JSON with the new field.
    assert _core.Exploration.from_json(state.to_json()).revalidations == []


class _CommitThreads:
    """An explorer whose committed configuration runs one intra-op thread."""

    def __init__(self):
        self.reports = []

    def register(self, spec):
        from microco.clients.compiler.explore import Config

        values = {v.name: v.choices[0] for v in spec.variables}
        values["threads"] = "1"
        self.committed = Config(spec.key, values, trial=-1, committed=True)
        return self.committed

    def report(self, key, rep):
        self.reports.append(rep)
        return self.committed


def test_the_thread_count_is_set_only_around_the_step():
    torch = pytest.importorskip("torch")
    from microco.clients.compiler._torch import AstraTorch
    from microco.clients.compiler.zoo import torch_models as zm

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = zm.make_model("gru", 6, 8)
        explorer = _CommitThreads()
        astra = AstraTorch(model, explorer, threads=("2", "1"), compile_choices=("eager",), background=False)
        inside = []
        model.register_forward_pre_hook(lambda m, a: inside.append(torch.get_num_threads()))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = zm.synthetic_batch(4, 8, 6)
        after = []
        for _ in range(4):
            with astra.step():
                loss = zm.loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            after.append(torch.get_num_threads())
        assert astra.config["threads"] == "1"
        assert inside[1:] == [1, 1, 1]  # the step ran under the configuration's count
        assert after == [2, 2, 2, 2]  # and the user's came back after every step
        # The first two steps under a commit with a thread count report the load found now.
        assert [r.trial for r in explorer.reports] == [-1] and explorer.reports[0].runnable >= 0
    finally:
        torch.set_num_threads(old)


def test_the_dynamo_backend_restores_the_callers_thread_count():
    torch = pytest.importorskip("torch")
    from microco.clients.compiler import MicrocoBackend
    from microco.clients.compiler.zoo import torch_models as zm

    old = torch.get_num_threads()
    torch._dynamo.reset()
    torch.set_num_threads(2)
    try:
        model = zm.make_model("gru", 4, 4)
        explorer = _CommitThreads()
        backend = MicrocoBackend(explorer, compile_choices=("eager",), threads=("2", "1"), total_steps=10)
        fwd = torch.compile(model, backend=backend)
        x, y = zm.synthetic_batch(3, 4, 4)
        after = []
        for _ in range(3):
            zm.loss_fn(fwd(x), y).backward()
            after.append(torch.get_num_threads())
        assert backend.config["threads"] == "1" and after == [2, 2, 2]
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(old)


class _ThreadTrial:
    """Hands out one trial of 2 intra-op threads, then commits the baseline; keeps the reports."""

    def __init__(self):
        self.reports = []

    def register(self, spec):
        from microco.clients.compiler.explore import Config

        self.base = {v.name: v.choices[0] for v in spec.variables}
        return Config(spec.key, {**self.base, "threads": "2"}, trial=0, steps=1)

    def report(self, key, rep):
        from microco.clients.compiler.explore import Config

        self.reports.append(rep)
        return Config(key, self.base, trial=-1, committed=True)


@pytest.mark.parametrize(("idle", "refused"), [(0.2, True), (4.0, False)])
def test_a_thread_count_trial_beyond_the_idle_cores_is_refused_not_run(monkeypatch, idle, refused):
    """Issue 18: on 2 cores at load 12-35 one 2-thread step took 31-67x the 1-thread step. A
    trial asking for more intra-op threads than there are idle cores runs the user's count and
    is reported failed; with the cores idle it runs as asked."""
    import torch
    from torch import nn

    from microco.clients.compiler import AstraTorch, _session

    monkeypatch.setattr(_session, "idle_cores", lambda: idle)
    user = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        explorer = _ThreadTrial()
        astra = AstraTorch(model, explorer, threads=("1", "2"), compile_choices=("eager",), total_steps=100)
        seen = []
        x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))
        for _ in range(3):  # the probe step, the trial's step(s), a committed step
            with astra.step():
                seen.append(torch.get_num_threads())
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            assert torch.get_num_threads() == 1  # the user's count after every step
        assert len(explorer.reports) == 1
        rep = explorer.reports[0]
        if refused:
            assert seen == [1, 1, 1]
            assert rep.failed and "idle cores" in rep.error
        else:
            assert seen[1] == 2
            assert not rep.failed
    finally:
        torch.set_num_threads(user)
