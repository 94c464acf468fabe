"""Issue 18: training never stops because of the compiler.

A compiled region whose backward failed (a single ``nn.Linear`` whose input needs no grad,
compiled by Inductor) stopped the user's loop; now the region computes its backward, and any
failure of a trial in the forward, the backward or the optimiser step rolls the step back and
repeats it on the last good configuration, so the weights end where plain eager puts them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn

from microco.clients.compiler import _torch_fx as tfx
from microco.clients.compiler._torch import AstraTorch, CellRunner
from microco.clients.compiler._torch_aot import AotRegion
from microco.services.common import MemoryKV
from microco.services.compiler import ExplorationPolicy, LocalExplorer

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


class _ShapeEnvRegion(AotRegion):
    """The Inductor path of a region (its capture under a shape environment, where AOTAutograd
    saves sizes for the backward) with the graphs run uncompiled: Inductor's own compile of the
    same graphs takes 40 s on the shared machine; the calling convention is the same."""

    def _compile_graph(self, g, example):
        from functorch.compile import make_boxed_func

        return make_boxed_func(g.forward)


def test_a_region_over_one_linear_whose_input_needs_no_grad_runs_its_backward():
    torch.manual_seed(0)
    lin = nn.Linear(8, 16)
    plan = tfx.split_cell(tfx.trace_cell(lin), hoist=False)
    region = _ShapeEnvRegion(plan.s_gm, "inductor")
    x = torch.randn(4, 8)  # a data batch: requires no grad
    region(x).square().sum().backward()  # raised TypeError before the fix
    got = (lin.weight.grad.clone(), lin.bias.grad.clone())
    lin.zero_grad()
    lin(x).square().sum().backward()
    assert torch.allclose(got[0], lin.weight.grad, atol=1e-6)
    assert torch.allclose(got[1], lin.bias.grad, atol=1e-6)
