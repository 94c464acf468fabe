"""Will the whole-step compile hit Inductor's on-disk cache? Ask Inductor, without compiling.

``torch.compile`` of a recurrent model's training step costs seconds when Inductor's caches
(``TORCHINDUCTOR_CACHE_DIR``) already hold its graphs (an earlier run of this model on this
machine, by any job) and minutes when they do not. Priced at the cold cost, the whole-step
compile is pruned from runs that a cache hit would have repaid many times over (measured on
gru and sru: 0.57-0.80x of ``torch.compile`` per step without it); priced at the warm cost, a
cold compile stalls training for minutes. :class:`WholeStepBackend` is Inductor (``compile_fx``,
what ``torch.compile`` runs by default) with a *cache-only* mode: dynamo traces the step and
Inductor looks its graphs up, but generating code is refused, so a miss costs only the trace
(about a second) and leaves the graph eager, and a hit is the compile, done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from ._deadline import DeadlineTimer


class _Refused(Exception):
    """Inductor was about to generate code: the graph is not in its caches."""


class WholeStepBackend:
    """``torch.compile`` backend: Inductor, or in :attr:`cache_only` mode Inductor's cache alone.

    In cache-only mode a graph found in the caches is loaded and returned compiled; a graph
    Inductor would have to generate code for is returned as traced (eager), and :attr:`cold`
    counts it. :attr:`available` is False when this torch has no such hook (then every probe
    reports cold, and the caller keeps its cold price)."""

    def __init__(self, rewrite: bool = False, compiler: Any = None) -> None:
        self.cache_only = False
        self.cold = 0
        self.hits = 0
        self.available = _codegen_hook() is not None
        # ``rewrite``: the whole-step graph passes (hoisting, batching: :mod:`._torch_fx`) run on
        # dynamo's graph first; :attr:`rewrites` counts the products they changed.
        self.rewrite = rewrite
        self.rewrites = 0
        # ``count_offered`` (a plain step's cache ask, issue 18): also count, on a copy, the
        # products the passes *would* change in dynamo's graph, so that the one trace of the ask
        # tells whether the rewritten step is worth offering (no separate capture of the step).
        self.count_offered = False
        self.offered = 0
        self.compiler = compiler  # another backend than Inductor (tests); no cache to ask then
        self.nodes = 0  # FX nodes of the graphs dynamo handed over: the size a compile is priced by
        # The in-line compile's deadline (``_deadline``): its timer runs only inside the compile
        # calls below (each graph's), never while dynamo traces; None: no deadline.
        self.deadline: DeadlineTimer | None = None

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx

        self.nodes += len(gm.graph.nodes)
        if self.rewrite:
            from ._torch_fx import batch_shared_inputs, hoist_time_slices

            self.rewrites += hoist_time_slices(gm) + batch_shared_inputs(gm)
        elif self.count_offered:
            from ._torch_fx import count_rewrites

            with contextlib.suppress(Exception):  # a graph the passes cannot read offers nothing
                self.offered += count_rewrites(gm)
        if self.compiler is not None:
            from torch._dynamo import lookup_backend

            with self._bounded():
                return cast(Callable[..., Any], lookup_backend(self.compiler)(gm, list(example_inputs)))
        if not self.cache_only:
            if self.deadline is None or not self.deadline.budget_ms > 0:
                return cast(Callable[..., Any], compile_fx(gm, list(example_inputs)))
            return cast(Callable[..., Any], compile_fx(gm, list(example_inputs), inner_compile=self._inner()))
        if not self.available:
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        refused: list[bool] = []
        try:
            with _no_codegen(refused):
                compiled = compile_fx(gm, list(example_inputs))
        except Exception:
            if not refused:
                raise  # a real failure, for the caller's guard to handle
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        if refused:  # refused inside, then recovered by a fallback: not a cache hit
            self.cold += 1
            return cast(Callable[..., Any], gm.forward)
        self.hits += 1
        return cast(Callable[..., Any], compiled)

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[None]:
        """A compile call under the deadline the wrapper allowed (if any)."""
        if self.deadline is None:
            yield
            return
        with self.deadline.within():
            yield

    def _inner(self) -> Any:
        """Inductor's per-graph compile (``compile_fx_inner``), each call under the deadline the
        wrapper allows at that moment: the forward graph's in the backend's call, the backward
        graph's when AOTAutograd compiles it, lazily, at the step's first backward. The timer
        runs only there, never over Dynamo's trace or the user's code. (Not AOTAutograd's
        ``force_non_lazy_backward_lowering``: it is part of AOTAutograd's cache key, so the
        caches a plain ``torch.compile`` or an earlier run filled would no longer be found.)"""
        from torch._inductor.compile_fx import compile_fx_inner

        def inner(*args: Any, **kwargs: Any) -> Any:
            with self._bounded():
                return compile_fx_inner(*args, **kwargs)

        return inner


def _codegen_hook() -> Any:
    try:
        import torch._inductor.compile_fx as cfx
    except Exception:  # noqa: BLE001 - no Inductor: nothing to probe
        return None
    return cfx if callable(getattr(cfx, "fx_codegen_and_compile", None)) else None


def _aot_cache() -> Any:
    try:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    except Exception:  # noqa: BLE001 - older or newer torch: the code-generation hook alone
        return None
    return AOTAutogradCache if callable(getattr(AOTAutogradCache, "try_load", None)) else None


@contextlib.contextmanager
def _no_codegen(refused: list[bool]) -> Iterator[None]:
    """Inductor's cache lookups run as usual; a miss raises :class:`_Refused`.

    Two places refuse. AOTAutograd's cache (forward and backward of the whole step, one entry)
    is asked first: its miss is refused there, before the joint graph is traced and partitioned
    (measured: a miss refused at code generation instead cost 9.5 s against 2.8 s for a hit,
    sru, 16 cell calls). Inductor's code generation refuses too, for a graph that AOTAutograd's
    cache does not cover. The two are patched process-wide for the one probe call: the training
    thread runs it between mini-batches, when nothing else in the job compiles."""
    cfx = _codegen_hook()
    real_codegen = cfx.fx_codegen_and_compile
    aot = _aot_cache()
    real_load = aot.__dict__["try_load"] if aot is not None else None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        refused.append(True)
        raise _Refused()

    def load_or_refuse(*args: Any, **kwargs: Any) -> Any:
        assert real_load is not None  # only installed where the cache has try_load
        compiled_fn, aot_config = real_load.__func__(*args, **kwargs)
        if compiled_fn is None:
            refused.append(True)
            raise _Refused()
        return compiled_fn, aot_config

    cfx.fx_codegen_and_compile = refuse
    if aot is not None:
        aot.try_load = staticmethod(load_or_refuse)
    try:
        yield
    finally:
        cfx.fx_codegen_and_compile = real_codegen
        if aot is not None:
            aot.try_load = real_load
