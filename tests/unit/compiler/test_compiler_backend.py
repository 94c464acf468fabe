"""``torch.compile(model, backend="microco")``: each call is a mini-batch, explored and committed."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from microco.clients.compiler import MicrocoBackend, register_backend
from microco.clients.compiler.explore import ExplorationPolicy, LocalExplorer
from microco.clients.compiler.zoo import torch_models as zm
from microco.common import MemoryKV

pytestmark = pytest.mark.torch


def test_backend_explores_commits_and_is_reused(monkeypatch):
    from microco.clients.compiler import _session

    # One load for both runs: a load that moved between them re-validates the committed thread
    # count (read from /proc/loadavg, it moves with whatever runs beside the test).
    monkeypatch.setattr(_session, "runnable_threads", lambda: 1)
    old = torch.get_num_threads()
    torch._dynamo.reset()
    try:
        kv = MemoryKV()
        policy = ExplorationPolicy(measure_steps=1, retime_rounds=0)  # exact step count: no re-timing
        x, y = zm.synthetic_batch(3, 4, 4)

        def run(steps):
            model = zm.make_model("gru", 4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            # Eager only (no Inductor compile in a unit test): threads are the variable explored.
            backend = MicrocoBackend(
                LocalExplorer(kv, policy), compile_choices=("eager",), threads=("1", "2"), total_steps=100
            )
            fwd = torch.compile(model, backend=backend)
            losses = []
            for _ in range(steps):
                loss = zm.loss_fn(fwd(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return backend, losses

        ref_model = zm.make_model("gru", 4, 4)
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.05)
        ref = []
        for _ in range(8):
            loss = zm.loss_fn(ref_model(x), y)
            ref_opt.zero_grad()
            loss.backward()
            ref_opt.step()
            ref.append(loss.item())
        backend, losses = run(8)
        assert backend.committed and backend.explore_steps == 4
        assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) for a, b in zip(ref, losses))
        torch._dynamo.reset()
        again, _ = run(3)
        assert again.committed and again.explore_steps == 0 and again.config == backend.config
        register_backend()
        from torch._dynamo.backends.registry import lookup_backend

        assert isinstance(lookup_backend("microco"), MicrocoBackend)
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(old)


class _BackwardRaises(torch.autograd.Function):
    """What a compiled graph whose backward breaks looks like from outside (issue 18's
    AOTAutograd region raised ``TypeError`` in ``loss.backward()``)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    passes = 0  # backward passes let through first (the compiled graph's check takes one)

    @staticmethod
    def backward(ctx, g):
        if _BackwardRaises.passes > 0:
            _BackwardRaises.passes -= 1
            return g
        raise TypeError("only integer tensors of a single element can be converted to an index")


def test_a_compiled_graph_whose_backward_fails_does_not_stop_training(monkeypatch):
    """The dynamo-backend form: the compiled graph's backward raises; the gradients come from the
    eager graph instead, the trial is failed, and the run's losses are an eager run's."""
    import torch._inductor.compile_fx as cfx

    def broken_compile(gm, example_inputs):
        def run(*args):
            return tuple(_BackwardRaises.apply(o) for o in gm.forward(*args))

        return run

    monkeypatch.setattr(cfx, "compile_fx", broken_compile)
    # (its outputs' backward passes in the check against the captured graph, then fails in the
    # step's own backward: the guarded backward's case)
    monkeypatch.setattr(_BackwardRaises, "passes", 1)
    _trains_as_eager_with_a_failed_compile_trial()  # its backward raised TypeError before the guard


def test_a_compiled_graph_that_computes_otherwise_is_failed_at_its_first_call(monkeypatch):
    """The dynamo-backend form of the equivalence check (session 37): a compiled graph whose
    outputs are off (here scaled; Inductor's dropped ``alpha`` in a held-out VQ-VAE) is found at
    its first call and the captured graph runs instead: the trial failed, the losses eager's.
    Before, the trial's steps trained otherwise."""
    import torch._inductor.compile_fx as cfx

    def scaled(gm, example_inputs, **kw):
        def run(*args):
            return tuple(o * 1.25 if o.is_floating_point() else o for o in gm.forward(*args))

        return run

    monkeypatch.setattr(cfx, "compile_fx", scaled)
    _trains_as_eager_with_a_failed_compile_trial()


def test_a_compile_that_raises_does_not_stop_training(monkeypatch):
    """The dynamo-backend form (issue 18, session 30): the compile of the trial's graph happened
    outside the runner's guard, so an Inductor compile that raises (a lowering it cannot do, say)
    ended the user's forward. Now the trial is failed, that graph runs eagerly, and the run's
    losses are an eager run's."""
    import torch._inductor.compile_fx as cfx

    def broken_compile(gm, example_inputs, **kw):
        raise RuntimeError("injected: Inductor cannot lower this graph")

    monkeypatch.setattr(cfx, "compile_fx", broken_compile)
    _trains_as_eager_with_a_failed_compile_trial()  # raised the injected error before


def _trains_as_eager_with_a_failed_compile_trial():
    """Six steps through the microco backend (a run long enough to try the compile) and six of
    plain eager: the compile's trial failed, the losses and weights eager's."""
    torch._dynamo.reset()
    try:
        x, y = zm.synthetic_batch(3, 4, 4)
        ref_model = zm.make_model("gru", 4, 4)
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.05)
        ref = []
        for _ in range(6):
            loss = zm.loss_fn(ref_model(x), y)
            ref_opt.zero_grad()
            loss.backward()
            ref_opt.step()
            ref.append(loss.item())
        model = zm.make_model("gru", 4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        backend = MicrocoBackend(
            LocalExplorer(MemoryKV(), ExplorationPolicy(measure_steps=1, retime_rounds=0)),
            compile_choices=("eager", "inductor"),
            threads=("1",),
            total_steps=100_000,  # long enough to repay any compile price: the compile is tried
        )
        fwd = torch.compile(model, backend=backend)
        losses = []
        for _ in range(6):
            loss = zm.loss_fn(fwd(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        failed = [t for t in backend.session.explorer.core.get(backend.session.spec.key).trials if t.failed]
        assert failed and failed[0].values["graph.compile"] == "inductor"
        assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(ref, losses))
        for p, q in zip(model.parameters(), ref_model.parameters()):
            assert torch.allclose(p, q, atol=1e-6)
    finally:
        torch._dynamo.reset()


def test_the_backend_is_shared_by_a_copy_of_what_holds_it_as_lightning_copies_it():
    """Importing ``lightning_fabric`` wraps ``torch.compile`` so that every compiled module keeps a
    deep copy of its keyword arguments; a backend holding a lock then made ``torch.compile``
    raise (found by CI, where a Lightning test ran first on the same worker). A copy of what holds
    the backend shares it."""
    import copy

    backend = MicrocoBackend(LocalExplorer(MemoryKV()), compile_choices=("eager",), threads=("1",))
    assert copy.deepcopy({"backend": backend})["backend"] is backend
    wrappers = pytest.importorskip("lightning_fabric.wrappers")
    torch._dynamo.reset()
    model = zm.make_model("gru", 4, 4)
    compiled = wrappers._capture_compile_kwargs(torch.compile)(model, backend=backend)
    assert compiled._compile_kwargs["backend"] is backend
    x, y = zm.synthetic_batch(3, 4, 4)
    assert torch.isfinite(zm.loss_fn(compiled(x), y))
    torch._dynamo.reset()
