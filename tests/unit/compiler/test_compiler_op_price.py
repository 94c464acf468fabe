"""A whole-step compile priced by the distinct ATen ops of the step it compiles (issue 18,
session 38): an op and its arguments' shapes, counted in the probe step (its forward, loss and
backward, not the optimiser's update), a host's rate is learned from its compiles of any graph and kept in its record, and a
graph's own measured compile still comes first. No timing is asserted: prices are compared
with what the record holds, at a pinned load and speed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from _support import through_probe
from torch import nn

from microco.clients.compiler import AstraTorch, _compile_costs
from microco.clients.compiler._compile_costs import HostCompileCosts
from microco.clients.compiler._torch import hardware_id
from microco.clients.compiler.explore import LocalExplorer

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("deep_probe")]  # (conftest)


def _mlp(depth: int, widths: bool = True) -> nn.Module:
    """``depth`` blocks of Linear, LayerNorm and GELU, each of its own width (``widths``), else
    all of one width (the same ops at the same shapes, block after block)."""
    torch.manual_seed(0)
    w = [16 + (i if widths else 0) for i in range(depth + 1)]
    layers: list[nn.Module] = [nn.Linear(8, w[0])]
    for i in range(depth):
        layers += [nn.Linear(w[i], w[i + 1]), nn.LayerNorm(w[i + 1]), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(w[-1], 4))


def _first_step(model: nn.Module, optimizer: bool = True) -> tuple[AstraTorch, float]:
    """A wrapper's probe step (a run of 2 steps: no cache ask, nothing compiled), and the cold
    price of its whole-step compile as offered to the core."""
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    astra = AstraTorch(model, LocalExplorer(), threads=("1",), total_steps=2, background=False)

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        if optimizer:
            opt.step()
            opt.zero_grad()
        else:
            model.zero_grad()  # (no update; the next step's backward does not accumulate)

    through_probe(astra, step)
    whole = next(v for v in astra.spec().variables if v.name == "model.compile")
    astra.restore()
    return astra, whole.compile_prior_ms


@pytest.fixture
def pinned_speed():
    """This host's compile speed, pinned (measured, it moves with the machine's load)."""
    HostCompileCosts().record(hardware_id(), _compile_costs.SPEED_KIND, 1.0)


def test_the_probe_step_counts_the_ops_a_whole_step_compile_would_compile(pinned_speed):
    small, small_price = _first_step(_mlp(1))
    large, large_price = _first_step(_mlp(8))
    assert 0 < small._step_ops < large._step_ops
    # the same block repeated at the same shapes compiles into the same kernels: counted once
    repeated, _ = _first_step(_mlp(8, widths=False))
    assert repeated._step_ops < large._step_ops
    assert repeated._step_ops == _first_step(_mlp(2, widths=False))[0]._step_ops
    # the optimiser's update is not counted: no whole-step compile compiles it
    alone, _ = _first_step(_mlp(1), optimizer=False)
    assert alone._step_ops == small._step_ops
    # nothing compiled here yet, no trace taken: the op curve (at the fastest host's speed, as
    # no host could repay it in 2 steps: this host's speed is not measured for
    # it), more ops dearer
    assert small_price == pytest.approx(
        small.compile_costs.op_prior(
            small._hw, small._step_ops, slowdown=small._slowdown, speed=_compile_costs.SPEED_FLOOR
        )
    )
    # (each at its own slowdown: its probe step's wall over its CPU, which the machine's load
    # sets; compared at one, more ops dearer whatever ran beside either step)
    assert small_price / small._slowdown < large_price / large._slowdown


def test_a_rate_learned_from_one_graphs_compile_prices_another_graph_in_a_later_run(tmp_path, pinned_speed):
    from microco.clients.compiler._compile_costs import op_curve_ms

    path = tmp_path / "costs.json"
    hw = hardware_id()
    # a cold compile measured on this host: 400 ops in 90 s (a graph of another model)
    HostCompileCosts(path).record(hw, "torch:whole:plain", 90_000.0, 300, graph="other", ops=400)
    scale = 90_000.0 / op_curve_ms(400)
    # a later run (a new record object over the same file) prices any graph by that rate
    later = HostCompileCosts(path)
    assert later.op_price(hw, 1000) == pytest.approx(scale * op_curve_ms(1000))
    assert later.op_price(hw, 0) is None  # no count, no price
    # and the wrapper's price of a step never compiled here is that rate at its own count
    model = _mlp(3)
    astra = AstraTorch(
        model, LocalExplorer(), threads=("1",), total_steps=300, background=False, compile_costs=later
    )
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    through_probe(astra, lambda: nn.functional.cross_entropy(model(x), y).backward())
    whole = next(v for v in astra.spec().variables if v.name == "model.compile")
    astra.restore()
    assert astra._step_ops > 0
    assert whole.prior_calibrated
    assert whole.compile_prior_ms == pytest.approx(scale * op_curve_ms(astra._step_ops))
    # another kind of whole-step compile (the rewrite) learns from it too: one rate a host
    assert later.op_scale(hw) == pytest.approx(scale)


def test_a_graphs_own_measured_compile_comes_before_the_rate_by_ops(pinned_speed):
    first, _ = _first_step(_mlp(2))
    costs = HostCompileCosts()
    # another graph's compile gives a rate by ops; this graph's own cold compile was measured
    costs.record(first._hw, "torch:whole:plain", 500_000.0, 50, graph="other", ops=first._step_ops)
    costs.record(first._hw, "torch:whole:plain", 7_000.0, 50, graph=first._cost_graph(), ops=first._step_ops)
    by_ops = costs.op_price(first._hw, first._step_ops)
    assert by_ops is not None and by_ops > 7_000.0
    second, price = _first_step(_mlp(2))
    assert second._cost_graph() == first._cost_graph()
    assert price == pytest.approx(7_000.0)
