"""Every configuration of every zoo model computes the same loss and gradients as eager."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from _support import through_probe

from microco.clients.compiler import _torch_fx as tfx
from microco.clients.compiler._torch import AstraTorch
from microco.clients.compiler._torch_aot import AotRegion
from microco.clients.compiler.explore import Config, GraphSpec, TrialReport
from microco.clients.compiler.zoo import CELL_NAMES
from microco.clients.compiler.zoo import torch_models as zm

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]  # (conftest)


class FixedExplorer:
    """Hands out one configuration for ever (lets a test pin every variable)."""

    def __init__(self, values=None):
        self.values = values or {}
        self.spec = None

    def register(self, spec: GraphSpec) -> Config:
        self.spec = spec
        return Config(spec.key, dict(self.values), trial=-1, committed=True)

    def report(self, key: str, report: TrialReport) -> Config:  # pragma: no cover - committed
        raise AssertionError("a committed configuration reports nothing")


def _loss_and_grads(model, x, y):
    model.zero_grad()
    loss = zm.loss_fn(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _assert_same(ref, got, tol=1e-5):
    (l0, g0), (l1, g1) = ref, got
    assert torch.allclose(l0, l1, atol=tol, rtol=tol), (l0, l1)
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=tol, rtol=1e-4), n


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_every_structural_configuration_matches_eager(cell):
    x, y = zm.synthetic_batch(5, 4, 6)
    ref = _loss_and_grads(zm.make_model(cell, 6, 8, layers=2), x, y)
    model = zm.make_model(cell, 6, 8, layers=2)
    astra = AstraTorch(model, FixedExplorer(), threads=("1",), compile_choices=("eager",))
    with astra.step():
        _assert_same(ref, _loss_and_grads(model, x, y))  # the probe step is plain eager
    # Both layers are found as repeated regions; the same structure would share one region.
    assert set(astra.runners) == {"cells.0", "cells.1"}
    names = {v.name.split(".")[-1] for v in astra.spec().variables}
    assert "hoist" in names and ("batch" in names or cell == "sru")
    # "streams" (offered on a GPU) runs the shared-input products through parallel_linears,
    # which on a CPU computes them in order: the rewrite itself is checked here.
    for batch, hoist in itertools.product(["off", "on", "streams"], ["off", "on"]):
        for r in astra.runners.values():
            r.configure(batch, hoist, "eager")
        with astra.step():
            got = _loss_and_grads(model, x, y)
        _assert_same(ref, got)
    astra.restore()
    _assert_same(ref, _loss_and_grads(model, x, y))


def test_repeated_identical_cells_share_one_region():
    model = zm.make_model("gru", 8, 8, layers=3)  # input size == hidden: all three cells alike
    astra = AstraTorch(model, FixedExplorer(), threads=("1",), compile_choices=("eager",))
    x, y = zm.synthetic_batch(3, 2, 8)
    with astra.step():
        _loss_and_grads(model, x, y)
    assert len({r.region for r in astra.runners.values()}) == 1
    assert len(astra.runners) == 3


def test_hoisting_moves_input_products_out_of_the_step_graph():
    gm = tfx.trace_cell(zm.LSTMCell(6, 8))
    plan = tfx.split_cell(tfx.batch_linears(gm), hoist=True)
    step_code = plan.s_gm.code
    # Four input products batched into one, hoisted: only the recurrent product stays per step.
    assert step_code.count("linear(") == 1
    assert plan.x_gm is not None and plan.x_gm.code.count("linear(") == 1
    assert tfx.count_batchable(gm) == 8


def test_batching_and_hoisting_preserve_outputs_directly():
    cell = zm.MILSTMCell(6, 8)
    gm = tfx.trace_cell(cell)
    x = torch.randn(4, 6)
    state = (torch.randn(4, 8), torch.randn(4, 8))
    want = cell(x, state)
    for batched, hoist in itertools.product([False, True], [False, True]):
        plan = tfx.split_cell(tfx.batch_linears(gm) if batched else gm, hoist=hoist)
        p = plan.p_gm()
        xs = plan.x_gm(x, *p) if plan.x_gm is not None else (x,)
        got = plan.s_gm(*xs, *p, state)
        assert torch.allclose(got[0], want[0], atol=1e-6)
        assert torch.allclose(got[1][1], want[1][1], atol=1e-6)


def test_stream_rewrite_runs_each_shared_input_product_in_one_parallel_call():
    cell = zm.LSTMCell(6, 8)
    gm = tfx.stream_linears(tfx.trace_cell(cell))
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is tfx.parallel_linears]
    assert len(calls) == 2  # the four input products, the four recurrent products
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    x, state = torch.randn(4, 6), (torch.randn(4, 8), torch.randn(4, 8))
    want = cell(x, state)
    for hoist in (False, True):  # the parallel products of x are hoistable like the linears
        plan = tfx.split_cell(gm, hoist=hoist)
        p = plan.p_gm()
        xs = plan.x_gm(x, *p) if plan.x_gm is not None else (x,)
        got = plan.s_gm(*xs, *p, state)
        assert torch.allclose(got[0], want[0], atol=1e-6) and torch.allclose(got[1][1], want[1][1], atol=1e-6)
    assert "parallel_linears" in tfx.split_cell(gm, hoist=True).x_gm.code


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="streams, kernel autotuning and CUDA graphs need a GPU"
)
@pytest.mark.parametrize(
    "batch, compile_mode", [("streams", "eager"), ("on", "inductor-autotune"), ("on", "inductor-cudagraphs")]
)
def test_gpu_variables_match_eager(batch, compile_mode):
    assert tfx.parallel_linears is not None
    x, y = (t.cuda() for t in zm.synthetic_batch(4, 8, 16))
    ref = _loss_and_grads(zm.make_model("lstm", 16, 32).cuda(), x, y)
    model = zm.make_model("lstm", 16, 32).cuda()
    astra = AstraTorch(model, FixedExplorer(), threads=("1",))
    assert "inductor-autotune" in astra.compile_choices and "streams" in astra.batch_choices
    with astra.step():
        _loss_and_grads(model, x, y)
    for r in astra.runners.values():
        r.configure(batch, "off", compile_mode)
    for _ in range(3):  # capture/compile (CUDA graphs record on a later call), then run
        with astra.step():
            got = _loss_and_grads(model, x, y)
        torch.cuda.synchronize()
        _assert_same(ref, got, tol=1e-4)
    assert not any(r.failed for r in astra.runners.values())
    if batch == "streams":
        assert tfx._SIDE_STREAMS.get(x.device) and len(tfx._SIDE_STREAMS[x.device]) >= 4


def test_find_time_slice_recognises_sequence_views_only():
    seq = torch.randn(5, 3, 4)
    base, d, t = tfx.find_time_slice(seq[2])
    assert base is seq and (d, t) == (0, 2)
    base, d, t = tfx.find_time_slice(seq[:, 1])
    assert (d, t) == (1, 1)
    assert tfx.find_time_slice(seq[2].clone()) is None
    assert tfx.find_time_slice(seq[1:3]) is None


def test_non_row_wise_input_work_is_not_hoisted():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 4)

        def forward(self, x, state):
            (h,) = state
            z = self.w(x - x.mean(0))  # a batch statistic: not row-wise, must stay per step
            h = torch.tanh(z + h)
            return h, (h,)

    gm = tfx.trace_cell(Odd())
    kinds = tfx.classify(gm)
    assert not any(k == "X" and tfx._is_linear_module(gm, n) for n, k in kinds.items())


def test_fixed_configuration_runs_without_reports():
    model = zm.make_model("sru", 6, 8)
    region_values = {}
    exp = FixedExplorer(region_values)
    astra = AstraTorch(model, exp, threads=("1",), compile_choices=("eager",))
    x, y = zm.synthetic_batch(4, 2, 6)
    for _ in range(3):
        with astra.step():
            _loss_and_grads(model, x, y)
    assert astra.committed and astra.explore_steps == 0


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_every_region_execution_of_every_model_matches_eager(cell):
    # The compiled-region machinery (AOTAutograd capture with parameters lifted to inputs,
    # min-cut partition, one autograd node per step, the strided hoisted inputs) under every
    # structural configuration; "aot-eager" runs the partitioned graphs without Inductor so that
    # every configuration is covered in seconds (Inductor itself: the test below).
    x, y = zm.synthetic_batch(3, 3, 6)
    ref = _loss_and_grads(zm.make_model(cell, 6, 8), x, y)
    model = zm.make_model(cell, 6, 8)
    astra = AstraTorch(model, FixedExplorer(), threads=("1",), compile_choices=("eager",))
    with astra.step():
        _loss_and_grads(model, x, y)
    for batch, hoist in itertools.product(["off", "on"], ["off", "on"]):
        for r in astra.runners.values():
            r.configure(batch, hoist, "aot-eager")
        for _ in range(2):  # the first call captures, the second runs the captured graphs
            with astra.step():
                got = _loss_and_grads(model, x, y)
            _assert_same(ref, got)
        assert not any(r.failed for r in astra.runners.values())
        assert all(isinstance(r.variant()[1], AotRegion) for r in astra.runners.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "cell, mode", [("gru", "inductor"), ("sru", "inductor"), ("gru", "inductor-autotune")]
)
def test_inductor_compiled_region_matches_eager(cell, mode):
    # Inductor compiles take seconds each on 2 cores: two models (a gated cell with recurrent
    # products, and one whose products all read the input), tiniest sizes. The machinery around
    # the kernels is the same for every model and every configuration (the test above).
    x, y = zm.synthetic_batch(3, 2, 4)
    ref = _loss_and_grads(zm.make_model(cell, 4, 4), x, y)
    model = zm.make_model(cell, 4, 4)
    astra = AstraTorch(model, FixedExplorer(), threads=("1",))
    with astra.step():
        _loss_and_grads(model, x, y)
    # "inductor-autotune" (kernel variants, offered on a GPU) compiles with Inductor's
    # max_autotune: on this CPU it generates the same kernels, but the path is the GPU's.
    for r in astra.runners.values():
        r.configure("on", "on", mode)
    for _ in range(2):
        with astra.step():
            got = _loss_and_grads(model, x, y)
        _assert_same(ref, got)
    assert not any(r.failed for r in astra.runners.values())
    region = next(iter(astra.runners.values())).variant()[1]
    assert isinstance(region, AotRegion) and region.compiler == mode and region.compile_s > 0


def _whole_step_run(monkeypatch, explorer=None, background=False):
    """A gru model over two time steps (dynamo's unrolled graph stays small) whose whole-step
    compiles use AOTAutograd without Inductor's code generation; its probe step is done.
    Returns ``(model, astra, x, y, eager's loss and gradients)``."""
    monkeypatch.setattr(AstraTorch, "WHOLE_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    x, y = zm.synthetic_batch(2, 2, 4)
    ref = _loss_and_grads(zm.make_model("gru", 4, 4), x, y)
    model = zm.make_model("gru", 4, 4)
    astra = AstraTorch(model, explorer or FixedExplorer(), threads=("1",), background=background)
    through_probe(astra, lambda: _loss_and_grads(model, x, y))
    return model, astra, x, y, ref


def test_whole_model_compile_matches_eager_and_switches_back(monkeypatch):
    # What torch.compile does, as one choice of the space: the model's forward compiled with the
    # cells' plain code inside; two time steps keep dynamo's unrolled graph small. Dynamo and
    # AOTAutograd without Inductor's code generation (30 s here; Inductor is covered above).
    model, astra, x, y, ref = _whole_step_run(monkeypatch, background=True)
    whole = next(v for v in astra.spec().variables if v.name == "model.compile")
    # Compiled in the background, it costs the critical path its warm load (see _background).
    assert astra._off_critical_path
    assert whole.compiles and whole.compile_prior_ms == astra.WHOLE_WARM_PRIOR_MS
    astra._set_whole_compile("plain")
    assert all("forward" not in r.cell.__dict__ for r in astra.runners.values())
    for _ in range(2):
        with astra.step():
            got = _loss_and_grads(model, x, y)
        _assert_same(ref, got)
    assert not astra.whole_failed
    astra._set_whole_compile(None)  # back to the per-cell regions
    assert "forward" not in model.__dict__
    with astra.step():
        _assert_same(ref, _loss_and_grads(model, x, y))


@pytest.mark.parametrize("cell", ["lstm", "sru"])
def test_whole_step_graph_passes_hoist_and_batch_dynamos_graph_exactly(cell):
    """The passes on dynamo's graph of the unrolled step (two layers, three time steps): every
    input product of every step is hoisted (one product of the whole sequence per gate), then the
    products of one input are batched; the step computes eager's loss and gradients."""
    torch._dynamo.reset()
    x, y = zm.synthetic_batch(3, 2, 4)
    ref = _loss_and_grads(zm.make_model(cell, 4, 5, layers=2), x, y)
    seen = {}

    def backend(gm, example_inputs):
        seen["hoisted"] = tfx.hoist_time_slices(gm)
        seen["batched"] = tfx.batch_shared_inputs(gm)
        seen["code"] = gm.code
        return gm.forward

    model = zm.make_model(cell, 4, 5, layers=2)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    loss = zm.loss_fn(compiled(x), y)
    loss.backward()
    _assert_same(ref, (loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert seen["hoisted"] == 4 * 3 * 2  # four gates, every time step, both layers
    # Per layer the four hoisted gates become one product (sru's unbiased skip too, its
    # neighbours' biases added to their parts), and lstm's four recurrent products per step.
    assert seen["batched"] == {"lstm": (4 + 4 * 3) * 2, "sru": 4 * 2}[cell]
    # products left: lstm 2 x (1 + 3), sru 2 x 1; and the head
    assert seen["code"].count("torch._C._nn.linear(") == {"lstm": 8, "sru": 2}[cell] + 1


def test_whole_step_rewrite_is_a_choice_that_matches_eager(monkeypatch):
    # The rewritten whole step (graph passes, then the backend) beside the plain one; the test
    # backend is AOTAutograd without Inductor's code generation.
    model, astra, x, y, ref = _whole_step_run(monkeypatch)
    variables = {v.name: v for v in astra.spec().variables}
    rewrite = variables["model.rewrite"]
    assert rewrite.compiles and "model.compile" in rewrite.subsumes
    assert set(variables["model.compile"].subsumes) < set(rewrite.subsumes)
    both = {"model.rewrite": "inductor", "model.compile": "inductor"}
    astra._apply(Config(astra.spec().key, both, trial=-1, committed=True))
    assert astra._whole_kind == "rewrite"  # the widest scope runs
    for _ in range(2):
        with astra.step():
            _assert_same(ref, _loss_and_grads(model, x, y))
    assert not astra.whole_failed and "rewrite" in astra._whole_built
    astra._set_whole_compile(None)
    with astra.step():
        _assert_same(ref, _loss_and_grads(model, x, y))


def test_a_failing_whole_step_rewrite_keeps_training_and_fails_its_trial(monkeypatch):
    def broken(gm):
        raise RuntimeError("pass failed")

    monkeypatch.setattr(tfx, "hoist_time_slices", broken)
    model, astra, x, y, ref = _whole_step_run(monkeypatch, FixedExplorer({"model.rewrite": "inductor"}))
    reports = []
    astra.session.record = lambda ms, regions, failed, built=False, **kw: reports.append(failed)
    for _ in range(2):
        with astra.step():
            _assert_same(ref, _loss_and_grads(model, x, y))  # the plain forward ran instead
    assert "pass failed" in astra.whole_failed["rewrite"]
    assert all(r.startswith("model: ") and "pass failed" in r for r in reports)


def test_a_region_called_with_other_layouts_runs_eagerly():
    cell = zm.GRUCell(4, 4)
    plan = tfx.split_cell(tfx.trace_cell(cell), hoist=False)
    region = AotRegion(plan.s_gm, "aot-eager")
    h = torch.randn(2, 4, requires_grad=True)
    out = region(torch.randn(2, 4), *plan.p_gm(), (h,))
    assert region.compile_s > 0
    wide = torch.randn(3, 4)  # another batch size: the captured graph does not apply
    got = region(wide, *plan.p_gm(), (torch.zeros(3, 4),))
    want = plan.s_gm(wide, *plan.p_gm(), (torch.zeros(3, 4),))
    assert torch.allclose(got[0], want[0])
    assert out[0].shape == (2, 4)


def test_a_failing_compiled_region_falls_back_to_eager(monkeypatch):
    def broken_compile(self, g, example):
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(AotRegion, "_compile_graph", broken_compile)
    x, y = zm.synthetic_batch(3, 2, 4)
    ref = _loss_and_grads(zm.make_model("lstm", 4, 4), x, y)
    model = zm.make_model("lstm", 4, 4)
    astra = AstraTorch(model, FixedExplorer(), threads=("1",))
    with astra.step():
        _loss_and_grads(model, x, y)
    for r in astra.runners.values():
        r.configure("on", "off", "inductor")
    with astra.step():
        got = _loss_and_grads(model, x, y)
    _assert_same(ref, got)
    assert all("compiler crashed" in r.failed for r in astra.runners.values())
