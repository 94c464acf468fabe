"""``torch.compile(model, backend="microco")``: Astra as a dynamo backend.

Dynamo hands a backend each captured FX graph once; the callable the backend returns runs on
every call, so it may change what runs from one mini-batch to the next. Here each call of the
graph is a mini-batch boundary: the time between two calls is one whole training step (forward,
backward, optimizer step, data), and the configuration (graph compiled by Inductor or run
eagerly, intra-op threads) is chosen by the explorer exactly as in :class:`AstraTorch`.

The structural rewrites (batching, hoisting) need the cell boundaries that dynamo's flattened
graph no longer has; they are :class:`AstraTorch`'s, not the backend's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import fx

from microco.clients.compiler.explore.types import STAGE_COMPILE, STAGE_FINE, GraphSpec, Variable

from . import _equiv
from ._replicas import replica_of
from ._run_length import run_length
from ._session import ExplorationSession, Explorer, SessionBacked
from ._torch import hardware_id, thread_choices

log = logging.getLogger(__name__)


class MicrocoBackend(SessionBacked):
    """A dynamo backend object: ``torch.compile(model, backend=MicrocoBackend(explorer))``.

    The first graph dynamo captures is explored; further graphs (graph breaks) run eagerly.
    """

    def __init__(
        self,
        explorer: Explorer | None = None,
        *,
        name: str = "",
        total_steps: int | None = None,  # None: $MICROCO_TOTAL_STEPS, else 1000 (_run_length)
        compile_choices: tuple[str, ...] = ("eager", "inductor"),
        threads: tuple[str, ...] | None = None,
        retry_every: int = 50,
    ) -> None:
        if explorer is None:
            from .explore import LocalExplorer

            explorer = LocalExplorer.on_disk()  # this host's state: a second run starts tuned
        self.session = ExplorationSession(explorer, retry_every=retry_every)
        self.name, self.total_steps = name, run_length(total_steps)
        self.compile_choices = compile_choices
        self.thread_values = threads if threads is not None else thread_choices()
        self.graphs = 0
        self._primary_code: str | None = None
        self._last_start: float | None = None
        self._failed = ""

    def __deepcopy__(self, memo: dict[int, Any]) -> MicrocoBackend:
        # A backend is a compiler, not state of the model: a copy of what holds it (Lightning
        # keeps a deep copy of ``torch.compile``'s keyword arguments, once ``lightning_fabric``
        # is imported, for every compiled module) shares it, as it shares ``"inductor"``.
        return self

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Dynamo may recompile the same frame (guards fail after the first optimizer step, for
        # one): a graph with the first graph's code is the same step and keeps marking mini-batch
        # boundaries; other graphs (graph breaks) run under the same configuration.
        self.graphs += 1
        replica = replica_of(gm)
        if replica:
            # (``_replicas``: every replica must take the same update; each rank's own exploration
            # would commit its own configuration) The captured graph runs as captured.
            if self.graphs == 1:
                log.warning(
                    "astra: %s: %s: a data-parallel replica runs the captured graph", self.name, replica
                )
            return gm.forward
        primary = self._primary_code is None or gm.code == self._primary_code
        if self._primary_code is None:
            self._primary_code = gm.code
        return _GraphRunner(self, gm, example_inputs, primary)


class _GraphRunner:
    def __init__(
        self, backend: MicrocoBackend, gm: fx.GraphModule, example_inputs: list[Any], primary: bool
    ) -> None:
        self.backend, self.gm, self.example_inputs = backend, gm, list(example_inputs)
        self.primary = primary
        self._compiled: Callable[..., Any] | None = None
        self._good_backwards = 0  # backward passes of the compiled graph that succeeded
        self._checked = False  # the compiled graph checked against the captured one (_equiv)
        if backend.session.spec is not None:
            return  # the step is registered already
        variables = []
        if len(backend.compile_choices) > 1:
            variables.append(
                Variable("graph.compile", backend.compile_choices, "graph", STAGE_COMPILE, compiles=True)
            )
        if len(backend.thread_values) > 1:
            variables.append(Variable("threads", backend.thread_values, "", STAGE_FINE))
        shapes = ";".join(
            f"{tuple(t.shape)}:{t.dtype}" for t in example_inputs if isinstance(t, torch.Tensor)
        )
        space = [v.to_dict() for v in variables]
        fp = hashlib.sha256(f"dynamo|{gm.code}|{space}".encode()).hexdigest()[:24]
        spec = GraphSpec(
            fp,
            shapes,
            hardware_id(),
            tuple(variables),
            backend.name or "dynamo-graph",
            "torch",
            backend.total_steps,
        )
        backend.session.register(spec)

    def _fn(self) -> Callable[..., Any]:
        v = self.backend.session.values
        if v.get("graph.compile", "eager") == "eager":
            return self.gm.forward
        if self._compiled is None:
            from torch._inductor.compile_fx import compile_fx

            from ._rng import draws_random, faithful_random

            faithful = draws_random(self.gm)  # a graph that draws random numbers draws eager's

            def inner(*args: Any, **kwargs: Any) -> Any:
                from torch._inductor.compile_fx import compile_fx_inner

                with faithful_random(faithful):  # (the backward's compile is lazy)
                    return compile_fx_inner(*args, **kwargs)

            with faithful_random(faithful):
                if faithful:
                    compiled = compile_fx(self.gm, self.example_inputs, inner_compile=inner)
                else:
                    compiled = compile_fx(self.gm, self.example_inputs)
                self._compiled = cast(Callable[..., Any], compiled)
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        b = self.backend
        if self.primary:
            now = time.perf_counter()
            if b._last_start is not None:  # the previous mini-batch ended where this one starts
                b.session.record((now - b._last_start) * 1e3, {}, b._failed)
                b._failed = ""
            b._last_start = now
        try:
            fn = self._fn()
        except Exception as exc:  # noqa: BLE001 - a compile that fails never stops training
            # (issue 18, session 30: Inductor's compile of the trial's graph ran outside every
            # guard, and its error ended the user's forward)
            b._failed = f"compile: {type(exc).__name__}: {exc}"
            log.warning("graph compile failed, running it eagerly: %s", b._failed)
            self._compiled = fn = self.gm.forward
        if fn != self.gm.forward and not self._checked:
            # The compiled graph computes what the captured one does, once (``_equiv``: Inductor
            # can be silently wrong, pytorch/pytorch#167313), or the captured graph runs.
            self._checked = True
            try:
                why = _equiv.graph_differs(self.gm.forward, fn, args)
            except Exception as exc:  # noqa: BLE001 - a compiled graph that raises here fails
                why = f"raised {type(exc).__name__}: {exc}"
            if why:
                b._failed = f"CompiledOtherwise: computes otherwise than the captured graph: {why}"
                log.warning("compiled graph failed its check, running it eagerly: %s", b._failed)
                self._compiled = fn = self.gm.forward
        # The thread count is set around this graph's call only and the caller's restored after
        # it (issue 18: a process-wide setting must not leak into the user's code). A dynamo
        # backend sees no more of the step than its graphs: autograd's backward runs outside.
        threads = b.session.values.get("threads")
        user = torch.get_num_threads()
        if threads is not None and int(threads) != user:
            torch.set_num_threads(int(threads))
        try:
            if fn != self.gm.forward and self._guard_backward(args):
                return _guarded_call(self, fn, args)
            return fn(*args)
        except Exception as exc:
            if fn == self.gm.forward:
                raise
            b._failed = f"{type(exc).__name__}: {exc}"
            log.warning("compiled graph failed, running it eagerly: %s", b._failed)
            self._compiled = self.gm.forward
            return self.gm.forward(*args)
        finally:
            if torch.get_num_threads() != user:
                torch.set_num_threads(user)

    def _guard_backward(self, args: tuple[Any, ...]) -> bool:
        """Guard this call's backward? While the configuration is explored, and for the first
        ``GUARDED_BACKWARDS`` backward passes of a committed compiled graph."""
        if not torch.is_grad_enabled():
            return False
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return False
        return not self.backend.session.committed or self._good_backwards < GUARDED_BACKWARDS

    def backward_failed(self, exc: BaseException) -> None:
        b = self.backend
        b._failed = f"backward: {type(exc).__name__}: {exc}"
        log.warning("compiled graph's backward failed, its gradients computed eagerly: %s", b._failed)
        self._compiled = self.gm.forward


GUARDED_BACKWARDS = 3


class _GuardedGraph(torch.autograd.Function):
    """One call of a compiled graph whose backward falls back to the eager graph (issue 18).

    The compiled graph runs on detached inputs in a graph of its own; this node's backward asks
    that graph for the gradients and, should it raise (a compiled backward that fails, like the
    AOTAutograd region of issue 18), recomputes the call with the eager graph from the same
    inputs and takes its gradients instead. The user's ``loss.backward()`` never sees the
    failure; the trial is reported failed and the graph runs eagerly from then on. Tensors the
    graph mutates in place (running statistics) are put back after the recompute."""

    @staticmethod
    def forward(ctx: Any, runner: _GraphRunner, fn: Callable[..., Any], *args: Any) -> Any:
        ins = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        with torch.enable_grad():
            outs = fn(*ins)
        ctx.runner, ctx.ins, ctx.outs = runner, ins, outs
        ctx.is_seq = isinstance(outs, (list, tuple))
        seq = list(outs) if ctx.is_seq else [outs]
        res = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in seq)
        ctx.mark_non_differentiable(
            *[r for r, o in zip(res, seq) if isinstance(o, torch.Tensor) and not o.requires_grad]
        )
        return res

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        runner: _GraphRunner = ctx.runner
        wrt = [i for i, a in enumerate(ctx.ins) if isinstance(a, torch.Tensor) and a.requires_grad]
        try:
            got = _grads(ctx.outs, [ctx.ins[i] for i in wrt], grads)
            runner._good_backwards += 1
        except Exception as exc:  # noqa: BLE001 - whatever broke, the eager gradients stand in
            runner.backward_failed(exc)
            mutable = [a for a in ctx.ins if isinstance(a, torch.Tensor) and not a.requires_grad]
            kept = [(a, a._version, a.clone()) for a in mutable]
            ins = [
                a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in ctx.ins
            ]
            with torch.enable_grad():
                outs = runner.gm.forward(*ins)
            got = _grads(outs, [ins[i] for i in wrt], grads)
            with torch.no_grad():  # after the gradients: the recompute's graph may have saved them
                for a, version, k in kept:
                    if a._version != version:
                        a.copy_(k)
        ctx.outs = ctx.ins = None
        full: list[Any] = [None, None] + [None] * len(ctx.needs_input_grad[2:])
        for i, g in zip(wrt, got):
            full[2 + i] = g
        return tuple(full)


def _grads(outs: Any, wrt: list[torch.Tensor], grads: tuple[Any, ...]) -> tuple[Any, ...]:
    seq = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    pairs = [
        (o, g)
        for o, g in zip(seq, grads)
        if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
    ]
    if not pairs or not wrt:
        return tuple(None for _ in wrt)
    return torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)


def _guarded_call(runner: _GraphRunner, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return _GuardedGraph.apply(runner, fn, *args)  # type: ignore[no-untyped-call]


_registered = False


def register_backend() -> None:
    """Make ``backend="microco"`` available to ``torch.compile`` (the in-process explorer)."""
    global _registered
    if _registered:
        return
    from torch._dynamo.backends.registry import register_backend as _register

    _register(compiler_fn=MicrocoBackend(), name="microco")
    _registered = True
