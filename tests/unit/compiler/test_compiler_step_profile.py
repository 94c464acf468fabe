"""What a whole-step compile never measured here is expected to save, from this run's own eager
step (issue 18, session 29): the probe step's op-level profile splits its time into GEMM-like
kernels (what a compile on the CPU leaves to the same BLAS) and the rest, and the gain rule
turns that share into the expected saving, in place of the core's fixed prior (2x at best, half
of that expected: a quarter of each step). Small models, one or two steps each."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from _support import through_probe

from microco.clients.compiler._compile_costs import HostCompileCosts
from microco.clients.compiler._gain_rule import CompileGainRule
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, GraphSpec, LocalExplorer, _core

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread", "deep_probe")]  # (conftest)
PRIOR = 0.25  # the core's fixed prior: (1 - 1/max_speedup) x expected_gain_share


class Elementwise(torch.nn.Module):
    """A step of small elementwise ops and their backward: almost no time in a product."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.w = torch.nn.Parameter(torch.full((16,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        for _ in range(30):
            h = torch.tanh(h * self.w + 0.1)
        return h


def _probed(
    model: torch.nn.Module, x: torch.Tensor, costs: HostCompileCosts, steps: int = 5000
) -> AstraTorch:
    """A wrapper over ``model`` (whole-step Inductor among its choices), after its probe step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # the user's first step, before the wrapper: its first touches of memory are not the probe's
    a = AstraTorch(model, LocalExplorer(), total_steps=steps, compile_costs=costs, background=False)
    through_probe(a, step)
    return a


def _gemm_model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(1024, 1024), torch.randn(512, 1024)  # a product of 1.1 GFLOP and its backward


def _elementwise_model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    # (4,096 rows: a step of some 5 ms. At 4 rows the step took 0.7-1.2 ms against 0.69 ms of the
    # profiler's own cost estimated for its 1,386 events, and its GEMM share, taken from what is
    # left, moved between 0.3 and 1.0 with a tenth of a millisecond of the step's time.)
    return Elementwise(), torch.randn(4096, 16)


def test_the_probe_step_is_profiled_and_split_into_gemm_and_the_rest(tmp_path):
    """The probe step (a step the run takes anyway) runs under the op profiler: its time in
    GEMM-like kernels is measured, its share kept in this host's record for the graph, and the
    step's time the probe prices by is the step's own, what profiling it added taken out."""
    costs = HostCompileCosts(tmp_path / "costs.json")
    model, x = _gemm_model()
    a = _probed(model, x, costs)
    p = a.step_profile
    assert p is not None and p.events > 0
    assert 0 < p.gemm_ms <= p.own_ms <= p.step_ms
    assert 0 < p.gemm_share <= 1
    assert a._probe_step_ms == pytest.approx(p.own_ms)
    assert costs.shares(a._hw, AstraTorch.GEMM_SHARE_KIND) == {a._cost_graph(): pytest.approx(p.gemm_share)}


def test_an_elementwise_step_expects_more_than_the_prior_and_a_gemm_step_less(tmp_path):
    """On a cold host (no gain measured for the graph): a step spent in elementwise work expects
    a compile to save more than the core's fixed quarter of each step, a step spent in one large
    product less; the core is told so (``expected_speedup``) and prices the compile by it."""
    costs = HostCompileCosts(tmp_path / "costs.json")
    elem = _probed(*_elementwise_model(), costs)
    gemm = _probed(*_gemm_model(), costs)
    assert elem.step_profile is not None and gemm.step_profile is not None
    assert elem.step_profile.gemm_share < 0.5 < gemm.step_profile.gemm_share
    assert elem._gain_fraction("plain") > PRIOR > gemm._gain_fraction("plain")
    step_ms = 10.0
    assert elem._optimistic_saving_ms(step_ms) > 5000 * step_ms * PRIOR > gemm._optimistic_saving_ms(step_ms)

    # The core, with the variable each wrapper offers, a compile priced between the two expected
    # savings and above the prior's quarter (midway from the larger of the prior and the GEMM
    # step's to the elementwise step's, as measured here: a fixed 30% was under the elementwise
    # step's saving in a CI run at load ~10, its measured share 0.253): tried for the elementwise
    # step only.
    low = max(PRIOR, gemm._gain_fraction("plain"))
    price = (low + elem._gain_fraction("plain")) / 2

    def reason(a: AstraTorch) -> str:
        a.session.spec = None
        mine = next(v for v in a._variables() if v.name == "model.compile")
        assert mine.expected_speedup > 0 and mine.measured_speedup == 0
        run = GraphSpec(
            "fp", "(4, 16)", "cpu", (replace(mine, compile_prior_ms=price * 5000 * step_ms),), "m"
        )
        state = _core.start(replace(run, total_steps=5000), ExplorationPolicy())
        state.trials.append(
            _core.TrialRecord(0, {}, 0, "baseline", steps=[step_ms] * 6, step_ms=step_ms, done=True)
        )
        state.best = 0
        return _core._prune_reason(
            state, ExplorationPolicy(), "", list(run.variables), {"model.compile": "inductor"}
        )

    assert reason(elem) == ""
    assert "cannot repay" in reason(gemm)


def test_a_compile_that_cannot_repay_a_short_run_is_still_pruned():
    """At 300 steps: even the largest saving the rule allows (the core's own bound, half of each
    step) does not repay a cold whole-step compile at the 60 s prior over 300 steps of 20 ms."""
    rule = CompileGainRule()
    share = rule.expected_share(0.0)  # nothing in GEMM-like kernels
    assert share == pytest.approx(rule.cap) and rule.cap == pytest.approx(0.5)
    v = _core.Variable(
        "model.compile",
        ("eager", "inductor"),
        "",
        2,
        compiles=True,
        compile_prior_ms=AstraTorch.WHOLE_COMPILE_PRIOR_MS,
        prior_calibrated=True,
        expected_speedup=1.0 / (1.0 - share),
    )
    run = GraphSpec("fp", "(4, 16)", "cpu", (v,), "m", "torch", 300)
    state = _core.start(run, ExplorationPolicy())
    state.trials.append(_core.TrialRecord(0, {}, 0, "baseline", steps=[20.0] * 6, step_ms=20.0, done=True))
    state.best = 0
    assert "cannot repay" in _core._prune_reason(
        state, ExplorationPolicy(), "", [v], {"model.compile": "inductor"}
    )


def test_the_gain_rule_is_amdahls_bound_times_a_fraction_calibrated_by_this_hosts_gains(tmp_path):
    """The rule: at most everything but the GEMM-like time, half of that expected a priori,
    capped at the core's bound; with this host's graphs that have both a kept share and a
    measured gain, the median share of their bound they realised; a measured gain of this graph
    is used as measured."""
    rule = CompileGainRule()
    assert rule.expected_share(0.2) == pytest.approx(0.4)  # 0.5 x (1 - 0.2)
    assert rule.expected_share(0.8) == pytest.approx(0.1)
    # Two graphs here: shares 0.2 and 0.3, measured 2.0x and 1.4x: they realised 0.625 and 0.408
    # of their bounds (0.5 / 0.8, 0.286 / 0.7); one graph alone does not calibrate.
    assert rule.fraction([(0.2, 2.0)]) == pytest.approx(0.5)
    assert rule.fraction([(0.2, 2.0), (0.3, 1.4)]) == pytest.approx((0.625 + 0.2857 / 0.7) / 2, rel=1e-3)
    assert rule.fraction([(0.2, 0.9), (0.3, 0.8)]) == 0.0  # slower where measured: nothing expected

    costs = HostCompileCosts(tmp_path / "costs.json")
    a = _probed(*_elementwise_model(), costs)
    share = a.step_profile.gemm_share
    assert a._gain_fraction("plain") == pytest.approx(rule.expected_share(share))
    for graph, s, g in (("g1", 0.2, 1.1), ("g2", 0.3, 1.05)):  # compiles here realised little
        costs.record_share(a._hw, AstraTorch.GEMM_SHARE_KIND, s, graph)
        costs.record_gain(a._hw, "torch:whole:plain", g, graph)
    low = rule.fraction([(0.2, 1.1), (0.3, 1.05)])
    assert low < rule.prior_fraction
    assert a._gain_fraction("plain") == pytest.approx(low * rule.bound(share))
    # This graph's shares kept here by earlier runs: their median, not one first step's
    for s in (0.9, 0.9):
        costs.record_share(a._hw, AstraTorch.GEMM_SHARE_KIND, s, a._cost_graph())
    assert a._gain_fraction("plain") == pytest.approx(low * rule.bound(0.9))
    costs.record_gain(a._hw, "torch:whole:plain", 1.6, a._cost_graph())  # measured on this graph
    assert a._gain_fraction("plain") == pytest.approx(1.0 - 1.0 / 1.6)
    assert a._expected_speedup("plain") == 0.0  # the core takes the measured gain


def test_no_profile_where_no_whole_step_compile_is_a_choice(tmp_path):
    """Only where a whole-step Inductor compile is offered (the profile prices nothing else)."""
    costs = HostCompileCosts(tmp_path / "costs.json")
    model, x = _elementwise_model()
    a = AstraTorch(model, LocalExplorer(), total_steps=100, compile_costs=costs, compile_choices=("eager",))
    with a.step():
        model(x).sum().backward()
    assert a.step_profile is None
    assert a._gain_fraction("plain") == pytest.approx(PRIOR)


def test_profiling_the_probe_step_prints_nothing_into_the_jobs_output():
    """Kineto printed two ``USDT: ... profiler_start`` lines to stderr at each profile: into
    every training job's output at its probe step. In a fresh process (Kineto reads its level
    once, at its first start), with the user's own level respected."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from microco.clients.compiler._step_profile import StepProfiler\n"
        "p = StepProfiler(); assert p.start()\n"
        "torch.randn(8, 8).mm(torch.randn(8, 8))\n"
        "assert p.stop(1.0) is not None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    quiet = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "profiler_start" not in quiet.stderr + quiet.stdout
    told = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env={**env, "KINETO_LOG_LEVEL": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert told.returncode == 0, told.stderr
    assert "profiler_start" in told.stderr  # (the user asked for Kineto's lines)
