"""The TensorFlow side of Astra: a training step as a ``tf.function`` whose variant (products
batched or not, input projections hoisted out of the time loop or not, XLA or not) is chosen
per mini-batch by the explorer. Variants are traced lazily and cached.

TensorFlow fixes its intra-op thread pool at start-up, so the thread count is not an adaptive
variable here; per-region timing is not available inside one ``tf.function`` either, so every
TensorFlow variable is a whole-step variable judged by step time (with ``.numpy()`` as barrier).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from microco.services.compiler._types import STAGE_COMPILE, STAGE_STRUCTURE, GraphSpec, Variable

from ._session import ExplorationSession, Explorer, SessionBacked


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


def _cell_step(cell: Any, xp: dict[str, tf.Tensor], state: Any, x_t: tf.Tensor, batch: bool) -> Any:
    hp = _project(cell.h_kernels, cell.h_input(state), batch)
    return cell.combine(xp, hp, state, x_t)


def _xla_cell_step(cell: Any, batch: bool) -> Callable[..., Any]:
    """The per-step region (recurrent products + gate arithmetic) as its own XLA cluster: a
    ``jit_compile=True`` function called from the (not XLA-compiled) training step is compiled by
    XLA on its own, forward and gradient, while the rest of the step runs as plain graph ops."""
    cache = cell.__dict__.setdefault("_microco_xla_steps", {})
    if batch not in cache:
        cache[batch] = tf.function(
            lambda xp, state, x_t: _cell_step(cell, xp, state, x_t, batch), jit_compile=True
        )
    return cache[batch]


def run_model(model: Any, x: tf.Tensor, hoist: bool, batch: bool, xla_cell: bool = False) -> tf.Tensor:
    """Forward pass of a zoo ``RecurrentClassifier`` over time-major ``x`` under the given choices."""
    seq = x
    steps = x.shape[0]
    for cell in model.cells:
        state = cell.zero_state(tf.shape(seq)[1])
        xp_all = _project(cell.x_kernels, seq, batch) if hoist else None
        step = _xla_cell_step(cell, batch) if xla_cell else None
        outs = []
        for t in range(steps):
            x_t = seq[t]
            xp = (
                {k: v[t] for k, v in xp_all.items()}
                if xp_all is not None
                else _project(cell.x_kernels, x_t, batch)
            )
            if step is not None:
                h, state = step(xp, state, x_t)
            else:
                h, state = _cell_step(cell, xp, state, x_t, batch)
            outs.append(h)
        seq = tf.stack(outs)
    return model.head(seq[-1])


def tf_hardware_id() -> str:
    import os
    import platform

    gpus = tf.config.list_physical_devices("GPU")
    return f"{platform.machine()}|cores={os.cpu_count()}|{'gpu' if gpus else 'cpu'}|tf={tf.__version__}"


class AstraTF(SessionBacked):
    """One TensorFlow training step, run under the configuration the explorer picks::

        astra = AstraTF(model, tf.keras.optimizers.SGD(0.05), loss_fn, explorer=RemoteExplorer(target))
        for x, y in batches:
            loss = astra.step(x, y)

    ``model`` is a zoo-style recurrent model whose cells state their products (``x_kernels``,
    ``h_kernels``) and element-wise remainder (``combine``).
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        explorer: Explorer | None = None,
        *,
        name: str = "",
        total_steps: int = 1000,
        xla: bool = True,
        retry_every: int = 50,
    ) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.name = name or type(model).__name__
        self.total_steps = total_steps
        self.xla = xla
        if explorer is None:
            from microco.services.compiler import LocalExplorer

            explorer = LocalExplorer()
        self.session = ExplorationSession(explorer, retry_every=retry_every)
        self._variants: dict[tuple[bool, bool, bool, bool], Callable[..., Any]] = {}
        if hasattr(optimizer, "build"):
            optimizer.build(model.trainable_variables)

    # Compile priors (ms) before anything is measured. XLA of the whole step compiles the unrolled
    # sequence: measured 11 to 170 s for 16 time steps on the loaded 2-core machine, so ~1.5 s
    # per cell call is the optimistic end; one cell region compiled alone took ~3.5 s.
    XLA_PRIOR_MS_PER_CALL = 1500.0
    XLA_CELL_PRIOR_MS = 3500.0

    def variables(self, cell_calls: int = 1) -> list[Variable]:
        out = [
            Variable("hoist", ("off", "on"), "", STAGE_STRUCTURE),
            Variable("batch", ("off", "on"), "", STAGE_STRUCTURE),
        ]
        if self.xla:
            # XLA for the whole step, or for the per-step cell region only (the rest of the
            # step, hoisted products included, stays in TensorFlow's own kernels). Whole-step XLA
            # has two choices: over the structure explored so far ("on"), and over the plain step
            # ("plain": exactly what `jit_compile=True` on the user's step does), because XLA's own
            # fusion may beat the rewritten structure it is handed (measured: gru and sru ran
            # faster as plain XLA than as microco's hoisted step). Both are priced like every
            # compile (measured costs, else the prior) and tried whenever they can pay back.
            whole = self.XLA_PRIOR_MS_PER_CALL * max(1, cell_calls)
            out.append(
                Variable(
                    "xla", ("off", "on", "plain"), "", STAGE_COMPILE, compiles=True, compile_prior_ms=whole
                )
            )
            out.append(
                Variable(
                    "xla_cell",
                    ("off", "on"),
                    "",
                    STAGE_COMPILE,
                    compiles=True,
                    compile_prior_ms=self.XLA_CELL_PRIOR_MS,
                )
            )
        return out

    def variant(self, hoist: bool, batch: bool, xla: bool, xla_cell: bool = False) -> Callable[..., Any]:
        xla_cell = xla_cell and not xla  # inside a whole-step XLA cluster it is the same thing
        key = (hoist, batch, xla, xla_cell)
        if key not in self._variants:
            model, opt, loss_fn = self.model, self.optimizer, self.loss_fn

            @tf.function(jit_compile=xla)
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(run_model(model, x, hoist, batch, xla_cell), y)
                variables = model.trainable_variables
                grads = tape.gradient(loss, variables)
                opt.apply_gradients(zip(grads, variables))
                return loss

            self._variants[key] = train_step
        return self._variants[key]

    def _register(self, x: tf.Tensor, y: tf.Tensor) -> None:
        # The step unrolls one cell call per time step and layer.
        variables = self.variables(int(x.shape[0] or 1) * len(self.model.cells))
        shapes = ";".join(f"{tuple(v.shape)}" for v in self.model.trainable_variables)
        cells = ",".join(type(c).__name__ for c in self.model.cells)
        space = [v.to_dict() for v in variables]
        fp = hashlib.sha256(f"{type(self.model).__name__}|{cells}|{shapes}|{space}".encode()).hexdigest()[:24]
        spec = GraphSpec(
            fingerprint=fp,
            input_shapes=f"{tuple(x.shape)}:{x.dtype.name};{tuple(y.shape)}:{y.dtype.name}",
            hardware=tf_hardware_id(),
            variables=tuple(variables),
            model_name=self.name,
            framework="tensorflow",
            total_steps=self.total_steps,
        )
        self.session.register(spec)

    def step(self, x: tf.Tensor, y: tf.Tensor) -> float:
        """One training step (forward, backward, optimizer update); returns the loss."""
        if self.session.spec is None:
            self._register(x, y)
        v = self.session.values
        if v.get("xla") == "plain":  # XLA over the plain step: the structure's choices do not apply
            fn = self.variant(False, False, True)
        else:
            fn = self.variant(
                v.get("hoist") == "on",
                v.get("batch") == "on",
                v.get("xla") == "on",
                v.get("xla_cell") == "on",
            )
        t0 = time.perf_counter()
        failed = ""
        try:
            loss = float(fn(x, y).numpy())  # .numpy() is the barrier: the step has finished
        except Exception as exc:  # a variant that fails must not stop training: run the baseline
            if fn is self.variant(False, False, False):
                raise
            failed = f"{type(exc).__name__}: {exc}"
            loss = float(self.variant(False, False, False)(x, y).numpy())
        ms = (time.perf_counter() - t0) * 1e3
        self.session.record(ms, {}, failed)
        return loss
