"""The PyTorch side of Astra: find the repeated regions of a training step, expose their
adaptive variables, run every mini-batch under the configuration the explorer hands out, and
time it (per region, with barriers where execution is asynchronous)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import fx, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from microco.clients import telemetry
from microco.clients.compiler.explore import ExplorationPolicy
from microco.clients.compiler.explore.types import (
    STAGE_COMPILE,
    STAGE_FINE,
    STAGE_STRUCTURE,
    Config,
    GraphSpec,
    Variable,
)

from . import _compile_costs, _equiv, _session
from . import _torch_fx as tfx
from ._background import BackgroundCompiler
from ._compile_costs import HostCompileCosts, compile_deadline_ms, most_saving_ms
from ._deadline import CompileDeadline, DeadlineTimer
from ._gain_rule import CompileGainRule
from ._guard import StepSnapshot
from ._op_count import StepOpCounter
from ._optim import FOREACH, FUSED, OPTIMIZER, StepOptimizers
from ._replicas import (
    GradSync,
    PeerStepFailed,
    ReplicaGroup,
    ReplicatedExplorer,
    coordinable,
    ddp_unfit,
    replica_of,
)
from ._rng import LayoutDrawWatch, layout_dependent_draw, layout_forward_check
from ._run_length import run_length
from ._session import ExplorationSession, Explorer, SessionBacked, failure, usable_cpus
from ._step_profile import StepProfile, StepProfiler
from ._torch_aot import AotRegion
from ._torch_cache import WholeStepBackend, read_signal
from ._whole_price import probed_memory_format

log = logging.getLogger(__name__)


def hardware_id() -> str:
    """What a committed configuration is only valid for: CPU model and count, device, versions."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # (only where /proc/cpuinfo names no model: on Linux ``platform.processor`` runs ``uname -p``
    # in a subprocess, ~2 ms of a wrapper's first step; issue 18, session 31)
    cpu = cpu or platform.processor() or platform.machine()
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return f"{cpu}|cores={os.cpu_count()}|{dev}|torch={torch.__version__}"


# The whole-step compiles, by kind, and the variable that turns each on.
WHOLE = {"plain": "model.compile", "rewrite": "model.rewrite"}


def whole_kind(values: dict[str, str]) -> str | None:
    """The whole-step compile a configuration runs: the rewritten step (the widest scope) before
    the plain one; None when neither is on."""
    if values.get(WHOLE["rewrite"], "eager") == "inductor":
        return "rewrite"
    if values.get(WHOLE["plain"], "eager") == "inductor":
        return "plain"
    return None


def thread_choices(cpus: int | None = None) -> tuple[str, ...]:
    """Intra-op thread counts worth trying: the current setting first, then 1 and powers of two."""
    cpus = cpus or usable_cpus()
    current = torch.get_num_threads()
    out = [current]
    n = 1
    while n <= cpus:
        if n not in out:
            out.append(n)
        n *= 2
    if cpus not in out:
        out.append(cpus)
    return tuple(str(c) for c in out)


def _ran_alone(process_ms: float, thread_ms: float) -> bool:
    """Did this thread do (nearly) all of its process's CPU work over a span: the process's CPU
    time within 1.5x the thread's (and a millisecond)? Else other threads worked meanwhile, and
    the thread's CPU time is not the span's work."""
    return process_ms <= 1.5 * thread_ms + 1.0


def _compiled_inside(model: nn.Module) -> bool:
    """Does the model hold code compiled by dynamo (a module ``torch.compile`` wrapped, or a
    compiled ``forward``)? Dynamo guards on the torch-function mode stack: a step run under
    ``LayoutDrawWatch`` would compile the user's code once more, for that step alone."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except Exception:  # noqa: BLE001 - no dynamo: nothing compiled by it
        return False
    return any(
        isinstance(m, OptimizedModule) or hasattr(getattr(m, "forward", None), "_torchdynamo_orig_callable")
        for m in model.modules()
    )


def spare_core() -> bool:
    """Is at least one core idle (1-minute load average) beside this process's own threads?

    The load average lags: a job that just started is not in it yet, so the training's own
    intra-op threads are counted on top of it (measured: a worker started at load 0.79 on 2
    cores, beside a one-thread training job, slowed the trials measured meanwhile and held
    training for 1,800 waiting steps)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return usable_cpus() - load - torch.get_num_threads() >= 1.0


class _StepClock:
    """Per-mini-batch bookkeeping shared by all cell runners of one wrapped model."""

    def __init__(self) -> None:
        self.token = 0  # changes every mini-batch: per-batch caches are keyed on it
        self.in_step = False
        self.barrier = torch.cuda.is_available()
        self.region_s: dict[str, float] = {}
        self.built = False  # a variant was built (rewritten, compiled) during this step

    def sync(self) -> None:
        if self.barrier:
            torch.cuda.synchronize()


class CompiledOtherwise(RuntimeError):
    """A compiled variant returned, wrote or differentiated otherwise than the code it replaces
    (``_equiv.differs``): it fails as a compile that raised does."""


def _hookable(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``model.named_modules()`` but for TorchScript modules and what they hold (they take no
    Python hooks: ``register_forward_pre_hook is not supported on ScriptModules``)."""
    scripted: list[str] = []
    for name, module in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in scripted):
            continue
        if isinstance(module, torch.jit.ScriptModule):
            scripted.append(name)
            continue
        yield name, module


def _saving_hooks_active() -> bool:
    """Are saved-tensors hooks in force (activation checkpointing's, or a user's offloading)?"""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def _class_forward(module: nn.Module) -> Callable[..., Any]:
    """The module's class's ``forward``, bound to it (what a copy of an instrumented module runs;
    a module-level function, so that pickling can name it)."""
    return cast(Callable[..., Any], type(module).forward.__get__(module))


def _own_code_of_copy(module: nn.Module, own: Callable[..., Any] | None, memo: dict[int, Any]) -> Any:
    """What a deep copy of ``module`` holds as ``forward`` where Astra installed one: the
    module's own code, bound to the copy (``memo`` maps the module to its copy while the copy is
    being made), or the user's own instance ``forward``, copied as any attribute is."""
    if own is not None:
        return copy.deepcopy(own, memo)
    twin = memo.get(id(module))
    return _class_forward(twin if isinstance(twin, nn.Module) else module)


class InstalledForward:
    """A forward Astra installs on a module (the whole model compiled), seen by a copy of the
    module (``copy.deepcopy``, pickling: a "best model" snapshot, an EMA teacher) as the
    module's own code. Held out (issue 18, session 38): a function installed as ``forward`` is
    copied by reference, so a deep copy of the model ran the original model's compiled code,
    silently: the snapshot answered with the weights trained after it."""

    def __init__(self, fn: Callable[..., Any], module: nn.Module, own: Callable[..., Any] | None) -> None:
        self.fn, self.module, self.own = fn, module, own

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _own_code_of_copy(self.module, self.own, memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_class_forward, (self.module,)) if self.own is None else (_identity, (self.own,))


def example_copy(a: torch.Tensor) -> torch.Tensor:
    """A copy of a step's input that dynamo and Inductor take for the same input: its values, and
    its strides and whether it requires grad, which the compiled graph depends on (a graph is
    compiled for its inputs' strides, and differentiates an input that requires grad).

    What the background worker compiles and the probe asks Inductor's caches about is the
    model's forward on such copies. Held out, issue 18, session 43: ``detach().clone()``
    dropped both. A model fed an activation that requires grad (an embedding, or another model,
    before it) and a language model fed ``tokens[:, :-1]`` (a slice: clone made it contiguous)
    were compiled by the worker for other graphs; the probe's ask found a hit, and the training
    process's compile missed Inductor's cache (2 misses, 2 hits: another graph compiled cold)."""
    src = a.detach()
    if src.numel() == 0 or src.is_contiguous() or src.layout != torch.strided:
        out = src.clone()
    else:
        # the storage span the view reads, copied, and viewed with the same sizes and strides
        # (a slice, a transpose, an expanded tensor's zero strides alike)
        span = 1 + sum((n - 1) * st for n, st in zip(src.shape, src.stride(), strict=True))
        flat = torch.as_strided(src, (span,), (1,)).clone()
        out = flat.as_strided(src.shape, src.stride())
    if a.requires_grad:
        out.requires_grad_(True)
    return out


# The most distinct calls of the model in one step the background worker compiles (multi-crop
# views, a siamese pair, a GAN discriminator on real and generated batches: two or three).
MAX_EXAMPLE_CALLS = 4


def autocast_state() -> tuple[tuple[str, str], ...]:
    """The autocast contexts in force, as (device type, dtype name) pairs."""
    state = []
    for device in ("cpu", "cuda"):
        with contextlib.suppress(RuntimeError, TypeError, AttributeError):
            if torch.is_autocast_enabled(device):
                state.append((device, str(torch.get_autocast_dtype(device)).removeprefix("torch.")))
    return tuple(state)


@contextlib.contextmanager
def autocast_as(state: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Run under the autocast contexts ``autocast_state`` read."""
    with contextlib.ExitStack() as stack:
        for device, dtype in state:
            stack.enter_context(torch.autocast(device, dtype=getattr(torch, dtype)))
        yield


def example_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One call of the model as the step made it, for the background worker to make again: its
    inputs (``example_copy``'s), the autocast and grad mode around it, and a key telling calls
    that compile different graphs apart.

    Held out, issue 18, session 43: the worker ran the model once, on the inputs of the probe
    step's last call, without the step's autocast. A step calling the model twice on inputs of
    two shapes (a siamese pair of a query and a longer document; multi-crop views) compiled the
    first call's graph cold in the training process, and a step under ``torch.autocast`` each
    of its graphs (dynamo guards on the autocast state: another graph)."""
    leaves = tfx.flatten_args((args, kwargs))
    grad = torch.is_grad_enabled()
    autocast = autocast_state()
    key = repr(
        (
            grad,
            autocast,
            [
                (tuple(a.shape), a.stride(), str(a.dtype), a.device.type, a.requires_grad)
                if isinstance(a, torch.Tensor)
                else type(a).__name__
                for a in leaves
            ],
        )
    )
    return {"args": args, "kwargs": kwargs, "grad": grad, "autocast": autocast, "key": key}


def _identity(x: Any) -> Any:
    return x


_GONE = object()  # (an attribute no longer on its module)


class CellRunner:
    """Replaces a repeated cell's ``forward``: runs the variant the configuration picks.

    Variants are built lazily and cached, so returning to an earlier configuration costs
    nothing; a compiled variant that fails falls back to eager and reports the failure.
    """

    def __init__(self, cell: nn.Module, gm: fx.GraphModule, region: str, clock: _StepClock) -> None:
        self.cell, self.gm, self.region, self.clock = cell, gm, region, clock
        self.original_forward = cell.forward
        self._own_forward = "forward" in cell.__dict__
        self.n_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        # The modules' plain values the graph was traced with: the trace keeps Python's values,
        # not the code reading them (``F.dropout(h, p, self.training)``, ``if self.training:``, a
        # temperature the loop anneals), so where one has changed the cell runs its own code
        # (held out, session 41: a cell's functional dropout went on dropping in the loop's
        # evaluation under ``model.eval()``, drawing numbers, and the training after it left
        # eager's by 58% in 30 steps; a temperature set every step stayed the first one, 16%).
        self._traced_values = tfx.plain_values(cell)
        self.batch, self.hoist, self.compile = "off", "off", "eager"
        self.failed: str = ""
        # (a variant None: it computed otherwise than the cell's own code, which runs instead)
        self._variants: dict[tuple[str, str, str], tuple[tfx.CellPlan, Callable[..., Any] | None]] = {}
        self._equivalent: set[tuple[str, str, str]] = set()  # variants checked (_equiv)
        # The per-step caches (the parameters' products, the hoisted inputs' products) are kept
        # per grad mode: a product made without a graph must not serve a call that differentiates.
        # Held out (session 41, Mistral under reentrant activation checkpointing): the layers'
        # forward runs under ``no_grad`` and again, differentiated, in the backward, in the same
        # step; the batched weights cached by the first served the second, and the MLP's
        # weights took no gradient (Adam's step count 18 behind eager's after 24 steps).
        self._p_cache: tuple[int, bool, tuple[Any, ...]] | None = None
        self._x_cache: dict[tuple[int, int, int, bool], tuple[torch.Tensor, tuple[Any, ...]]] = {}
        self._x_token = -1

    # -- configuration
    def configure(self, batch: str, hoist: str, compile_mode: str) -> None:
        self.batch, self.hoist, self.compile = batch, hoist, compile_mode
        self._p_cache = None
        self._x_cache.clear()

    def is_compiled(self, batch: str, hoist: str, compile_mode: str) -> bool:
        """Has the variant for these choices been built, and compiled if it compiles?"""
        built = self._variants.get((batch, hoist, compile_mode))
        return built is not None and (not isinstance(built[1], AotRegion) or built[1].built)

    def variant(self) -> tuple[tfx.CellPlan, Callable[..., Any] | None]:
        key = (self.batch, self.hoist, self.compile)
        if key not in self._variants:
            self.clock.built = True
            gm = self.gm
            if self.batch == "on" or self.batch == "streams" and self.compile != "eager":
                # Under a compiled region the products are one kernel schedule on one stream:
                # there "streams" is the batched product (the rewrite's calls would not compile).
                gm = tfx.batch_linears(gm)
            elif self.batch == "streams":
                gm = tfx.stream_linears(gm)  # GPU: the shared-input products on their own streams
            plan = tfx.split_cell(gm, hoist=self.hoist == "on")
            fn: Callable[..., Any] = plan.s_gm
            if self.compile in ("inductor", "inductor-autotune", "aot-eager"):
                # Inductor kernels for the step's forward and backward, one autograd node per
                # call, none of torch.compile's per-call guards (see _torch_aot). "aot-eager"
                # runs the same captured graphs uncompiled (not offered: it checks the capture);
                # "inductor-autotune" (GPU) has Inductor time alternative kernels for each
                # product (Triton templates against the vendor library) and keep the fastest.
                fn = AotRegion(plan.s_gm, self.compile)
            elif self.compile == "inductor-cudagraphs":
                fn = torch.compile(plan.s_gm, backend="inductor", mode="reduce-overhead", dynamic=False)
            self._variants[key] = (plan, fn)
        return self._variants[key]

    # -- execution
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self.n_inputs or not isinstance(args[0], torch.Tensor):
            return self.original_forward(*args, **kwargs)
        if any(m.__dict__.get(k, _GONE) != v for m, k, v in self._traced_values):
            return self.original_forward(*args)  # (not the values traced: see __init__)
        if _saving_hooks_active():
            # Inside activation checkpointing (``checkpoint(..., use_reentrant=False)``, Hugging
            # Face's ``gradient_checkpointing_enable()``): the cell's forward runs again in the
            # backward and must save exactly the tensors it saved the first time, while a
            # variant's per-step caches (hoisted products) and its first call's check run other
            # work then. Held out, session 39 (a tiny Llama with gradient checkpointing): every
            # region trial raised in backward ("A different number of tensors was saved during the
            # original forward and recomputation"), was rolled back and repeated, and its check
            # logged the checkpoint's own stop signal as "computes otherwise". Such a cell runs
            # its own code.
            return self.original_forward(*args)
        self.clock.sync()
        t0 = time.perf_counter()
        try:
            return self._run(args)
        finally:
            self.clock.sync()
            self.clock.region_s[self.region] = (
                self.clock.region_s.get(self.region, 0.0) + time.perf_counter() - t0
            )

    def _run(self, args: tuple[Any, ...]) -> Any:
        plan, fn = self.variant()
        if fn is None:  # computed otherwise than the cell's own code: the cell's own code
            return self.original_forward(*args)
        key = (self.batch, self.hoist, self.compile)
        # (once per variant, not per input signature: this runs at every cell call, tens a step)
        if key not in self._equivalent and key != ("off", "off", "eager"):
            if not self._same_as_own(plan, fn, args):
                return self.original_forward(*args)
            self._equivalent.add(key)
        token = self.clock.token if self.clock.in_step else None
        grad = torch.is_grad_enabled()
        if token is not None and self._p_cache is not None and self._p_cache[:2] == (token, grad):
            p_vals = self._p_cache[2]
        else:
            p_vals = tuple(plan.p_gm())
            if token is not None:
                self._p_cache = (token, grad, p_vals)
        x = args[0]
        if plan.x_gm is None:
            x_vals: tuple[Any, ...] = (x,)
        else:
            x_vals = self._hoisted(plan, x, p_vals, token)
        try:
            return fn(*x_vals, *p_vals, *args[1:])
        except Exception as exc:  # a compiled variant must never stop training
            if fn is plan.s_gm:
                raise
            self.failed = failure(exc)
            log.warning("compiled region %s failed, running it eagerly: %s", self.region, self.failed)
            self._variants[(self.batch, self.hoist, self.compile)] = (plan, plan.s_gm)
            return plan.s_gm(*x_vals, *p_vals, *args[1:])

    def _same_as_own(self, plan: tfx.CellPlan, fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        """Does the variant (a rewrite, a compiled region) compute what the cell's own forward
        does on ``args`` (``_equiv.differs``: outputs, buffers, the cell's parameters'
        gradients)? Once per variant, at its first call; one that differs, or raises, is failed
        and the cell's own code runs in its place from then on."""
        self.clock.built = True  # (a step that checks is not a measurement)

        def variant(*a: Any) -> Any:
            p_vals = tuple(plan.p_gm())
            x_vals = (a[0],) if plan.x_gm is None else tuple(plan.x_gm(a[0], *p_vals))
            return fn(*x_vals, *p_vals, *a[1:])

        try:
            twin = _equiv.float64_twin(self.cell, self.original_forward)
            why = _equiv.differs(self.cell, self.original_forward, variant, args, {}, twin)
        except Exception as exc:  # noqa: BLE001 - a variant that raises here is failed below
            why = f"raised {type(exc).__name__}: {exc}"
        if not why:
            return True
        self.failed = f"CompiledOtherwise: computes otherwise than the cell's own code: {why}"
        log.warning("region %s: %s; running the cell's own code", self.region, self.failed)
        self._variants[(self.batch, self.hoist, self.compile)] = (plan, None)
        return False

    def _hoisted(
        self, plan: tfx.CellPlan, x: torch.Tensor, p_vals: tuple[Any, ...], token: int | None
    ) -> tuple[Any, ...]:
        x_gm = plan.x_gm
        assert x_gm is not None
        found = tfx.find_time_slice(x)
        if found is None or token is None:
            return tuple(x_gm(x, *p_vals))
        base, d, t = found
        if self._x_token != token:
            self._x_cache.clear()
            self._x_token = token
        key = (id(base), base._version, d, torch.is_grad_enabled())
        hit = self._x_cache.get(key)
        if hit is None or hit[0] is not base:
            # unbind, not select: the backward of T selects would materialise T zero-filled
            # copies of the whole sequence; one unbind's backward stacks the T gradients once.
            hit = (base, tuple(v.unbind(d) for v in x_gm(base, *p_vals)))
            self._x_cache[key] = hit
        return tuple(v[t] for v in hit[1])

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # A copy of the cell (of the model: a "best model" snapshot, an EMA teacher) runs the
        # cell's own code. Held out (session 38): ``copy.deepcopy(model)`` raised once hoisting
        # was committed (the runner's cache holds tensors of the step's graph, which
        # ``deepcopy`` refuses), stopping the user's program.
        return _own_code_of_copy(self.cell, self.original_forward if self._own_forward else None, memo)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._own_forward:
            return (_identity, (self.original_forward,))
        return (_class_forward, (self.cell,))

    def restore(self) -> None:
        if self._own_forward:
            self.cell.forward = self.original_forward
        else:
            self.cell.__dict__.pop("forward", None)  # the class's forward, as before

    def install(self) -> None:
        self.cell.forward = self


class AstraTorch(SessionBacked):
    """Wraps a PyTorch model so that every training step runs under a configuration chosen
    at run time by an explorer (the compiler service, or the same core in-process).

    Use it as a context manager around each training step::

        astra = AstraTorch(model, explorer=RemoteExplorer(target), name="lstm")
        for x, y in batches:
            with astra.step():
                loss = loss_fn(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()

    The first step runs eagerly and finds the repeated regions (a cell called once per time
    step); from then on the explorer picks, trial by trial, whether each region's input work is
    hoisted out of the time loop, whether its independent matrix products are batched, whether
    it runs compiled (Inductor) or eager, and the intra-op thread count. Once the explorer
    commits, the best configuration runs with no further calls. If the explorer is lost, training
    continues under the configuration in force.
    """

    def __init__(
        self,
        model: nn.Module,
        explorer: Explorer | None = None,  # None: the exploration core in-process
        *,
        name: str = "",
        total_steps: int | None = None,  # None: $MICROCO_TOTAL_STEPS, else 1000 (_run_length)
        compile_choices: tuple[str, ...] | None = None,
        threads: tuple[str, ...] | None = None,
        retry_every: int = 50,
        background: bool | None = None,  # None: when a core is idle at the probe step
        compile_costs: HostCompileCosts | None = None,  # None: this host's record (_compile_costs)
        explore_replicas: bool = False,  # data-parallel ranks explore together (``_replicas``)
    ) -> None:
        self.model = model
        # Off by default (session 40): measured on the CPU, the ranks' coordinated exploration
        # found nothing faster than the model's own code and cost 5-46% of a 400-step run of a
        # small MLP (docs/compiler.md, "Data-parallel replicas, coordinated"); a replica then
        # runs the model's own code, as since session 38.
        self.explore_replicas = explore_replicas
        # Compile times measured on this host, by kind: the price of the next compile of a kind
        # (issue 18), instead of priors per cell call.
        self.compile_costs = compile_costs if compile_costs is not None else HostCompileCosts()
        self._hw = hardware_id()
        self._whole_nodes: dict[str, int] = {}  # FX nodes of dynamo's whole-step graph, by kind (probe)
        # (kind, warm-up step's ms, warm, the ask that step carries)
        self._pending_whole: tuple[str, float, bool, float, float] | None = None
        self._recorded_regions: set[int] = set()
        self._graph_rewrites = -1  # products dynamo's captured step offers the passes (-1: not asked)
        self.name = name or type(model).__name__
        self.total_steps = run_length(total_steps)
        self.clock = _StepClock()
        gpu = torch.cuda.is_available()
        if compile_choices is None:
            # On a GPU also kernel variants (Inductor's autotuning) and CUDA graphs of the region.
            compile_choices = ("eager", "inductor") + (
                ("inductor-autotune", "inductor-cudagraphs") if gpu else ()
            )
        self.compile_choices = compile_choices
        # How independent products that share an input run: one each, batched into one product,
        # or (GPU) one CUDA stream each.
        self.batch_choices = ("off", "on", "streams") if gpu else ("off", "on")
        self.thread_values = threads if threads is not None else thread_choices()
        self.runners: dict[str, CellRunner] = {}
        if explorer is None:
            from .explore import LocalExplorer

            explorer = LocalExplorer.on_disk()  # this host's state: a second run starts tuned
        # Compiles (Inductor cell regions, the whole step) run first in a background process
        # that fills Inductor's on-disk caches while training runs the best configuration; the
        # trial then loads them (see _background).
        self.background = (
            BackgroundCompiler(self._needs_compile, self._background_payload, self._record_background)
            if background is not False
            else None
        )
        self._background_auto = background is None
        self.session = ExplorationSession(explorer, retry_every=retry_every, warmer=self.background)
        self._snapshot: nn.Module | None = None
        self._example_args: tuple[Any, ...] | None = None
        # ... and its keyword arguments (a Hugging Face model is called ``model(input_ids=...)``:
        # until the third session of 2026-12-02 the probe called such a forward without them,
        # and Inductor's cache, asked about another graph, answered cold)
        self._example_kwargs: dict[str, Any] = {}
        # ... and every distinct call of the model in the probe step (``example_call``), by key
        self._example_calls: dict[str, dict[str, Any]] = {}
        self._example_autocast: tuple[tuple[str, str], ...] = ()  # ... the last call's autocast
        self._whole_built: set[str] = set()  # whole-step kinds compiled in this process
        # A trial's in-line whole-step compile runs under a deadline (``_deadline``, session 11).
        self._deadline = DeadlineTimer()
        self._deadline_kind = ""
        self._probe_calls: dict[str, int] | None = None
        self._hooks: list[Any] = []
        self._input_shapes = ""
        self._step_started = 0.0
        self._cpu_started = 0.0  # the step's start on this thread's CPU clock (time.thread_time)
        self._process_started = 0.0  # ... and on the process's (time.process_time)
        self._step_cpu_ms = math.nan  # the last step's thread CPU time (NaN: not measured)
        self._regions: dict[str, list[str]] = {}  # region -> runner names
        self._channels_last = any(isinstance(m, nn.Conv2d) for m in model.modules())
        # the first draw the probe step saw whose numbers follow the layout ("": none): a dropout
        # module's name, or the random call ``LayoutDrawWatch`` saw draw otherwise over a
        # channels-last copy
        self._layout_draws = ""
        self._layout_watch: LayoutDrawWatch | None = None
        # ... the probe step's watch, judged at the probe's end against a channels-last forward on
        # the probe's inputs (kept for it: ``_judge_layout_draws``)
        self._probe_watch: LayoutDrawWatch | None = None
        self._layout_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        # The whole-step compiles are part of the space, by kind (``WHOLE``): "plain", the
        # model's forward compiled by dynamo + Inductor with the cells' plain code inside it
        # (what torch.compile does); "rewrite", the same with the whole-step graph passes
        # (hoisting, batching) run on dynamo's graph before Inductor.
        self._own_forward = model.__dict__.get("forward")  # an instance-level forward, if any
        self._compiled_forward: dict[str, Callable[..., Any]] = {}
        self._equivalent: set[tuple[Any, ...]] = set()  # (kind, inputs) checked against eager (_equiv)
        self._whole_kind: str | None = None  # the kind running now
        self._region_calls = 0  # cell calls per step, seen by the probe: sizes the compile prior
        self.replica = ""  # why the model trains as one data-parallel replica (``_replicas``), at the probe
        # The ranks exploring together (``_replicas.ReplicaGroup``; None: not a replica, or one
        # that runs the model's own code, ``uncoordinated`` says why), from the probe step on.
        self.replicas: ReplicaGroup | None = None
        self.uncoordinated = ""
        self._ddps: list[Any] = []  # the DDP modules the probe step called around or inside the model
        self._ddp_probe: Any = None  # (the probe step's hook that finds them)
        self._step_agreed = False  # did the ranks agree this step's end (or a failure in it)?
        self._replica_guard = False  # a guarded step of coordinated replicas (``_before``)
        self._grad_sync = GradSync()
        self._grad_hooks: list[Any] = []
        self._backward_queued = False
        self.whole_failed: dict[str, str] = {}  # kind -> why its compiled step failed
        self._whole_fresh = False
        # Did Inductor's caches hold each kind at the probe? "hit" / "cold" (absent: not asked)
        # and what asking cost (see _torch_cache): a hit prices that compile at what it cost.
        self.whole_cache: dict[str, str] = {}
        self.whole_probe_ms: dict[str, float] = {}
        # ... and the CPU time of the thread that asked (NaN where other threads of this process
        # worked meanwhile): a load's price at another contention (``HostCompileCosts._at_load``)
        self.whole_probe_cpu_ms: dict[str, float] = {}
        # Does Inductor's cache hold this model's whole step, compiled by any program (read without
        # a trace, ``_warm_signal``)? None: not read.
        self.warm_signal: bool | None = None
        # ... and whether its "no" is certain (``read_signal``: the whole cache read, and no entry
        # traced from the model's source files): no program compiled this step here, and an ask
        # would find it cold
        self.warm_absent = False
        self.whole_rewrites = -1  # products the graph passes changed at the probe (-1: not asked)
        self._probe_charge_ms = 0.0  # the probe's cost, charged to the first step that uses it
        self._probe_charge_cpu_ms = 0.0  # ... its thread's CPU time
        # What the probe step's capture and cache asks have spent so far (ms): together, not
        # each, they are bounded by CACHE_PROBE_SHARE of the run's eager time (issue 18, evening
        # of 2026-12-02: a capture and two asks, each under the bound, took 79 s of a 375 s run).
        self._probe_spent_ms = 0.0
        # The probe step's wall time over its process CPU time, at least the machine's
        # contention (and 1): how much slower than alone this process runs on this host now.
        # Priors (what a trace or a compile takes alone) are scaled by it, and so is the step the
        # probe's gate prices an ask's saving by (``_typical_step_ms``): both sides at one slowdown.
        self._slowdown = 1.0
        # ... and the probe step's own wall over its process CPU time (at least 1): the slowdown
        # its time was measured at, which the gate takes out before scaling it to ``_slowdown``.
        self._step_slowdown = 1.0
        # The distinct ATen ops (an op and its arguments' shapes, views left out) of the probe
        # step's forward, loss and backward (``_op_count``; 0: not counted): the size a
        # whole-step compile is priced by, before any trace (session 38).
        self._step_ops = 0
        self._op_counter: StepOpCounter | None = None
        self._op_stop: Any = None  # the optimiser pre-hook that ends the count
        self._probe_unused: set[str] = set()
        # The step guard (issue 18, _guard.py): a step run under a configuration that changes the
        # model's code is rolled back when it fails anywhere, and run again under the last good
        # configuration (``run``/``wrap``) or skipped (``with step()``).
        self._applied: dict[str, str] = {}  # the values in force (a broken one replaced)
        self._last_good: dict[str, str] | None = None  # values of the last step that succeeded
        self._broken: dict[str, str] = {}  # values id -> why a step under them failed
        self._good_steps: dict[str, int] = {}  # values id -> steps that succeeded under them
        self._seen_inputs: set[tuple[str, str]] = set()  # (values id, input signature) that ran
        self._snap: StepSnapshot | None = None
        self._repeat: dict[str, str] | None = None  # values to repeat a rolled-back step under
        self._step_inputs = ""
        self._guard_hook: Any = None  # (a hook on every module call: ``_before``)
        self._module_ids: frozenset[int] = frozenset()
        self.rolled_back = 0  # steps rolled back (and repeated or skipped)
        self.skipped_steps = 0  # rolled back under ``with step()``: the batch was not trained on
        self.abandoned = ""  # why the wrapper gave up and left the model its own code (``_abandon``)
        # The intra-op thread count the configuration asks for (None: leave the user's): set
        # around each step only, the user's count restored after it (issue 18: a process-wide
        # setting left behind leaked into the user's later work).
        self._threads: int | None = None
        self._threads_refused = ""  # why this step's thread count was not set (a refused trial)
        self._user_threads: int | None = None
        # The optimisers the step reaches (found at the probe step) and the implementation the
        # configuration asks of them (``_optim``; None: as the user built them): set around each
        # step only, the user's flags restored after it, as the thread count is.
        self.optimizers = StepOptimizers(model)
        self._optimizer: str | None = None
        self._probe_step_ms = 0.0  # the probe step's time: what exploring the optimiser is priced by
        # The probe's costly reads of the step (its op-level profile and its op count: what a
        # whole-step compile is priced by) run on a second probe step, and only where the first,
        # timed without them, says some whole-step compile could be repaid by the run
        # (``_whole_could_pay``): None until the first probe step is timed, then whether they run.
        self._probe_deep: bool | None = None
        # The probe step's op-level profile (``_step_profile``: its share in GEMM-like kernels),
        # where a whole-step compile is among the choices and the step runs on the CPU; what a
        # compile never measured here is expected to save follows from it (``_gain_fraction``).
        self._profiler: StepProfiler | None = None
        self.step_profile: StepProfile | None = None
        # The job's telemetry stream (``microco.clients.telemetry``), when a scheduler hook
        # drives one: the step is then timed there once, this wrapper adds its regions' times
        # and records the trial from the stream's record at the hook's ``step_end``.
        self._stream: telemetry.StepTelemetry | None = None
        self._stop_listening: Callable[[], None] | None = None
        self._deferred: float | None = None  # a finished step waiting for its record (guard ms)
        self._stream_unused = False  # a stream that ended no step: timed alone from then on
        # Committed to the model's own code (every variable but the thread count at its
        # baseline) with nothing left to report: each step calls the user's code directly,
        # with the committed thread count around it and nothing else (issue 18; see _go_direct).
        self.direct = False

    # -- public
    def spec(self) -> GraphSpec | None:
        return self.session.spec

    @property
    def running(self) -> dict[str, str]:
        """The values the model runs under now: the explorer's configuration, or the last good
        one while a rolled-back step is repeated or after a configuration failed a step."""
        return dict(self._applied)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Run one training step (forward, backward, optimizer step) under the current configuration.

        A trial configuration that fails anywhere in the step is rolled back (parameters,
        gradients, buffers, optimiser state, random streams as before the step) and marked
        failed; since Python cannot run a ``with`` body twice, that mini-batch is then skipped
        (``skipped_steps``). :meth:`run` / :meth:`wrap` repeat it instead."""
        if self.direct:
            user = self._direct_threads()
            self.optimizers.apply(self._optimizer)
            try:
                yield
            finally:
                self.optimizers.restore()
                if user is not None:
                    torch.set_num_threads(user)
            return
        try:
            self._before()
        except Exception as exc:  # noqa: BLE001 - the wrapper's own failure: never the user's step
            self._abandon(exc)
            yield
            return
        try:
            yield
            self._agree_end()
        except Exception as exc:
            if not self._recover(exc):
                raise
            self.skipped_steps += 1
            log.warning(
                "the step was rolled back and its mini-batch skipped (use AstraTorch.run to repeat it)"
            )
            return
        try:
            self._after(True)
        except Exception as exc:  # noqa: BLE001 - (as above)
            self._abandon(exc)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)``, one whole training step, under the current configuration.

        A trial configuration that fails anywhere in the step (forward, backward, optimiser) is
        rolled back and marked failed, and the step runs again under the last configuration that
        ran a step without failing (or plain eager): the loss curve is the one of a run without
        the compiler. ``fn`` should change nothing but the model and its optimisers (what is
        rolled back), e.g. not append to a list before it fails."""
        if self.direct:
            user = self._direct_threads()
            if user is None and self._optimizer is None:
                return fn(*args, **kwargs)
            self.optimizers.apply(self._optimizer)
            try:
                return fn(*args, **kwargs)
            finally:
                self.optimizers.restore()
                if user is not None:
                    torch.set_num_threads(user)
        while True:
            if self.direct:  # (abandoned while recovering a step: the model's own code repeats it)
                return fn(*args, **kwargs)
            try:
                self._before()
            except Exception as exc:  # noqa: BLE001 - the wrapper's own failure: never the user's step
                self._abandon(exc)
                return fn(*args, **kwargs)
            try:
                out = fn(*args, **kwargs)
                self._agree_end()
            except Exception as exc:
                if not self._recover(exc):
                    raise
                continue  # again, under self._repeat
            try:
                self._after(True)
            except Exception as exc:  # noqa: BLE001 - (as above)
                self._abandon(exc)
            return out

    def _abandon(self, exc: Exception) -> None:
        """The wrapper's own work around a step failed (its bookkeeping, the exploration, a
        background compile's launch: not the user's forward, backward or optimiser, which
        ``_recover`` handles). Training must not stop for it (issue 18: on a GPU machine in
        session 30 a background payload that could not be written escaped the step and ended
        the run): the model runs its own code from now on, its forward, optimisers and thread
        count as the user set them, and the reason is kept (``abandoned``)."""
        self.abandoned = f"{type(exc).__name__}: {exc}"
        log.error(
            "astra: the compiler failed around a step (%s); the model runs its own code", self.abandoned
        )
        undo: list[Callable[[], None]] = [
            lambda: self._layout_watch.stop() if self._layout_watch is not None else None,
            lambda: self._snap.close() if self._snap is not None else None,
            lambda: self._set_whole_compile(None),
            self._go_direct,
            self.optimizers.restore,
            self._unguard_replica,
        ]
        for fn in undo:
            with contextlib.suppress(Exception):
                fn()
        self.direct = True
        self._threads, self._optimizer = None, None
        user = getattr(self, "_user_threads", None)
        if user:
            torch.set_num_threads(user)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``wrap(train_step)(*args)`` is ``run(train_step, *args)``."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.run(fn, *args, **kwargs)

        return wrapped

    def restore(self) -> None:
        """Undo the instrumentation: the model runs plain eager code again."""
        self._disarm_deadline()
        self.optimizers.stop_finding()
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening, self._stream = None, None
        self._set_whole_compile(None)
        for r in self.runners.values():
            r.restore()
        self.runners.clear()
        self._unhook_guard()
        if self.background is not None:
            self.background.close()
        self._drop_snapshot()

    # -- the committed model's own code: the user's step, called directly
    def _direct_threads(self) -> int | None:
        """Set the committed thread count for a direct step; the user's count to restore after
        it (None: nothing was changed)."""
        threads = self._threads
        if threads is None:
            return None
        user = torch.get_num_threads()
        if user == threads:
            return None
        torch.set_num_threads(threads)
        return user

    def _runs_own_code(self) -> bool:
        """Is the configuration in force for good, and is it the model's own code (nothing but
        a thread count and an optimiser implementation chosen)? Then the wrapper has nothing to
        do in a step but set them."""
        return (
            self.session.settled
            and self._repeat is None
            and self._probe_calls is None
            and self._deferred is None
            and self._whole_kind is None
            and not self._risky(self._applied, scoped=("threads", OPTIMIZER))
        )

    def _go_direct(self) -> None:
        """From now on each step calls the user's code directly (issue 18: the wrapper cost
        every step its bookkeeping once the exploration had committed plain eager code). Its
        instrumentation comes off: the model's guard hook, the cells' runners (their forwards
        back to the cells' own), the telemetry subscription (no regions to add, no trial to
        record). The explorer hands a settled session nothing else in this process."""
        self._disarm_deadline()
        self.optimizers.stop_finding()  # (no layout changes from now on)
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening, self._stream = None, None
        for r in self.runners.values():
            r.restore()
        self._unhook_guard()
        if self.background is not None:
            self.background.close()
        self._drop_snapshot()
        self.direct = True

    # -- per step
    def _use_stream(self) -> None:
        # (coordinated replicas time each step here: its time is agreed at its end, every rank
        # at the same step, not whenever a stream's record comes)
        stream = None if self._stream_unused or self.replicas is not None else telemetry.current()
        if self._deferred is not None:
            # The stream did not end the last step (no hook's step_end between two steps):
            # that step is not recorded, and this wrapper times its steps alone from now on.
            log.warning("the telemetry stream ended no step between two steps; timing steps here")
            self._deferred = None
            self._stream_unused, stream = True, None
        if stream is not self._stream:
            if self._stop_listening is not None:
                self._stop_listening()
            self._stop_listening = stream.subscribe(self._on_step) if stream is not None else None
            self._stream = stream

    def _on_step(self, rec: telemetry.StepRecord) -> None:
        if self._deferred is None:
            return
        guard_ms, self._deferred = self._deferred, None
        self._finish_step(True, rec.compute_s * 1e3 + guard_ms)

    def _before(self) -> None:
        self._step_agreed = False
        if self.session.spec is None and self._probe_calls is None:
            self._start_probe()
        elif (
            self.session.spec is None
            and self._probe_deep
            and self._op_counter is None
            and self._profiler is None
        ):
            self._start_deep_probe()
        self._use_stream()
        if self._repeat is not None:
            self._apply_values(self._repeat)
        self._user_threads = torch.get_num_threads()
        self._threads_refused = ""
        if self._threads is not None and self._threads != self._user_threads:
            extra = self._threads - self._user_threads
            idle = _session.idle_cores() if extra > 0 and self._trial_running() else math.inf
            if idle < extra:
                # More intra-op threads than idle cores: the trial is refused, not run (it runs
                # the user's count and is reported failed). Measured on 2 cores at load 12-35:
                # one 2-thread step took 31-67x the 1-thread step, a fifth of a 300-step run.
                self._threads_refused = f"threads: {extra} more than the idle cores ({idle:.1f})"
            else:
                torch.set_num_threads(self._threads)
        elif self.session.spec is None and torch.get_num_threads() > 1:
            self._probe_at_room()
        self.optimizers.apply(self._optimizer)
        # Armed under a configuration that changes the model's code; the model's state is kept
        # at the first call of any of its modules in the step (_guard_forward), when the inputs'
        # shapes are known: the model itself, or the modules a step calls without it (a GAN's
        # two models in a ModuleDict, an encoder and a decoder called one by one). A hook on
        # every module call, only until that first call (issue 18, session 31: a hook on the
        # model alone kept nothing there, and a failed trial stopped the run).
        self._snap = StepSnapshot(self.model) if self._risky(self._applied) else None
        if self._snap is not None and self._guard_hook is None:
            self._guard_hook = nn.modules.module.register_module_forward_pre_hook(self._guard_any)
        if self._snap is not None and self.replicas is not None:
            self._guard_replica()
        self._step_inputs = ""
        self.clock.token += 1
        self.clock.in_step = True
        self.clock.region_s = {}
        self.clock.built = False
        self.clock.sync()
        if self._stream is None:
            self._step_started = time.perf_counter()
            self._cpu_started = time.thread_time()
            self._process_started = time.process_time()

    def _probe_at_room(self) -> None:
        """A probe step runs at the most intra-op threads among the choices that the machine has
        room for (its idle cores and the one running this step), where the user's count is more
        and the thread count is a choice: what the probe prices every compile and cache ask by is
        then a step as the run will take it, not one of threads waiting for cores. Measured
        (issue 18, session 40, torch's default two threads on the 2-core VM at load 5-6): probe
        steps of 80-2,300 ms where one thread took 6-20, a cache ask opened by them (3-4 s) in a
        300-step run of 1.7-3.7 s at one thread. The user's count is back after the step."""
        if len(self.thread_values) < 2:
            return  # (the user's count is the only choice: left as set)
        room = 1 + math.floor(max(0.0, _session.idle_cores()))
        fits = [int(v) for v in self.thread_values if int(v) <= room]
        if fits and max(fits) < torch.get_num_threads():
            torch.set_num_threads(max(fits))

    def _trial_running(self) -> bool:
        """Is the configuration in force an exploration trial (not a commit, not a hold)?"""
        cfg = self.session.current
        return cfg is not None and not cfg.committed and not cfg.hold and cfg.trial >= 0

    def _end_step(self, timed: bool = True) -> float:
        """The step's time (ms, the guard's own copies excluded); the user's thread count back.
        ``timed=False`` (the stream times the step): minus the guard's copies only."""
        self.clock.sync()
        ms = (time.perf_counter() - self._step_started) * 1e3 if timed else 0.0
        # The step's CPU time on this thread, where it ran on this thread alone: one intra-op
        # thread, CPU tensors (autograd runs a CPU backward on the calling thread). What the
        # interleaved A/B judges by (issue 18): it leaves out the time other processes held
        # the core. Not with more threads (their work is elsewhere) nor on an accelerator.
        one = timed and torch.get_num_threads() == 1 and self._stream is None and not self.clock.barrier
        cpu = (time.thread_time() - self._cpu_started) * 1e3 if one else math.nan
        if timed and self._probe_calls is not None and not self.clock.barrier:
            # (on the CPU only: an accelerator's step waits on the device, not on the host's load)
            # ... and at least the machine's contention (the load over the cores), which scales
            # this host's measured costs (``HostCompileCosts``): one step's own ratio is noisy
            # (BART at load ~10: its ask priced 6 s alone at a ratio near 1 took 23.8 s).
            proc = (time.process_time() - self._process_started) * 1e3
            self._step_slowdown = max(1.0, ms / proc if proc > 0 else 1.0)
            # (through the module: a test that pins ``_compile_costs.contention`` pins it here too)
            self._slowdown = max(self._step_slowdown, _compile_costs.contention())
        if one and not _ran_alone((time.process_time() - self._process_started) * 1e3, cpu):
            # Other threads of this process worked during the step (a kernel compiled for more
            # threads, the user's own threads): this thread's time is not the step's work.
            cpu = math.nan
        self.clock.in_step = False
        self._unhook_guard()
        self._unguard_replica()
        counter = self._op_counter
        if counter is not None and counter.active:
            counter.stop()  # (a step without an optimiser's update: at its end)
        if counter is not None and counter.done and not counter.counted:
            counter.counted = True
            ms -= counter.cost_s * 1e3  # (what counting added: not the step's work)
            cpu -= counter.cost_s * 1e3
        watch, self._layout_watch = self._layout_watch, None
        if watch is not None:
            watch.stop()
            if watch.redraws and self._probe_calls is not None:
                self._probe_watch = watch  # (judged with the probe: ``_judge_layout_draws``)
            else:
                self._layout_draws = self._layout_draws or watch.found
            ms -= watch.cost_s * 1e3  # (its redraws: not the step's work)
            cpu -= watch.cost_s * 1e3
        if self._snap is not None:
            self._snap.close()
            ms -= self._snap.cost_s * 1e3
            cpu -= self._snap.cost_s * 1e3
        self._step_cpu_ms = cpu
        self.optimizers.restore()
        if self._user_threads is not None and torch.get_num_threads() != self._user_threads:
            torch.set_num_threads(self._user_threads)
        return ms

    def _after(self, ok: bool) -> None:
        self._disarm_deadline()
        stream = self._stream
        if stream is None or not ok:
            self._finish_step(ok, self._end_step(timed=stream is None))
            return
        guard_ms = self._end_step(timed=False)
        for region, secs in self.clock.region_s.items():
            stream.add_region(region, secs)
        self._deferred = guard_ms  # finished by the stream's record (``_on_step``)

    def _finish_step(self, ok: bool, ms: float) -> None:
        self._snap = None
        if ok and self.replicas is not None:
            # The step as the slowest rank ran it (a data-parallel step waits for it), and a
            # trial any rank refused failed on all: every rank's session records the same.
            refused, (ms, self._step_cpu_ms) = self.replicas.agree(
                bool(self._threads_refused), ms, self._step_cpu_ms
            )
            if refused and not self._threads_refused:
                self._threads_refused = "threads: refused on another rank"
        charged, charged_cpu = self._probe_charge_ms, self._probe_charge_cpu_ms
        step_cpu, self._step_cpu_ms = self._step_cpu_ms, math.nan
        cpu = step_cpu + charged
        ms, self._probe_charge_ms, self._probe_charge_cpu_ms = ms + charged, 0.0, 0.0
        if self._probe_calls is not None:
            self._finish_probe(ms if ok else 0.0)
            return
        if ok:
            vid = _values_id(self._applied)
            self._last_good = dict(self._applied)
            self._good_steps[vid] = self._good_steps.get(vid, 0) + 1
            self._seen_inputs.add((vid, self._step_inputs))
        if self._repeat is not None:
            # A rolled-back step, run again under the last good configuration: not a trial's
            # measurement. The configuration the explorer handed out comes back.
            self._repeat = None
            if self.session.current is not None:
                self._apply(self.session.current)
            if ok:
                return
        failed = "; ".join(
            [f"{r.region}: {r.failed}" for r in self.runners.values() if r.failed]
            + ([self._threads_refused] if self._threads_refused else [])
        )
        kind = whole_kind(self.session.values)  # what the configuration asked for (ran or failed)
        if kind and self.whole_failed.get(kind):
            failed = f"model: {self.whole_failed[kind]}"
        region_ms = {k: v * 1e3 for k, v in self.clock.region_s.items()}
        # Did this step build anything (a rewritten or compiled variant, the compiled model)? Then
        # it was a warm-up, not a measurement (a structural rewrite alone costs tens of ms).
        built = self.clock.built or self._whole_fresh
        self._whole_fresh = False
        self._record_compiles(ok, ms, built, charged, step_cpu + charged_cpu)
        running = self._whole_kind  # what ran (a kind whose compile failed runs the plain forward)
        if ok and running and self.model.__dict__.get("forward") is self._compiled_forward.get(running):
            self._whole_built.add(running)
        new = self.session.record(ms if ok else float("nan"), region_ms, failed, built, cpu_ms=cpu)
        if new is not None:
            if new.committed:
                self._learn_gain()
            self._apply(new)
        if self._runs_own_code():
            self._go_direct()

    # -- discovery
    def _start_probe(self) -> None:
        calls: dict[str, int] = {}
        self._probe_calls = calls
        # (read at the first step, not at construction: the process group, or the DDP module
        # around the model, may be made after the wrapper) A replica's probe step is the
        # model's own step and no more: no copy for a background compile, no channels-last
        # forward judging its draws (a DDP module's forward is a collective of its own).
        self.replica = replica_of(self.model)
        if self.replica and self.explore_replicas:
            self._join_replicas()
        elif self.replica:
            self.uncoordinated = "not asked to explore (AstraTorch(..., explore_replicas=True))"
        names = {m: n for n, m in self.model.named_modules()}

        def count(mod: nn.Module, args: Any) -> None:
            n = names[mod]
            calls[n] = calls.get(n, 0) + 1
            redraws = self._layout_watch is not None and self._layout_watch.redraws
            if not redraws and not self._layout_draws and layout_dependent_draw(mod, args):
                self._layout_draws = n  # channels-last would draw other masks (``_variables``)

        def shapes(mod: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            sig = [
                f"{tuple(a.shape)}:{a.dtype}" for a in tfx.flatten_args(args) if isinstance(a, torch.Tensor)
            ]
            sig += [  # keyword inputs by name (none: the key as before)
                f"{k}={tuple(a.shape)}:{a.dtype}"
                for k, v in sorted(kwargs.items())
                for a in tfx.flatten_args((v,))
                if isinstance(a, torch.Tensor)
            ]
            self._input_shapes = ";".join(sig)
            # One copy per tensor, not per argument: a tensor passed twice (a language model's
            # ``input_ids=x, labels=x``) stays one input, as dynamo traced it in the user's call.
            # Two copies made the probe's graph another graph (one more input, 372 nodes against
            # 371), and Inductor's caches missed the compile the user's own ``torch.compile`` had
            # left (hf-t5: asked, "cold", in every corpus run).
            copies: dict[int, torch.Tensor] = {}

            def keep(a: Any) -> Any:
                if not isinstance(a, torch.Tensor):
                    return a
                if id(a) not in copies:
                    copies[id(a)] = example_copy(a)
                return copies[id(a)]

            if not self.replica and (self.background is not None or "inductor" in self.compile_choices):
                # inputs of these shapes: for the background compiles, and the cache probe
                self._example_args = tuple(keep(a) for a in args)
                self._example_kwargs = {k: keep(v) for k, v in kwargs.items()}
                # ... and each distinct call of the step, under the autocast and grad mode it ran
                # in: each is a graph of its own to compile (``_background_payload``)
                call = example_call(self._example_args, self._example_kwargs)
                self._example_autocast = call["autocast"]
                if call["key"] not in self._example_calls and len(self._example_calls) < MAX_EXAMPLE_CALLS:
                    self._example_calls[call["key"]] = call
            if self._layout_watch is not None and self._layout_watch.redraws:
                # ... and for the channels-last forward its draws are judged by
                self._layout_inputs = (tuple(keep(a) for a in args), {k: keep(v) for k, v in kwargs.items()})

        if self.background is not None and self._background_auto and not spare_core():
            # Measured on the oversubscribed 2-core machine: a compile worker either slows the
            # training steps beside it 1.3-2.75x or, at a low priority, starves, and the trial
            # waits (see docs/compiler.md); without an idle core, compiles stay in line.
            self.background.enabled = False
        if self.background is not None and self.replica:
            self.background.enabled = False
        if self.background is not None and self.background.enabled:
            self._snapshot = self._take_snapshot()

        if self._channels_last and not self.replica:
            # every random call of the step asked whether its numbers follow the layout (a
            # functional dropout has no module to hook); where the model holds compiled code,
            # which cannot be watched so, the modules' hooks and any draw at all
            self._layout_watch = LayoutDrawWatch(redraw=not _compiled_inside(self.model))
            self._layout_watch.start()
        self.optimizers.watch()  # the optimisers the probe step reaches
        # (not inside a TorchScript module, which takes no hooks: it runs as one opaque call, as
        # it does under dynamo; held out, session 38: a scripted encoder's hook raised, and the
        # whole model ran unexplored)
        self._hooks = [m.register_forward_pre_hook(count) for n, m in _hookable(self.model) if n]
        self._hooks.append(self.model.register_forward_pre_hook(shapes, with_kwargs=True))
        # (the op count and the profile: on a second probe step, where the first says they may
        # pay, ``_finish_probe``)

    def _start_deep_probe(self) -> None:
        """The second probe step's reads: the step's distinct ops counted from the model's
        forward to the optimiser's update (``_op_count``), and its op-level profile
        (``_step_profile``), started before the step's clock."""
        if self._counts_ops():
            counter = self._op_counter = StepOpCounter()
            self._hooks.append(self.model.register_forward_pre_hook(lambda *_: counter.start()))
            self._hooks.append(self.model.register_forward_hook(lambda *_: counter.mark_forward()))
            # the count ends where the optimiser's update begins (no whole-step compile has it)
            self._op_stop = register_optimizer_step_pre_hook(lambda *_: counter.stop())
        if self._profiles_step():
            profiler = StepProfiler()
            if profiler.start():  # (started before the step's clock: its start is not the step's)
                self._profiler = profiler

    def _wants_deep_probe(self, step_ms: float) -> bool:
        """Are the probe's reads of the step (its op count and profile) worth a second probe
        step? Where a whole-step Inductor compile is among the choices and some compile of it
        could be repaid by the run (``_whole_could_pay``), judged by the first probe step's time
        (``step_ms``; 0: it failed, no second).

        Issue 18, session 40: the first step was profiled and its ops counted in every run that
        offered Inductor, 24 ms alone (15 ms of profile, 9 of counting) and 60 ms at load 5 in
        a 300-step run of 2.9 ms steps (0.87 s) that no compile could repay: torch-lstmcell-loop
        at 300 steps, 1.06-1.12x eager."""
        if step_ms <= 0 or self.replica or not (self._counts_ops() or self._profiles_step()):
            # (a data-parallel replica compiles nothing, and its ranks must end their probes at
            # one step: a gate judged by each rank's own step time could differ between them)
            return False
        typical = self._typical_step_ms(step_ms)
        pays = self._whole_could_pay(typical)
        log.info(
            "probe: first step %.1f ms, priced at %.1f ms a step over %d steps: %s",
            step_ms,
            typical,
            self.total_steps,
            "a whole-step compile could pay, the next step counted and profiled"
            if pays
            else "no whole-step compile could pay, nothing counted or profiled",
        )
        return pays

    def _whole_could_pay(self, step_ms: float) -> bool:
        """Could any whole-step compile be repaid by this run at ``step_ms`` a step, before its
        ops are counted or its step profiled? The most it could save (``most_saving_ms``: twice
        as fast, or what this host measured it to gain here, whichever is more) against the least
        it could cost: a cold compile at its least price (``_cold_compile_could_pay``, at that
        saving) or a cache hit, which costs at least the ask that finds it
        (``_probe_price_ms``). Compiles in the background are off the path: they may."""
        if self._off_critical_path:
            return True
        most = most_saving_ms(self.total_steps, step_ms) or 0.0
        most = max(most, *(self._optimistic_saving_ms(step_ms, kind) for kind in WHOLE))
        if most > self._probe_price_ms():
            return True
        family = "torch:whole:plain"
        price = self.compile_costs.estimate(self._hw, family, 0, graph=self._cost_graph(), warm=False)
        if price is None:
            price = self._unseen_price(family, sum(1 for _ in self.model.parameters()), below=most)
        return price is None or most > price

    # -- data-parallel replicas exploring together (``_replicas``, session 40)
    def _join_replicas(self) -> None:
        """At the probe step of a replica: the ranks' own gloo group (every rank's wrapper at its
        first step: a collective), and a hook that finds the DDP modules the step calls around
        or inside the model (built before the wrapper or after it)."""
        why = coordinable(self.model)
        if why:
            self.uncoordinated = why
            return
        self.replicas = ReplicaGroup.join()
        if self.background is not None:
            self.background.enabled = False
        self.session.warmer = None  # (nothing compiles: no choice offered needs it)

        def find(mod: nn.Module, args: Any) -> None:
            if isinstance(mod, nn.parallel.DistributedDataParallel) and not any(d is mod for d in self._ddps):
                self._ddps.append(mod)

        self._ddp_probe = nn.modules.module.register_module_forward_pre_hook(find)

    def _agree_space(self, params: str) -> None:
        """Do the ranks explore together? Where every rank's model has rank 0's parameters
        (names and shapes) and every DDP module its step called can have its gradients averaged
        by hand (``ddp_unfit``); else every rank runs the model's own code, as before session
        40. Then rank 0's explorer answers for all."""
        group = self.replicas
        assert group is not None
        unfit = "; ".join(f"DistributedDataParallel with {w}" for w in map(ddp_unfit, self._ddps) if w)
        theirs = group.from_rank0(lambda: params)
        if theirs != params:
            unfit = unfit or "the ranks' models differ"
        bad, _ = group.agree(bool(unfit))
        if bad:
            self.uncoordinated = unfit or "another rank cannot explore its model"
            self.replicas = None
            log.warning(
                "astra: %s: %s: %s: a data-parallel replica runs the model's own code",
                self.name,
                self.replica,
                self.uncoordinated,
            )
            return
        self.session.explorer = ReplicatedExplorer(self.session.explorer, group)
        log.info(
            "astra: %s: %s: the ranks explore together (rank 0 decides; threads and the "
            "optimiser's implementation only)",
            self.name,
            self.replica,
        )

    def _replica_variables(self) -> list[Variable]:
        """What replicas may explore: the intra-op thread count and the optimiser's
        implementation. Both leave every parameter where DDP's buckets see it; channels-last
        does not (DDP does not follow a layout change made after it was built: ``_replicas``),
        and neither a compiled step nor the cells' rewrites were measured under DDP."""
        return self._scoped_variables()

    def _scoped_variables(self) -> list[Variable]:
        """The variables that change no code of the model, only settings around its step: the
        intra-op thread count, with the structure, before anything compiles (code compiled
        under one thread count is recompiled when it changes: measured, a 186 s recompile of the
        whole step), and the optimiser's implementation (``_optim``: the same update, no
        compile), fine tuning after the structure and the compiles, around the best of them."""
        out: list[Variable] = []
        if len(self.thread_values) > 1:
            out.append(Variable("threads", self.thread_values, "", STAGE_STRUCTURE))
        impls = self.optimizers.choices()
        if impls and self._optimizer_pays(len(impls)):
            out.append(Variable(OPTIMIZER, impls, "", STAGE_FINE))
        return out

    def _agree_end(self) -> None:
        """The step ran here: does every rank say so? (explored steps of coordinated replicas;
        once per step.) Where another rank's failed, this one's is rolled back too."""
        if self.replicas is None or self.direct or self._step_agreed:
            return
        self._step_agreed = True
        failed, _ = self.replicas.agree(False)
        if failed:
            raise PeerStepFailed("another rank's step failed: rolled back on every rank")

    def _agree_failure(self) -> None:
        """This rank's step failed: the others learn it at their next agreement (the end of
        their backward, or of their step) and roll theirs back."""
        if self.replicas is None or self.direct or self._step_agreed:
            return
        self._step_agreed = True
        self.replicas.agree(True)

    def _guard_replica(self) -> None:
        """A guarded step of coordinated replicas (a trial that may fail): DDP reduces no
        gradient in its backward (``GradSync``, paused at its call), and the end of each backward
        is agreed across the ranks before the gradients are averaged by hand, so that a rank
        whose backward failed leaves no other rank waiting in a bucket's all-reduce, nor a
        user's own all-reduce after it."""
        self._replica_guard = True
        self._backward_queued = False
        params = [p for p in self.model.parameters() if p.requires_grad]
        self._grad_hooks = [p.register_hook(self._on_grad) for p in params]  # type: ignore[no-untyped-call]

    def _unguard_replica(self) -> None:
        if not self._replica_guard:
            return
        self._replica_guard = False
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks = []
        self._grad_sync.resume()

    def _on_grad(self, grad: torch.Tensor) -> None:
        if self._replica_guard and not self._backward_queued:
            self._backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self) -> None:
        """(the autograd engine's callback, at the end of a backward that raised nothing here)"""
        self._backward_queued = False
        if self.replicas is None or self._step_agreed:
            return
        failed, _ = self.replicas.agree(False)
        if failed:
            self._step_agreed = True
            raise PeerStepFailed("another rank's backward failed: rolled back on every rank")
        self._grad_sync.average()

    def _finish_op_count(self) -> None:
        """The probe step's op count, kept for this run's prices (``_step_ops``); the counter's
        hooks removed."""
        counter, self._op_counter = self._op_counter, None
        stop, self._op_stop = self._op_stop, None
        if stop is not None:
            stop.remove()
        if counter is None:
            return
        counter.stop()
        self._step_ops = counter.distinct
        log.info(
            "probe: %d distinct ATen ops in the step's forward and backward (%d in all, %d in its "
            "forward), counted in %.1f ms",
            counter.distinct,
            counter.ops,
            counter.forward_ops,
            counter.cost_s * 1e3,
        )

    def _judge_layout_draws(self) -> None:
        """Would a channels-last step draw other numbers than the probe step drew? Where the
        probe step drew over tensors of two or more dimensions, its model's forward runs once
        more on the probe's inputs with its parameters channels-last (copies) and each draw is
        compared with the probe step's (``layout_forward_check``): exact, where the probe's own
        guess (``LayoutDrawWatch.found``: a draw over any four-dimensional tensor that a
        channels-last copy of it would change) also counts attention probabilities, which stay
        contiguous under channels-last. Where that forward cannot run (no inputs kept, the
        model's forward not called in the step, an error), the guess stands."""
        watch, self._probe_watch = self._probe_watch, None
        inputs, self._layout_inputs = self._layout_inputs, None
        if watch is None:
            return
        verdict = watch.found
        if watch.seen and inputs is not None:
            started = time.perf_counter()
            try:
                with _equiv.left_as_found(self.model):
                    verdict = layout_forward_check(self.model, inputs[0], inputs[1], watch)
            except Exception as exc:  # noqa: BLE001 - a forward that cannot run so: the guess stands
                log.info("the channels-last draws could not be checked (%s): %s", exc, watch.found or "none")
            spent = (time.perf_counter() - started) * 1e3
            self._probe_spent_ms += spent
            log.info(
                "channels-last forward's draws checked in %.1f ms: %s (the probe's guess: %s)",
                spent,
                verdict or "the eager step's",
                watch.found or "none",
            )
        self._layout_draws = self._layout_draws or verdict

    def _profiles_step(self) -> bool:
        """Is the probe step profiled? Where a whole-step Inductor compile is among the choices
        and the model's parameters are on the CPU (on an accelerator the CPU's op times are
        launches, not kernels)."""
        if "inductor" not in self.compile_choices or self.WHOLE_COMPILE_BACKEND:
            return False
        return all(p.device.type == "cpu" for p in self.model.parameters())

    def _counts_ops(self) -> bool:
        """Are the probe step's ops counted (``_op_count``)? Where a whole-step Inductor compile is
        among the choices (what the count prices), and not where the model holds code compiled
        by dynamo (dynamo guards on the dispatch-mode stack: its code would be compiled again
        for the probe step alone, as ``LayoutDrawWatch`` pushes no mode there), nor in a
        data-parallel replica, which compiles nothing (``_replicas``)."""
        return "inductor" in self.compile_choices and not self.replica and not _compiled_inside(self.model)

    def _finish_profile(self, step_ms: float) -> float:
        """Read the probe step's profile (None where none ran or the step failed) and return the
        step's time less what profiling it added. What reading it cost is the probe's spending
        (``_probe_spent_ms``); its GEMM share is kept for this graph (``record_share``), which a
        later run's gain rule is calibrated by."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return step_ms
        profile = profiler.stop(step_ms)
        if profile is None:
            return step_ms
        self.step_profile = profile
        self._probe_spent_ms += profile.cost_ms
        self.compile_costs.record_share(
            self._hw, self.GEMM_SHARE_KIND, profile.gemm_share, self._cost_graph()
        )
        log.info(
            "probe profile: %.1f ms a step (%.1f ms of it profiling, %d op events), %.1f ms in GEMM-like "
            "kernels (share %.2f); read in %.1f ms; a whole-step compile expected to save %.2f of a step",
            profile.own_ms,
            profile.overhead_ms,
            profile.events,
            profile.gemm_ms,
            profile.gemm_share,
            profile.cost_ms,
            self._gain_fraction("plain"),
        )
        return profile.own_ms

    def _finish_probe(self, step_ms: float) -> None:
        if self._probe_deep is None:
            self._probe_step_ms = step_ms  # (what the ask's price scales by, ``_traced_price_ms``)
            self._probe_deep = self._wants_deep_probe(step_ms)
            if self._probe_deep:
                # The first probe step's hooks off (the calls are counted), the probe open for
                # a second step that counts and profiles (``_start_deep_probe``).
                for h in self._hooks:
                    h.remove()
                self._hooks = []
                return
        calls, self._probe_calls = self._probe_calls or {}, None
        self.optimizers.stop()
        if self._ddp_probe is not None:
            self._ddp_probe.remove()
            self._ddp_probe = None
        if self.replica and self.replicas is not None:
            calls = {}
        elif self.replica:
            log.warning(
                "astra: %s: %s: a data-parallel replica runs the model's own code (every replica "
                "must take the same update; each rank's own exploration would commit its own)",
                self.name,
                self.replica,
            )
            calls = {}
        if self._channels_last:
            self.optimizers.keep_finding()  # (whose state a change of layout must move: ``_apply_values``)
        step_ms = self._finish_profile(step_ms)
        self._probe_step_ms = step_ms
        self._finish_op_count()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._judge_layout_draws()
        repeated = sorted(n for n, c in calls.items() if c > 1)
        # Outermost repeated modules only: a cell's own Linear layers repeat with it.
        outer = [n for n in repeated if not any(n.startswith(p + ".") for p in repeated if p != n)]
        self._region_calls = sum(calls[n] for n in outer)
        # The probe's work (a capture of the step, the cache asks) shares one budget
        # (``_worth_cache_probe``). No module repeats (a time loop inside ``forward`` over raw
        # parameters, say): the recurrent structure is looked for in the graph dynamo captures
        # (issue 18), by the plain step's ask when it runs (one trace), else by a capture alone.
        typical = self._typical_step_ms(step_ms)
        asks = not self.replica and self._worth_cache_probe(typical)
        log.info(
            "probe: first step %.1f ms (its own slowdown %.2f, the process's %.2f), priced at %.1f ms "
            "a step over %d steps; the ask priced %.0f ms: %s",
            step_ms,
            self._step_slowdown,
            self._slowdown,
            typical,
            self.total_steps,
            self._probe_price_ms(),
            "asked" if asks else "not asked",
        )
        if self._region_calls <= 1 and not asks and not self.replica and self._worth_graph_capture(typical):
            self._graph_rewrites = self._count_graph_rewrites()
        if asks:
            # On the plain model, before the cells are instrumented; the rewrite only where the
            # step repeats cells or its captured graph has products to hoist or batch, and where
            # what is left of the budget (or its warm load) pays for a second ask.
            self._probe_whole_cache("plain")
            if (
                self._recurrent
                and self._worth_rewrite_ask(typical)
                and self._worth_cache_probe(typical, "rewrite")
            ):
                self._probe_whole_cache("rewrite")
        fingerprints = []
        for name in outer:
            cell = self.model.get_submodule(name)
            if _builtin_leaf(cell):
                # A torch.nn layer called once per time step (an nn.Linear in a loop inside
                # ``forward``) is not a cell: a region of one product has nothing to rewrite and
                # a compiled one costs more per call than it saves. Its products are hoisted and
                # batched in the whole-step graph instead (``model.rewrite``).
                continue
            try:
                gm = tfx.trace_cell(cell)
            except Exception as exc:  # noqa: BLE001 - untraceable cells simply stay eager
                log.info("cell %s is not traceable (%s); it stays eager", name, exc)
                continue
            fp = tfx.fingerprint(gm)
            region = f"{type(cell).__name__}@{fp[:8]}"  # same structure = same region = shared decision
            runner = CellRunner(cell, gm, region, self.clock)
            cell.forward = runner
            self.runners[name] = runner
            self._regions.setdefault(region, []).append(name)
            fingerprints.append(f"{name}={fp}")
        params = ";".join(f"{n}:{tuple(p.shape)}" for n, p in self.model.named_parameters())
        variables = tuple(self._variables())
        if self.replicas is not None:
            self._agree_space(params)
        if self.replica and self.replicas is None:
            variables = ()
        # A different space is a different exploration, but not different priors: a prior moves
        # with this host's caches and load, and the key (which finds an earlier run's commit)
        # must not move with it.
        # Nor what this run measured (issue 18: the identical second run must find the first's
        # key): which whole-step compiles are offered follows the probe step's time (the cache
        # probe and the graph capture run only where a compile could repay them) and the
        # cache's answers, so the whole-step variables enter the key as what the run asks for
        # (Inductor among the compile choices), not as the subset offered.
        space = [
            {
                k: d
                for k, d in v.to_dict().items()
                if k not in ("compile_prior_ms", "prior_calibrated", "subsumes")
            }
            for v in variables
            if v.name not in WHOLE.values() and v.name != OPTIMIZER
        ] + [{"whole": "inductor" in self.compile_choices}]
        # (the optimiser's implementations as the optimisers allow them, not whether this run's
        # length offers them: ``_optimizer_pays``)
        if self.optimizers.choices():
            space.append({OPTIMIZER: list(self.optimizers.choices())})
        fingerprint = hashlib.sha256(
            f"{type(self.model).__name__}|{params}|{fingerprints}|{space}".encode()
        ).hexdigest()[:24]
        spec = GraphSpec(
            fingerprint=fingerprint,
            input_shapes=self._input_shapes,
            hardware=hardware_id(),
            variables=variables,
            model_name=self.name,
            framework="torch",
            total_steps=self.total_steps,
        )
        if self.replicas is not None:
            # rank 0's space, on every rank (its explorer decides; the sessions must agree on
            # what is the baseline and what a trial is)
            spec = self.replicas.from_rank0(lambda: spec)
        cfg = self.session.register(spec)
        self._module_ids = frozenset(id(m) for m in self.model.modules())
        self._apply(cfg)

    # -- the whole-step compile: is it in Inductor's caches?
    # Asking (dynamo's trace of the step, about WHOLE_WARM_PRIOR_MS) and capturing the step's
    # graph are spent before anything is known; they are allowed at most this share of the run's
    # eager time (total steps x the probe step). Issue 18: with a share of 0.5 a 300-step run of
    # a 16-step loop (18 ms a step, 5.4 s in all) spent 20 s in the capture and two cache asks,
    # for a compile that could never pay back; the target is to stay within 5% of eager.
    CACHE_PROBE_SHARE = 0.05
    # The first trace in a process also imports dynamo and Inductor: measured on the 2-core VM,
    # a capture of Llama's step that was the process's first took ~6 s alone, its later asks
    # ~3 s (issue 18, evening of 2026-12-02). A prior, until this host's asks are measured.
    FIRST_TRACE_PRIOR_MS = 3000.0
    CAPTURE_KIND = "probe:torch:capture"  # a capture of the step alone, measured here
    # What each ask cost is kept in this host's record (``HostCompileCosts``) under its own
    # family, so that no compile is priced by an ask's per-node rate (``_other_kinds_estimate``).
    PROBE_KIND = "probe:torch:whole"

    def _worth_cache_probe(self, step_ms: float, kind: str = "plain") -> bool:
        if "inductor" not in self.compile_choices or self._example_args is None or self.WHOLE_COMPILE_BACKEND:
            return False  # (another whole-step backend than Inductor: no Inductor cache to ask)
        gain = self._measured_gain(kind)
        if gain is not None and gain <= 1.0:
            return False  # measured here not faster than the baseline: what it finds would lose
        price = self._probe_price_ms()
        if self.total_steps * step_ms * self.CACHE_PROBE_SHARE > self._probe_spent_ms + price:
            if (
                kind == "plain"
                and not self._cold_compile_could_pay(step_ms, kind)
                and self._cache_lacks_step(price)
            ):
                # What the ask can find: a hit, or a cold answer, which leaves the compile at its
                # cold price. The caches, read whole without a trace, surely hold no compile of
                # this step (no entry traced a line of the model's source files), and no cold
                # compile of it could be repaid by this run: the ask would buy nothing (issue
                # 18, session 27: x-transformers' decoder at 5,000 steps, never compiled here,
                # asked in 4.7 s, 6% of its run, answered cold; its compile priced 94 s before
                # and after against 19 s to save).
                log.info(
                    "whole-step compile (plain): not asked, the caches hold no compile of this "
                    "step and a cold compile cannot be repaid (ask %.0f ms)",
                    price,
                )
                return False
            return True
        # Inductor's caches hold a compile of this model's whole step that some program left
        # here (``_torch_cache.warm_signal``, read without a trace): the ask is worth what the
        # compiled step may save times the chance that the signal is right (this host's
        # signalled asks that hit), against what asking costs (issue 18, session of 2026-12-03
        # morning: Llama and DistilBERT at 5,000 steps never asked and ran eager code against a
        # torch.compile that loaded the same compile and won by 1.48x, 1.32x). The caches are
        # read only where a signal would open the gate, for at most what the ask costs. And only
        # where the core would try what a hit finds: it prices the hit at the ask and the load
        # beyond it (``_hit_price_ms``: as measured here, else ``WHOLE_WARM_PRIOR_MS``) and
        # prunes it where the run cannot repay that (BART at 1,000 steps, same session: asked on
        # a signal, hit in 2.2 s, pruned, 1.17x eager).
        right = self.compile_costs.signal_precision(self._hw, self.PROBE_KIND, self.WARM_SIGNAL_PRIOR)
        saving = self._optimistic_saving_ms(step_ms)
        tried = saving > self._hit_price_ms(price, slowdown=self._slowdown)  # (the saving's footing)
        if (
            kind == "plain"
            and tried
            and right * saving > self._probe_spent_ms + price
            and self._warm_signal(price)
        ):
            log.info(
                "Inductor's caches hold this step (signal right %.2f): expected saving %.0f ms, ask %.0f ms",
                right,
                saving,
                price,
            )
            if right * saving > self._probe_spent_ms + price:  # (the read spent too)
                return True
        # This graph's whole step was loaded from the caches on this host before (a warm load
        # measured here, ``_record_compiles``): the ask is expected to find it again, and is worth
        # what the compiled step may save, the core's own optimistic bound over the run, less the
        # load (issue 18, afternoon of 2026-12-02: hf-t5 at 5,000 steps, loaded here before,
        # asked nothing at load 3.7, its ask priced 8 s against 5% of the run, 5.5 s; the
        # static compiler loaded the same compile and ran 1.6x faster).
        loads = [
            est
            for kind in WHOLE
            if (
                est := self.compile_costs.estimate(
                    self._hw,
                    f"torch:whole:{kind}",
                    graph=self._cost_graph(),
                    warm=True,
                    slowdown=self._slowdown,  # (the saving's, ``_typical_step_ms``)
                )
            )
            is not None
        ]
        if not loads:
            return False
        # A load is recorded from the first step that runs the compile the ask found, which
        # carries that ask (``_probe_charge_ms``): the ask and the load it expects are one cost,
        # at least the ask's price, not two (issue 18, session of 2026-12-03: hf-t5 at 1,000
        # steps, asks of 6.1 s recorded as loads of 6.1 s, weighed as 12.1 s against 8.5 s, ran
        # eager code against a static compiler that loaded the same compile and won by 1.24x).
        return self._optimistic_saving_ms(step_ms) > self._probe_spent_ms + max(price, min(loads))

    # What a signal is worth before this host has kept any signalled ask's answer: 3 hits in 4
    # (Laplace's rule over one miss, three hits). A signal matches every parameter's and input's
    # shape, the source lines traced, the torch and the thread count of the cache key; one is
    # wrong where the same model and batch were compiled into another graph (another loss, other
    # dynamo or Inductor settings). Measured here: see docs/compiler.md, "A cache warmed by
    # another program".
    WARM_SIGNAL_PRIOR = (3.0, 1.0)

    def _cold_compile_could_pay(self, step_ms: float, kind: str) -> bool:
        """Could a cold compile of the whole step (``kind``) be repaid by this run, at ``step_ms``
        a step? The run's optimistic saving (``_optimistic_saving_ms``) against the least the core
        would price it at: this graph's cold compiles measured here, else its first price at a
        size no smaller than one FX node per parameter tensor (the graph's inputs; its true size,
        known only after a trace, is larger), else the cold prior at this process's slowdown (as
        ``_variables`` prices it). In the background the compile is off the path: it may pay."""
        if self._off_critical_path:
            return True
        family = f"torch:whole:{kind}"
        size = self._whole_nodes.get(kind, 0)
        price = self.compile_costs.estimate(self._hw, family, size, graph=self._cost_graph(), warm=False)
        saving = self._optimistic_saving_ms(step_ms, kind)
        if price is None:
            least = size or sum(1 for _ in self.model.parameters())
            price = self._unseen_price(family, least, below=saving)
        if price is None:
            price = self.WHOLE_COMPILE_PRIOR_MS * self._slowdown
        return saving > price

    def _cache_lacks_step(self, budget_ms: float) -> bool:
        """Did a read of Inductor's caches find surely no compile of this step (``read_signal``:
        read whole, and no entry traced from the model's source files)?"""
        return not self._warm_signal(budget_ms) and self.warm_absent

    def _warm_signal(self, budget_ms: float) -> bool:
        """Do Inductor's caches here hold a compile of this model's whole step, by any program
        (``_torch_cache.warm_signal``, reading for at most ``budget_ms``)? Read once per run; its
        time is the probe's."""
        if self.warm_signal is None:
            started = time.perf_counter()
            try:
                index = self.compile_costs.path.parent / "inductor_steps.json"
                self.warm_signal, self.warm_absent = read_signal(
                    self.model,
                    self._example_args or (),
                    self._example_kwargs,
                    index=index,
                    budget_ms=budget_ms,
                )
            except Exception as exc:  # noqa: BLE001 - an unreadable cache signals nothing
                log.info("Inductor's caches not read (%s)", exc)
                self.warm_signal, self.warm_absent = False, False
            self._probe_spent_ms += (time.perf_counter() - started) * 1e3
        return self.warm_signal

    # The ratio of a run's typical eager step (its baseline's median) to its first, kept per
    # graph with the gains (``record_gain``): a first step pays one-time work (allocations,
    # autograd's first graph), and a saving priced by it is too large.
    FIRST_STEP_KIND = "eager:first_step"

    # The typical eager step itself (the baseline's median, ms), kept per graph at each commit
    # (``HostCompileCosts.record_step``).
    TYPICAL_STEP_KIND = "eager:typical"

    def _typical_step_ms(self, first_ms: float) -> float:
        """This run's typical step, expected from its first (``first_ms``, the probe's): as an
        earlier run of this graph here measured the two, never above the first; the first where
        none did (issue 18, session 22: Llama's second run of 300 steps, first step 11.0 ms
        against a typical 7.2, expected 1.4 s saved by a cache hit where 0.9 s was to be had,
        asked for 1.5 s and ran 1.35x the better contender).

        And never above the typical step the earlier runs of this graph here measured (each a
        median of its baseline's steps): a first step is one sample, and its ratio to the typical
        one varies from run to run (0.53-2.1 over one host's record of three models, session
        25), so a slow first step times the usual ratio still prices a saving the run's steps do
        not hold (session 24: Llama's second run of 300 steps, a first step of 17.1 ms against
        its first run's 10.5, priced at 15.2 ms where its steps took about 10; it asked, loaded
        the compile in 1.7 s and ran 1.33x the better contender). Each kept step is scaled up to
        today's contention where it is higher than the one it was kept at (never down: the
        1-minute load average lags): under more load the steps take longer, and an ask's price
        is scaled up with it (``_traced_price_ms``).

        Both at the slowdown the ask's price is scaled by (``_slowdown``; issue 18, session 26):
        the first step at its own measured slowdown taken out (``_at_slowdown``), a kept step by
        the CPU time it kept where it did (``HostCompileCosts.step_ms``). Before, the price's
        prior was scaled by the process's slowdown, at least the machine's contention, while the
        saving stayed at the step's own: Llama and DistilBERT at 5,000 steps on a second run at
        load 4.4-7.9 (contention 2.2-2.6; the eager steps' wall 1.1-1.4x their CPU time) never
        asked, the ask's prior at the contention against a saving at the step's own slowdown,
        and ran eager code 1.50x and 1.88x the static contender, which loaded the same compile
        (session 25's B2)."""
        graph = self._cost_graph()
        ratio = self.compile_costs.gain(self._hw, self.FIRST_STEP_KIND, graph)
        first = self._at_slowdown(first_ms)
        typical = first * min(1.0, ratio) if ratio is not None and ratio > 0 else first
        measured = self.compile_costs.step_ms(
            self._hw, self.TYPICAL_STEP_KIND, graph, slowdown=self._slowdown
        )
        return min(typical, measured) if measured is not None else typical

    def _at_slowdown(self, ms: float) -> float:
        """A time of this run's probe step, measured at its own slowdown (``_step_slowdown``: its
        wall over its CPU time), at the slowdown the probe's priors are scaled by (``_slowdown``:
        at least the machine's contention), so that a saving and the price it is weighed against
        are at one slowdown: what the step takes alone, times the same factor as the prior."""
        return ms * max(1.0, self._slowdown) / max(1.0, self._step_slowdown)

    def _optimistic_saving_ms(self, step_ms: float, kind: str = "plain") -> float:
        """What a compiled whole step may save over the run at ``step_ms`` a step: what this host
        measured it to gain on this graph (``_measured_gain``), else the core's own bound
        (``ExplorationPolicy``'s defaults: twice as fast, half of that expected)."""
        return self.total_steps * step_ms * self._gain_fraction(kind)

    # The share of the eager step in GEMM-like kernels (``_step_profile``), kept per graph
    GEMM_SHARE_KIND = "torch:gemm"
    # What a whole-step compile never measured here is expected to save, from that share
    # (policy: ``_gain_rule``; issue 18, session 29)
    GAIN_RULE = CompileGainRule()

    def _gain_fraction(self, kind: str) -> float:
        """The share of each step a compiled whole step (``kind``) is expected to save: what
        this host measured it to gain (``_measured_gain``), else what the gain rule expects of
        this run's eager step from its profile (``_profiled_gain_fraction``), else the core's
        bound (twice as fast at best, half of that expected: a quarter)."""
        gain = self._measured_gain(kind)
        if gain is not None:
            return max(0.0, 1.0 - 1.0 / gain)
        profiled = self._profiled_gain_fraction()
        if profiled is not None:
            return profiled
        policy = ExplorationPolicy()
        return (1.0 - 1.0 / policy.max_speedup) * policy.expected_gain_share

    def _profiled_gain_fraction(self) -> float | None:
        """The share of each step a whole-step compile is expected to save by the gain rule, from
        the GEMM share of this graph's probe steps kept here (their median, this run's included:
        one first step can be an outlier, e.g. xt-tied's second run at 0.80 against 0.29-0.33 in
        five runs before it, session 29), the rule calibrated by this host's graphs that have
        both a kept share and a measured whole-step gain; None: the step was not profiled."""
        if self.step_profile is None:
            return None
        shares = self.compile_costs.shares(self._hw, self.GEMM_SHARE_KIND)
        gains = self.compile_costs.gains(self._hw, "torch:whole:plain")
        pairs = [(shares[g], gains[g]) for g in shares if g in gains]
        share = shares.get(self._cost_graph(), self.step_profile.gemm_share)
        return self.GAIN_RULE.expected_share(share, pairs)

    def _expected_speedup(self, kind: str) -> float:
        """The speedup the core is told to expect of a whole-step compile never measured here:
        the profiled gain fraction as a speedup (1: nothing expected; 0: no estimate, the core's
        own bound)."""
        if self._measured_gain(kind) is not None:
            return 0.0
        share = self._profiled_gain_fraction()
        return 1.0 / (1.0 - share) if share is not None and 0.0 <= share < 1.0 else 0.0

    def _measured_gain(self, kind: str) -> float | None:
        """The speedup this graph's compiled whole step (``kind``) gave on this host, measured
        interleaved against the baseline by an earlier run's exploration; None: never measured."""
        return self.compile_costs.gain(self._hw, f"torch:whole:{kind}", self._cost_graph())

    def _learn_gain(self) -> None:
        """At a commit: keep what the committed whole-step compile gained, as the exploration
        measured it interleaved (``Exploration.speedup``), for this graph on this host (issue
        18, session of 2026-12-03: hf-t5's compiled step ran 1.83x at 5,000 steps; a run of
        1,000 expected a quarter of its time saved, 1.33x, and ran eager code against a static
        compiler that loaded the same compile). Only an explorer in this process shows its
        state (``LocalExplorer.core``); a remote one keeps the bound."""
        base = self.session.base_ms
        if base is not None and self._probe_step_ms > 0:
            # How much longer the run's first step (the probe's, which prices the asks) took than
            # its typical one: the next run's asks are priced by the typical step.
            self.compile_costs.record_gain(
                self._hw, self.FIRST_STEP_KIND, base / self._probe_step_ms, self._cost_graph()
            )
        if base is not None:
            # (with its thread's CPU time where the baseline kept it: the step alone, which the
            # next run's gate scales to its own slowdown, ``_typical_step_ms``)
            cpu = self.session.base_cpu_ms
            self.compile_costs.record_step(
                self._hw,
                self.TYPICAL_STEP_KIND,
                base,
                self._cost_graph(),
                cpu=cpu if cpu is not None else math.nan,
            )
        state = self._explored_state()
        if state is None:
            return  # nothing learned
        kind = whole_kind(state.best_values)
        if kind and state.interleaved is not None:
            self.compile_costs.record_gain(self._hw, f"torch:whole:{kind}", state.speedup, self._cost_graph())
        # ... and what a whole-step compile that was measured against the baseline and not
        # committed gave: the next run expects that, not the optimistic bound (issue 18, session
        # of 2026-12-03 morning: torch-transformer's compiled step ran 0.94x eager's at 5,000
        # steps; the next run of 300 asked the cache on the bound, loaded it and lost 0.38 s, 1.30x)
        for r in state.confirm_log:
            values = state.trials[r["best"]].values
            lost = whole_kind(values)
            if lost and r.get("pairs") and values != state.best_values:
                self.compile_costs.record_gain(
                    self._hw, f"torch:whole:{lost}", float(r["ratio"]), self._cost_graph()
                )

    def _hit_price_ms(self, ask_ms: float, kind: str = "plain", slowdown: float | None = None) -> float:
        """What an ask that hits and the load of the compile it finds cost, as the core will
        price the trial (``_variables``): this graph's loads measured here (each carries the ask
        that found it), at least the ask; else the ask and the load beyond it learned here
        (``_warm_load_ms``, its prior at ``slowdown``: by default the probe step's own, the
        footing of the measured steps the core weighs the trial against; the probe's gate
        passes the process's, its saving's, ``_typical_step_ms``)."""
        at = self._step_slowdown if slowdown is None else slowdown
        # (a load measured here that kept its CPU time: that time at the same slowdown; measured
        # beside nice-19 busy loops, at the contention the core pruned the hits the gate asked for)
        own = self.compile_costs.estimate(
            self._hw, f"torch:whole:{kind}", graph=self._cost_graph(), warm=True, slowdown=at
        )
        if own is not None:
            return max(ask_ms, own)
        return ask_ms + self._warm_load_ms(kind, at)

    def _warm_load_ms(self, kind: str, slowdown: float = 1.0) -> float:
        """A load of this step's compile found in the caches, beyond the ask that found it, where
        this graph's was never measured here: what this host's loads of other graphs cost beyond
        their asks (``HostCompileCosts.warm_load``: per node at this graph's size where known, at
        today's load), else ``WHOLE_WARM_PRIOR_MS`` (issue 18, session 22: DistilBERT at 1,000
        steps did not ask, its saving, 0.95 s, against the ask and a 3 s prior, while this
        host's loads had cost their asks and a few ms more; the static contender loaded the
        same compile in 1.0 s and won by 1.09x)."""
        size = self._whole_nodes.get(kind, 0) or self.compile_costs.last_size(
            self._hw, self.PROBE_KIND, self._cost_graph()
        )
        learned = self.compile_costs.warm_load(self._hw, f"torch:whole:{kind}", self.PROBE_KIND, size)
        # (the prior is a load alone: at the slowdown of the saving it is weighed against)
        return learned if learned is not None else self.WHOLE_WARM_PRIOR_MS * max(1.0, slowdown)

    def _probe_price_ms(self) -> float:
        """What asking Inductor's caches for the whole step costs on this host (issue 18, third
        session of 2026-12-02): this graph's asks measured here, else (``_traced_price_ms``) the
        other graphs' asks here per step of their eager step, else their median; else
        ``WHOLE_WARM_PRIOR_MS``. With the flat 3 s a run
        of 5,000 steps of 10 ms never asked, and hf-bert's and tv-vit-tiny's whole steps, in the
        caches and paying at 5,000 steps, were priced cold and not tried."""
        return self._traced_price_ms(self.PROBE_KIND)

    def _traced_price_ms(self, kind: str) -> float:
        """A trace of the step (``kind``: a cache ask, a capture): this graph's measured here, at
        today's load; else the other graphs' traces here, per step of their eager step (at their
        load) times this graph's probe step (at today's); else the median of every one measured
        here, at today's load; else the prior
        (``WHOLE_WARM_PRIOR_MS``, plus ``FIRST_TRACE_PRIOR_MS`` where nothing has traced in this
        process yet) at this process's measured slowdown (issue 18, evening of 2026-12-02: at a
        slowdown of 6 an ask priced 3 s took 26 s and a capture 35 s)."""
        own = self.compile_costs.estimate(self._hw, kind, graph=self._cost_graph())
        if own is None:
            # (another graph's trace costs what its size does: the eager step says this one's
            # before it is traced, ``HostCompileCosts.per_step``; a median across graphs priced
            # DistilBERT's ask by hf-t5's twelve, 2.4 s against its own 0.8 s)
            # (at the slowdown of the saving it is weighed against, ``_at_slowdown``)
            own = self.compile_costs.per_step(self._hw, kind, self._at_slowdown(self._probe_step_ms))
        if own is None:
            own = self.compile_costs.estimate(self._hw, kind)
        if own is not None:
            return own
        return (self.WHOLE_WARM_PRIOR_MS + self._first_trace_ms()) * self._slowdown

    def _first_trace_ms(self) -> float:
        """The first trace's imports (dynamo, Inductor), when this process has not paid them."""
        return 0.0 if "torch._inductor.compile_fx" in sys.modules else self.FIRST_TRACE_PRIOR_MS

    def _worth_rewrite_ask(self, step_ms: float) -> bool:
        """Ask the caches for the rewritten step too? Not once the plain step was found compiled
        (a hit, priced as a load) where the run could not repay the rewrite's compile if the ask
        answered cold (issue 18, hf-t5 at 5,000 steps: the rewrite's ask, 5.3 s, answered cold,
        and its 60 s cold price was pruned at once, against a static compiler's 7.7 s load). The
        bound is the core's own optimistic one (``ExplorationPolicy``'s defaults: twice as fast,
        half of that expected) over the whole run at the probe step's time, against the rewrite's
        cold price (its compiles measured here, else its first price at the plain graph's size);
        a cold plain step keeps both asks (a hit of either is the only way either is tried)."""
        if self.whole_cache.get("plain") != "hit":
            return True
        saving = self._optimistic_saving_ms(step_ms, "rewrite")
        price: float | None = self.WHOLE_WARM_PRIOR_MS  # in the background: its load on the path
        if not self._off_critical_path:
            size = self._whole_nodes.get("plain", 0)  # the rewrite's graph: at least the plain one's
            price = self.compile_costs.estimate(
                self._hw, "torch:whole:rewrite", size, graph=self._cost_graph(), warm=False
            )
            if price is None:
                price = self._unseen_price("torch:whole:rewrite", size)
        if price is None:
            price = self.WHOLE_COMPILE_PRIOR_MS * self._slowdown
        if saving >= price:
            return True
        log.info(
            "the rewritten step is not asked for: the plain step is in the caches and a cold "
            "rewrite (est. %.0f ms) cannot be repaid (expected saving %.0f ms)",
            price,
            saving,
        )
        return False

    def _worth_graph_capture(self, step_ms: float) -> bool:
        """Is a whole-step compile in the space, and is the run long enough to afford the trace?"""
        if "inductor" not in self.compile_choices or self._example_args is None:
            return False
        if not self._cold_compile_could_pay(step_ms, "rewrite"):
            # What a capture finds is offered as the rewritten step's compile, cold (no ask
            # follows it): one the run cannot repay is pruned, and the capture bought nothing.
            return False
        price = self._traced_price_ms(self.CAPTURE_KIND)
        return self.total_steps * step_ms * self.CACHE_PROBE_SHARE > self._probe_spent_ms + price

    def _probe_whole_cache(self, kind: str) -> None:
        """Trace the whole step with dynamo and ask Inductor's caches for its graphs, without
        compiling (see _torch_cache). A hit is the compile, done: it is kept for the trial, and
        that whole-step compile is priced at what the probe cost. A miss leaves the cold price."""
        started = time.perf_counter()  # (the backend's first import of Inductor is the ask's too)
        cpu_started, proc_started = time.thread_time(), time.process_time()
        backend = WholeStepBackend(rewrite=kind == "rewrite")
        if not backend.available:
            return
        backend.cache_only = True
        # The plain step's ask tells, from its one trace, whether a rewrite is worth offering.
        backend.count_offered = kind == "plain" and self._region_calls <= 1
        compiled = torch.compile(self._plain_forward(), backend=backend, dynamic=False)
        asked = False
        try:
            # A forward only, under autograd (the training graph, as a trial compiles it), with
            # the random streams, the buffers (running statistics) and the modules' plain
            # attributes (a call counter) as they were: the probe leaves no trace in training.
            # (under the autocast the step's call ran in: another graph without it)
            with (
                _equiv.left_as_found(self.model),
                torch.random.fork_rng(),
                torch.enable_grad(),
                autocast_as(self._example_autocast),
            ):
                compiled(*(self._example_args or ()), **self._example_kwargs)
            asked = True
        except Exception as exc:  # noqa: BLE001 - an untraceable step keeps its cold price
            log.info("whole-step cache probe failed (%s); the whole-step compile keeps its cold price", exc)
            backend.cold += 1
        self.clock.sync()
        self.whole_probe_ms[kind] = (time.perf_counter() - started) * 1e3
        cpu = (time.thread_time() - cpu_started) * 1e3
        # (other threads of this process worked meanwhile: this thread's time is not the ask's)
        alone = _ran_alone((time.process_time() - proc_started) * 1e3, cpu)
        self.whole_probe_cpu_ms[kind] = cpu if alone else math.nan
        self._probe_spent_ms += self.whole_probe_ms[kind]
        if asked and backend.count_offered:
            self._graph_rewrites = backend.offered
        # (a hit's ask includes the load of the compile it found: what asking costs, either way;
        # a forward that raised asked nothing, in a millisecond: not a price)
        if asked:
            self.compile_costs.record(
                self._hw,
                self.PROBE_KIND,
                self.whole_probe_ms[kind],
                backend.nodes,
                graph=self._cost_graph(),
                step=self._probe_step_ms,
            )
        backend.cache_only = False  # from now on (a recompile for new guards), Inductor proper
        backend.deadline = self._deadline  # ... under the trial's deadline
        self._whole_nodes[kind] = backend.nodes
        if kind == "rewrite":
            self.whole_rewrites = backend.rewrites
        if asked and kind == "plain" and self.warm_signal:  # (a signal read: its answer, for its price)
            self.compile_costs.record_signal(
                self._hw, self.PROBE_KIND, bool(backend.hits and not backend.cold)
            )
        if backend.hits and not backend.cold:
            self.whole_cache[kind] = "hit"
            self._compiled_forward[kind] = self._guarded(compiled, kind)
            self._whole_built.add(kind)
            self._probe_unused.add(kind)
        else:
            self.whole_cache[kind] = "cold"
        log.info(
            "whole-step compile (%s): Inductor cache %s (asked in %.0f ms)",
            kind,
            self.whole_cache[kind],
            self.whole_probe_ms[kind],
        )

    # -- background compiles
    def _take_snapshot(self) -> nn.Module | None:
        """A copy of the plain model (before any instrumentation) for the background worker; None
        when another process could not rebuild it (a class defined in ``__main__``, or inside a
        function, which pickle cannot name)."""
        if any(
            type(m).__module__ == "__main__" or "<locals>" in type(m).__qualname__
            for m in self.model.modules()
        ):
            return None
        try:
            return copy.deepcopy(self.model)
        except Exception as exc:  # noqa: BLE001 - compiles then stay in line
            log.info("model cannot be copied for background compiles (%s)", exc)
            return None

    def _drop_snapshot(self) -> None:
        """No background compile is wanted any more: the model's copy and the step's inputs kept
        for the worker are let go. Held out, issue 18, session 43: the copy was kept for the
        wrapper's life, a second model's parameters and buffers held through a run that had
        committed and called the user's code directly (on a GPU host, where background compiles
        are on, in the device's memory)."""
        self._snapshot = None
        self._example_calls.clear()

    def _background_payload(self, values: dict[str, str]) -> dict[str, Any] | None:
        if self._snapshot is None or self._example_args is None:
            return None
        return {
            "model": self._snapshot,
            "args": self._example_args,
            "kwargs": self._example_kwargs,
            # every graph the step compiles: each call's inputs, autocast and grad mode
            "calls": [{k: v for k, v in call.items() if k != "key"} for call in self._example_calls.values()],
            "values": dict(values),
            "threads": int(values.get("threads", torch.get_num_threads())),
            "compile_choices": list(self.compile_choices),
        }

    @property
    def _off_critical_path(self) -> bool:
        """Will compiles run in the background (the model can be rebuilt in another process)?"""
        return self.background is not None and self.background.enabled and self._snapshot is not None

    def _needs_compile(self, values: dict[str, str]) -> bool:
        """Would running ``values`` now compile anything with Inductor in this process?"""
        kind = whole_kind(values)
        if kind:
            return not self.whole_failed.get(kind) and kind not in self._whole_built
        for runner in self.runners.values():
            r = runner.region
            mode = values.get(f"{r}.compile", "eager")
            if mode not in ("inductor", "inductor-autotune", "inductor-cudagraphs"):
                continue
            if not runner.is_compiled(values.get(f"{r}.batch", "off"), values.get(f"{r}.hoist", "off"), mode):
                return True
        return False

    # Cold priors, used only until this host has measured a compile of the kind
    # (``HostCompileCosts``): flat, not per cell call (issue 18: priced per call, a whole step
    # with its time loop inside ``forward`` was estimated at 256-512 s and measured 40-343 s).
    WHOLE_COMPILE_PRIOR_MS = 60_000.0
    # With background compiles, what a compile costs the critical path before any is measured:
    # the in-process load once Inductor's caches are filled (dynamo's trace of the unrolled step
    # is not cached across processes: measured 2.6-4.7 s for 8 cell calls and 0.7-3.5 s for 16,
    # loaded machine), or for a cell region its AOTAutograd capture plus the cache load (measured
    # 0.6-2.6 s with warm caches). The slowdown of the steps run beside the background compile is
    # charged as it accrues, and the core drops a compile once that alone exceeds what it could
    # save, so an optimistic price here risks at most the compile's best-case saving.
    WHOLE_WARM_PRIOR_MS = 3000.0
    REGION_WARM_PRIOR_MS = 1500.0
    # "" is Inductor, as torch.compile runs it (WholeStepBackend); tests name a cheaper backend.
    WHOLE_COMPILE_BACKEND = ""
    # The in-line compile's deadline (``_deadline``). Its timer runs only inside the backend's
    # compile call (``WholeStepBackend``, around Inductor's ``compile_fx``, the backward compiled
    # there too), never in Dynamo's tracing nor the user's forward and backward: armed from the
    # forward's call (session 11) it fired in Dynamo's tracing, and a raise there aborted a CI
    # worker ("Fatal Python error: Aborted"), so it was off until the second session of
    # 2026-12-02. A trial's call allows the deadline; the backend arms it only if it compiles.
    INLINE_DEADLINE = True

    def _set_whole_compile(self, kind: str | None) -> None:
        """Run the whole step compiled (``kind``: "plain" or "rewrite"), or (None) the cells'
        regions under the model's own forward."""
        if kind and not self.whole_failed.get(kind):
            if kind in self._probe_unused:
                # The probe's loaded compile: its first step is a warm-up carrying what the probe
                # cost, so the compile cost measured (and kept for the key) is the real one.
                self._probe_unused.discard(kind)
                self._whole_fresh = True
                self._probe_charge_ms = self.whole_probe_ms.get(kind, 0.0)
                self._probe_charge_cpu_ms = self.whole_probe_cpu_ms.get(kind, math.nan)
            if kind not in self._compiled_forward:
                self._whole_fresh = True  # compiles on its first call, the next step
                rewrite = kind == "rewrite"
                backend = WholeStepBackend(rewrite, self.WHOLE_COMPILE_BACKEND or None)
                backend.deadline = self._deadline  # runs only inside its compile call
                self._compiled_forward[kind] = self._guarded(
                    torch.compile(self._plain_forward(), backend=backend, dynamic=False), kind
                )
            for r in self.runners.values():
                r.restore()  # dynamo traces the cells' own code
            self.model.forward = self._compiled_forward[kind]
            self._whole_kind = kind
            return
        self._whole_kind = None
        if self._own_forward is None:
            self.model.__dict__.pop("forward", None)
        else:
            self.model.forward = self._own_forward
        for r in self.runners.values():
            r.install()

    def _plain_forward(self) -> Callable[..., Any]:
        if self._own_forward is not None:
            return cast(Callable[..., Any], self._own_forward)
        return cast(Callable[..., Any], type(self.model).forward.__get__(self.model))

    def _guarded(self, compiled: Callable[..., Any], kind: str) -> Callable[..., Any]:
        plain = self._plain_forward()

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.whole_failed.get(kind):
                return plain(*args, **kwargs)
            if self._trial_running() and not self._arm_deadline(kind):
                # Its price is more than the most it could save: it would be abandoned at its
                # deadline; not started (the trial fails, the step runs the plain forward).
                self.whole_failed[kind] = "not started: its price exceeds the most it could save"
                log.warning("astra: %s: %s", kind, self.whole_failed[kind])
                return plain(*args, **kwargs)
            try:
                # (and the model's mode: an evaluation's graph, dropout off and batch norms on
                # their running statistics, is another compile, checked on its own)
                sig = (kind, self.model.training, _equiv.signature(args, kwargs))
                if sig not in self._equivalent:
                    # Once per compiled variant and input signature in this process: the same
                    # function as the model's own code, or the model's own code runs (a compiler
                    # that computes otherwise is a failure like one that raises).
                    twin = _equiv.float64_twin(self.model, plain)
                    why = _equiv.differs(self.model, plain, compiled, args, kwargs, twin)
                    if why:
                        raise CompiledOtherwise(f"computes otherwise than the model's own code: {why}")
                    self._equivalent.add(sig)
                return compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a failing compile must never stop training
                self.whole_failed[kind] = failure(exc)
                log.warning(
                    "compiled model (%s) failed, running it eagerly: %s", kind, self.whole_failed[kind]
                )
                return plain(*args, **kwargs)

        return InstalledForward(forward, self.model, self._own_forward)

    # -- the in-line compile's deadline (session 11)
    def _arm_deadline(self, kind: str) -> bool:
        """Whatever a trial's call compiles (the first compile, or a recompile for guards the
        probe's graph does not pass: another memory format) is bounded by its price. False: a
        compile not done yet whose price exceeds the most it could save over the steps left
        (``most_saving_ms``, the deadline's own bound): it would be abandoned at a deadline known
        to be too short, and is not started (issue 18, evening of 2026-12-02)."""
        spec, s = self.session.spec, self.session
        if spec is None or not self.INLINE_DEADLINE:
            return True
        price = next((v.compile_prior_ms for v in spec.variables if v.name == WHOLE.get(kind)), 0.0)
        base = s.base_ms if s.base_ms is not None else s.best_ms
        left = self.total_steps - s.steps
        most = most_saving_ms(left, base)
        if kind not in self._whole_built and most is not None and price > most:
            return False
        deadline = compile_deadline_ms(price, left, base)
        if self._deadline_kind != kind:  # once per step: what the step's compiles may take in all
            self._deadline.allow(deadline, f"whole-step compile ({kind})")
            self._deadline_kind = kind
        if kind not in self._whole_built:
            self._deadline.begin()  # the trace before the compile calls counts toward it too
        return True

    def _disarm_deadline(self) -> None:
        self._deadline.disarm()
        # what the abandoned compile ran in all, Dynamo's trace and AOTAutograd included
        elapsed = self._deadline.spent_ms()
        self._deadline.allow(0.0, "")
        kind, self._deadline_kind = self._deadline_kind, ""
        if not (kind and self._deadline.fired):
            self._deadline.fired = False
            return
        self._deadline.fired = False
        # Abandoned (in the forward or in the backward's lazy compile): the trial fails, the
        # kind is not run again in this process, and this graph costs at least that here.
        why = f"{CompileDeadline.__name__}: compile abandoned after {elapsed / 1e3:.1f} s (its deadline)"
        # The deadline is the cause, whatever the guard caught: Dynamo wraps what a backend raises
        # (BackendCompilerFailed), and on a busy machine the timer can fire where a caller turns
        # it into another error (a CI run at load ~9: the guard kept the wrapper's message).
        self.whole_failed[kind] = why
        self._pending_whole = None
        self.compile_costs.record(
            self._hw,
            f"torch:whole:{kind}",
            elapsed,
            self._whole_nodes.get(kind, 0),
            graph=self._cost_graph(),
            ops=self._step_ops,
            warm=self.whole_cache.get(kind) == "hit" or self._off_critical_path,
            floor=True,
        )
        log.warning("astra: %s: %s", kind, why)

    def _variables(self) -> list[Variable]:
        out: list[Variable] = []
        if self.replica:
            # (``_replicas``) ranks exploring together: only what leaves the parameters where
            # they are (DDP's buckets view them as built); else no variable, the model's own
            # code committed at once
            return self._replica_variables() if self.replicas is not None else out
        for region, names in sorted(self._regions.items()):
            gm = self.runners[names[0]].gm
            if tfx.count_batchable(gm):
                out.append(Variable(f"{region}.batch", self.batch_choices, region, STAGE_STRUCTURE))
            kinds = tfx.classify(gm)
            if any(k == "X" and tfx._is_linear_module(gm, n) for n, k in kinds.items()):
                out.append(Variable(f"{region}.hoist", ("off", "on"), region, STAGE_STRUCTURE))
            if len(self.compile_choices) > 1:
                learned = (
                    None
                    if self._off_critical_path
                    else self._learned("torch:region:inductor", gm, self._cost_graph(region))
                )
                out.append(
                    Variable(
                        f"{region}.compile",
                        self.compile_choices,
                        region,
                        STAGE_COMPILE,
                        compiles=True,
                        compile_prior_ms=(
                            self.REGION_WARM_PRIOR_MS if self._off_critical_path else (learned or 0.0)
                        ),
                        prior_calibrated=learned is not None,
                    )
                )
        if "inductor" in self.compile_choices:
            # torch.compile unrolls the time loop: its compile grows with the cell calls per step
            # (measured 4 to 18 minutes for 16 calls, cold cache, loaded machine; seconds with a
            # warm cache). The prior keeps it from being tried in runs too short to repay it.
            # (in line: the cold prior is a compile alone, at this process's measured slowdown)
            cold = (
                self.WHOLE_WARM_PRIOR_MS
                if self._off_critical_path
                else self.WHOLE_COMPILE_PRIOR_MS * self._slowdown
            )
            regional = tuple(v.name for v in out if v.region)
            # The rewrite where the step repeats cells and (when the probe asked) its passes
            # changed something; without, it would compile the plain step again.
            whole_kinds = WHOLE if self._recurrent and self.whole_rewrites != 0 else ("plain",)
            for kind in whole_kinds:
                hit = self.whole_cache.get(kind) == "hit"  # found compiled: what it cost, measured
                learned = None
                if not self._off_critical_path or hit:
                    # This graph's own compiles, cold or warm as the cache says it will be
                    # (session 11: not another graph's, and a hit priced as a load, not a compile).
                    learned = self.compile_costs.estimate(
                        self._hw,
                        f"torch:whole:{kind}",
                        self._whole_nodes.get(kind, 0),
                        graph=self._cost_graph(),
                        warm=hit,
                    )
                holds_for: tuple[str, ...] = ()
                otherwise = 0.0
                if hit:
                    # The lookup the probe ran, and what a load of this graph cost its trials
                    # here (its warm-up step: loading and the first run of the compiled code);
                    # never measured: the lookup plus the load beyond it learned across graphs
                    # here, else the warm load's prior (``_hit_price_ms``, the gate's price too).
                    probe = self.whole_probe_ms.get(kind, 0.0)
                    warm = self._hit_price_ms(probe, kind)
                    prior = max(1.0, warm)
                    if kind in self._probe_unused:
                        # The ask is paid and its loaded compile kept ready: trying it costs
                        # what a load cost here beyond its ask (a sunk ask priced again pruned
                        # hf-t5's hit at load 6.7: 6.5 s against 5.6 s saved, 1.68x eager;
                        # issue 18, session of 2026-12-03 morning)
                        prior = max(1.0, warm - probe)
                    learned = prior
                    # ... only for the configuration the probe ran: under another memory format
                    # or thread count Dynamo recompiles (tv-mobilenet, session 11: the hit priced
                    # a compile over channels_last that ran ~300 s cold).
                    holds_for = self._probed_configuration()
                    if holds_for:
                        otherwise = self._cold_whole_price(kind, cold)
                else:
                    prior = learned if learned is not None else cold
                    if learned is None and not self._off_critical_path:
                        prior = self._first_whole_price(kind, cold)
                        learned = prior  # as given: no other choice's compile scales it down
                    wait = self._background_wait_ms(kind) if self._off_critical_path else 0.0
                    if wait > 0:
                        # What the steps run while the trial waits for its worker would have
                        # gained: lost with the wait (as given: this host's measured times, not
                        # scaled by other choices' compiles)
                        prior += wait * self._gain_fraction(kind)
                        learned = prior
                out.append(
                    Variable(
                        WHOLE[kind],
                        ("eager", "inductor"),
                        "",
                        STAGE_COMPILE,
                        compiles=True,
                        compile_prior_ms=prior,
                        prior_calibrated=hit or learned is not None,
                        # dynamo traces the cells' plain code: the region rewrites do nothing under
                        # it; the rewritten step replaces the plain one (the widest scope runs).
                        subsumes=regional + (("model.compile",) if kind == "rewrite" else ()),
                        prior_holds_for=holds_for,
                        prior_otherwise_ms=otherwise,
                        measured_speedup=self._measured_gain(kind) or 0.0,
                        expected_speedup=self._expected_speedup(kind),
                        runs_as=self._inductor_runs_as(),
                    )
                )
        if self._channels_last and self._layout_draws:
            # its masks follow the layout: every channels-last step would drop other elements
            # than the run without the compiler (``layout_dependent_draw``, ``LayoutDrawWatch``)
            log.info(
                "%s draws random numbers over feature maps in their storage order: channels-last "
                "is not offered (it would draw other numbers than the eager run)",
                self._layout_draws,
            )
        elif self._channels_last:
            out.append(Variable("memory_format", ("contiguous", "channels_last"), "", STAGE_STRUCTURE))
        return out + self._scoped_variables()

    def _inductor_runs_as(self) -> tuple[str, ...]:
        """The configuration whose kernels a whole-step Inductor compile runs (``Variable.runs_as``):
        ``memory_format=channels_last`` where the model has convolutions, its parameters are on the
        CPU and oneDNN is on: Inductor's layout optimisation then lays every convolution out
        channels-last whatever the model's format (``GraphLowering.decide_layout_opt``, "for cpu
        backend and mkldnn enabled, we always use channels_last"; unless the user turned
        ``torch._inductor.config.layout_optimization`` off, read only where Inductor is imported
        already: importing it costs 1.5-2.2 s). Measured here (issue 18, session 35): torchvision's
        ResNet-18 at 32x32, eager 48-50 ms a step, channels-last 60-89 ms, compiled 78-90 ms."""
        if not self._channels_last or not all(p.device.type == "cpu" for p in self.model.parameters()):
            return ()
        mkldnn = torch.backends.mkldnn
        if not (mkldnn.enabled and mkldnn.is_available()):  # type: ignore[no-untyped-call]
            return ()
        config = sys.modules.get("torch._inductor.config")
        if config is not None and not getattr(config, "layout_optimization", True):
            return ()
        return ("memory_format=channels_last",)

    # What one explored step costs beyond the step itself, as a share of the step: the guard's
    # copies (measured ~3x the optimiser's own step on the held-out models) and the trial's
    # bookkeeping between steps. Measured 25-29% (2026-12-03, Llama, DistilBERT, BART: 49-67
    # steps of exploring the optimiser took 1.05-2.7 ms a step above their median step).
    EXPLORED_STEP_COST = 0.3

    def _optimizer_pays(self, choices: int) -> bool:
        """Is the run long enough for the optimiser's implementation to repay exploring it? Its
        best case, the core's own bound (twice as fast, half of that expected) on the optimiser's
        step over the run, against the steps its exploration takes (a trial per choice, a
        confirming A/B and one re-timing, at the policy's defaults) at ``EXPLORED_STEP_COST``
        of the probe step each. Measured at 300 steps (2026-12-03): exploring it took 49-67
        steps and 6-8% of the run, for an optimiser step of 5-10% of the step."""
        policy = ExplorationPolicy()
        bound = (1.0 - 1.0 / policy.max_speedup) * policy.expected_gain_share
        saving = self.total_steps * self.optimizers.step_ms * bound
        steps = (choices - 1) * policy.steps_per_trial + 4 * policy.retime_rounds * policy.retime_steps
        cost = steps * self._probe_step_ms * self.EXPLORED_STEP_COST
        if saving >= cost:
            return True
        log.info(
            "the optimiser's implementation is not explored: at most %.0f ms to save over %d steps "
            "(its step %.2f ms), against %.0f ms of exploring it",
            saving,
            self.total_steps,
            self.optimizers.step_ms,
            cost,
        )
        return False

    def _record_background(self, entry: dict[str, Any]) -> None:
        """Keep a background worker's wall time for a whole-step compile (``background:torch:
        whole:<kind>``, this graph): how long a trial waits for it. A worker cancelled before it
        finished (its trial dropped, the run committed) ran at least that long: a floor."""
        kind = whole_kind(entry.get("values", {}))
        wall_ms = float(entry.get("wall_s") or 0.0) * 1e3
        failed = not entry.get("cancelled") and (entry.get("rc") != 0 or entry.get("error"))
        if kind is None or failed or wall_ms <= 0:
            return
        self.compile_costs.record(
            self._hw,
            f"background:torch:whole:{kind}",
            wall_ms,
            size=self._worker_size(kind),
            graph=self._cost_graph(),
            floor=bool(entry.get("cancelled")),
        )

    def _worker_size(self, kind: str) -> int:
        """The nodes a worker of ``kind`` compiles, for its per-node rate: the probe's count, or
        for the rewritten step, when it was not counted, the plain step's (at least that many)."""
        return self._whole_nodes.get(kind, 0) or self._whole_nodes.get("plain", 0)

    def _background_wait_ms(self, kind: str) -> float:
        """How long a trial of this whole-step compile would wait for its background worker
        (issue 18, 2026-12-03: Llama's worker took 30 s wall for the plain step and 38 s for the
        rewrite, DistilBERT's more than 15 s, against eager runs of 5,000 steps of 28 and 20 s;
        a trial whose worker outlasts the run's steps cannot gain, and the steps beside the
        worker ran up to 2x slower). This graph's finished workers here; where it has only
        floors (workers cancelled early) or nothing, the larger of its floors and the highest
        per-node rate of this host's whole-step workers; else this graph's in-process cold
        compile (a worker takes at least that), else its first price; 0: nothing known."""
        size, graph = self._worker_size(kind), self._cost_graph()
        bg = f"background:torch:whole:{kind}"
        wait = self.compile_costs.estimate(self._hw, bg, size, graph=graph)
        rows = [r for r in self.compile_costs.measurements(self._hw, bg) if r.get("graph") == graph]
        if all(r.get("floor") for r in rows):
            # Only floors (workers cancelled early) or nothing: a floor is a lower bound, the
            # rate of this host's finished workers the estimate (Llama, 2026-12-03: the plain
            # step's worker cancelled at 6.1 s when the run committed the rewrite, whose worker
            # took 48.9 s; priced at the floor, the plain step was tried at 5,000 steps and lost).
            # (each kind's: ``first_price`` stops at the first kind with any row, a floor too)
            rates = [
                self.compile_costs.first_price(self._hw, f"background:torch:whole:{k}", size) for k in WHOLE
            ]
            known = [r for r in rates if r is not None]
            if known:
                wait = max(wait or 0.0, *known)
        if wait is None:
            wait = self.compile_costs.estimate(self._hw, f"torch:whole:{kind}", size, graph=graph)
        if wait is None:
            wait = self.compile_costs.first_price(self._hw, f"torch:whole:{kind}", size)
        return wait or 0.0

    def _probed_configuration(self) -> tuple[str, ...]:
        """The structure variables' choices the whole-step cache probe ran under (the model as
        given: its memory format, the thread count at registration)."""
        holds: list[str] = []
        if self._channels_last and not self._layout_draws:  # (the variable is offered)
            holds.append(f"memory_format={probed_memory_format(self.model)}")
        if len(self.thread_values) > 1 and str(torch.get_num_threads()) in self.thread_values:
            holds.append(f"threads={torch.get_num_threads()}")
        return tuple(holds)

    def _cold_whole_price(self, kind: str, cold: float) -> float:
        """A whole-step compile of this graph that is not the probe's hit: its cold compiles
        measured here, else its first price (``_first_whole_price``)."""
        measured = self.compile_costs.estimate(
            self._hw,
            f"torch:whole:{kind}",
            self._whole_nodes.get(kind, 0),
            graph=self._cost_graph(),
            warm=False,
        )
        return measured if measured is not None else self._first_whole_price(kind, cold)

    def _first_whole_price(self, kind: str, cold: float) -> float:
        """The first cold compile of a whole-step graph never compiled here (issue 18, fourth
        session of 2026-12-02): its size (FX nodes, known when the probe traced it) priced as
        ``_unseen_price`` does; the cold prior where the size is unknown. Sent as calibrated, so the core uses it as given:
        scaled by other choices' compiles (a cell region's, a cache load's), the 60 s prior fell
        to ~19 s for hf-t5's rewritten step, which was tried and abandoned at its 57.6 s deadline."""
        # (priced by its counted ops: where even the fastest host's price exceeds the most the
        # compile could save over the run, that bound, and this host's speed is not measured,
        # as ``_cold_compile_could_pay`` does: session 38, torch-lstm's 300 steps of 2 ms)
        below = None
        if self._step_ops > 0 and self._probe_step_ms > 0:
            below = most_saving_ms(self.total_steps, self._typical_step_ms(self._probe_step_ms))
        first = self._unseen_price(f"torch:whole:{kind}", self._whole_nodes.get(kind, 0), below=below)
        return first if first is not None else cold

    def _unseen_price(self, kind: str, size: int, below: float | None = None) -> float | None:
        """A cold compile of a graph of ``size`` nodes never compiled here: at this host's
        measured scale of compiles of the kind (``first_price``), else, where this host measured
        none, at its speed on the reference curve, with Inductor's first compile in this process
        where none ran yet, at this process's slowdown (``size_prior``; issue 18, session 30:
        before, the flat cold prior, 60 s, priced every graph of every size, and on a host that
        never compiled a whole step no cold compile was ever tried); None: size unknown.

        ``below``: what the price is weighed against. Where even the fastest host's price is
        not below it, that bound is returned and this host's speed is not measured (a short
        run, which no compile can repay, pays no measurement: ~20 ms, 7% of torch-lstm's
        300-step run)."""
        ops = self._step_ops if kind.startswith("torch:whole:") else 0
        # (by the ops of the step: the rate this host learned from its compiles of any graph)
        learned = self.compile_costs.op_price(self._hw, ops)
        if learned is not None:
            return learned
        first = self.compile_costs.first_price(self._hw, kind, size)
        if first is not None:
            return first
        if ops > 0:
            # (none measured here with an op count: the op curve at this host's speed)
            if below is not None:
                least = self.compile_costs.op_prior(
                    self._hw, ops, slowdown=self._slowdown, speed=_compile_costs.SPEED_FLOOR
                )
                if least is not None and least >= below:
                    return least
            return self.compile_costs.op_prior(self._hw, ops, slowdown=self._slowdown)
        if below is not None:
            least = self.compile_costs.size_prior(
                self._hw, size, slowdown=self._slowdown, speed=_compile_costs.SPEED_FLOOR
            )
            if least is not None and least >= below:
                return least
        return self.compile_costs.size_prior(self._hw, size, slowdown=self._slowdown)

    # -- recurrent structure from the captured graph (issue 18)
    @property
    def _recurrent(self) -> bool:
        """Does the step repeat work the whole-step passes can hoist or batch: a module called
        more than once, or products found in dynamo's graph of the step?"""
        return self._region_calls > 1 or self._graph_rewrites > 0

    def _count_graph_rewrites(self) -> int:
        """Capture the plain step's forward with dynamo (no compile: the graph is run as traced)
        and count the products the whole-step passes would hoist or batch in it (0 on failure).
        Random streams, buffers and plain attributes are left as they were."""
        counts: list[int] = []

        def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            try:
                counts.append(tfx.count_rewrites(gm))
            except Exception as exc:  # noqa: BLE001 - a graph the passes cannot read offers nothing
                log.info("whole-step passes failed on the captured graph (%s)", exc)
            return gm.forward

        started = time.perf_counter()
        try:
            with _equiv.left_as_found(self.model), torch.random.fork_rng(), torch.enable_grad():
                torch.compile(self._plain_forward(), backend=backend, dynamic=False)(
                    *(self._example_args or ()), **self._example_kwargs
                )
        except Exception as exc:  # noqa: BLE001 - an untraceable step: the module tree decides
            log.info("the step could not be captured (%s)", exc)
        ms = (time.perf_counter() - started) * 1e3
        self._probe_spent_ms += ms
        if counts:  # what capturing cost here: the next capture's price
            self.compile_costs.record(
                self._hw, self.CAPTURE_KIND, ms, graph=self._cost_graph(), step=self._probe_step_ms
            )
        return sum(counts)

    # -- compile costs learned on this host (issue 18)
    def _learned(self, kind: str, gm: fx.GraphModule | None = None, graph: str = "") -> float | None:
        size = len(gm.graph.nodes) if gm is not None else 0
        return self.compile_costs.estimate(self._hw, kind, size, graph=graph)

    def _cost_graph(self, region: str = "") -> str:
        """What a compile price is kept by (session 11): the model's class, its parameters'
        shapes and the step's input shapes (the whole step), or a cell region's structure
        fingerprint and the input shapes (a region). Prices are not borrowed across graphs."""
        if region:
            what = f"region|{region}|{self._input_shapes}"
        else:
            params = ";".join(f"{n}:{tuple(p.shape)}" for n, p in self.model.named_parameters())
            what = f"whole|{type(self.model).__name__}|{params}|{self._input_shapes}"
        return hashlib.sha256(what.encode()).hexdigest()[:24]

    def _record_compiles(
        self, ok: bool, ms: float, built: bool, asked: float = 0.0, cpu: float = math.nan
    ) -> None:
        """Keep what this step's compiles cost on this host: a cell region's build (timed by
        the region), a whole step's compile (its warm-up step's excess over the next step; a
        load's with the ask ``asked`` that step carries, ``warm_load``, and its thread's CPU
        time, ``cpu``: the step's and the ask's, NaN where unknown)."""
        if not ok:
            self._pending_whole = None
            return
        for runner in self.runners.values():
            for plan, fn in runner._variants.values():
                if isinstance(fn, AotRegion) and fn.built and id(fn) not in self._recorded_regions:
                    self._recorded_regions.add(id(fn))
                    if fn.compiler == "inductor":
                        size = len(plan.s_gm.graph.nodes)
                        self.compile_costs.record(
                            self._hw,
                            "torch:region:inductor",
                            fn.compile_s * 1e3,
                            size,
                            graph=self._cost_graph(runner.region),
                            warm=self._off_critical_path,  # after a background compile: a load
                        )
        running = self._whole_kind
        pending, self._pending_whole = self._pending_whole, None
        if pending is not None and running == pending[0] and not built:
            self.compile_costs.record(
                self._hw,
                f"torch:whole:{running}",
                pending[1] - ms,
                self._whole_nodes.get(running, 0),
                graph=self._cost_graph(),
                ops=self._step_ops,
                warm=pending[2],
                ask=pending[3] if pending[2] else None,
                cpu=pending[4] - cpu,  # (NaN where either step's is unknown: not kept)
            )
        if built and running:
            # Priced by the next step: a cold compile, or (a cache hit) the load, whose step
            # carries the probe's lookup too (``_probe_charge_ms``): kept apart (session 11).
            # (After a background compile the in-process one is a load too.)
            warm = self.whole_cache.get(running) == "hit" or self._off_critical_path
            self._pending_whole = (running, ms, warm, asked, cpu)

    # -- the step guard (issue 18)
    # A configuration is trusted, and its steps no longer copied, after this many steps without
    # a failure in this process, for inputs of a signature it already ran; a new signature (a
    # last, smaller batch) is guarded again. (A priori: a failure of compiled code shows at its
    # first call, or at the first backward, in every failure seen.)
    TRUSTED_AFTER = 3

    def _risky(self, values: dict[str, str], scoped: tuple[str, ...] = ("threads",)) -> bool:
        """Does ``values`` run other code than the model's own (anything but the ``scoped``
        variables: a thread count; for the direct path, an optimiser implementation too, which
        the direct step sets around the user's step as it sets threads)?"""
        spec = self.session.spec
        if spec is None or not values:
            return False
        return any(
            values.get(v.name, v.choices[0]) != v.choices[0] for v in spec.variables if v.name not in scoped
        )

    def _guard_any(self, mod: nn.Module, args: Any) -> None:
        """A forward pre-hook on every module call, while a guarded step has kept nothing yet:
        the first call of one of the model's modules keeps its state."""
        if self._replica_guard and isinstance(mod, nn.parallel.DistributedDataParallel):
            self._grad_sync.pause(mod)  # (before its forward reads whether to reduce in backward)
        if id(mod) not in self._module_ids:
            return
        self._unhook_guard()
        self._guard_forward(mod, args)

    def _unhook_guard(self) -> None:
        if self._guard_hook is not None:
            self._guard_hook.remove()
            self._guard_hook = None

    def _guard_forward(self, mod: nn.Module, args: Any) -> None:
        """At the first call of one of the model's modules in a guarded step, keep its state."""
        snap = self._snap
        if snap is None or snap.taken or not self.clock.in_step:
            return
        inputs = [a for a in tfx.flatten_args(args) if isinstance(a, torch.Tensor)]
        self._step_inputs = ";".join(f"{tuple(a.shape)}:{a.dtype}" for a in inputs)
        vid = _values_id(self._applied)
        trusted = (
            self._good_steps.get(vid, 0) >= self.TRUSTED_AFTER
            and (vid, self._step_inputs) in self._seen_inputs
            and self.session.committed
        )
        if trusted:
            snap.close()  # (it watches the optimisers from the step's start)
            self._snap = None
            return
        snap.take_model(inputs)

    def _recover(self, exc: BaseException) -> bool:
        """A step raised: roll it back and mark its configuration failed when the compiler's
        configuration may be the cause (True: the caller repeats or skips the step); False when
        the error is the user's own (plain eager code, or nothing of the model ran yet).

        The wrapper's own work in here (the step's bookkeeping, the exploration's record of the
        failed trial, which may be a call to the service) failing must not stop the run either:
        the step is still rolled back where its snapshot can be restored, and the model runs its
        own code from then on (``_abandon``)."""
        snap = self._snap
        rolled = False
        try:
            self._agree_failure()  # (first: another rank may be waiting on it)
            self._disarm_deadline()  # an armed compile deadline must not fire in the repeated step
            if snap is None or not snap.taken or not isinstance(exc, Exception):
                self._after(False)
                return False
            self._end_step()
            self._snap = None
            snap.restore()
            self.optimizers.restore()  # (the snapshot kept the groups as the step ran them)
            rolled = True
            self._mark_failed(exc)
        except Exception as failed:  # noqa: BLE001 - the wrapper's own failure: never the user's step
            if not rolled and snap is not None and snap.taken and isinstance(exc, Exception):
                with contextlib.suppress(Exception):
                    snap.restore()
                    self.optimizers.restore()
                    rolled = True
            self._abandon(failed)
        return rolled

    def _mark_failed(self, exc: Exception) -> None:
        """The rolled-back step's configuration is marked failed; the step is repeated (or, under
        ``with``, skipped) on the last good configuration, or on the model's own code."""
        self.rolled_back += 1
        failing = dict(self._applied)
        why = f"{type(exc).__name__}: {exc}"
        self._broken[_values_id(failing)] = why
        log.warning("step failed under configuration %s (%s); rolled back", failing, why)
        if self._repeat is None:
            # The trial is over and failed: the explorer hands out the next configuration.
            cfg = self.session.current
            if cfg is not None and not cfg.committed and not cfg.hold and cfg.trial >= 0:
                self.session.record(float("nan"), {}, why, True)
        good = self._last_good
        if good is None or _values_id(good) in self._broken:
            good = baseline_values(self.session.spec) if self.session.spec is not None else {}
        self._repeat = good

    def _apply(self, cfg: Config) -> None:
        values = dict(cfg.values)
        if _values_id(values) in self._broken:
            # A configuration that failed a step in this process (the committed one, say, on a
            # new input) is not run again: the last good one, or plain eager, instead.
            good = self._last_good
            if good is None or _values_id(good) in self._broken:
                good = baseline_values(self.session.spec) if self.session.spec is not None else values
            values = good
        self._apply_values(values)

    def _apply_values(self, values: dict[str, str]) -> None:
        self._applied = dict(values)
        self._set_whole_compile(whole_kind(values))
        for runner in self.runners.values():
            r = runner.region
            runner.failed = ""
            runner.configure(
                values.get(f"{r}.batch", "off"),
                values.get(f"{r}.hoist", "off"),
                values.get(f"{r}.compile", "eager"),
            )
        # Set around each step (_before), restored after it: not left behind for the user's code.
        self._threads = int(values["threads"]) if "threads" in values else None
        spec = self.session.spec
        base = next((v.choices[0] for v in spec.variables if v.name == OPTIMIZER), None) if spec else None
        choice = values.get(OPTIMIZER)
        self._optimizer = choice if choice in (FOREACH, FUSED) and choice != base else None
        if self._channels_last and "memory_format" in values:
            fmt = (
                torch.channels_last if values["memory_format"] == "channels_last" else torch.contiguous_format
            )
            self.model.to(memory_format=fmt)  # type: ignore[call-overload]
            self.optimizers.follow_layouts()  # (the fused updates pair elements in memory order)


def _values_id(values: dict[str, str]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(values.items()))


def baseline_values(spec: GraphSpec) -> dict[str, str]:
    """Every variable at its baseline: the model's own code."""
    return {v.name: v.choices[0] for v in spec.variables}


def _builtin_leaf(module: nn.Module) -> bool:
    """A layer of ``torch.nn`` itself (nn.Linear, nn.LayerNorm, ...), not a user's cell."""
    return type(module).__module__.startswith("torch.nn.")
