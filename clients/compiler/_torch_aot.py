"""A compiled region without a compiler's per-call overhead: one cell step as one autograd node
whose forward and backward are Inductor-compiled kernels.

Measured on the zoo's cells (batch 16, hidden 64, CPU): a step is a few dozen tiny operators,
each costing dispatch and autograd bookkeeping rather than arithmetic. ``torch.compile`` of the
cell fuses them, but every call then passes dynamo's guards and AOTAutograd's runtime wrappers,
which at this size cost about what fusion saves (measured: no gain over eager). Here the cell's
joint graph is captured once with AOTAutograd (decomposed and partitioned like Inductor does),
forward and backward graphs are compiled with Inductor's graph compiler (``compile_fx_inner``,
which uses Inductor's on-disk FX graph cache, so the next run of the same cell compiles in a
fraction of the time), and each call runs them inside one plain ``torch.autograd.Function``:
per time step one autograd node and a handful of fused kernels instead of ~40 operators.

Shapes are static: a call whose flattened inputs differ in shape, dtype or layout from the
captured ones runs the original graph eagerly (it computes the same thing).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _compile_costs
from ._rng import draws_random, faithful_random

log = logging.getLogger(__name__)


def _signature(flat: list[Any]) -> tuple[Any, ...]:
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a)
        for a in flat
    )


class AotRegion:
    """``AotRegion(gm)(*args)`` computes ``gm(*args)`` with Inductor-compiled forward and
    backward graphs run as one autograd node per call. Compiles on the first call."""

    def __init__(self, gm: fx.GraphModule, compiler: str = "inductor") -> None:
        self.gm = gm
        self.compiler = compiler
        self.compile_s = 0.0
        self._sig: tuple[Any, ...] | None = None
        self._fw: Callable[[list[Any]], Any] | None = None
        self._bw: Callable[[list[Any]], Any] | None = None
        self._n_out = 0
        self._out_spec: Any = None
        self._fn: Any = None
        self._flat_len = -1
        # Parameters and buffers the graph reads are lifted to explicit inputs: the compiled
        # graphs must not close over real tensors, and gradients must reach the parameters.
        self._names = [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]
        self._tensors = [t for _, t in gm.named_parameters()] + [t for _, t in gm.named_buffers()]
        # a region that draws random numbers draws eager's, compiled (``_rng``)
        self._faithful = compiler != "aot-eager" and draws_random(gm)

    # -- build
    def _compile_graph(self, g: fx.GraphModule, example: list[Any]) -> Callable[[list[Any]], Any]:
        if self.compiler in ("inductor", "inductor-autotune"):
            from torch._inductor import config
            from torch._inductor.compile_fx import compile_fx_inner

            # Kernel variants: Inductor benchmarks alternative kernels for each product (its
            # Triton templates against the vendor library's) and keeps the fastest. On a GPU only:
            # on this project's CPU it generated the same code as plain Inductor.
            # Plain "inductor" leaves Inductor's configuration as the user set it.
            autotune = self.compiler == "inductor-autotune"
            with (
                config.patch(max_autotune=True) if autotune else contextlib.nullcontext(),
                faithful_random(self._faithful),
            ):
                compiled: Callable[[list[Any]], Any] = compile_fx_inner(g, example)
            _compile_costs.mark_inductor_compiled()
            return compiled
        from functorch.compile import make_boxed_func

        boxed: Callable[[list[Any]], Any] = make_boxed_func(g.forward)  # "aot-eager": uncompiled graphs
        return boxed

    def _build(self, flat: list[Any], spec: Any) -> None:
        from functorch.compile import aot_function, min_cut_rematerialization_partition
        from torch._inductor.decomposition import select_decomp_table

        if not all(isinstance(a, torch.Tensor) for a in flat):
            raise TypeError("a compiled region takes tensors only")
        t0 = time.perf_counter()
        captured: dict[str, Callable[[list[Any]], Any]] = {}

        def fw_compiler(g: fx.GraphModule, example: list[Any]) -> Callable[[list[Any]], Any]:
            captured["fw"] = self._compile_graph(g, example)
            return captured["fw"]

        def bw_compiler(g: fx.GraphModule, example: list[Any]) -> Callable[[list[Any]], Any]:
            captured["bw"] = self._compile_graph(g, example)
            return captured["bw"]

        gm, names, n_p = self.gm, self._names, len(self._names)

        def fn(*flat_args: Any) -> Any:
            lifted = dict(zip(names, flat_args[:n_p]))
            args = tree_unflatten(list(flat_args[n_p:]), spec)
            return torch.func.functional_call(gm, lifted, args)

        # Every floating input requires grad at capture, so the backward graph computes a
        # gradient for each of them; autograd drops those the caller's inputs do not need.
        # (Detached views, not clones: the compiled kernels assume the inputs' strides, and a
        # hoisted step input is a strided slice of the whole sequence.)
        example = [a.detach().requires_grad_(a.is_floating_point()) for a in flat]
        aot = aot_function(
            fn,
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            partition_fn=min_cut_rematerialization_partition,
            decompositions=select_decomp_table(),
        )
        inductor = self.compiler in ("inductor", "inductor-autotune")
        with torch.enable_grad(), _cacheable() if inductor else contextlib.nullcontext():
            out = aot(*example)
            leaves, out_spec = tree_flatten(out)
            diff = [o for o in leaves if isinstance(o, torch.Tensor) and o.requires_grad]
            inputs = [a for a in example if isinstance(a, torch.Tensor) and a.requires_grad]
            # The backward graph is compiled on the first backward: run one now, at build time.
            torch.autograd.grad(diff, inputs, [torch.ones_like(o) for o in diff], allow_unused=True)
        if "fw" not in captured or "bw" not in captured:
            raise RuntimeError("AOTAutograd did not produce forward and backward graphs")
        # Call the generated module directly: the CompiledFxGraph wrapper's per-call bookkeeping
        # (autotune-cache and metrics contexts) cost as much as the kernels at this size.
        self._fw, self._bw = (getattr(c, "current_callable", c) for c in (captured["fw"], captured["bw"]))
        self._n_out = len(leaves)
        self._out_spec = _structure(out_spec, [0])
        self._sig = _signature(flat)
        # The backward graph takes one tangent per output that requires grad, in order.
        diff_idx = [k for k, o in enumerate(leaves) if isinstance(o, torch.Tensor) and o.requires_grad]
        self._fn = _make_function(self._fw, self._bw, self._n_out, diff_idx)
        self.compile_s = time.perf_counter() - t0

    # -- run
    @property
    def built(self) -> bool:
        """Has the first call captured and compiled the region?"""
        return self._fw is not None

    def __call__(self, *args: Any) -> Any:
        # A cell is called once per time step: this path is kept to a few list operations (a
        # pytree flatten and a signature check cost more than the fused kernels).
        flat = list(self._tensors)
        for a in args:
            if type(a) is tuple or type(a) is list:
                flat.extend(a)
            else:
                flat.append(a)
        if self._fw is None:
            with faithful_random(self._faithful):  # (the decompositions are chosen by it too)
                self._build(flat, tree_flatten(args)[1])
            self._flat_len = len(flat)
        if len(flat) != self._flat_len:
            return self.gm(*args)
        try:
            # Inductor's generated code checks every input's size and stride first.
            outs = self._fn.apply(*flat)
        except AssertionError:
            if _signature(flat) == self._sig:
                raise
            return self.gm(*args)  # not the layouts it was compiled for: same result, eagerly
        return _rebuild(self._out_spec, outs)


def _cacheable() -> Any:
    """A tracing context whose fake mode has a shape environment, as dynamo provides one.

    Inductor's FX graph cache refuses a graph compiled without a shape environment (measured
    with torch 2.13: every compile of a region built by a bare ``aot_function`` was an
    ``fxgraph_cache_bypass``, reason "No shape env"), so without this a region compiled again,
    in a later run or after a background compile, paid Inductor's whole lowering each time.
    ``aot_function`` picks the context's fake mode up (``detect_fake_mode``); shapes stay static.
    """
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv())))


def _structure(spec: Any, counter: list[int]) -> Any:
    """The output's nesting as nested tuples of leaf indices (tuples and lists only)."""
    if spec.is_leaf():
        counter[0] += 1
        return counter[0] - 1
    if spec.type not in (tuple, list):
        raise TypeError(f"a compiled region returns tensors in tuples and lists, not {spec.type}")
    kids = tuple(_structure(c, counter) for c in spec.children())
    return kids if spec.type is tuple else list(kids)


def _rebuild(structure: Any, outs: Any) -> Any:
    if type(structure) is int:
        return outs[structure]
    built = tuple(_rebuild(s, outs) for s in structure)
    return built if type(structure) is tuple else list(built)


def _make_function(
    fw: Callable[[list[Any]], Any], bw: Callable[[list[Any]], Any], n_out: int, diff_idx: list[int]
) -> type[torch.autograd.Function]:
    class _Region(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *flat: Any) -> Any:  # runs with grad mode off
            res = fw(list(flat))
            saved = res[n_out:]
            # AOTAutograd's forward returns the tensors saved for the backward, then the sizes
            # (symbolic ints) it saves; its backward takes the sizes *first*, then the tensors,
            # then the tangents (its runtime: ``[*ctx.symints, *ctx.saved_tensors, *grads]``).
            # Passed in forward order, a saved size landed where the backward read a tensor
            # (issue 18: TypeError "only integer tensors of a single element can be converted
            # to an index" from the backward of a region over one nn.Linear).
            tensors = [s for s in saved if isinstance(s, torch.Tensor)]
            ctx.save_for_backward(*tensors)
            ctx.sizes = [s for s in saved if not isinstance(s, torch.Tensor)]
            return tuple(res[:n_out])

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            saved = [*ctx.sizes, *ctx.saved_tensors]
            # Inductor's kernels assume the layouts they were compiled for; autograd hands
            # unused outputs' gradients as expanded zeros.
            tangents = [grads[k].contiguous() for k in diff_idx]
            return tuple(bw([*saved, *tangents]))

    return _Region
