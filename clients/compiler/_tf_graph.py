"""Graph analysis and rewriting of a TensorFlow recurrent cell, from its captured graph.

A cell is any callable ``cell(x_t, state) -> (h, new_state)`` (``state`` a tuple of tensors)
written from TensorFlow operators over its own variables, with a ``zero_state(batch)``. Its
step is traced once into a ``FuncGraph`` (``tf.function(...).get_concrete_function``) and the
graph's operations are read:

* a **product** is a ``MatMul`` (no transposes) of a graph input by a variable, with the bias
  add that alone consumes it (``AddV2`` or ``BiasAdd`` of a rank-1 variable) folded in;
* a product of the step input ``x_t`` is an *input projection*: it can be **hoisted** out of
  the time loop (one product over the whole sequence before the loop; each step takes its
  slice) and **batched** with the step input's other products (one product against the
  concatenated kernels, split after);
* a product of one state tensor is a *recurrent projection*: it runs every step, and is batched
  with the other products of the same state tensor.

The rewrite **replays** the captured graph operation by operation through ``tf.raw_ops`` inside
the caller's trace, with each product's output replaced by the tensor the executor computed for
it (hoisted slice, batched split, or its own product). The replayed ops are ordinary
TensorFlow ops created in the caller's trace, so ``GradientTape`` records them and variable
reads go through the variables themselves (the tape watches them): gradients reach the
original variables. A graph that holds anything the replay cannot re-create (a nested function
call, a loop, a stateful random op) is not rewritten: the cell then runs as it is, and the
model gets only the whole-step XLA choice.

Only the products above are rewritten; everything else in the cell (its gate arithmetic,
normalisations, products of intermediate values) is replayed unchanged.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import tensorflow as tf
from tensorflow.python.framework import tensor_util

# Ops the replay re-creates by hand or skips; every other op goes through ``tf.raw_ops``.
_F = TypeVar("_F", bound=Callable[..., Any])


def _do_not_convert(fn: _F) -> _F:
    """AutoGraph's ``do_not_convert``, typed: the decorated function keeps its signature."""
    return cast(_F, tf.autograph.experimental.do_not_convert(fn))


_SKIPPED = {"NoOp"}
# Op types whose graphs are not replayed: nested functions and control flow carry function
# attributes the replay does not re-trace. Stateful ops (random draws, variable updates) are
# refused too (``op_def.is_stateful``): replayed, they would draw other numbers or run twice.
_UNSUPPORTED_PREFIXES = ("StatefulPartitionedCall", "PartitionedCall", "While", "StatelessWhile", "If")
_STATEFUL_ALLOWED = {"ReadVariableOp"}


class NotReplayable(ValueError):
    """The cell's graph holds an operation the rewrite cannot re-create."""


@dataclass(frozen=True)
class Product:
    """One matrix product of a cell input by a variable (with its bias, if one alone follows)."""

    name: str  # the MatMul op's name in the traced graph (first one, when deduplicated)
    source: str  # "x" (the step input) or "s<k>" (state tensor k)
    kernel: tf.Variable
    bias: tf.Variable | None
    replaces: tuple[str, ...]  # graph tensor names this product's value stands for


@dataclass
class CellGraph:
    """The analysed step of one cell: its products and how to replay the rest."""

    cell: Any
    x_products: dict[str, Product]
    h_products: dict[int, dict[str, Product]]  # state index -> products of that state tensor
    h_shape: tf.TensorShape  # the shape of the step output h
    summary: str  # what the analysis found, for fingerprints and logs
    _x_shape: list[int] = field(default_factory=list)  # the step input's shape it was traced on
    xla_steps: dict[bool, Any] = field(repr=False, default_factory=dict)  # the executor's cell clusters
    _ops: list[tf.Operation] = field(repr=False, default_factory=list)
    _plan: list[tuple[tuple[str, ...], Any]] = field(repr=False, default_factory=list)
    _inputs: dict[str, int] = field(repr=False, default_factory=dict)  # placeholder -> position
    _reads: dict[str, tf.Variable] = field(repr=False, default_factory=dict)  # handle -> variable
    _captured: dict[str, Any] = field(repr=False, default_factory=dict)  # other captures
    _outputs: Any = field(repr=False, default=None)
    _live_cache: dict[frozenset[str], list[tuple[tuple[str, ...], Any]]] = field(
        repr=False, default_factory=dict
    )

    # What the executor needs (the same shape of interface as a cell that states its kernels).
    @property
    def x_kernels(self) -> dict[str, tuple[tf.Variable, tf.Variable | None]]:
        return {k: (p.kernel, p.bias) for k, p in self.x_products.items()}

    def h_kernels(self, index: int) -> dict[str, tuple[tf.Variable, tf.Variable | None]]:
        return {k: (p.kernel, p.bias) for k, p in self.h_products.get(index, {}).items()}

    def zero_state(self, batch: Any) -> Any:
        return self.cell.zero_state(batch)

    @_do_not_convert  # plain ops in order: nothing for AutoGraph to convert
    def replay(
        self, x_t: tf.Tensor, state: Sequence[tf.Tensor], values: dict[str, tf.Tensor] | None = None
    ) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        """The cell's step on ``(x_t, state)``, with each product named in ``values`` taken from
        there instead of computed; a product not named there is computed by the replay."""
        env: dict[str, tf.Tensor] = {}
        flat_in = [x_t, *state]
        for name, pos in self._inputs.items():
            env[name] = flat_in[pos]
        for name, value in self._captured.items():
            env[name] = tf.convert_to_tensor(value)
        for key, value in (values or {}).items():
            product = self.x_products.get(key) or next(
                (p[key] for p in self.h_products.values() if key in p), None
            )
            if product is None:
                raise KeyError(f"cell {type(self.cell).__name__} has no product {key!r}")
            for t in product.replaces:
                env[t] = value
        for outputs, emit in self._live(frozenset(values or ())):
            for t, v in zip(outputs, emit(env)):
                env.setdefault(t, v)  # a supplied value is never overwritten
        flat = [env[t.name] for t in tf.nest.flatten(self._outputs)]
        h, new_state = tf.nest.pack_sequence_as(self._outputs, flat)
        return h, tuple(new_state)

    def _live(self, replaced: frozenset[str]) -> list[tuple[tuple[str, ...], Any]]:
        """The operations the replay must emit when the products in ``replaced`` are supplied:
        those the outputs depend on through what is not supplied (a supplied product's own
        ``MatMul`` and kernel read are not emitted). Cached per set of supplied products."""
        if replaced not in self._live_cache:
            given = set(self._inputs) | set(self._captured)
            for key in replaced:
                product = self.x_products.get(key) or next(
                    p[key] for p in self.h_products.values() if key in p
                )
                given.update(product.replaces)
            needed = {t.name for t in tf.nest.flatten(self._outputs)} - given
            live = []
            for op, (outputs, emit) in zip(reversed(self._ops), reversed(self._plan)):
                if needed.intersection(outputs) and not given.issuperset(outputs):
                    live.append((outputs, emit))
                    needed.update(t.name for t in op.inputs if t.name not in given)
            self._live_cache[replaced] = live[::-1]
        return self._live_cache[replaced]


def _planned(op: tf.Operation, reads: dict[str, tf.Variable]) -> Any:
    """How to re-create one operation of the captured graph in the current trace: a function of
    the environment (graph tensor name -> tensor in the new trace) returning the op's outputs.
    Planned once at analysis, so that each replay (one per time step of an unrolled trace) only
    calls the raw op."""
    names = [t.name for t in op.inputs]
    if op.type == "Const":
        value = tensor_util.MakeNdarray(op.get_attr("value"))
        return lambda env: [tf.constant(value)]
    if op.type == "ReadVariableOp":
        var = reads.get(names[0])
        if var is None:
            raise NotReplayable(f"{op.name} reads a resource that is not one of the cell's variables")
        return lambda env: [tf.convert_to_tensor(var)]  # through the variable: the tape watches it
    if op.type == "Identity":
        return lambda env: [tf.identity(env[names[0]])]
    fn = getattr(tf.raw_ops, op.type, None)
    if fn is None:
        raise NotReplayable(f"no raw op for {op.type} ({op.name})")
    params = inspect.signature(fn).parameters
    # The raw op takes the op's inputs first, in the op definition's order (a few under other
    # names: Mean's ``reduction_indices`` is ``axis``), then its non-inferred attributes.
    pnames = list(params)
    if len(pnames) < len(op.op_def.input_arg):
        raise NotReplayable(f"raw op {op.type} does not take the inputs of {op.name}")
    layout: list[tuple[str, int, int]] = []  # (argument, first input, count or -1 for one)
    pos = 0
    for k, arg in enumerate(op.op_def.input_arg):
        if arg.number_attr:
            n = op.get_attr(arg.number_attr)
        elif arg.type_list_attr:
            n = len(op.get_attr(arg.type_list_attr))
        else:
            n = -1
        layout.append((pnames[k], pos, n))
        pos += 1 if n < 0 else n
    taken = {arg for arg, _, _ in layout}
    attrs = {k: op.get_attr(k) for k in op.node_def.attr if k in params and k not in taken}
    single = len(op.outputs) == 1

    @_do_not_convert
    def emit(env: dict[str, tf.Tensor]) -> list[Any]:
        kwargs: dict[str, Any] = dict(attrs)
        for arg, first, n in layout:
            kwargs[arg] = env[names[first]] if n < 0 else [env[t] for t in names[first : first + n]]
        out = fn(**kwargs)
        if isinstance(out, tf.Operation):
            return []
        if single and not isinstance(out, (list, tuple)):
            return [out]
        flat: list[Any] = []
        for item in out:
            flat.extend(item if isinstance(item, (list, tuple)) else [item])
        return flat

    return emit


def _bias_of(op: tf.Operation, reads: dict[str, tf.Variable]) -> tuple[tf.Variable, tf.Operation] | None:
    """The bias add that alone consumes a product, if its other operand is a rank-1 variable."""
    consumers = op.outputs[0].consumers()
    if len(consumers) != 1 or consumers[0].type not in ("AddV2", "BiasAdd", "Add"):
        return None
    add = consumers[0]
    other = [t for t in add.inputs if t is not op.outputs[0]]
    if len(other) != 1 or other[0].op.type != "ReadVariableOp":
        return None
    var = reads.get(other[0].op.inputs[0].name)
    if var is None or var.shape.rank != 1 or var.shape[0] != op.outputs[0].shape[-1]:
        return None
    return var, add


def analyse_cell(cell: Any, x_shape: Sequence[int], dtype: tf.DType = tf.float32) -> CellGraph:
    """Trace ``cell(x_t, state)`` for a step input of ``x_shape`` (``[batch, features]``) and
    read its products. Raises :class:`NotReplayable` when the graph cannot be replayed."""
    batch = int(x_shape[0])
    state0 = tuple(cell.zero_state(batch))
    specs = (tf.TensorSpec(x_shape, dtype), tuple(tf.TensorSpec(s.shape, s.dtype) for s in state0))
    concrete = tf.function(lambda x, s: cell(x, s), autograph=False).get_concrete_function(*specs)
    graph = concrete.graph
    handles = {id(v.handle): v for v in getattr(cell, "variables", ()) if hasattr(v, "handle")}
    reads: dict[str, tf.Variable] = {}
    captured: dict[str, Any] = {}
    for external, internal in graph.captures:
        var = handles.get(id(external))
        if var is not None:
            reads[internal.name] = var
        elif external.dtype == tf.resource:
            raise NotReplayable(f"{type(cell).__name__} captures a resource that is not its variable")
        else:
            captured[internal.name] = external
    placeholders = [t.name for t in graph.inputs if t.name not in reads and t.name not in captured]
    inputs = {name: k for k, name in enumerate(placeholders)}
    if len(inputs) != 1 + len(state0):
        raise NotReplayable(
            f"{type(cell).__name__}: expected {1 + len(state0)} graph inputs, got {len(inputs)}"
        )
    ops: list[tf.Operation] = []
    for op in graph.get_operations():
        stateful = op.op_def.is_stateful and op.type not in _STATEFUL_ALLOWED
        if stateful or op.type.startswith(_UNSUPPORTED_PREFIXES):
            raise NotReplayable(f"{type(cell).__name__}: {op.type} ({op.name}) is not replayed")
        if op.type == "Placeholder" or op.type in _SKIPPED:
            continue
        ops.append(op)

    # Products of a graph input by a variable, deduplicated by (input, kernel, bias).
    found: dict[tuple[str, int, int], dict[str, Any]] = {}
    for op in ops:
        if op.type != "MatMul" or op.get_attr("transpose_a") or op.get_attr("transpose_b"):
            continue
        a, b = op.inputs
        if a.name not in inputs or b.op.type != "ReadVariableOp" or b.op.inputs[0].name not in reads:
            continue
        kernel = reads[b.op.inputs[0].name]
        pos = inputs[a.name]
        source = "x" if pos == 0 else f"s{pos - 1}"
        biased = _bias_of(op, reads)
        bias, out = (biased[0], biased[1].outputs[0]) if biased else (None, op.outputs[0])
        key = (source, id(kernel), id(bias) if bias is not None else 0)
        entry = found.setdefault(key, {"name": op.name, "kernel": kernel, "bias": bias, "replaces": []})
        entry["replaces"].append(out.name)
    x_products: dict[str, Product] = {}
    h_products: dict[int, dict[str, Product]] = {}
    for (source, _, _), e in found.items():
        p = Product(e["name"], source, e["kernel"], e["bias"], tuple(e["replaces"]))
        if source == "x":
            x_products[p.name] = p
        else:
            h_products.setdefault(int(source[1:]), {})[p.name] = p
    h_out = tf.nest.flatten(concrete.structured_outputs)[0]
    cg = CellGraph(
        cell=cell,
        x_products=x_products,
        h_products=h_products,
        h_shape=h_out.shape,
        summary="",
        _x_shape=[int(d) for d in x_shape],
        _ops=ops,
        _plan=[(tuple(t.name for t in op.outputs), _planned(op, reads)) for op in ops],
        _inputs=inputs,
        _reads=reads,
        _captured=captured,
        _outputs=concrete.structured_outputs,
    )
    cg.summary = _summary(cg)
    return cg


def _summary(cg: CellGraph) -> str:
    """A stable description of the analysed step: op types in order and the products found."""
    ops = ",".join(op.type for op in cg._ops)
    xs = ",".join(
        f"{tuple(p.kernel.shape)}{'+b' if p.bias is not None else ''}" for p in cg.x_products.values()
    )
    hs = ";".join(
        f"s{i}:"
        + ",".join(f"{tuple(p.kernel.shape)}{'+b' if p.bias is not None else ''}" for p in ps.values())
        for i, ps in sorted(cg.h_products.items())
    )
    digest = hashlib.sha256(ops.encode()).hexdigest()[:12]
    return f"ops={digest}|x={xs}|h={hs}"


def structure_of(cell: Any) -> CellGraph | None:
    """The analysis cached on the cell by :func:`analyse_model` (None: not analysed, or opaque)."""
    return cast(CellGraph | None, cell.__dict__.get("_microco_graph"))


@_do_not_convert  # called from traced steps; plain Python, run as it is
def analyse_model(model: Any, x: tf.Tensor) -> tuple[bool, str]:
    """Analyse each of ``model.cells`` on its step input (``x`` is time-major ``[T, B, F]``;
    layer ``k > 0`` reads layer ``k - 1``'s output) and cache the result on the cell. Returns
    whether every cell can be rewritten, and what was found (or why not). Safe to call inside a
    trace: the cells are traced from the eager context, on shapes only."""
    cells = getattr(model, "cells", None)
    if not cells or not hasattr(model, "head"):
        return False, "the model has no `cells` and `head`"
    shape = [int(x.shape[1]), int(x.shape[2])]
    notes = []
    with tf.init_scope():
        for k, cell in enumerate(cells):
            cg = structure_of(cell)
            if cg is None or cg._x_shape != shape:
                if not hasattr(cell, "zero_state"):
                    return False, f"cell {k} has no zero_state"
                try:
                    cg = analyse_cell(cell, shape, x.dtype)
                except NotReplayable as exc:
                    return False, str(exc)
                except Exception as exc:  # noqa: BLE001 - a cell that cannot be traced alone runs as it is
                    return (
                        False,
                        f"cell {k} ({type(cell).__name__}) could not be traced: {type(exc).__name__}: {exc}",
                    )
                if not cg.x_products and not cg.h_products:
                    return False, f"cell {k} ({type(cell).__name__}) has no product of an input by a variable"
                cell.__dict__["_microco_graph"] = cg
            notes.append(f"{type(cell).__name__}[{cg.summary}]")
            shape = [shape[0], int(cg.h_shape[-1])]
    return True, ";".join(notes)


def require_structure(model: Any, x: tf.Tensor) -> list[CellGraph]:
    """Every cell's analysis for this input (analysed now if needed); raises
    :class:`NotReplayable` with the reason when the model cannot be rewritten."""
    ok, why = analyse_model(model, x)
    if not ok:
        raise NotReplayable(why)
    return [structure_of(c) for c in model.cells]  # type: ignore[misc]
