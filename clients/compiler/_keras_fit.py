"""Keras' own ``model.fit`` through Astra (issue 18, session 34).

``attach_fit(model)`` before ``fit`` and the user's ``fit`` call runs unchanged through Astra's
online exploration::

    from microco.clients.compiler import attach_fit

    model.compile(optimizer, loss, metrics=[...])
    astra = attach_fit(model)  # explorer=RemoteExplorer(target), or this host's LocalExplorer
    model.fit(ds, epochs=5, validation_data=val, callbacks=[...])
    astra.summary()  # the baseline, the configuration in force, each trial

Keras 3 on the TensorFlow backend builds the function ``fit`` calls per step in
``make_train_function``: ``one_step_on_data(data) -> self.train_step(data)`` under
``tf.function(jit_compile=model.jit_compile)``. The attachment replaces that method on the
model instance (nothing else of ``fit`` is touched: callbacks, validation, metrics and their
logs, sample and class weights, ``stop_training`` are Keras' own), and the function it builds
runs each step through :class:`AstraKerasFit`, an :class:`~._tf.AstraTF` whose step variants are
that same ``one_step_on_data`` over the model's own ``train_step`` (Keras' compiled loss with
``model.losses``, the optimiser's loss scaling, the metrics' updates), with and without XLA. The
exploration, pricing of XLA's compile, background compiles with a deadline, the random-number
check and the fallbacks are ``AstraTF``'s, unchanged.

While exploring, the batch is taken from the iterator outside the step, so a trial that fails
(its trace, XLA's lowering or compile, or the step itself) is repeated on the same batch by the
plain step after the variables it may have changed (the model's, the optimiser's, the metrics')
are put back: ``fit`` goes on, each update applied once. Once the configuration is settled,
``fit``'s ``train_function`` calls the committed variant with no wrapper per step: Keras' own
function (``_make_function``, the iterator read in the graph, ``steps_per_execution`` as Keras
loops it) around it where the batches' static shapes are those it was traced for, else the batch
taken outside it (no second trace nor XLA compile for a general shape).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ._session import Explorer
from ._tf import AstraTF, input_signature

log = logging.getLogger(__name__)

__all__ = ["AstraFit", "AstraKerasFit", "attach_fit"]


def _tf_variable(v: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (``.value``), or ``v`` itself."""
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _no_optionals(data: Any) -> Any:
    """Keras' batch (or its spec) with each ``tf.experimental.Optional`` as None, as Keras hands
    it to ``train_step`` (``TensorFlowTrainer._autoconvert_optionals``): a generator's ``None``
    (``yield x, y, None``; an optional input's value) reaches ``fit``'s iterator as an empty
    ``Optional``. Before (issue 18, session 42, held out: a generator yielding ``(x, y, None)``),
    Astra's step handed the ``Optional`` itself to ``train_step``: its loss refused it ("Expected
    float32, but got ... _OptionalImpl"), the plain step too, and ``fit`` stopped at its first
    step where plain ``fit`` trains."""
    return tf.nest.map_structure(
        lambda i: None if isinstance(i, (tf.experimental.Optional, tf.OptionalSpec)) else i, data
    )


class AstraKerasFit(AstraTF):
    """The step ``fit`` calls, explored: :class:`AstraTF` over Keras' ``train_step``.

    A step's input is Keras' batch (``data``: ``(x, y)``, ``(x, y, sample_weight)``, ...) as the
    first argument of each variant; the second, AstraTF's labels, is empty (``()``). A step
    returns Keras' logs.
    """

    def __init__(self, model: Any, explorer: Explorer | None = None, **options: Any) -> None:
        options.setdefault("name", f"keras-fit:{getattr(model, 'name', type(model).__name__)}")
        super().__init__(model, model.optimizer, model.loss, explorer, **options)
        self.structured = False  # Keras' step as it is: XLA over it, or not
        self.structure = "Keras train_step"
        self.failures: list[str] = []  # trial steps that failed and were repeated plainly
        self._state_vars: list[Any] | None = None
        self._copy: Callable[[], Any] | None = None
        self._completed: set[int] = set()  # variants (by id) that completed a step
        self._settled: Callable[[Any], Any] | None = None
        self._data_signature = ""  # the shapes of the first batch (``_settle``)
        self._element_spec: Any = None  # what ``fit``'s iterator yields (``traced_step``)

    # -- AstraTF's step, Keras' body
    def traced_step(
        self, hoist: bool, batch: bool, xla: bool, xla_cell: bool = False, loop: bool = False
    ) -> Callable[..., Any]:
        """Keras' ``one_step_on_data`` (``keras/src/backend/tensorflow/trainer.py``): the model's
        ``train_step`` as a ``tf.function(reduce_retracing=True, jit_compile=xla)``. Keras runs it
        under the distribution strategy (``strategy.run``, then a reduction per replica); under
        the default strategy, the only one explored (``AstraFit``), that is the step itself, and
        the settled function (``_settle``) is Keras' own, which adds both around the variant."""
        train_step = self.model.train_step

        @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]
        def one_step_on_data(data: Any, _labels: Any) -> Any:
            return train_step(data)

        traced: Any = tf.function(one_step_on_data, reduce_retracing=True, jit_compile=xla)
        step: Callable[..., Any] = traced
        spec = self._element_spec
        if not xla and spec is not None:
            # Traced as Keras traces its own step: for the iterator's ``element_spec`` (a batch
            # dimension of None where the last batch may be short), not for the first batch's
            # shapes; the batches' calls reuse that trace. A step reads static shapes: Keras'
            # per-output loss trackers weigh a batch by ``y_pred.shape[0]``, None in Keras' own
            # trace, so every batch weighs one there; traced for the first batch, a short last
            # batch weighed its size and the History's ``<output>_loss`` of each epoch was not
            # plain ``fit``'s (held out, session 39: a two-output model, 100 samples in batches
            # of 16, 4.5e-2 apart; the weights and the total loss equal).
            try:
                traced.get_concrete_function(spec, ())
            except Exception as exc:  # noqa: BLE001 - a spec it cannot trace for: traced at its call
                log.info("astra-keras: %s: not traced for the iterator's spec (%s)", self.name, exc)
        return step

    def _run(self, fn: Any, x: Any, y: Any) -> Any:
        logs = fn(x, y)
        leaves = tf.nest.flatten(logs)
        if leaves and hasattr(leaves[0], "numpy"):
            leaves[0].numpy()  # the barrier: the step has finished
        self._completed.add(id(fn))  # (its later trial steps run without a copy: ``_snapshot``)
        return logs

    def _build(self, x: Any) -> None:
        """``fit`` built the model and its optimiser (``_maybe_symbolic_build``) before its first
        step."""

    def _other_variables(self) -> list[Any]:
        """Besides the model's variables (its seed generators' states among them) and the
        optimiser's, Keras' step writes the metrics' (``_tf_warm`` shadows them for a background
        compile; the guard keeps them), and whatever else its trace reads or writes (a user's
        ``train_step``: its own ``tf.Variable``s, a second optimiser; ``_note_step_variables``)."""
        return list(getattr(self.model, "metrics_variables", []) or []) + super()._other_variables()

    # -- the guard: a failed trial step leaves nothing of its work
    def _snapshot(self, fn: Any) -> Any:
        """The variables before a trial step of ``fn``, kept until it has completed a step: what
        fails does so at its first step (its trace, XLA's lowering or compile, its first run), and
        a variant that completed one runs as one XLA cluster, which writes its variables at its
        end or not at all. Held by the step that writes them, the copy costs it a copy of every
        variable (TensorFlow copies a variable's buffer on a write while a read of it is held).
        Before (issue 18, session 43, held out: ``keras.applications.ConvNeXtTiny`` at 32x32,
        AdamW, 318 MB of variables), every XLA trial step was preceded by the copy: 812 ms a step
        against 775 ms without, 5% on each XLA trial step and none on the baseline's."""
        if id(fn) in self._completed:
            return None
        if self._copy is None:
            seen: set[int] = set()
            tvars = []
            for v in self._all_variables():
                tv = _tf_variable(v)
                if isinstance(tv, tf.Variable) and id(tv) not in seen:
                    seen.add(id(tv))
                    tvars.append(tv)
            self._state_vars = tvars
            self._copy = tf.function(lambda: [tf.identity(v) for v in tvars])
        return self._copy()

    def _restore(self, snapshot: Any, why: str) -> None:
        self.failures.append(why[:300])
        log.warning(
            "astra-keras: %s: a trial step failed (%s); repeated on the plain step", self.name, why[:300]
        )
        if snapshot is None or self._state_vars is None:
            return
        for v, kept in zip(self._state_vars, snapshot):
            v.assign(kept)

    # -- the function ``fit`` calls
    def train_function(self, iterator: Any) -> Any:
        """What ``fit`` calls per step (``steps_per_execution`` steps): the batch taken here, each
        step through :meth:`AstraTF.step`; once settled, the committed variant without the
        wrapper (``_settle``)."""
        if self.direct is not None:
            settled = self._settle(iterator)
            if settled is not None:
                return settled(iterator)
        if self._element_spec is None:
            self._element_spec = _no_optionals(getattr(iterator, "element_spec", None))
        return self._steps(iterator, self._explore_one)

    def _explore_one(self, data: Any) -> Any:
        if not self._data_signature:
            self._data_signature = input_signature(data)
        return self.step(data, ())

    def _steps(self, iterator: Any, one: Callable[[Any], Any]) -> Any:
        """``steps_per_execution`` steps of ``one`` over batches taken from ``iterator`` here (a
        ``tf.data`` iterator, or the batches ``train_on_batch`` hands over), the last one's logs
        returned, as Keras' own function does; ``StopIteration`` where there was no batch. Each
        batch as Keras hands it to ``train_step`` (``_no_optionals``)."""
        spe = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        logs = None
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            for _ in range(spe):
                try:
                    data = next(iterator)
                except (StopIteration, tf.errors.OutOfRangeError):
                    if logs is None:
                        raise StopIteration from None
                    break
                logs = one(_no_optionals(data))
        else:
            for _, data in zip(range(spe), iterator):
                logs = one(_no_optionals(data))
        return logs

    def _settle(self, iterator: Any) -> Callable[[Any], Any] | None:
        """Once committed, the model's ``train_function`` (``fit`` reads it at every step) calls
        the committed variant with nothing around it. Where the iterator's batches are of the
        very shapes the variant was traced for (its ``element_spec``), that is Keras' own train
        function (``_make_function``: the batch read inside the graph, ``steps_per_execution``
        looped there) around the variant, whose trace (and XLA executable) the new graph calls.
        Otherwise (a ``tf.data`` pipeline whose batch dimension is unknown statically) the
        graph's call would trace the variant again for the general shape and XLA compile it
        again, so the batch is still taken here and the variant called on it."""
        if self._settled is None:
            model, fn = self.model, self.direct
            if fn is None:
                return None
            make = getattr(model, "_make_function", None)
            spec = _no_optionals(getattr(iterator, "element_spec", None))
            same = spec is not None and input_signature(spec) == self._data_signature
            if make is not None and same:
                old = getattr(model, "_jit_compile", None)
                model._jit_compile = False  # (the variant carries its own jit_compile)
                try:
                    self._settled = make(lambda data: fn(data, ()))
                finally:
                    model._jit_compile = old
                how = "Keras' own train function"
            else:
                self._settled = lambda it: self._steps(it, lambda data: fn(data, ()))
                how = "the batch taken outside the step"
            if getattr(model, "train_function", None) == self.train_function:
                model.train_function = self._settled
            log.info("astra-keras: %s settled on %s (%s)", self.name, self.config or "the plain step", how)
        return self._settled


def _fit_length(default: int | None) -> int | None:
    """The number of steps of the ``fit`` that is building its train function: its epochs left
    times its batches per epoch, read from ``fit``'s own frame (Keras calls
    ``make_train_function`` from ``fit``); None where it is not found (a dataset of unknown
    length)."""
    if default is not None:
        return default
    frame: Any = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        loc = frame.f_locals
        it = loc.get("epoch_iterator")
        if it is not None and "epochs" in loc:
            batches = getattr(it, "num_batches", None)
            if not batches:
                return None
            first = loc.get("initial_epoch") or 0
            return max(1, int(loc["epochs"]) - int(first)) * int(batches)
        frame = frame.f_back
    return None


class AstraFit:
    """A Keras model whose ``fit`` runs through Astra (made by :func:`attach_fit`).

    ``astra``: the :class:`AstraKerasFit` of the latest train function (a new one per
    ``compile``); ``baseline_jit``: what Keras' own ``jit_compile`` resolved to (``"auto"``: XLA
    off on a CPU-only host, on with an accelerator where every layer supports it), the step the
    user would otherwise get.
    """

    def __init__(self, model: Any, explorer: Explorer | None, options: dict[str, Any]) -> None:
        self.model, self.options = model, options
        if explorer is None:
            from .explore import LocalExplorer

            explorer = LocalExplorer.on_disk()  # this host's state: a second run starts tuned
        self.explorer = explorer
        self.astra: AstraKerasFit | None = None
        self.baseline_jit: bool | None = None
        self.skipped = ""  # why fit runs as Keras builds it (run_eagerly, a distribution strategy)

    def make_train_function(self, force: bool = False) -> Any:
        model = self.model
        if model.train_function is not None and not force:
            return model.train_function
        self.baseline_jit = bool(model.jit_compile)
        if model.run_eagerly:
            self.skipped = "run_eagerly: Keras' eager step"
        elif getattr(model, "_distribute_strategy", None) is not None or tf.distribute.has_strategy():
            self.skipped = "a tf.distribute strategy"
        if self.skipped:
            log.info("astra-keras: fit runs as Keras builds it (%s)", self.skipped)
            type(model).make_train_function(model, force=True)
            return model.train_function
        options = dict(self.options)
        total = _fit_length(options.pop("total_steps", None))
        self.astra = AstraKerasFit(model, self.explorer, total_steps=total, **options)
        model.train_function = self.astra.train_function
        return model.train_function

    def detach(self) -> None:
        """``fit`` as Keras builds it again (from the next ``fit``)."""
        if self.model.__dict__.get("make_train_function") == self.make_train_function:
            del self.model.__dict__["make_train_function"]
        self.model.train_function = None

    @property
    def config(self) -> dict[str, str]:
        """The configuration in force (``{"xla": "off"}``: the plain step)."""
        return self.astra.config if self.astra is not None else {}

    @property
    def committed(self) -> bool:
        return self.astra is not None and self.astra.committed

    def summary(self) -> dict[str, Any]:
        """What exploring did to the run: Keras' own step (the baseline), the configuration in
        force and whether it is committed, the steps explored, each trial (its configuration,
        measured step, whether it failed and why), trial steps that failed and were repeated on
        the plain step, and why the wrapper gave up, if it did."""
        a = self.astra
        out: dict[str, Any] = {
            "baseline": {"jit_compile": self.baseline_jit},
            "skipped": self.skipped,
        }
        if a is None:
            return out
        out.update(
            config=a.config,
            committed=a.committed,
            settled=a.direct is not None,
            total_steps=a.total_steps,
            explore_steps=a.explore_steps,
            failures=list(a.failures),
            abandoned=a.abandoned,
        )
        state = a._explored_state()
        if state is not None:
            out["trials"] = [
                {
                    "values": dict(t.values),
                    "step_ms": None if t.step_ms == float("inf") else round(t.step_ms, 3),
                    "failed": t.failed,
                    "error": t.error[:200],
                }
                for t in state.trials
            ]
        return out


def attach_fit(model: Any, explorer: Explorer | None = None, **options: Any) -> AstraFit:
    """Run ``model.fit`` (Keras 3, TensorFlow backend) through Astra from its next call.

    ``explorer``: the compiler service (``RemoteExplorer``) or an in-process core; by default
    this host's on-disk ``LocalExplorer``. ``options``: :class:`AstraTF`'s (``total_steps``:
    by default the ``fit`` call's epochs x batches; ``xla``, ``exact_random``, ``background``,
    ``cost_model``, ``retry_every``). Call after or before ``compile``; a new ``compile``
    starts a new exploration at the next ``fit``. ``.detach()`` undoes it."""
    handle = AstraFit(model, explorer, options)
    model.make_train_function = handle.make_train_function
    model.train_function = None
    return handle
