"""Graph analysis and rewriting of a recurrent cell captured with ``torch.fx``.

A cell is called once per time step as ``cell(x_t, state)``. Its captured graph is split by
what each node depends on:

* ``P`` nodes depend on parameters only (e.g. gate weights concatenated for batching): they are
  computed once per mini-batch, not once per time step;
* ``X`` nodes depend on the step input and parameters only, through row-wise operators: they
  can be *hoisted* out of the time loop and computed once for the whole sequence;
* ``S`` nodes depend on the recurrent state: they run every step.

Horizontal batching replaces independent matrix products that read the same input with one
product against concatenated weights, split afterwards. Every rewrite is an ordinary
differentiable graph, so gradients reach the original parameters unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.utils import parametrize

# Operators that act on each row (all leading dimensions) independently: applying them to a
# whole [T, B, ...] sequence equals applying them to each [B, ...] slice, which makes hoisting
# out of the time loop exact.
_ROWWISE_FUNCTIONS = {
    torch.sigmoid,
    torch.tanh,
    torch.relu,
    torch.exp,
    torch.neg,
    torch.add,
    torch.sub,
    torch.mul,
    F.linear,
    F.relu,
    F.gelu,
    F.silu,
    torch.nn.functional.layer_norm,
    operator.add,
    operator.sub,
    operator.mul,
    operator.neg,
    operator.truediv,
}
_ROWWISE_METHODS = {"sigmoid", "tanh", "relu", "exp", "neg", "add", "sub", "mul"}


def _is_linear_module(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), nn.Linear)


def _splits_last_dim(node: fx.Node) -> bool:
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    return bool(dim == -1)


def _rowwise(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_function":
        if node.target is torch.split:
            return _splits_last_dim(node)  # splitting features keeps rows independent
        if node.target is operator.getitem:
            src = node.args[0]
            if isinstance(src, fx.Node) and src.target is parallel_linears:
                return True  # one of the products: as row-wise as a linear
            return isinstance(src, fx.Node) and src.target is torch.split and _splits_last_dim(src)
        return node.target in _ROWWISE_FUNCTIONS or node.target is parallel_linears
    if node.op == "call_method":
        return node.target in _ROWWISE_METHODS
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        if isinstance(mod, nn.Linear):
            return True
        if isinstance(mod, nn.LayerNorm):
            return len(mod.normalized_shape) == 1
        return isinstance(mod, (nn.Sigmoid, nn.Tanh, nn.ReLU, nn.GELU, nn.SiLU, nn.Identity))
    return False


def trace_cell(cell: nn.Module) -> fx.GraphModule:
    """Capture a cell's forward graph; raises if the cell cannot be traced symbolically, or if
    its forward does what a traced graph would not keep (held out, session 41; such a cell stays
    eager):

    * a custom ``torch.autograd.Function``: ``symbolic_trace`` runs the Function's ``forward`` on
      proxies and records its operators, so the captured graph differentiates that forward, not
      the Function's own ``backward`` (a straight-through estimator's rounding took zero
      gradients in every variant of the cell; the loss left eager's by 22% in 30 steps);
    * a change of grad mode or autocast inside the forward (``with torch.no_grad():``,
      ``enable_grad``, ``inference_mode``, ``autocast``): the graph records the operators, not the
      context, so a statistic the cell computes without gradient took one in every variant
      (a norm under ``no_grad``: the loss 2.2e-3 from eager's in 30 steps, and growing);
    * a write of a plain value of its modules (``self.calls += 1``) or of one of their tensors
      (a buffer counting steps, ``self.count += 1``): the trace runs it once, on the real value,
      and the graph would not write it (a buffer counter stopped counting, the losses 3.6% from
      eager's in 30 steps). The write is undone.

    * a module with forward hooks or pre-hooks, or with parametrized tensors
      (``nn.utils.spectral_norm``, ``parametrizations.weight_norm``): the graph's rewrites call
      the module another number of times, or read its weight without it (a hoisted spectral
      norm ran its power iteration once a sequence instead of once a time step: its vectors
      0.013 from eager's after 30 steps, the losses 1.5e-4; a batched parametrized weight's
      graph was freed by the check's backward, and each trial of it failed).

    The graph holds the modules' plain values as they were when traced (``plain_values``): the
    caller runs it only while they are."""
    for name, m in cell.named_modules():
        if m._forward_hooks or m._forward_pre_hooks or parametrize.is_parametrized(m):
            raise fx.proxy.TraceError(
                f"module {name or type(cell).__name__!r} has forward hooks or parametrizations: "
                "the graph's rewrites would not call them as its own code does"
            )
    before = plain_values(cell)
    tensors = [(n, t, t._version) for n, t in [*cell.named_parameters(), *cell.named_buffers()]]
    with torch.no_grad():
        kept = [t.clone() for _, t, _ in tensors]
    with _untraceable_refused():
        gm = fx.symbolic_trace(cell)
    changed = [(m, k, v) for m, k, v in before if m.__dict__.get(k, _GONE) != v]
    written = [n for n, t, version in tensors if t._version != version]
    with torch.no_grad():
        for (_, t, version), copy in zip(tensors, kept, strict=True):
            if t._version != version:
                t.copy_(copy)
    for m, k, v in changed:
        m.__dict__[k] = v
    if changed or written:
        what = changed[0][1] if changed else written[0]
        raise fx.proxy.TraceError(f"the forward writes {what!r}: a traced graph would not")
    return gm


_GONE = object()  # (an attribute no longer on its module)
_PLAIN = (bool, int, float, str, type(None))


def plain_values(cell: nn.Module) -> list[tuple[nn.Module, str, Any]]:
    """The plain values (numbers, flags, strings, None) held on the cell's modules, ``training``
    among them: what a traced graph keeps as the constants it read."""
    return [(m, k, v) for m in cell.modules() for k, v in m.__dict__.items() if isinstance(v, _PLAIN)]


@contextlib.contextmanager
def _untraceable_refused() -> Iterator[None]:
    """While this thread traces, a custom ``autograd.Function`` applied to a traced value, or a
    change of grad mode, inference mode or autocast, raises ``TraceError``. Patched as ``fx``
    patches ``Module.__call__`` while it traces; a call from another thread, or a Function
    applied to real tensors, goes through unchanged."""
    tracing = threading.get_ident()
    base = torch.autograd.function.Function
    original_apply = base.__dict__["apply"]  # (a classmethod)

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        if any(isinstance(a, fx.Proxy) for a in leaves):
            raise fx.proxy.TraceError(
                f"{cls.__name__} is a custom autograd.Function: a traced graph would "
                "differentiate its forward, not run its own backward"
            )
        return original_apply.__func__(cls, *args, **kwargs)

    def refusing(what: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == tracing:
                raise fx.proxy.TraceError(f"the forward sets {what}: a traced graph would not")
            return original(*args, **kwargs)

        return call

    patches = [
        (torch._C, "_set_grad_enabled", "the grad mode"),
        (torch._C, "_InferenceMode", "inference mode"),
        (torch, "set_autocast_enabled", "autocast"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    base.apply = classmethod(apply)  # type: ignore[assignment, method-assign]
    for (owner, name, what), (_, _, original) in zip(patches, saved, strict=True):
        setattr(owner, name, refusing(what, original))
    try:
        yield
    finally:
        base.apply = original_apply  # type: ignore[method-assign]
        for owner, name, original in saved:
            setattr(owner, name, original)


def fingerprint(gm: fx.GraphModule) -> str:
    """A structural hash of a captured graph and its parameter shapes."""
    h = hashlib.sha256(gm.code.encode())
    for name, p in sorted(gm.named_parameters()):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    return h.hexdigest()[:16]


def count_batchable(gm: fx.GraphModule) -> int:
    """How many matrix products read an input that another product also reads."""
    groups = _linear_groups(gm)
    return sum(len(g) for g in groups if len(g) > 1)


def _linear_groups(gm: fx.GraphModule) -> list[list[fx.Node]]:
    by_input: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if _is_linear_module(gm, node) and len(node.args) == 1 and not node.kwargs:
            by_input.setdefault(node.args[0], []).append(node)
    return [nodes for nodes in by_input.values() if len(nodes) > 1]


def batch_linears(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite a copy of ``gm``: linears that share an input become one product, then a split."""
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    graph = gm.graph
    for group in _linear_groups(gm):
        mods: list[Any] = [gm.get_submodule(str(n.target)) for n in group]
        if len({(m.in_features, m.weight.dtype) for m in mods}) != 1:
            continue
        first = min(group, key=lambda n: list(graph.nodes).index(n))
        with graph.inserting_before(first):
            weights = [graph.get_attr(f"{n.target}.weight") for n in group]
            wcat = graph.call_function(torch.cat, (weights, 0))
            all_bias = all(m.bias is not None for m in mods)
            if all_bias:
                bcat = graph.call_function(
                    torch.cat, ([graph.get_attr(f"{n.target}.bias") for n in group], 0)
                )
                y = graph.call_function(F.linear, (first.args[0], wcat, bcat))
            else:
                y = graph.call_function(F.linear, (first.args[0], wcat))
            parts = graph.call_function(torch.split, (y, [m.out_features for m in mods], -1))
            for k, (node, mod) in enumerate(zip(group, mods)):
                part = graph.call_function(operator.getitem, (parts, k))
                if mod.bias is not None and not all_bias:
                    part = graph.call_function(operator.add, (part, graph.get_attr(f"{node.target}.bias")))
                node.replace_all_uses_with(part)
        for node in group:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


_SIDE_STREAMS: dict[Any, list[Any]] = {}


def _side_streams(device: torch.device, n: int) -> list[Any]:
    """``n`` side streams of ``device``, created once and reused by every call."""
    pool = _SIDE_STREAMS.setdefault(device, [])
    while len(pool) < n:
        pool.append(torch.cuda.Stream(device=device))  # type: ignore[no-untyped-call]
    return pool[:n]


def parallel_linears(
    x: torch.Tensor, weights: list[torch.Tensor], biases: list[Any]
) -> tuple[torch.Tensor, ...]:
    """``F.linear(x, w, b)`` for each weight, each on its own CUDA stream when ``x`` is on a GPU
    (independent small products overlap instead of queueing on one stream); in order otherwise.

    Each side stream first waits for the work that produced ``x``; the caller's stream then waits
    for every side stream before it reads the results. ``record_stream`` tells the caching
    allocator which streams use each block, so none is reused while a stream may still read it.
    Autograd runs each product's backward on the stream its forward ran on and synchronises the
    streams itself."""
    if not x.is_cuda or len(weights) < 2:
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
    current = torch.cuda.current_stream(x.device)
    streams = _side_streams(x.device, len(weights))
    outs = []
    for stream, w, b in zip(streams, weights, biases):
        stream.wait_stream(current)
        x.record_stream(stream)
        with torch.cuda.stream(stream):
            outs.append(F.linear(x, w, b))
    for stream, y in zip(streams, outs):
        current.wait_stream(stream)
        y.record_stream(current)
    return tuple(outs)


def stream_linears(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite a copy of ``gm``: linears that share an input run concurrently, one CUDA stream
    each (:func:`parallel_linears`): the GPU alternative to batching them into one product."""
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    graph = gm.graph
    for group in _linear_groups(gm):
        mods: list[Any] = [gm.get_submodule(str(n.target)) for n in group]
        first = min(group, key=lambda n: list(graph.nodes).index(n))
        with graph.inserting_before(first):
            weights = [graph.get_attr(f"{n.target}.weight") for n in group]
            biases = [
                graph.get_attr(f"{n.target}.bias") if m.bias is not None else None
                for n, m in zip(group, mods)
            ]
            outs = graph.call_function(parallel_linears, (first.args[0], weights, biases))
            for k, node in enumerate(group):
                node.replace_all_uses_with(graph.call_function(operator.getitem, (outs, k)))
        for node in group:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


def classify(gm: fx.GraphModule) -> dict[fx.Node, str]:
    """Label every node ``P`` (parameters only), ``X`` (hoistable input work) or ``S`` (state)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    x = placeholders[0] if placeholders else None
    kind: dict[fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            kind[node] = "X" if node is x else "S"
        elif node.op == "get_attr":
            kind[node] = "P"
        elif node.op == "output":
            kind[node] = "S"
        else:
            deps = {kind[a] for a in node.all_input_nodes}
            if "S" in deps:
                kind[node] = "S"
            elif "X" in deps:
                kind[node] = "X" if _rowwise(gm, node) else "S"
            else:
                kind[node] = "P"
    return kind


@dataclass
class CellPlan:
    """A cell split into its per-batch, per-sequence and per-step graphs."""

    p_gm: fx.GraphModule  # () -> tuple of P values
    x_gm: fx.GraphModule | None  # (x, *P values) -> tuple of X values; None when not hoisted
    s_gm: fx.GraphModule  # (*X values or x, *P values, *state placeholders) -> the cell's output
    n_x: int  # how many values x_gm returns (1 = x itself when not hoisted)
    n_p: int


def split_cell(gm: fx.GraphModule, hoist: bool) -> CellPlan:
    """Partition a (possibly batched) cell graph by :func:`classify`; ``hoist=False`` folds X into S."""
    kind = classify(gm)
    if not hoist:
        kind = {n: ("S" if k == "X" else k) for n, k in kind.items()}
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    x_ph, state_ph = placeholders[0], placeholders[1:]

    def users_of_other_kind(node: fx.Node, other: set[str]) -> bool:
        return any(kind[u] in other for u in node.users)

    p_out = [n for n in nodes if kind[n] == "P" and n.op != "get_attr" and users_of_other_kind(n, {"X", "S"})]
    if hoist:
        x_out = [n for n in nodes if kind[n] == "X" and users_of_other_kind(n, {"S"})]
    else:
        x_out = [x_ph]
    p_gm = _extract(gm, [n for n in nodes if kind[n] == "P"], [], p_out)
    x_gm = None
    if hoist:
        x_gm = _extract(gm, [n for n in nodes if kind[n] == "X" and n is not x_ph], [x_ph, *p_out], x_out)
    s_nodes = [n for n in nodes if kind[n] == "S" and n.op != "placeholder" or n.op == "get_attr"]
    s_gm = _extract(gm, s_nodes, [*x_out, *p_out, *state_ph], None)
    return CellPlan(p_gm=p_gm, x_gm=x_gm, s_gm=s_gm, n_x=len(x_out), n_p=len(p_out))


def _extract(
    gm: fx.GraphModule, body: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node] | None
) -> fx.GraphModule:
    """Copy ``body`` (in order) into a new graph whose placeholders are ``inputs``.

    ``outputs=None`` keeps the original output node (with its nested structure).
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k, node in enumerate(inputs):
        env[node] = graph.placeholder(f"in{k}_{node.name}")

    def lookup(n: fx.Node) -> fx.Node:
        if n not in env:
            if n.op != "get_attr":
                raise RuntimeError(f"node {n.name} is not available in this partition")
            env[n] = graph.get_attr(str(n.target))
        return env[n]

    for node in body:
        if node in env or node.op in ("output", "placeholder"):
            continue
        env[node] = graph.node_copy(node, lookup)
    if outputs is None:
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        graph.output(fx.map_arg(out_node.args[0], lookup))
    else:
        graph.output(tuple(lookup(n) for n in outputs))
    new = fx.GraphModule(gm, graph)
    new.graph.eliminate_dead_code()
    new.recompile()
    return new


def find_time_slice(x: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """If ``x`` is ``base.select(d, t)`` of a larger tensor, return ``(base, d, t)``.

    A Python time loop feeds a cell ``seq[t]``: a view of the whole sequence. Recognising the
    view is what lets hoisted input work run once on the whole sequence and be indexed per step.
    """
    base = x._base
    if base is None or base.dim() != x.dim() + 1:
        return None
    found = None
    offset = x.storage_offset() - base.storage_offset()
    for d in range(base.dim()):
        shape = base.shape[:d] + base.shape[d + 1 :]
        strides = base.stride()[:d] + base.stride()[d + 1 :]
        if tuple(shape) != tuple(x.shape) or tuple(strides) != tuple(x.stride()):
            continue
        step = base.stride(d)
        if step == 0 or offset % step:
            continue
        t = offset // step
        if 0 <= t < base.shape[d]:
            if found is not None:
                return None  # ambiguous: do not guess
            found = (base, d, t)
    return found


def flatten_args(args: tuple[Any, ...]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, (tuple, list)):
            out.extend(flatten_args(tuple(a)))
        else:
            out.append(a)
    return out


# -- the whole step, as dynamo captures it --------------------------------------------------
# Dynamo's graph of a training step's forward has no cell boundaries: the time loop is unrolled
# and every cell's products are ``linear(input, weight, bias)`` calls on the parameters (graph
# inputs). Two passes over it do at the scale of the whole step what the region rewrites do per
# cell, before Inductor compiles it: hoisting (the products of every time slice ``X[t]`` of one
# tensor by the same weight become one product of ``X``, unbound per step) and batching (products
# of one input by several weights become one product by the concatenated weights, split).

_LINEAR_TARGETS = {torch._C._nn.linear, F.linear}


def _linear_parts(node: fx.Node) -> tuple[fx.Node, fx.Node, Any] | None:
    """``(input, weight, bias or None)`` of a whole-step ``linear`` call, else None."""
    if node.op != "call_function" or node.target not in _LINEAR_TARGETS or node.kwargs:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    x, w, b = args[:3]
    if not isinstance(x, fx.Node) or not isinstance(w, fx.Node) or not (b is None or isinstance(b, fx.Node)):
        return None
    return x, w, b


# ``x @ W`` with ``W`` a 2-D parameter: how a cell written from raw parameters spells a product.
_MATMUL_TARGETS = {operator.matmul, torch.matmul, torch.mm}


def _matmul_parts(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(input, weight)`` of ``x @ W`` where ``W`` is a 2-D graph input (a parameter), else None."""
    if node.op != "call_function" or node.target not in _MATMUL_TARGETS or node.kwargs or len(node.args) != 2:
        return None
    x, w = node.args
    if not isinstance(x, fx.Node) or not isinstance(w, fx.Node) or w.op != "placeholder":
        return None
    shape = _shape(w)
    return (x, w) if shape is not None and len(shape) == 2 else None


def _product(node: fx.Node) -> tuple[str, fx.Node, fx.Node, Any] | None:
    """``(kind, input, weight, bias)`` of a product by a parameter: ``linear`` or ``matmul``."""
    parts = _linear_parts(node)
    if parts:
        return ("linear", *parts)
    mm = _matmul_parts(node)
    if mm:
        return ("matmul", mm[0], mm[1], None)
    return None


def _time_slice(node: fx.Node) -> tuple[fx.Node, int, int] | None:
    """``(X, t, d)`` when ``node`` is the ``t``-th slice of ``X`` along dimension ``d``: ``X[t]``
    (d = 0), ``X[:, t]`` (a batch-first sequence: d = 1, one leading full slice per dimension),
    ``X.unbind(d)[t]`` / ``torch.unbind(X, d)[t]``, or ``X.select(d, t)``."""
    if node.op == "call_function" and node.target is operator.getitem:
        base, idx = node.args[0], node.args[1]
        if not isinstance(base, fx.Node):
            return None
        if isinstance(idx, int) and idx >= 0:
            if base.op in ("call_function", "call_method") and base.target in (torch.unbind, "unbind"):
                src = base.args[0]
                d = base.args[1] if len(base.args) > 1 else base.kwargs.get("dim", 0)
                if isinstance(src, fx.Node) and isinstance(d, int) and d >= 0:
                    return src, idx, d
                return None
            return base, idx, 0
        if isinstance(idx, tuple) and idx and isinstance(idx[-1], int) and idx[-1] >= 0:
            lead = idx[:-1]
            if all(isinstance(i, slice) and i == slice(None, None, None) for i in lead):
                return base, idx[-1], len(lead)
        return None
    if node.op in ("call_function", "call_method") and node.target in (torch.select, "select"):
        src, d, t = (list(node.args) + [None, None])[:3]
        if isinstance(src, fx.Node) and isinstance(d, int) and isinstance(t, int) and d >= 0 and t >= 0:
            return src, t, d
    return None


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    value = node.meta.get("example_value", node.meta.get("val"))
    shape = getattr(value, "shape", None)
    return tuple(int(s) for s in shape) if shape is not None else None


def _leading(node: fx.Node, dim: int = 0) -> int | None:
    shape = _shape(node)
    return shape[dim] if shape is not None and len(shape) >= 2 and dim < len(shape) - 1 else None


def hoist_time_slices(gm: fx.GraphModule) -> int:
    """In place: ``linear(X[t], W, b)`` (or ``X[t] @ W``) for every ``t`` of ``X`` -> one
    ``linear(X, W, b)`` (``X @ W``), unbound along time. The time dimension is the one sliced:
    the first for ``X[t]``, the second for a batch-first ``X[:, t]``. Returns how many products
    were hoisted."""
    graph = gm.graph
    groups: dict[tuple[Any, ...], dict[int, fx.Node]] = {}
    for node in graph.nodes:
        prod = _product(node)
        sliced = _time_slice(prod[1]) if prod else None
        if prod and sliced:
            kind, _, w, b = prod
            base, t, d = sliced
            groups.setdefault((kind, base, d, w, b), {})[t] = node
    hoisted = 0
    order = {n: k for k, n in enumerate(graph.nodes)}
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for (kind, base, d, w, b), by_t in groups.items():
        steps = _leading(base, d)
        if steps is None or sorted(by_t) != list(range(steps)) or steps < 2:
            continue  # not every time step reads it: hoisting would compute unused rows
        if w.op != "placeholder" or b is not None and b.op != "placeholder":
            continue  # parameters enter dynamo's graph as inputs; anything else is left alone
        anchor = max((base, last_input), key=order.__getitem__)
        with graph.inserting_after(anchor):
            if kind == "linear":
                whole = graph.call_function(torch._C._nn.linear, (base, w, b))
            else:
                whole = graph.call_function(torch.matmul, (base, w))
        with graph.inserting_after(whole):
            # (a function, not the method: AOTAutograd's cache refuses graphs with method calls)
            per_step = graph.call_function(torch.unbind, (whole, d))
        cursor = per_step
        for t in range(steps):
            with graph.inserting_after(cursor):
                cursor = graph.call_function(operator.getitem, (per_step, t))
            by_t[t].replace_all_uses_with(cursor)
            graph.erase_node(by_t[t])
            hoisted += 1
    if hoisted:
        graph.lint()
        gm.recompile()
    return hoisted


def batch_shared_inputs(gm: fx.GraphModule) -> int:
    """In place: ``linear(x, W_k, b_k)`` for several weights of one input ``x`` -> one product
    by the concatenated weights (concatenated once per step, where the weights enter the graph),
    split; with the biases concatenated too when every product has one, else each added to its
    part. Returns how many products were merged."""
    graph = gm.graph
    by_input: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        parts = _linear_parts(node)
        if parts:
            by_input.setdefault(parts[0], []).append(node)
    merged = _batch_matmuls(gm)
    cats: dict[tuple[Any, ...], tuple[fx.Node, fx.Node | None]] = {}
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    order = {n: k for k, n in enumerate(graph.nodes)}
    for x, nodes in by_input.items():
        if len(nodes) < 2:
            continue
        weights = tuple(n.args[1] for n in nodes)
        biases = tuple(n.args[2] if len(n.args) > 2 else None for n in nodes)
        sizes = [_leading(cast(fx.Node, w)) for w in weights]
        params = [p for p in weights + biases if p is not None]
        if any(s is None for s in sizes) or any(
            not isinstance(p, fx.Node) or p.op != "placeholder" for p in params
        ):
            continue  # parameters enter dynamo's graph as inputs; anything else is left alone
        all_bias = all(b is not None for b in biases)
        key = weights + (biases if all_bias else ())
        if key not in cats:
            # Once per step, where every input is defined (before any product).
            with graph.inserting_after(last_input):
                wcat = graph.call_function(torch.cat, (list(weights), 0))
            bcat = None
            if all_bias:
                with graph.inserting_after(wcat):
                    bcat = graph.call_function(torch.cat, (list(biases), 0))
            cats[key] = (wcat, bcat)
        wcat, bcat = cats[key]
        first = min(nodes, key=order.__getitem__)
        with graph.inserting_before(first):
            y = graph.call_function(torch._C._nn.linear, (x, wcat, bcat))
            split = graph.call_function(torch.split, (y, sizes, -1))
            for k, (node, b) in enumerate(zip(nodes, biases)):
                part = graph.call_function(operator.getitem, (split, k))
                if b is not None and not all_bias:
                    part = graph.call_function(operator.add, (part, b))
                node.replace_all_uses_with(part)
        for node in nodes:
            graph.erase_node(node)
        merged += len(nodes)
    if merged:
        graph.lint()
        gm.recompile()
    return merged


def _batch_matmuls(gm: fx.GraphModule) -> int:
    """In place: ``x @ W_k`` for several 2-D parameters ``W_k`` of one input ``x`` -> one
    ``x @ cat(W_k, 1)`` (concatenated once per step), split along the last dimension. Returns
    how many products were merged."""
    graph = gm.graph
    by_input: dict[fx.Node, list[fx.Node]] = {}
    for node in list(graph.nodes):
        mm = _matmul_parts(node)
        if mm:
            by_input.setdefault(mm[0], []).append(node)
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    order = {n: k for k, n in enumerate(graph.nodes)}
    cats: dict[tuple[fx.Node, ...], fx.Node] = {}
    merged = 0
    for x, nodes in by_input.items():
        if len(nodes) < 2:
            continue
        weights = tuple(cast(fx.Node, n.args[1]) for n in nodes)  # (_matmul_parts checked them)
        shapes = [_shape(w) for w in weights]
        if len(set(weights)) != len(weights) or any(sh is None or len(sh) != 2 for sh in shapes):
            continue
        if len({sh[0] for sh in shapes if sh}) != 1:
            continue
        if weights not in cats:
            with graph.inserting_after(last_input):
                cats[weights] = graph.call_function(torch.cat, (list(weights), 1))
        first = min(nodes, key=order.__getitem__)
        with graph.inserting_before(first):
            y = graph.call_function(torch.matmul, (x, cats[weights]))
            split = graph.call_function(torch.split, (y, [sh[1] for sh in shapes if sh], -1))
            for k, node in enumerate(nodes):
                part = graph.call_function(operator.getitem, (split, k))
                node.replace_all_uses_with(part)
        for node in nodes:
            graph.erase_node(node)
        merged += len(nodes)
    if merged:
        graph.lint()
        gm.recompile()
    return merged


def count_rewrites(gm: fx.GraphModule) -> int:
    """How many products the whole-step passes would change in dynamo's graph ``gm`` (on a
    copy): whether the captured step has recurrent structure worth the rewritten compile."""
    import copy

    g = copy.deepcopy(gm)
    return hoist_time_slices(g) + batch_shared_inputs(g)
