"""A whole-step compile whose kernels run as another configuration's (issue 18, session 35).

Inductor on the CPU lays every convolution out channels-last, whatever the model's memory format
(its layout optimisation), so the compiled step of a convolutional model runs its convolutions as
the ``memory_format=channels_last`` trial does. Where the exploration measured that trial slower
than the best, the compile's expected saving (from the eager step's profile) is taken from the
slower step, and a compile it then cannot repay is not tried: torchvision's ResNet-18 on the CPU,
expected 9% of a 50 ms step, ran channels-last 1.04-1.52x and compiled 1.56x slower than eager.
Decisions for given measurements and prices; no timing."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from microco.clients.compiler._compile_costs import HostCompileCosts
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler.explore import ExplorationPolicy, GraphSpec, LocalExplorer, _core
from microco.clients.compiler.explore.types import Variable

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)

STEP_MS = 50.0
STEPS = 5000
EXPECTED = 1.0 / (1.0 - 0.09)  # the profile's expectation: 9% of each step saved
CL = "memory_format=channels_last"


def _state(cl_ms: float | None, runs_as: tuple[str, ...] = (CL,)) -> tuple[_core.Exploration, list[Variable]]:
    """An exploration of ``STEPS`` steps whose baseline (contiguous) measured ``STEP_MS`` a step,
    and, unless ``cl_ms`` is None, its channels-last trial ``cl_ms``; the whole-step compile priced
    between the saving the profile expects of the best's step (22.7 s) and nothing."""
    price = 0.8 * STEPS * STEP_MS * (1.0 - 1.0 / EXPECTED)
    compile_v = Variable(
        "model.compile",
        ("eager", "inductor"),
        "",
        1,
        compiles=True,
        compile_prior_ms=price,
        prior_calibrated=True,
        expected_speedup=EXPECTED,
        runs_as=runs_as,
    )
    fmt = Variable("memory_format", ("contiguous", "channels_last"), "", 0)
    spec = GraphSpec("fp", "(8, 3, 32, 32)", "cpu", (fmt, compile_v), "m", "torch", STEPS)
    state = _core.start(spec, ExplorationPolicy())
    base = {"memory_format": "contiguous", "model.compile": "eager"}
    state.trials.append(
        _core.TrialRecord(0, base, 0, "baseline", steps=[STEP_MS] * 6, step_ms=STEP_MS, done=True)
    )
    if cl_ms is not None:
        cl = {**base, "memory_format": "channels_last"}
        state.trials.append(
            _core.TrialRecord(1, cl, 0, "explore", steps=[cl_ms] * 6, step_ms=cl_ms, done=True)
        )
    state.best = 0
    return state, [compile_v]


def _reason(state: _core.Exploration, variables: list[Variable]) -> str:
    return _core._prune_reason(state, ExplorationPolicy(), "", variables, {"model.compile": "inductor"})


def test_a_compile_whose_convolutions_run_as_a_slower_measured_layout_is_not_tried():
    """Priced at 80% of what the profile expects of the best's step: tried where the channels-last
    step was not measured, or measured no slower; not tried once it measured 1.28x the best's
    (its expected compiled step, 1.28 x 91% of the best's, is slower than the best)."""
    assert _reason(*_state(None)) == ""
    assert _reason(*_state(STEP_MS)) == ""
    assert _reason(*_state(0.9 * STEP_MS)) == ""  # faster: no more than the profile expects
    reason = _reason(*_state(1.28 * STEP_MS))
    assert "cannot repay" in reason and "measured slower configuration" in reason
    # ... and only where the compile declares it runs that configuration's kernels
    assert _reason(*_state(1.28 * STEP_MS, runs_as=())) == ""


def test_a_slightly_slower_layout_scales_the_expected_saving():
    """1 - r (1 - f) of a step: at 1.04x the expected 9% shrinks to ~5.4%, above a price at half
    the best's expectation (4.5%), below one at 80% (7.2%)."""
    state, variables = _state(1.04 * STEP_MS)
    f = 1.0 - 1.0 / EXPECTED
    expected = STEPS * STEP_MS * (1.0 - 1.04 * (1.0 - f))
    assert _core._as_run_saving(
        state, ExplorationPolicy(), "", variables, {"model.compile": "inductor"}, STEPS, STEPS * STEP_MS * f
    ) == pytest.approx(expected)
    assert _reason(state, variables) != ""
    cheaper = [replace(variables[0], compile_prior_ms=0.5 * STEPS * STEP_MS * f)]
    assert _reason(state, cheaper) == ""


def test_the_layout_ratio_is_the_smaller_of_the_fastest_and_typical_steps():
    """One noisy reading does not make the layout look slower than the other reading shows."""
    state, _ = _state(None)
    cl = {"memory_format": "channels_last", "model.compile": "eager"}
    # fastest 1.3x, typical 1.1x
    state.trials.append(
        _core.TrialRecord(1, cl, 0, "explore", steps=[65.0] + [55.0] * 5, step_ms=65.0, done=True)
    )
    assert _core.runs_as_ratio(state, {"memory_format": "channels_last"}) == pytest.approx(1.1)
    assert _core.runs_as_ratio(state, {"memory_format": "contiguous"}) == 1.0  # the best itself


def test_a_stored_exploration_takes_this_runs_kernels_and_round_trips():
    state, variables = _state(None)
    stored = replace(state.spec, variables=tuple(replace(v, runs_as=()) for v in state.spec.variables))
    assert _core.with_run_priors(stored, state.spec).variables[1].runs_as == (CL,)
    v = variables[0]
    assert Variable.from_dict(v.to_dict()) == v
    assert "runs_as" not in replace(v, runs_as=()).to_dict()  # older states unchanged


class Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean((2, 3)))


def _offered(model: torch.nn.Module, x: torch.Tensor, tmp_path) -> Variable:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    costs = HostCompileCosts(tmp_path / "costs.json")
    a = AstraTorch(model, LocalExplorer(), total_steps=STEPS, compile_costs=costs, background=False)

    def step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    with a.step():
        step()
    a.session.spec = None
    return next(v for v in a._variables() if v.name == "model.compile")


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="oneDNN absent: Inductor keeps the layout"
)
def test_the_wrapper_says_a_convolutional_step_compiles_to_channels_last_kernels(tmp_path):
    torch.manual_seed(0)
    conv = _offered(Conv(), torch.randn(2, 3, 8, 8), tmp_path)
    assert conv.runs_as == (CL,)
    dense = _offered(torch.nn.Linear(8, 2), torch.randn(2, 8), tmp_path)
    assert dense.runs_as == ()


def _drive(state: _core.Exploration, policy: ExplorationPolicy) -> list[tuple[str, dict[str, str]]]:
    """Run the exploration to its commit with step times by configuration: in its own trials the
    baseline reads 62 ms (a trial beside other work) and channels-last 59 ms, 4% under it; side by
    side (interleaved) the baseline runs 50 ms, channels-last 90 ms, as ResNet-18 did here; a
    compiled step 88 ms. Returns every (kind, values) handed out."""
    handed = []
    cfg = _core.next_config(state, policy)
    while not cfg.committed:
        t = state.trials[cfg.trial]
        handed.append((t.kind, dict(cfg.values)))
        side_by_side = t.kind in _core.INTERLEAVED
        if cfg.values.get("model.compile") == "inductor":
            ms = 88.0
        elif cfg.values.get("memory_format") == "channels_last":
            ms = 90.0 if side_by_side else 59.0
        else:
            ms = 50.0 if side_by_side else 62.0
        cfg = _core.report(state, _core.TrialReport(cfg.trial, [ms] * cfg.steps), policy)
    return handed


def test_a_compile_priced_on_an_unconfirmed_layout_waits_for_its_confirmation():
    """The channels-last trial reads 4% under the baseline's trial and becomes the best; before the
    compile stage is planned on it, it is measured against the baseline side by side (1.8x
    slower: not confirmed), and the compile, whose convolutions run channels-last, is priced on
    that measurement and not tried. Before: the compile was planned on the channels-last best
    and tried."""
    policy = ExplorationPolicy()
    state, _ = _state(None)
    state = _core.start(state.spec, policy)
    handed = _drive(state, policy)
    kinds = [k for k, _ in handed]
    assert "confirm" in kinds
    assert not any(v.get("model.compile") == "inductor" for _, v in handed)
    assert any("measured slower configuration" in p for p in state.pruned)
    assert state.best_values.get("memory_format") == "contiguous"
    # Without the declaration the compile is planned on the channels-last best, as before.
    state2, _ = _state(None, runs_as=())
    state2 = _core.start(state2.spec, policy)
    assert any(v.get("model.compile") == "inductor" for _, v in _drive(state2, policy))
