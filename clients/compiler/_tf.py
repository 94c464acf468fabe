"""The TensorFlow side of Astra: a training step as a ``tf.function`` whose variant (products
batched or not, input projections hoisted out of the time loop or not, XLA or not) is chosen
per mini-batch by the explorer. Variants are traced lazily and cached.

TensorFlow fixes its intra-op thread pool at start-up, so the thread count is not an adaptive
variable here; per-region timing is not available inside one ``tf.function`` either, so every
TensorFlow variable is a whole-step variable judged by step time (with ``.numpy()`` as barrier).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, cast

import numpy as np
import tensorflow as tf

from microco.clients.compiler.explore import ExplorationPolicy
from microco.clients.compiler.explore.types import STAGE_STRUCTURE, GraphSpec, Variable

from . import _compile_costs, _session
from ._compile_costs import HostCompileCosts
from ._gain_rule import CompileGainRule
from ._replicas import tf_replicas_of
from ._run_length import run_length
from ._session import ExplorationSession, Explorer, SessionBacked, failure
from ._tf_cost import (
    TF_SPEED_KIND,
    XlaCostModel,
    calibrate,
    default_cost_file,
    graph_kinds,
    graph_ops,
    measure_tf_speed,
    step_hlo_profile,
    unrolled_hlo_profile,
)
from ._tf_equiv import CHECK_BYTES, StepState
from ._tf_equiv import differs as tf_differs
from ._tf_graph import CellGraph, analyse_model, require_structure
from ._tf_profile import StepsProfiler, TfStepProfile
from ._tf_rng import draws_random
from ._tf_warm import XlaWarmer, _tf_variable, compile_deadline_ms, handle_key

log = logging.getLogger(__name__)


def _project(kernels: dict[str, Any], x: tf.Tensor, batch: bool) -> dict[str, tf.Tensor]:
    """Apply every kernel to ``x`` (``[..., in]``): one product per kernel, or one batched product."""
    if not kernels:
        return {}
    names = list(kernels)
    ws = [k[0] if isinstance(k, tuple) else k for k in kernels.values()]
    bs = [k[1] if isinstance(k, tuple) else None for k in kernels.values()]
    lead = tf.shape(x)[:-1]
    flat = tf.reshape(x, [-1, x.shape[-1]]) if x.shape.rank != 2 else x
    if batch and len(names) > 1:
        sizes = [w.shape[1] for w in ws]
        y = tf.matmul(flat, tf.concat(ws, axis=1))
        if any(b is not None for b in bs):
            y = y + tf.concat([b if b is not None else tf.zeros([n]) for b, n in zip(bs, sizes)], axis=0)
        outs = tf.split(y, sizes, axis=-1)
    else:
        outs = []
        for w, b in zip(ws, bs):
            y = tf.matmul(flat, w)
            outs.append(y + b if b is not None else y)
    if x.shape.rank != 2:
        outs = [tf.reshape(o, tf.concat([lead, [o.shape[-1]]], 0)) for o in outs]
    return dict(zip(names, outs))


def _cell_step(cg: CellGraph, xp: dict[str, tf.Tensor], state: Any, x_t: tf.Tensor, batch: bool) -> Any:
    """One time step of an analysed cell: its recurrent products (batched per state tensor or
    not), then the rest of its captured graph replayed with every product's value supplied."""
    values = dict(xp)
    for index in cg.h_products:
        values.update(_project(cg.h_kernels(index), state[index], batch))
    return cg.replay(x_t, state, values)


def _xla_cell_step(cg: CellGraph, batch: bool) -> Callable[..., Any]:
    """The per-step region (recurrent products + the rest of the cell) as its own XLA cluster: a
    ``jit_compile=True`` function called from the (not XLA-compiled) training step is compiled by
    XLA on its own, forward and gradient, while the rest of the step runs as plain graph ops."""
    # Kept with the analysis it replays: a cell analysed again (another input shape) gets its own.
    if batch not in cg.xla_steps:
        cg.xla_steps[batch] = tf.function(
            lambda xp, state, x_t: _cell_step(cg, xp, state, x_t, batch), jit_compile=True
        )
    return cast(Callable[..., Any], cg.xla_steps[batch])


def run_model(
    model: Any, x: tf.Tensor, hoist: bool, batch: bool, xla_cell: bool = False, loop: bool = False
) -> tf.Tensor:
    """Forward pass of a recurrent model (``model.cells``, each ``cell(x_t, state)``, then
    ``model.head``) over time-major ``x``, under the given choices, through each cell's analysed
    graph (:mod:`._tf_graph`; analysed here if it was not yet).

    ``loop``: the time loop is one ``tf.while_loop`` (its body traced once) instead of unrolled
    into one copy of the cell per time step. Under XLA that is a module a fraction of the size
    (one body, compiled once) and, measured, a faster step than the unrolled one (see
    ``AstraTF.variables``)."""
    graphs = require_structure(model, x)
    if loop:
        return _run_model_loop(model, graphs, x, hoist, batch)
    seq = x
    steps = x.shape[0]
    for cg in graphs:
        state = tuple(cg.zero_state(tf.shape(seq)[1]))
        xp_all = _project(cg.x_kernels, seq, batch) if hoist else None
        step = _xla_cell_step(cg, batch) if xla_cell else None
        outs = []
        for t in range(steps):
            x_t = seq[t]
            xp = (
                {k: v[t] for k, v in xp_all.items()}
                if xp_all is not None
                else _project(cg.x_kernels, x_t, batch)
            )
            if step is not None:
                h, state = step(xp, state, x_t)
            else:
                h, state = _cell_step(cg, xp, state, x_t, batch)
            outs.append(h)
        seq = tf.stack(outs)
    return model.head(seq[-1])


def _run_model_loop(model: Any, graphs: list[CellGraph], x: tf.Tensor, hoist: bool, batch: bool) -> tf.Tensor:
    seq = x
    steps = int(x.shape[0])
    for cg in graphs:
        state = tuple(cg.zero_state(tf.shape(seq)[1]))
        xp_all = _project(cg.x_kernels, seq, batch) if hoist else None
        outs = tf.TensorArray(seq.dtype, size=steps, element_shape=cg.h_shape)

        def body(
            t: Any, state: Any, outs: Any, cg: CellGraph = cg, seq: Any = seq, xp_all: Any = xp_all
        ) -> Any:
            x_t = seq[t]
            xp = (
                {k: v[t] for k, v in xp_all.items()}
                if xp_all is not None
                else _project(cg.x_kernels, x_t, batch)
            )
            h, state = _cell_step(cg, xp, state, x_t, batch)
            return t + 1, state, outs.write(t, h)

        _, state, outs = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), state, outs), maximum_iterations=steps
        )
        seq = outs.stack()
    return model.head(seq[-1])


def input_signature(value: Any) -> str:
    """The shapes and dtypes of a step's input (or labels), for the graph's key: a tensor's
    ``(4, 32):int32``, as before, or for a nest of tensors (a Keras model's dict of named inputs,
    keras-hub's ``{"token_ids": ..., "padding_mask": ...}``; a list, a tuple) each leaf's under its
    name, in a fixed order. Issue 18, session 27: the key read ``x.shape`` and a dict input
    stopped the user's training at the first step (``AttributeError``)."""
    if isinstance(value, dict):
        inner = ",".join(f"{k}={input_signature(value[k])}" for k in sorted(value, key=str))
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(input_signature(v) for v in value) + "]"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return type(value).__name__
    return f"{tuple(shape)}:{getattr(dtype, 'name', dtype)}"


def tf_hardware_id() -> str:
    import os
    import platform

    gpus = tf.config.list_physical_devices("GPU")
    return f"{platform.machine()}|cores={os.cpu_count()}|{'gpu' if gpus else 'cpu'}|tf={tf.__version__}"


def total_loss(model: Any, loss_fn: Callable[..., Any], out: Any, y: Any) -> Any:
    """The loss a step minimises, as Keras's own training step has it: ``loss_fn`` on the batch
    (a ``keras.losses.Loss`` called as Keras calls it, ``(y_true, y_pred)``; any other callable
    as ``loss_fn(out, y)``, prediction first) plus the losses the model adds itself (weight
    regularisers, ``add_loss``: ``model.losses``). Before (issue 18, session 29, a Keras model
    nobody here wrote: a ``Dense`` with an L2 ``kernel_regularizer`` and a
    ``SparseCategoricalCrossentropy`` object), the loss object failed the step (its arguments
    swapped) and, with a lambda, the regularisers were left out: the weights after 30 steps were
    0.011 from ``model.fit``'s."""
    if isinstance(loss_fn, keras_loss_type()):
        loss = loss_fn(y, out)
    else:
        loss = loss_fn(out, y)
    extra = list(getattr(model, "losses", None) or [])
    if extra:
        loss = loss + tf.add_n([tf.cast(e, loss.dtype) for e in extra])
    return loss


def scaled_loss(optimizer: Any, loss: Any) -> Any:
    """The loss the gradients are taken of, as Keras's own training step scales it for mixed
    precision: a Keras 3 optimiser's ``scale_loss`` (a ``LossScaleOptimizer``'s dynamic scale, or
    its ``loss_scale_factor``; the loss itself otherwise), tf.keras 2's ``get_scaled_loss``. Its
    ``apply_gradients`` (Keras 3) or ``unscaled_gradients`` (tf.keras 2) divides it out again.
    Before (issue 18, session 31, a held-out ``mixed_float16`` loop with a ``LossScaleOptimizer``)
    the step took the gradients of the unscaled loss and the optimiser divided them by the scale
    (32,768): the model barely trained, silently, losses 1.36x apart after 20 steps."""
    if hasattr(optimizer, "scale_loss"):
        return optimizer.scale_loss(loss)
    if hasattr(optimizer, "get_scaled_loss"):
        return optimizer.get_scaled_loss(loss)
    return loss


def unscaled_gradients(optimizer: Any, grads: Any) -> Any:
    """tf.keras 2's ``LossScaleOptimizer`` leaves the unscaling to the step (Keras 3's
    ``apply_gradients`` does it itself)."""
    if not hasattr(optimizer, "scale_loss") and hasattr(optimizer, "get_unscaled_gradients"):
        return optimizer.get_unscaled_gradients(grads)
    return grads


def keras_loss_type() -> type:
    """``keras.losses.Loss`` (Keras 3, or tf.keras's where that is what is installed)."""
    try:
        import keras

        return keras.losses.Loss  # type: ignore[no-any-return]
    except ImportError:  # pragma: no cover - TensorFlow without Keras 3
        return tf.keras.losses.Loss  # type: ignore[no-any-return]


class _StepRan(Exception):
    """The wrapper's work after a step failed; the step itself ran, with this loss."""

    def __init__(self, exc: Exception, loss: Any) -> None:
        super().__init__(str(exc))
        self.exc, self.loss = exc, loss


class AstraTF(SessionBacked):
    """One TensorFlow training step, run under the configuration the explorer picks::

        astra = AstraTF(model, tf.keras.optimizers.SGD(0.05), loss_fn, explorer=RemoteExplorer(target))
        for x, y in batches:
            loss = astra.step(x, y)

    ``model`` is any Keras model (or ``tf.Module`` called on a batch). A recurrent model, a stack
    of ``cells`` (each ``cell(x_t, state) -> (h, state)`` with a ``zero_state(batch)``, written
    from TensorFlow operators) then a ``head``, gets the whole space, found by analysing each
    cell's captured graph (:mod:`._tf_graph`: its products of the step input and of the state
    by its variables): the time loop under XLA, hoisting, batching, the cell cluster, the
    unrolled step under XLA. Any other model, or one whose cell graph cannot be replayed, gets
    what applies to every step:
    XLA over the user's own forward or not (``xla``: off / plain), priced by the HLO size of its
    module and judged by step time like the rest.

    ``cost_model`` prices XLA compiles (HLO instructions x measured ms per instruction, see
    :mod:`._tf_cost`); by default the per-hardware rate file ``default_cost_file()``.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        explorer: Explorer | None = None,
        *,
        name: str = "",
        total_steps: int | None = None,  # None: $MICROCO_TOTAL_STEPS, else 1000 (_run_length)
        xla: bool = True,
        exact_random: bool = True,
        retry_every: int = 50,
        cost_model: XlaCostModel | None = None,
        background: bool = True,
        reduce_retracing: bool | None = None,
    ) -> None:
        replicas = tf_replicas_of(model)
        if replicas:
            # (``_replicas``) Not a step to explore under: refused, before any step trains.
            raise ValueError(
                f"AstraTF runs one replica's training step, and {replicas}: their gradients would "
                "not be all-reduced. Train it with model.fit (Keras' distributed step; Astra's fit "
                "adapter leaves a strategy's fit as it is) or the strategy's own loop."
            )
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.name = name or type(model).__name__
        # Is the model a stack of recurrent cells (``cells``, then ``head``)? Until the first step
        # analyses each cell's graph (``_register``) that is a candidate; a cell whose graph
        # cannot be rewritten then makes the model unstructured, run as it is.
        cells = getattr(model, "cells", None)
        self.structured = (
            cells is not None
            and bool(cells)
            and hasattr(model, "head")
            and all(hasattr(c, "zero_state") for c in cells)
        )
        self.structure = ""  # what the analysis found, or why the model is run as it is
        self.total_steps = run_length(total_steps)
        self.xla = xla
        # A step that draws random numbers is not offered XLA: its numbers would differ from the
        # plain step's (``_tf_rng``); ``exact_random=False`` offers it anyway.
        self.exact_random = exact_random
        self.random_checked = False
        if explorer is None:
            from .explore import LocalExplorer

            explorer = LocalExplorer.on_disk()  # this host's state: a second run starts tuned
        self.session = ExplorationSession(explorer, retry_every=retry_every)
        self._variants: dict[tuple[bool, bool, bool, bool, bool], Callable[..., Any]] = {}
        # Committed, with nothing left to report: the step function each step calls directly,
        # with nothing around it (issue 18, evening of 2026-12-02: the wrapper's per-step path
        # cost keras-sublstm's committed XLA step 4.19 against 3.95 ms called directly; PyTorch's
        # wrapper goes direct the same way, ``AstraTorch._go_direct``).
        self.direct: Callable[..., Any] | None = None
        self.abandoned = ""  # why the wrapper gave up and left the step as written (``_abandon``)
        self.cost_model = cost_model
        # HLO instructions of each XLA choice's module ("loop", "unrolled"), counted at
        # registration; what a measured compile of that choice is divided by to get a rate.
        self.hlo_instructions: dict[str, int] = {}
        # id(variant) -> (size kind, its first call's ms of wall and of the process's CPU)
        self._first_call: dict[int, tuple[str, float, float]] = {}
        self._called: set[int] = set()
        # The model's graph on this hardware (structure and input shapes) and the class of each
        # XLA module (``_tf_cost.hlo_class``): what its compile prices are kept and looked up by.
        self.graph_key = ""
        self.hlo_classes: dict[str, str] = {}
        # Trials' XLA compiles run in a background thread with a deadline (``_tf_warm``).
        self.background = background
        # The plain step traced as ``tf.function(reduce_retracing=...)``: a new input shape then
        # reuses a trace of unknown dimensions (the second distinct shape makes it) where a plain
        # ``tf.function`` traces every new shape again. None: on for a Keras model run as it is,
        # as Keras traces its own step (``fit``'s ``one_step_on_data``), off for a ``tf.Module``
        # (its Python may read static shapes) and for a recurrent stack, whose time loop is
        # unrolled over the sequence's static length. Issue 18, session 42 (held out: a user's
        # ``tf.function(reduce_retracing=True)`` loop over ``padded_batch``-style batches of 5-29
        # tokens, 40 steps): that loop traced 3 times in 0.67 s, ``AstraTF`` 18 times in 2.61 s.
        self.reduce_retracing = (
            isinstance(model, tf.keras.layers.Layer) if reduce_retracing is None else reduce_retracing
        )
        self.warmer: XlaWarmer | None = None
        self._example: tuple[Any, Any] = (None, None)
        # Variants whose first step was checked against the plain step's (``_tf_equiv``), by id.
        self._equivalent: set[int] = set()
        self._state: StepState | None = None
        self._refused: dict[int, str] = {}  # variant id -> why it was refused (it ran otherwise)
        # Steps run before registering (a model without cells whose XLA module was never counted
        # here): the first traces the step, the others are steps; see ``PRE_STEPS``.
        self._pre_ms: list[float] = []
        # The plain step's trace when ``_check_random`` made it, before the first pre-step timed
        # its call (that call then found the trace made): added to the first pre-step's time.
        self._checked_trace_ms = 0.0
        # The inputs' shapes (``input_signature`` of the batch and its labels) of the steps run
        # before registering, and of the one XLA's modules are traced for: XLA compiles one module
        # per input shape (``_shapes_vary``).
        self._signatures: set[str] = set()
        self._xla_signature = ""
        self._unpriced_ms = 0.0  # > 0: XLA was not priced (the count could not pay): this prior
        # This host's record of what compiles gained (``HostCompileCosts.record_gain``): an XLA
        # choice committed here leaves its interleaved speedup for this graph, and a later run
        # expects that, not the core's optimistic bound (``_learn_gain``, ``_measured_gain``).
        self.compile_costs = HostCompileCosts()
        self._gain_learned = False
        # One plain pre-step's profile (``_tf_profile``): the share of the step in products and
        # convolutions, which XLA does not fuse away; what an XLA choice never measured here is
        # expected to save is drawn from it (``_expected_share``). None: not profiled.
        self.step_profile: TfStepProfile | None = None
        self._profiler: StepsProfiler | None = None  # over the profiled pre-steps, once wanted
        self._pre_target = self.PRE_STEPS  # pre-steps to run (more while they are profiled)
        self._step_ops: int | None = None  # the plain step's computing ops (``graph_ops``), once read
        self._kinds: str | None = None  # what the plain step computes (``_step_kinds``), once read
        # Variables the step reads or writes besides the model's and the optimiser's (None: not
        # read yet; ``_note_step_variables``).
        self._step_extra: list[Any] | None = None
        self._build_optimizer()

    def _build_optimizer(self) -> None:
        # The optimizer's slots are created outside any traced step, once the model has all its
        # weights. A subclassed Keras model whose parts are built (a ``Sequential`` given its
        # ``Input``) but whose own layers are not yet (built at its first call) has some weights
        # only: an optimiser built on those fails every step ("Unknown variable"; issue 18,
        # session 33, keras.io's VAE, whose encoder and decoder are built and whose latent
        # ``Dense`` layers are not). Such a model's optimiser is built where the user's own step
        # builds it: in the step's first trace (Keras' ``apply_gradients`` builds it there).
        ready = hasattr(self.optimizer, "build") and not getattr(self.optimizer, "built", False)
        if ready and getattr(self.model, "built", True) and self.model.trainable_variables:
            self.optimizer.build(self.model.trainable_variables)

    # The XLA choices, each its own variable so that each is priced by the size of its own module,
    # and in its own stage (the core plans one stage at a time from the best so far, so exactly
    # one XLA choice is tried per trial; when several are on in a configuration, the widest
    # scope is the one that runs: see ``_mode``). Cheapest compile first: the while-loop
    # step before the structure, so that hoisting and batching are then judged under the loop
    # (where they pay) and priced against its step time (see ``variables``).
    STAGES: ClassVar[dict[str, int]] = {"xla_loop": 0, "structure": 1, "xla_cell": 2, "xla": 3}

    def variables(self, hlo_instructions: dict[str, int] | None = None) -> list[Variable]:
        """The TF variable space. ``hlo_instructions``: HLO size of the plain-structure module of
        each XLA choice (``"loop"``, ``"unrolled"``), priced by the cost model."""
        if not self.xla:
            if not self.structured:
                return []  # nothing to choose: the explorer commits the plain step at once
            return [
                Variable("hoist", ("off", "on"), "", STAGE_STRUCTURE),
                Variable("batch", ("off", "on"), "", STAGE_STRUCTURE),
            ]
        sizes = hlo_instructions or {}
        cost = self.cost_model or XlaCostModel(tf_hardware_id(), None)

        def prior(kind: str) -> float:
            if self._unpriced_ms > 0:
                return round(self._unpriced_ms, 1)
            if kind not in sizes:
                return 0.0
            # What the compile costs the run. In line: its wall time at today's load. In the
            # background (``_tf_warm``): the training runs on beside it, and the compile can take
            # from it at most its own work, what it costs alone (issue 18, afternoon of
            # 2026-12-02: keras-sublstm's XLA, 2.3 s alone by this host's measured compiles,
            # was priced 2.9-7.1 s at loads 3.5-4, scaled as if it stopped the training; one
            # compile measured 2.7 s of CPU over its threads and 19.5 s of wall at load 16.6).
            # The deadline stays on the wall time at load (``_compile_deadline_ms``).
            return round(
                cost.estimate(
                    sizes[kind],
                    kind,
                    self.graph_key,
                    self.hlo_classes.get(kind, ""),
                    at_load=not self.background or self.compiles_in_line(kind),
                ),
                1,
            )

        def priced(
            name: str, choices: tuple[str, ...], stage: int, kind: str, subsumes: tuple[str, ...] = ()
        ) -> Variable:
            # The estimate is already calibrated (a rate measured on this hardware for this kind
            # of module): the core must not rescale it by the key's other compiles, which are of
            # the other kind (looped compiles measured below their estimate would otherwise pull
            # the unrolled estimate down and get a losing unrolled compile tried).
            ms = prior(kind)
            return Variable(
                name,
                choices,
                "",
                stage,
                True,
                ms,
                prior_calibrated=ms > 0,
                subsumes=subsumes,
                measured_speedup=self._measured_gain(name) or 0.0,
                expected_speedup=self._expected_speedup(name),
            )

        st = self.STAGES
        if not self.structured:
            # XLA over the user's forward, as `jit_compile=True` on their step would run it.
            return [priced("xla", ("off", "plain"), st["xla"], "unrolled")]
        out = [
            # A structural choice builds a new step variant before it runs: a trace of the unrolled
            # step and Grappler's pass over it (3-12 s measured on the loaded machine), or under
            # `xla_loop` a new XLA compile of the loop (3-11 s). That is compile time like any
            # other, so it is priced (at the loop module's estimate, the same order) and a variant
            # that cannot repay it within the run is not built.
            priced("hoist", ("off", "on"), st["structure"], "loop"),
            priced("batch", ("off", "on"), st["structure"], "loop"),
        ]
        # `xla_loop`: the whole step under XLA with the time loop as one while loop (one cell
        # body to compile, not one per time step), over the structure in force. Explored first:
        # measured (sequence 16, load 1.4-6), the plain loop under XLA beat `tf.function` on all
        # five cells (2.5-7.6 ms against 4.7-17.4) and compiled in 2-8 s against 4-118 s for the
        # unrolled step; hoisted and batched, it was faster still on four of five (1.9-6.0 ms).
        # The structure stage then judges hoisting and batching under it, where they pay.
        # The cell is inside that loop's XLA cluster, so `xla_cell` is inert under it (the core
        # then treats the two as one configuration: the cell-only cluster, the narrower scope,
        # is tried only where the loop did not win; it never won a trial where it did).
        out.append(priced("xla_loop", ("off", "on"), st["xla_loop"], "loop", subsumes=("xla_cell",)))
        # `xla_cell`: only the per-step cell region (recurrent products and gate arithmetic)
        # as its own XLA cluster, the rest of the step in TensorFlow's kernels. Its module is
        # about a loop body, forward and gradient: priced at the loop module's size.
        out.append(priced("xla_cell", ("off", "on"), st["xla_cell"], "loop"))
        # `xla`: the whole unrolled step under XLA, over the structure explored so far ("on")
        # or over the plain step ("plain": exactly what `jit_compile=True` on the user's step
        # does; XLA's own fusion may beat the rewritten structure it is handed). It replaces
        # the loop and the cell clusters: both are inert under it.
        out.append(
            priced("xla", ("off", "on", "plain"), st["xla"], "unrolled", subsumes=("xla_loop", "xla_cell"))
        )
        return out

    def variant(
        self, hoist: bool, batch: bool, xla: bool, xla_cell: bool = False, loop: bool = False
    ) -> Callable[..., Any]:
        """The traced training step for one set of choices (cached). ``xla``: the whole step under
        XLA; with ``loop`` its time loop is a while loop; ``xla_cell``: the cell region only."""
        xla_cell = xla_cell and not xla  # inside a whole-step XLA cluster it is the same thing
        loop = loop and not xla_cell
        key = (hoist, batch, xla, xla_cell, loop)
        if key not in self._variants and xla and not loop:
            # The whole step under XLA is the same step's traced function (the variant without
            # XLA, traced once for the baseline) called inside an XLA cluster, not a second trace
            # of the user's Python: XLA compiles the call as one module. The trace is what a
            # Keras model's first call spends (issue 18, session 32: keras-hub's GPT-2, the
            # count's trace and lowering 180-240 ms against 470-540 ms re-traced, and the first
            # XLA call after it 0.86-1.0 s against 1.1-1.7 s, load 4-7; see docs/compiler.md).
            inner = self.variant(hoist, batch, False)
            self._variants[key] = tf.function(lambda x, y: inner(x, y), jit_compile=True)
        if key not in self._variants:
            self._variants[key] = self.traced_step(hoist, batch, xla, xla_cell, loop)
        return self._variants[key]

    def traced_step(
        self, hoist: bool, batch: bool, xla: bool, xla_cell: bool = False, loop: bool = False
    ) -> Callable[..., Any]:
        """The training step for one set of choices as its own ``tf.function`` (a new one, not
        cached), ``jit_compile=xla``: with ``xla``, what ``jit_compile=True`` on the user's step
        runs (the benchmark's static contender); ``variant`` is what the wrapper runs."""
        model, opt, loss_fn = self.model, self.optimizer, self.loss_fn
        structured = self.structured
        # Keras layers take the training flag (dropout, batch norm); a plain tf.Module does not.
        kwargs = {"training": True} if isinstance(model, tf.keras.layers.Layer) else {}
        relax = self.reduce_retracing and not structured and not xla

        @tf.function(jit_compile=xla, reduce_retracing=relax)  # type: ignore[untyped-decorator]
        def train_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                if structured:
                    out = run_model(model, x, hoist, batch, xla_cell, loop)
                else:
                    out = model(x, **kwargs)
                loss = total_loss(model, loss_fn, out, y)
                scaled = scaled_loss(opt, loss)
            variables = model.trainable_variables
            grads = unscaled_gradients(opt, tape.gradient(scaled, variables))
            opt.apply_gradients(zip(grads, variables))
            return loss

        step: Callable[..., Any] = train_step
        return step

    def _mode(self, v: dict[str, str]) -> tuple[Callable[..., Any], str]:
        """The variant a configuration runs, and the size kind its compile is priced by ("" when
        it compiles nothing). The widest XLA scope that is on wins: the unrolled step, then the
        looped step (whose cluster holds the cell), then the cell alone (as the variables'
        ``subsumes`` declare)."""
        hoist, batch = v.get("hoist") == "on", v.get("batch") == "on"
        if v.get("xla") == "plain":  # XLA over the plain step: the structure's choices do not apply
            return self.variant(False, False, True), "unrolled"
        if v.get("xla") == "on":
            return self.variant(hoist, batch, True), "unrolled"
        if v.get("xla_loop") == "on":
            return self.variant(hoist, batch, True, loop=True), "loop"
        if v.get("xla_cell") == "on":
            return self.variant(hoist, batch, False, xla_cell=True), "loop"
        return self.variant(hoist, batch, False), ""

    # Counting the HLO of a model's whole step (to price XLA over it) traces the step a second
    # time and lowers it: measured 28 s for MobileNetV3Small at load ~12, against a 300-step run
    # of 35 s (session 11). It is done only where the run could repay it, like PyTorch's cache
    # probe (``AstraTorch.CACHE_PROBE_SHARE``): when this share of the run's time at the plain
    # step exceeds the first step's trace. Otherwise XLA stays in the space (the key does not
    # move with the run's length) priced at the whole run, which no compile can repay.
    XLA_PRICING_SHARE = 0.05

    def _size_key(self, x: tf.Tensor, y: tf.Tensor) -> str:
        shapes = ";".join(f"{tuple(v.shape)}" for v in self.model.trainable_variables)
        cells = self.structure if self.structured else "-"
        input_shapes = f"{input_signature(x)};{input_signature(y)}"
        structure = f"{type(self.model).__name__}|{cells}|{shapes}|{input_shapes}{self._step_kinds(x, y)}"
        return hashlib.sha256(structure.encode()).hexdigest()[:24]

    def _step_kinds(self, x: tf.Tensor, y: tf.Tensor) -> str:
        """What the plain step computes (``_tf_cost.graph_kinds`` of its trace, read once), as a
        part of the keys this graph's exploration, XLA module sizes, gains and profile are kept
        by ("" for a recurrent stack, whose analysed structure is in its keys, or a trace that
        cannot be read). Issue 18, session 43 (held out: a user's ``Sequential`` with
        ``BatchNormalization``, then the same with ``LayerNormalization``, through ``model.fit``):
        the keys were the model's class and its trainable shapes, the two models' the same, so
        the second program started "tuned" on the first's exploration, no step of its own
        explored, as PyTorch's keys (the traced graph's fingerprint, ``AstraTorch``) do not."""
        if self.structured:
            return ""
        if self._kinds is None:
            self._kinds = ""
            try:
                step: Any = self.variant(False, False, False)  # (a tf.function)
                t0 = time.perf_counter()
                concrete = step.get_concrete_function(x, y)
                if not self._pre_ms:  # (the first pre-step's call then finds its trace made)
                    self._checked_trace_ms += (time.perf_counter() - t0) * 1e3
                self._kinds = "|" + graph_kinds(concrete)
            except Exception as exc:  # noqa: BLE001 - an unreadable trace: keyed as before
                log.info("astra-tf: %s: the step's ops not read for its key (%s)", self.name, exc)
        return self._kinds

    def _build(self, x: tf.Tensor) -> None:
        if not self.model.trainable_variables:
            self.model(x)  # a Keras model builds its weights on its first call: outside any trace
            self._build_optimizer()

    def _check_random(self, x: tf.Tensor, y: tf.Tensor) -> None:
        """Once, before XLA is offered: drop it where the plain step draws random numbers and
        ``exact_random`` holds (``_tf_rng``)."""
        if self.random_checked or not self.xla or not self.exact_random:
            return
        self.random_checked = True
        self._build(x)
        try:
            step: Any = self.variant(False, False, False)  # (a tf.function)
            t0 = time.perf_counter()
            concrete = step.get_concrete_function(x, y)
            self._checked_trace_ms += (time.perf_counter() - t0) * 1e3
            draws = draws_random(concrete)
        except Exception as exc:  # noqa: BLE001 - a graph that cannot be read: XLA as before
            log.info("astra-tf: %s: the step's random operators not read (%s)", self.name, exc)
            return
        if draws:
            self.xla = False
            log.info(
                "astra-tf: %s: the step draws random numbers (dropout, noise); XLA would draw others, "
                "so it is not offered (AstraTF(..., exact_random=False) offers it)",
                self.name,
            )

    def _needs_pre_step(self, x: tf.Tensor, y: tf.Tensor) -> bool:
        """Run the plain step unregistered (``PRE_STEPS`` times) to learn its trace and step
        times first?"""
        self._check_random(x, y)
        if not self.xla or self.structured:
            return False
        if len(self._pre_ms) == self.PRE_STEPS and self._profiler is None and self.step_profile is None:
            if self._wants_profile(x, y):  # (three more pre-steps, each profiled)
                self._profiler = StepsProfiler()
                self._pre_target = self.PRE_STEPS + self.PROFILED_STEPS
        if len(self._pre_ms) >= self._pre_target:
            return False
        self._build(x)
        if self.cost_model is None:
            self.cost_model = XlaCostModel(tf_hardware_id(), default_cost_file(), speed=self._tf_speed)
        return self.cost_model.module_sizes(self._size_key(x, y)) is None

    # Steps run before registering (a model whose XLA module was never counted here): the first
    # traces the step, the others are steps, the fastest of them the plain step's time that the
    # count's gate (``_worth_pricing``) and a calibration's budget weigh the run by. One step
    # alone was that time until issue 18, session 33: on the shared machine one step in a few
    # runs 10-25x its neighbours (keras-sublstm at 1,000 steps: a second step of 35 ms against
    # 1.5 ms), and the gate then read a run 20x longer than it was and counted the module
    # (280 ms of a 1.5 s run) to price XLA out at once. The fastest of two, as a trial's time
    # is its fastest step; the extra step is a training step like the others.
    PRE_STEPS = 3

    def _pre_step_ms(self) -> float:
        return min(self._pre_ms[1:])

    def _pre_step(self, x: tf.Tensor, y: tf.Tensor) -> Any:
        self._signatures.add(self._signature(x, y))
        plain = self.variant(False, False, False)
        if self._profiler is not None:
            return self._profiled_pre_step(plain, x, y)
        t0 = time.perf_counter()
        loss = self._run(plain, x, y)
        # The first call's time includes the step's trace, wherever it was made: when the random
        # check traced it first, the call found it made (issue 18, session 32: keras-hub's
        # GPT-2 timed 160-195 ms against a first step of 430-445 ms; the count's gate then
        # counted its module at 1,000 steps, 0.35-0.45 s of a 2 s run, and priced XLA out).
        self._pre_ms.append(
            (time.perf_counter() - t0) * 1e3 + (0.0 if self._pre_ms else self._checked_trace_ms)
        )
        return loss

    # -- the plain step's profile: what XLA can be expected to save (issue 18, session 41)
    # What XLA, never measured on a graph here, is expected to save of each step, from the share
    # of the plain step it cannot remove (policy: ``_gain_rule``, the rule PyTorch's whole-step
    # compiles use, calibrated by this host's graphs with a kept share and a measured XLA gain).
    # That share counts products once (XLA calls a product library for its dots) and
    # convolutions twice: XLA's CPU backend emits its own convolutions, not oneDNN's, and they ran
    # slower than the plain step's everywhere they were tried here, so their time is taken as at
    # risk of costing as much as fusion saves elsewhere (2-core VM, one intra-op thread, 15
    # interleaved step pairs each, 2026-12-05, ``keras.applications`` at 32x32 with weights=None,
    # models the corpus does not hold: EfficientNetB0 0.10x, ResNet50 0.49x, DenseNet121 0.85x,
    # a stack of four 3x3 convolutions 0.79x, at convolution shares 0.55-0.97 of the step; the
    # corpus' MobileNetV3Small 0.25x; a six-layer GELU MLP, no convolution, products 0.40 of the
    # step: 1.32x). Before, the core's fixed bound (a quarter of the step) stood for every step:
    # MobileNetV3Small had its XLA trial at 5,000 steps, 5% of the run lost; keras-sublstm's
    # (0.35-0.41 of its span in products, XLA 1.5-1.7x faster) was priced out at 1,000 steps.
    UNFUSED_SHARE_KIND = "tf:unfused"
    GAIN_RULE = CompileGainRule()
    # What a profile costs beyond its step, before one was measured in the process: the
    # profiler's first start in a process loads its tracer (~90 ms here), later ones 6-46 ms
    # (2-core VM, keras-sublstm and MobileNetV3Small, loads 3-5, 2026-12-05).
    PROFILE_PRICE_MS = 150.0
    # Pre-steps run under the profile, added after the plain ones where the gate (which weighs
    # the run by the faster of their two timed steps) wants it: the profile is that of the step
    # with the median share (``StepsProfiler``).
    PROFILED_STEPS = 3

    def _wants_profile(self, x: tf.Tensor, y: tf.Tensor) -> bool:
        """Profile the last pre-step? Where XLA is offered over the step as it is, this host never
        measured XLA on this graph nor kept its share, and a compile could pay at its most: the
        core's optimistic saving (half of every step) over the run exceeds the profile's price,
        the variant's own trace and the least an XLA compile of the step's ops can cost here
        (``least_ms``)."""
        if not self.xla or self.structured or self.cost_model is None or len(self._signatures) > 1:
            return False  # (inputs of several shapes: not offered XLA, ``_no_xla_for_varying_shapes``)
        graph = f"{tf_hardware_id()}|{self._size_key(x, y)}"
        if self.compile_costs.gain(tf_hardware_id(), "tf:xla", graph) is not None:
            return False
        if graph in self.compile_costs.shares(tf_hardware_id(), self.UNFUSED_SHARE_KIND):
            return False
        step_ms = self._pre_step_ms()
        most = self.total_steps * step_ms * self.GAIN_RULE.cap
        ops = self._ops(x, y)
        # An XLA trial traces its variant in the training thread (``XlaWarmer._launch``, or its
        # first call in line): at least the plain step's own first trace again. Session 42: a
        # 300-step MobileNetV3Small (a 2.5 s trace, a compile of 7.9 s) and keras-sublstm (0.19 s
        # against at most 0.26 s saved) profiled three steps to learn what the trace showed.
        least = self.PROFILE_PRICE_MS * _compile_costs.contention() + max(0.0, self._pre_ms[0] - step_ms)
        if ops is not None:
            least += self.cost_model.least_ms(
                ops, "unrolled", self.compile_costs.known_speed(tf_hardware_id(), TF_SPEED_KIND)
            )
        return most > least

    def _ops(self, x: tf.Tensor, y: tf.Tensor) -> int | None:
        """The plain step's computing ops (``graph_ops``, read from its trace), once; None where
        its graph cannot be read."""
        if self._step_ops is None:
            try:
                step: Any = self.variant(False, False, False)  # (a tf.function)
                self._step_ops = graph_ops(step.get_concrete_function(x, y))
            except Exception as exc:  # noqa: BLE001 - an unreadable graph: no bound
                log.info("astra-tf: %s: the step's ops not read (%s)", self.name, exc)
                self._step_ops = -1
        return self._step_ops if self._step_ops >= 0 else None

    def _profiled_pre_step(self, plain: Any, x: tf.Tensor, y: tf.Tensor) -> Any:
        prof = cast(StepsProfiler, self._profiler)
        t0 = time.perf_counter()
        loss = prof.run(lambda: self._run(plain, x, y))
        self._pre_ms.append((time.perf_counter() - t0) * 1e3)
        if len(self._pre_ms) < self._pre_target:
            return loss
        name = plain.get_concrete_function(x, y).name
        profile = prof.read(name.decode() if isinstance(name, bytes) else str(name))
        self._profiler = None
        if profile is None:
            return loss
        self.step_profile = profile
        log.info(
            "astra-tf: %s: the plain step profiled over %d steps: %.1f ms (%.1f ms on the executor), "
            "%.0f%% in products and convolutions (%.0f%% convolutions), %d ops, %.0f ms to profile",
            self.name,
            profile.steps,
            profile.step_ms,
            profile.span_ms,
            100 * profile.library_share,
            100 * profile.convolution_share,
            profile.events,
            profile.cost_ms,
        )
        return loss

    @staticmethod
    def _unfused_share(profile: TfStepProfile) -> float:
        """The share of a profiled step XLA is not expected to remove: its products, and its
        convolutions twice (see ``UNFUSED_SHARE_KIND``)."""
        return min(1.0, profile.library_share + profile.convolution_share)

    def _expected_share(self, name: str) -> float | None:
        """The share of each step XLA choice ``name`` is expected to save: what this host
        measured it to gain on this graph, else what the gain rule expects from the step's
        library share (kept for this graph, else this run's profile); None: neither (the core's
        own bound then stands)."""
        gain = self._measured_gain(name)
        if gain is not None:
            return max(0.0, 1.0 - 1.0 / gain)
        hw = tf_hardware_id()
        shares = self.compile_costs.shares(hw, self.UNFUSED_SHARE_KIND)
        share = shares.get(self.graph_key) if self.graph_key else None
        if share is None and self.step_profile is not None:
            share = self._unfused_share(self.step_profile)
        if share is None:
            return None
        gains = self.compile_costs.gains(hw, "tf:xla")
        pairs = [(shares[g], gains[g]) for g in shares if g in gains]
        return self.GAIN_RULE.expected_share(share, pairs)

    def _expected_speedup(self, name: str) -> float:
        """The speedup the core is told to expect of XLA choice ``name`` where none was measured
        here: the gain rule's, as a speedup (1: nothing expected; 0: no estimate, the core's own
        bound). Only the whole step's (``xla``) is profiled."""
        if name != "xla" or self._measured_gain(name) is not None:
            return 0.0
        share = self._expected_share(name)
        return 1.0 / (1.0 - share) if share is not None and 0.0 <= share < 1.0 else 0.0

    def _register(self, x: tf.Tensor, y: tf.Tensor) -> None:
        self._build(x)
        if self.structured:
            # The space comes from each cell's captured graph (its products of the step input
            # and of the state by its variables); a cell the rewrite cannot replay is run as it is.
            self.structured, self.structure = analyse_model(self.model, x)
            if not self.structured:
                log.info("astra-tf: %s runs as it is (XLA only): %s", self.name, self.structure)
        hardware = tf_hardware_id()
        shapes = ";".join(f"{tuple(v.shape)}" for v in self.model.trainable_variables)
        cells = self.structure if self.structured else "-"
        input_shapes = f"{input_signature(x)};{input_signature(y)}"
        self._xla_signature = self._signature(x, y)
        self._signatures.add(self._xla_signature)
        if self.xla and len(self._signatures) > 1:
            self._no_xla_for_varying_shapes()
        if self.xla:
            if self.cost_model is None:
                self.cost_model = XlaCostModel(hardware, default_cost_file(), speed=self._tf_speed)
            # The size of what XLA would compile, for each XLA choice over the plain structure:
            # traced and lowered to HLO, not compiled (the loop's trace stays with its variant;
            # the unrolled size is extrapolated from one- and two-step traces), unless a run of
            # the same model and shapes on this host counted them already.
            size_key = self._size_key(x, y)
            self.graph_key = f"{hardware}|{size_key}"
            known = self.cost_model.module_sizes(size_key)
            kinds = {"loop", "unrolled"} if self.structured else {"unrolled"}
            profiles: dict[str, tuple[int, str]] = {}
            if known is not None and set(known) == kinds:
                self.hlo_instructions = known
                self.hlo_classes = self.cost_model.module_classes(size_key)
            elif not self.structured and len(self._pre_ms) >= 2 and not self._worth_pricing(x, y):
                step_ms = self._pre_step_ms()
                self._unpriced_ms = max(1.0, self.total_steps * step_ms)
                log.info(
                    "astra-tf: %s: XLA not priced (a trace of %.0f ms against a run of %.0f ms)",
                    self.name,
                    self._pre_ms[0] - step_ms,
                    self._unpriced_ms,
                )
            else:
                profiles = self._hlo_profiles(x, y)
            if self.step_profile is not None:  # (kept: the next run of this graph is not profiled)
                self.compile_costs.record_share(
                    hardware, self.UNFUSED_SHARE_KIND, self._unfused_share(self.step_profile), self.graph_key
                )
            if profiles:
                self.hlo_instructions = {k: n for k, (n, _) in profiles.items()}
                self.hlo_classes = {k: c for k, (_, c) in profiles.items()}
                self.cost_model.remember_module_sizes(size_key, self.hlo_instructions, self.hlo_classes)
            if self.hlo_instructions and not self._unpriced_ms:
                self._calibrate_rates()
            if self.background and self.xla:
                self._example = (x, y)
                # (a background compile shadows every variable the step captures)
                self._note_step_variables(self.variant(False, False, False), x, y)
                self.warmer = XlaWarmer(self)
                self.session.warmer = self.warmer
        variables = self.variables(self.hlo_instructions)
        # The space without its priors: a prior moves with the measured rate, and the key (which
        # finds the committed configuration of an earlier run) must not move with it.
        # Nor with what this host measured a compile to gain (``measured_speedup``).
        space = [
            {
                k: d
                for k, d in v.to_dict().items()
                if k not in ("compile_prior_ms", "prior_calibrated", "measured_speedup", "expected_speedup")
            }
            for v in variables
        ]
        computes = self._step_kinds(x, y) if space else ""  # (nothing to choose: a key of nothing)
        fp = hashlib.sha256(
            f"{type(self.model).__name__}|{cells}|{shapes}|{space}{computes}".encode()
        ).hexdigest()[:24]
        spec = GraphSpec(
            fingerprint=fp,
            input_shapes=input_shapes,
            hardware=hardware,
            variables=tuple(variables),
            model_name=self.name,
            framework="tensorflow",
            total_steps=self.total_steps,
        )
        self.session.register(spec)
        # Committed at the start (an earlier run's commit): its A/B is that run's, learned then.
        self._gain_learned = self.session.committed

    @staticmethod
    def _signature(x: Any, y: Any) -> str:
        """The shapes XLA compiles a module for: each input tensor's, a composite tensor's by its
        components (a ``tf.RaggedTensor``'s values and row splits, whose lengths change from
        batch to batch under a static shape of ``(8, None)``). Before (issue 18, session 42, held
        out: a bag-of-vectors model over ``RaggedTensor`` batches through ``AstraTF``), the
        step's shapes read as steady, XLA was offered, and its trial compiled a module per batch
        in the training step; a run starting tuned on it took 9.3 s for 20 steps against the
        plain step's 0.35 s."""
        parts = tf.nest.flatten((x, y), expand_composites=True)
        return ";".join(input_signature(p) for p in parts)

    # XLA (``jit_compile``) compiles one module per input shape, where ``tf.function`` only
    # retraces: a step whose inputs change shape (a ``tf.data`` pipeline's ``padded_batch`` of
    # sequences of varying length, batches of any size) compiles again at every new shape, a
    # cost its price (one module) does not hold. Issue 18, session 33 (a held-out Keras text model
    # fed by ``padded_batch``, 5,000 steps, 14 shapes): the XLA trial's steps each met a new shape
    # and compiled it in the training step, 6.1 s of slow steps against the plain step's 2.9 s
    # of retraces, 13.9 s in all against 10.6 s (1.31x); ``jit_compile=True`` on the user's own
    # step took 16.4 s at 2,000 steps against 5.4 s. So a step seen with two input shapes before
    # XLA is priced is not offered XLA, and an XLA trial step whose inputs are not of the shape
    # its module was traced for runs the plain step and fails the trial (the core then commits
    # no XLA choice). A committed XLA step is called as it is (what the user's own
    # ``jit_compile=True`` step would do at a new shape: compile it).
    def _shapes_vary(self, kind: str, x: Any, y: Any) -> bool:
        return bool(kind) and bool(self._xla_signature) and self._signature(x, y) != self._xla_signature

    def _no_xla_for_varying_shapes(self) -> None:
        self.xla = False
        log.info(
            "astra-tf: %s: the step's input shapes vary (%d seen in %d steps); XLA compiles one module per "
            "shape, so it is not offered",
            self.name,
            len(self._signatures),
            len(self._pre_ms) + 1,
        )

    def _hlo_profiles(self, x: tf.Tensor, y: tf.Tensor) -> dict[str, tuple[int, str]]:
        """(instructions, class) of each XLA choice's module, traced and lowered to HLO (the
        trace stays with the variant its trial runs). A step XLA cannot lower however it is
        traced (tf2xla refuses one of its operators: a ``StringLookup``'s table lookup) is not
        offered XLA: the plain step is all there is to run, as ``jit_compile=True`` on the user's
        step would fail there. Before (issue 18, session 33, keras.io's multi-input functional
        model and a masked ``GRU``, see below), the lowering's error was the wrapper's own
        failure: logged as an error, the exploration dropped."""
        try:
            if self.structured:
                return {
                    "loop": step_hlo_profile(self.variant(False, False, True, loop=True), x, y),
                    "unrolled": unrolled_hlo_profile(self.variant(False, False, True), x, y),
                }
            # The whole step; "unrolled" is the kind of a whole-step module.
            try:
                return {"unrolled": step_hlo_profile(self.variant(False, False, True), x, y)}
            except (ValueError, tf.errors.OpError) as exc:
                # The XLA variant calls the plain step's trace (``variant``), made outside any XLA
                # context: TensorFlow's while loops built there (a Keras ``GRU`` over an
                # ``Embedding``) keep gradient lists of a run-time length that tf2xla refuses,
                # where a trace made under ``jit_compile`` (the user's own ``jit_compile=True``
                # step) bounds them and lowers (issue 18, session 33, held-out Keras text
                # models). Then the step is traced under XLA itself, as the user's would be.
                log.info(
                    "astra-tf: %s: the plain step's trace does not lower (%s); traced under XLA",
                    self.name,
                    type(exc).__name__,
                )
                self._variants[(False, False, True, False, False)] = self.traced_step(False, False, True)
                return {"unrolled": step_hlo_profile(self.variant(False, False, True), x, y)}
        except (ValueError, tf.errors.OpError) as exc:
            self.xla = False
            log.info(
                "astra-tf: %s: XLA cannot compile this step, so it is not offered (%s)",
                self.name,
                failure(exc),
            )
            return {}

    # What a calibration compile (``_tf_cost.calibrate``) is priced at before it runs: its module
    # of ~220-430 instructions at the cold prior's rate (measured 0.45-0.65 s here, 2026-12-04).
    CALIBRATION_PRICE_MS = 1_000.0

    def _calibrate_rates(self) -> None:
        """Where an XLA choice's module is of a class this host never compiled (no rate of its
        kind and class, no compile of this graph measured), compile a small step of that class
        once (``_tf_cost.calibrate``) and keep its rate for the class, in place of the cold prior
        (issue 18, session 28: keras-hub's GPT-2 and BERT, 1,650 and 1,702 instructions of
        ``dot+gather+scatter``, priced 8.3 and 8.5 s at the 5 ms prior against 5.8-7.3 s of
        expected saving; the static contender compiled them in 2.6-6.3 s and ran 1.4-1.7x
        faster). Either way the prior can be wrong (a class that compiles slower than the prior,
        convolutions, was tried at it and ran minutes), so the calibration is not reserved for the
        cases the prior prunes: it runs wherever its price fits the share of the run a pricing
        trace may take (``XLA_PRICING_SHARE``, at the plain step's time, ``_pre_ms``), once per
        class on a host. A rate from a module smaller than the model's errs high (its compile's
        fixed part spread over fewer instructions); the model's own compile, once measured,
        replaces it."""
        cost = self.cost_model
        if cost is None or len(self._pre_ms) < 2:
            return
        budget = self.total_steps * self._pre_step_ms() * self.XLA_PRICING_SHARE
        for kind in self.hlo_instructions:
            cls = self.hlo_classes.get(kind, "")
            if not cls or cost.has_rate(kind, cls) or cost.measured(self.graph_key, kind):
                continue
            if self.CALIBRATION_PRICE_MS * _compile_costs.contention() > budget:
                continue
            started = time.perf_counter()
            try:
                got = calibrate(cls)
            except Exception as exc:  # noqa: BLE001 - a calibration that fails leaves the prior
                log.info("astra-tf: %s: no calibration of %s (%s)", self.name, cls, exc)
                continue
            if got is None:
                log.info("astra-tf: %s: no calibration step of class %s", self.name, cls)
                continue
            m, ms, cpu = got
            cost.observe_calibration(m, ms, kind, cls, cpu_ms=cpu)
            log.info(
                "astra-tf: %s: calibrated %s (%s) on %d instructions: %.0f ms (%.0f ms CPU), %.0f ms in all",
                self.name,
                kind,
                cls,
                m,
                ms,
                cpu,
                (time.perf_counter() - started) * 1e3,
            )

    def _worth_pricing(self, x: tf.Tensor, y: tf.Tensor) -> bool:
        """Count the step's XLA module (a second trace and a lowering)? Where what the count can
        show could get XLA tried: the module is priced at no less than the step's computing ops
        (``graph_ops``, read from the trace already made) at the lowest rate this host prices a
        module of any class at, and that must be below what XLA is expected to save in this run
        (this graph's gain measured here, else the gain rule's from the step's profile, else the
        core's bound: a quarter of the run). The count itself (about the step's first trace)
        must fit this share of the run at the plain step (``XLA_PRICING_SHARE``) or, where the
        step was profiled, what XLA is expected to save beyond its least price: the count is
        then paid by the compile it can get tried. Unless a calibration of the module's class fits
        the same share (then its rate is unknown), the ops' bound is asked. Issue 18, session 30:
        keras-sublstm at 1,000 steps on a fresh record counted its module (168 ms, 12% of a
        1.35 s run; at least 146 ops x 5 ms = 0.73 s) to price it at 3.5 s, against 0.3 s it
        could save, and ran 1.10x eager."""
        step_ms = self._pre_step_ms()
        budget = self.total_steps * step_ms * self.XLA_PRICING_SHARE
        trace_ms = max(0.0, self._pre_ms[0] - step_ms)
        expected = self._expected_share("xla")
        if expected is not None and not expected > 0:
            log.info(
                "astra-tf: %s: XLA's module not counted: nothing expected of XLA on this step", self.name
            )
            return False
        profiled = expected is not None and self._measured_gain("xla") is None
        if budget <= trace_ms and not profiled:
            return False
        if budget > trace_ms and self.CALIBRATION_PRICE_MS * _compile_costs.contention() <= budget:
            return True  # (a calibration may price its class at any rate: the count may pay)
        cost = self.cost_model
        if cost is None:
            return budget > trace_ms
        ops = self._ops(x, y)
        if ops is None:
            return budget > trace_ms  # (an unreadable graph: no bound, counted as before)
        share = expected
        if share is None:
            policy = ExplorationPolicy()
            share = (1.0 - 1.0 / policy.max_speedup) * policy.expected_gain_share
        saving = self.total_steps * step_ms * max(0.0, share)
        # (alone: a background compile's price; at this host's speed where it was measured)
        least_ms = cost.least_ms(
            ops, "unrolled", self.compile_costs.known_speed(tf_hardware_id(), TF_SPEED_KIND)
        )
        if saving > least_ms and (budget > trace_ms or saving - least_ms > trace_ms):
            return True
        log.info(
            "astra-tf: %s: XLA's module not counted: at least %d ops, %.0f ms to compile, and a count of "
            "about %.0f ms, against %.0f ms it may save",
            self.name,
            ops,
            least_ms,
            trace_ms,
            saving,
        )
        return False

    def _observe_compile(self, fn: Callable[..., Any], kind: str, ms: float, cpu_ms: float) -> None:
        """A variant's first call compiles (and traces); its second is a plain step: their
        difference is one measured compile, a sample of this hardware's ms per instruction (of
        wall, and of the process's CPU: its work, on every thread; XLA's compile ran 0.44 of its
        1.56 s of CPU in the calling thread, keras-sublstm, 2026-12-03). Not where the compile
        ran in the background: the first call was then a cache hit."""
        fid = id(fn)
        if fid not in self._called:
            self._called.add(fid)
            warmed = self.warmer is not None and fid in self.warmer.done
            if kind and self.cost_model is not None and kind in self.hlo_instructions and not warmed:
                self._first_call[fid] = (kind, ms, cpu_ms)
            return
        pending = self._first_call.pop(fid, None)
        if pending is not None and self.cost_model is not None:
            k, first, first_cpu = pending
            self.cost_model.observe(
                self.hlo_instructions[k],
                first - ms,
                k,
                self.graph_key,
                self.hlo_classes.get(k, ""),
                cpu_ms=first_cpu - cpu_ms,
            )

    # -- what an XLA choice gained here (issue 18, session of 2026-12-03 morning)
    XLA_CHOICES = ("xla", "xla_loop", "xla_cell")  # widest scope first (see ``_mode``)

    def _measured_gain(self, name: str) -> float | None:
        """The speedup XLA choice ``name`` gave this graph on this host, measured interleaved
        against the baseline by an earlier run's exploration; None: never measured."""
        if not self.graph_key:
            return None
        return self.compile_costs.gain(tf_hardware_id(), f"tf:{name}", self.graph_key)

    def _learn_gain(self) -> None:
        """At a commit of an XLA choice: keep its interleaved speedup for this graph on this host
        (keras-sublstm: XLA ran 1.6x its plain step at 5,000 steps, while a run of 1,000
        expected a quarter of its time saved, 0.63 s, below its compile's price, and stayed
        plain against a static XLA run 1.13x faster). As PyTorch's whole-step compiles
        (``AstraTorch._learn_gain``); only an in-process explorer shows its state."""
        self._gain_learned = True
        state = self._explored_state()
        if state is None or not self.graph_key:
            return  # nothing learned
        values = state.best_values
        on = [n for n in self.XLA_CHOICES if values.get(n, "off") != "off"]
        if on and state.interleaved is not None:
            self.compile_costs.record_gain(tf_hardware_id(), f"tf:{on[0]}", state.speedup, self.graph_key)
        # ... and what an XLA choice measured against the baseline and not committed gave: the
        # next run of this graph expects that, and the gain rule is calibrated by it (issue 18,
        # session 41: MobileNetV3Small's XLA step, 0.25x its plain step, was tried again by every
        # run that had not committed, as PyTorch's lost compiles were before, ``AstraTorch``).
        # A trial the core rejected as slower than the baseline without an interleaved A/B
        # (MobileNetV3Small's, 4x slower) keeps its step time over the baseline's: the core's own
        # verdict, kept as a loss only.
        hw, kept = tf_hardware_id(), set()
        for r in state.confirm_log:
            tried = state.trials[r["best"]].values
            lost = [n for n in self.XLA_CHOICES if tried.get(n, "off") != "off"]
            if lost and r.get("pairs") and tried != values:
                self.compile_costs.record_gain(hw, f"tf:{lost[0]}", float(r["ratio"]), self.graph_key)
                kept.add(lost[0])
        base = [
            t.step_ms for t in state.trials if t.kind == "baseline" and t.done and math.isfinite(t.step_ms)
        ]
        for t in state.trials:
            lost = [n for n in self.XLA_CHOICES if t.values.get(n, "off") != "off"]
            if not lost or lost[0] in kept or t.values == values or t.failed or not t.done or not base:
                continue
            if math.isfinite(t.step_ms) and t.step_ms > base[0]:
                self.compile_costs.record_gain(hw, f"tf:{lost[0]}", base[0] / t.step_ms, self.graph_key)
                kept.add(lost[0])

    # -- background compiles (``_tf_warm``)
    def _all_variables(self) -> list[Any]:
        """What a training step captures: the model's and the optimiser's variables, and the others
        its trace reads or writes (``_other_variables``)."""
        return list(self.model.variables) + self._optimizer_variables() + self._other_variables()

    def _tf_speed(self) -> float:
        """This host's speed at a step's first call against the reference host's, measured once
        per host (``_tf_cost.measure_tf_speed``, ~60 ms) and kept in its record: the scale of a
        cold XLA compile priced by its size (``_tf_cost.xla_curve_ms``)."""
        return self.compile_costs.host_speed(tf_hardware_id(), TF_SPEED_KIND, measure_tf_speed)

    def _price_ms(self, kind: str) -> float:
        if self.cost_model is None or kind not in self.hlo_instructions:
            return 0.0
        return self.cost_model.estimate(
            self.hlo_instructions[kind], kind, self.graph_key, self.hlo_classes.get(kind, "")
        )

    def compiles_in_line(self, kind: str) -> bool:
        """Does a trial's XLA compile of ``kind`` run in the training step rather than beside it?
        In line where no core is idle beside the training (``_session.idle_cores``) and a compile
        of this very graph finished here before (its price is a measurement, not a guess that
        the background's deadline must guard). Measured on keras-sublstm at 5,000 steps (load
        ~4 on 2 cores, 2026-12-03): its compile took 1.28 s of wall beside the training, the run held 310 steps for it and reached its commit after 2.9 s,
        where the static contender compiled the same step in line in 1.7 s: beside the training
        on an oversubscribed machine a compile slows the steps beside it more than it costs in
        the step (PyTorch's background worker stays off there too: ``_torch.spare_core``)."""
        if not self.background:
            return True
        if self.cost_model is None or not self.graph_key:
            return False
        return self.cost_model.compiled_here(self.graph_key, kind) and _session.idle_cores() < 1.0

    def _compile_deadline_ms(self, kind: str) -> float:
        s = self.session
        base = s.base_ms if s.base_ms is not None else s.best_ms
        return compile_deadline_ms(self._price_ms(kind), self.total_steps - s.steps, base)

    def _observe_background_compile(self, kind: str, ms: float) -> None:
        # Wall time (over the load): its CPU time would include the training's steps beside it,
        # whose kernels run in TensorFlow's pool threads as the compile's do.
        if self.cost_model is not None and kind in self.hlo_instructions:
            self.cost_model.observe(
                self.hlo_instructions[kind], ms, kind, self.graph_key, self.hlo_classes.get(kind, "")
            )

    def _observe_abandoned_compile(self, kind: str, ms: float) -> None:
        if self.cost_model is not None:
            self.cost_model.observe_abandoned(self.graph_key, kind, ms)

    def step(self, x: tf.Tensor, y: tf.Tensor) -> Any:
        """One training step (forward, backward, optimizer update); returns the loss (a float;
        Keras' logs for :class:`AstraKerasFit`)."""
        if self.direct is not None:
            return self._run(self.direct, x, y)
        try:
            if self.session.spec is None:
                if self._needs_pre_step(x, y):
                    return self._pre_step(x, y)
                self._register(x, y)
            fn, kind = self._mode(self.session.values)
        except Exception as exc:  # noqa: BLE001 - the wrapper's own failure: never the user's step
            return self._abandon(exc, x, y, ran=None)
        try:
            return self._step(fn, kind, x, y)
        except _StepRan as ran:
            return self._abandon(ran.exc, x, y, ran=ran.loss)

    def _abandon(self, exc: Exception, x: tf.Tensor, y: tf.Tensor, ran: Any) -> Any:
        """The wrapper's own work around a step failed (its analysis of the step, the exploration,
        the bookkeeping after it; not the step itself, whose failure runs the baseline). Training
        must not stop for it (issue 18, session 30; the same net as ``AstraTorch._abandon``):
        the user's step as written, under ``tf.function``, runs from now on; ``ran``: the loss of
        this step when it had already run (not run twice)."""
        self.abandoned = f"{type(exc).__name__}: {exc}"
        log.error("astra: the compiler failed around a step (%s); the step runs as written", self.abandoned)
        self.direct = self.variant(False, False, False)
        return ran if ran is not None else self._run(self.direct, x, y)

    def _run(self, fn: Any, x: Any, y: Any) -> Any:
        """Call a step variant and wait for it: its loss as a float (``.numpy()`` is the barrier:
        the step has finished). :class:`AstraKerasFit` returns Keras' logs instead."""
        return float(fn(x, y).numpy())

    # -- the variant against the plain step (``_tf_equiv``): once per variant in a process
    def _check_before(self, fn: Any, plain: Any) -> list[Any] | None:
        """The variables before a variant's first step, when that step is to be checked against
        the plain step's (None: no check). Not where the user accepts other random numbers
        (``exact_random=False``: the two steps' draws differ), nor a step whose variables are too
        large to copy three times."""
        if fn is plain or id(fn) in self._equivalent or not self.exact_random:
            return None
        try:
            if self._state is None:
                self._state = StepState(self.model, self._optimizer_variables(), self._other_variables())
            if self._state.bytes * 3 > CHECK_BYTES:
                log.info(
                    "astra-tf: %s: variants not checked (%d MB of variables)",
                    self.name,
                    self._state.bytes >> 20,
                )
                self._equivalent.add(id(fn))
                return None
            return self._state.copy()
        except Exception as exc:  # noqa: BLE001 - a state that cannot be copied: not checked
            log.info("astra-tf: %s: variants not checked (%s)", self.name, failure(exc))
            self._equivalent.add(id(fn))
            return None

    def _check_against_plain(
        self, fn: Any, plain: Any, before: list[Any], ran: Any, x: Any, y: Any
    ) -> tuple[Any, str]:
        """The variant's first step has run (``ran``, its result) from ``before``: run the plain
        step from the same variables on the same batch and compare what each did. The plain
        step's result stands either way; returns it, and why the variant is refused ("" if not)."""
        state = self._state
        assert state is not None
        try:
            after_variant = state.read()
            start = [np.asarray(t) for t in before]
        except Exception as exc:  # noqa: BLE001 - nothing put back yet: the variant's step stands
            log.info("astra-tf: %s: a variant not checked (%s)", self.name, failure(exc))
            self._equivalent.add(id(fn))
            return ran, ""
        try:
            state.restore(before)
        except Exception as exc:  # the wrapper's own failure with the variables half put back
            raise _StepRan(exc, ran) from exc
        result = self._run(plain, x, y)  # (the user's own step: its failure is the user's)
        why = ""
        try:
            why = tf_differs(state.kinds, start, state.read(), after_variant, result, ran)
        except Exception as exc:  # noqa: BLE001 - a comparison that cannot be made: refused
            why = f"not compared ({failure(exc)})"
        if why:
            why = f"computes otherwise than the plain step: {why}"
            log.warning("astra-tf: %s: a variant refused: %s", self.name, why)
            self._refused[id(fn)] = why
        else:
            self._equivalent.add(id(fn))
        return result, why

    def _optimizer_variables(self) -> list[Any]:
        opt_vars = getattr(self.optimizer, "variables", [])
        return list(opt_vars() if callable(opt_vars) else opt_vars)

    def _other_variables(self) -> list[Any]:
        """The step's variables that are neither the model's nor the optimiser's, as far as
        known (``_note_step_variables``)."""
        return list(self._step_extra or [])

    def _note_step_variables(self, plain: Any, x: Any, y: Any) -> None:
        """Once, before a variant other than the plain step runs (its check against the plain
        step puts the variables back, a failed trial step is undone) or is compiled beside the
        training (on shadows of the variables, ``_tf_warm``): the variables the plain
        step's trace reads or writes (its graph's watched variables) that ``model.variables`` and
        the optimiser's do not hold. Keras lists only its own variables: a raw ``tf.Variable``
        a layer or a ``train_step`` keeps (a running statistic, gradient accumulators and their
        counter) and a second optimiser a ``train_step`` steps are not in them. Before (issue
        18, session 42, held out: a ``train_step`` accumulating gradients in ``tf.Variable``s over
        three batches, a tuned ``fit`` whose XLA step was checked), those were left as the checked
        variant had written them when the plain step ran again: the step counted and accumulated
        twice, and the run left plain ``fit``'s silently."""
        if self._step_extra is not None:
            return
        self._step_extra = []
        try:
            watched = list(plain.get_concrete_function(x, y).graph.variables)
        except Exception as exc:  # noqa: BLE001 - a trace that cannot be read: the known ones
            log.info("astra-tf: %s: the step's own variables not read (%s)", self.name, failure(exc))
            return
        # Known by their resource handles: a Keras 3 variable is not the ``tf.Variable`` it wraps,
        # nor the one the trace watches, while the handle is one (by object identity, every one
        # of MobileNetV3Small's 213 variables read as the step's own: session 42's corpus run)
        known = {
            handle_key(v)
            for v in list(self.model.variables) + self._optimizer_variables() + self._other_variables()
        }
        extra: list[Any] = []
        for v in watched:
            tv, key = _tf_variable(v), handle_key(v)
            if tv is not None and key is not None and key not in known:
                known.add(key)
                extra.append(tv)
        if extra:
            log.info(
                "astra-tf: %s: the step also reads or writes %d variables of neither the model nor its "
                "optimiser (kept and put back with theirs)",
                self.name,
                len(extra),
            )
        self._step_extra = extra

    def _snapshot(self, fn: Any) -> Any:
        """What a trial step of variant ``fn`` (not the plain one) may change, kept before it runs
        so that a failure inside it can be undone before the plain step repeats it (None: nothing
        kept). Here nothing: ``AstraTF``'s variants differ only in XLA, which fails before it runs
        (its trace, lowering or compile) or writes its variables at the end of its one cluster;
        :class:`AstraKerasFit` keeps the variables, since a Keras step's failure is not known to
        be of that kind."""
        return None

    def _restore(self, snapshot: Any, why: str) -> None:
        """Put back what ``_snapshot`` kept (a trial step failed, ``why``: its partial work)."""

    def _step(self, fn: Any, kind: str, x: tf.Tensor, y: tf.Tensor) -> Any:
        plain = self.variant(False, False, False)
        if fn is not plain:
            self._note_step_variables(plain, x, y)
        snapshot = self._snapshot(fn) if fn is not plain else None
        chosen = fn
        failed = self._refused.get(id(fn), "")  # (it computed otherwise: the plain step runs)
        if not failed and self.warmer is not None:
            failed = self.warmer.abandoned.get(id(fn), "")
        before = self._check_before(fn, plain) if not failed else None
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            if not failed and self._shapes_vary(kind, x, y):
                failed = f"input shapes vary ({self._signature(x, y)} against {self._xla_signature}): XLA compiles per shape"
            if failed:  # its compile was abandoned at its deadline, or cannot serve this shape: the
                fn = plain  # trial fails, training goes on
            loss = self._run(fn, x, y)
        except Exception as exc:  # a variant that fails must not stop training: run the baseline
            if fn is plain:
                raise
            failed = f"{type(exc).__name__}: {exc}"
            self._restore(snapshot, failed)
            loss = self._run(plain, x, y)
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3
        compiled = not failed
        if before is not None and not failed:
            loss, failed = self._check_against_plain(fn, plain, before, loss, x, y)
        try:  # (``_StepRan``: the step ran, its loss stands, whatever fails after it)
            if compiled:
                self._observe_compile(fn, kind, ms, cpu_ms)
            self.session.record(ms, {}, failed)
            if self.session.committed and not self._gain_learned:
                self._learn_gain()
            if self.session.settled and self._mode(self.session.values)[0] is chosen:
                if not failed:
                    self.direct = fn  # its compile observed; the explorer hands a settled session nothing
                elif id(chosen) in self._refused:
                    self.direct = plain  # (a committed variant refused: the plain step from now on)
        except Exception as exc:  # (the step ran: its loss stands)
            raise _StepRan(exc, loss) from exc
        return loss
