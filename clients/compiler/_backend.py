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
        total_steps: int = 1000,
        compile_choices: tuple[str, ...] = ("eager", "inductor"),
        threads: tuple[str, ...] | None = None,
        retry_every: int = 50,
    ) -> None:
        if explorer is None:
            from .explore import LocalExplorer

            explorer = LocalExplorer()
        self.session = ExplorationSession(explorer, retry_every=retry_every)
        self.name, self.total_steps = name, total_steps
        self.compile_choices = compile_choices
        self.thread_values = threads if threads is not None else thread_choices()
        self.graphs = 0
        self._primary_code: str | None = None
        self._last_start: float | None = None
        self._failed = ""

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Dynamo may recompile the same frame (guards fail after the first optimizer step, for
        # one): a graph with the first graph's code is the same step and keeps marking mini-batch
        # boundaries; other graphs (graph breaks) run under the same configuration.
        self.graphs += 1
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

            self._compiled = cast(Callable[..., Any], compile_fx(self.gm, self.example_inputs))
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        b = self.backend
        if self.primary:
            now = time.perf_counter()
            if b._last_start is not None:  # the previous mini-batch ended where this one starts
                b.session.record((now - b._last_start) * 1e3, {}, b._failed)
                b._failed = ""
            b._last_start = now
        fn = self._fn()
        # The thread count is set around this graph's call only and the caller's restored after
        # it (issue 18: a process-wide setting must not leak into the user's code). A dynamo
        # backend sees no more of the step than its graphs: autograd's backward runs outside.
        threads = b.session.values.get("threads")
        user = torch.get_num_threads()
        if threads is not None and int(threads) != user:
            torch.set_num_threads(int(threads))
        try:
            return fn(*args)
        except Exception as exc:
            if fn is self.gm.forward:
                raise
            b._failed = f"{type(exc).__name__}: {exc}"
            log.warning("compiled graph failed, running it eagerly: %s", b._failed)
            self._compiled = self.gm.forward
            return self.gm.forward(*args)
        finally:
            if torch.get_num_threads() != user:
                torch.set_num_threads(user)


_registered = False


def register_backend() -> None:
    """Make ``backend="microco"`` available to ``torch.compile`` (the in-process explorer)."""
    global _registered
    if _registered:
        return
    from torch._dynamo.backends.registry import register_backend as _register

    _register(compiler_fn=MicrocoBackend(), name="microco")
    _registered = True
