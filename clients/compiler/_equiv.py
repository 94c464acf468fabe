"""Is a compiled variant of the model the same function as the model's own code? (issue 18)

A compiler can be wrong. Held out in session 37: a VQ-VAE whose codebook is an exponential
moving average updated inside ``forward`` (``embed_avg.mul_(0.99).add_(onehot.t() @ flat,
alpha=0.01)``, as public VQ-VAE code writes it) trained otherwise under every Inductor trial:
Inductor (torch 2.13 and 2.14, CPU) rewrites ``add(x, mm(a, b), alpha=c)`` into an ``addmm``
that drops ``alpha`` (pytorch/pytorch#167313, #196577, open, "correctness (silent)"). After one
compiled forward the codebook's average was 27 away from eager's and the encoder's gradients
0.02-0.37 apart; a plain ``torch.compile`` of the model does the same. Astra compiles on its own
initiative, so a silent miscompile would change a user's training without the user asking for
a compiler at all.

:func:`differs` runs the model's own forward and the variant from the same state (buffers,
random streams) on the same inputs, detached from the step's graph, and compares what each
returns, what each wrote into the buffers, and the parameters' gradients for one fixed random
cotangent of the outputs (``torch.autograd.grad``: nothing accumulates into ``.grad``). The
state is put back after each run, so the step itself then runs from where it was. The check is
per compiled variant and input signature, once in a process (a second run that starts tuned is
checked too); it costs one eager and one compiled forward and backward.

Agreement is judged per tensor by the norm of the difference against the tensor's own norm
(floor: a small share of the group's mean norm, so a gradient that is float noise, a bias before
a batch norm, is not judged alone), at a tolerance set by the lowest-precision floating dtype in
the outputs (float32 1e-3; bfloat16 and float16 5e-2): Inductor's float order moves a forward by
~1e-6 and a gradient by ~1e-5 in float32. Integer outputs and buffers must be equal. A
discontinuous model (an argmin over near ties) can differ beyond the tolerance by float order
alone; it is then refused the compile, which keeps its training eager's.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ._agreement import judge
from ._rng import host_random_states, set_host_random_states

# Without an exact twin (a model that cannot be copied): tolerances of the outputs' precision.
RTOL = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 5e-2, torch.float16: 5e-2}
# With the float64 twin: the variant may be this many times further from it than the model's
# own code is, or FLOOR of the tensor's norm or its group's mean norm, whichever is larger (a
# conv net's weight gradient under Inductor: 2e-4 from float64's where eager's was 1.3e-5, of a
# norm of 4.8; a miscompile that matters is far beyond either).
ERROR_FACTOR = 10.0
FLOOR = 1e-3
TWIN_BYTES = 1 << 30  # a larger model is judged without a twin (its float64 copy's memory)


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The inputs' shapes and dtypes (what a static-shape compile specialises on), and whether
    gradients are on."""
    leaves, _ = tree_flatten((args, kwargs))
    return (torch.is_grad_enabled(),) + tuple(
        (tuple(v.shape), v.dtype, v.device.type) if isinstance(v, torch.Tensor) else type(v).__name__
        for v in leaves
    )


def float64_twin(
    model: nn.Module, forward: Callable[..., Any] | None = None
) -> tuple[nn.Module, Callable[..., Any]] | None:
    """A float64 copy of ``model`` and its class's forward over it (what the exact arithmetic
    gives, near enough), or None where the model cannot be copied or its forward is its own
    (an instance's ``forward``, bound to the original)."""
    if forward is not None and getattr(forward, "__self__", None) is not model:
        return None
    if sum(p.numel() for p in model.parameters()) * 8 > TWIN_BYTES:
        return None
    try:
        twin = copy.deepcopy(model)
        for m in twin.modules():
            m.__dict__.pop("forward", None)  # (Astra's own forwards: the class's code runs)
        twin.double()  # (complex tensors it leaves: widened too)
        twin._apply(lambda t: t.to(torch.complex128) if t.is_complex() else t)  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - a model that cannot be copied or widened: no twin
        return None
    return twin, type(twin).forward.__get__(twin)


def differs(
    model: nn.Module,
    reference: Callable[..., Any],
    variant: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    twin: tuple[nn.Module, Callable[..., Any]] | None = None,
) -> str:
    """ "" when ``variant(*args, **kwargs)`` agrees with ``reference(...)`` on ``model`` (outputs,
    buffer updates, parameter gradients), else what differs. The model's buffers and the random
    streams are as before the call when it returns (or raises: the variant's own failure is the
    caller's to handle, as for any compiled call).

    With ``twin`` (``float64_twin``), agreement is judged against float64: the variant may be at
    most ``ERROR_FACTOR`` times further from the twin's results than the model's own code is (a
    deep network's gradients under a batch norm of eight images are ~1e-2 apart between two float
    orders in float32, and bfloat16 autocast's tens of percent: the model's own error sets the
    scale). Without it, by fixed tolerances of the outputs' precision."""
    args, kwargs = _detached((args, kwargs))
    params = [p for p in model.parameters() if p.requires_grad]
    exact_of = None
    if twin is not None:
        module, forward = twin

        def exact_of(wide: tuple[Any, ...]) -> tuple[list[torch.Tensor], ...] | None:
            wide_params = [p for p in module.parameters() if p.requires_grad]
            try:
                return _run(forward, wide[0], wide[1], wide_params, _Buffers(module))
            except Exception:  # noqa: BLE001 - a forward with float32 constants: no twin
                return None

    return _judge(_Buffers(model), params, reference, variant, (args, kwargs), exact_of, copy_inputs=True)


def graph_differs(gm: Callable[..., Any], compiled: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """``differs`` for a captured graph (``torch.compile(model, backend="microco")``'s): the
    graph run as captured against its compiled code, on detached copies of its inputs (the
    model's parameters and buffers among them), the inputs a graph mutates in place (running
    statistics) put back after each run, gradients taken for the inputs that require them; the
    float64 twin is the captured graph over float64 copies of the inputs (none where the graph
    will not run so)."""
    (inputs,) = _detached((args,))
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    params = [a for a in tensors if a.requires_grad]

    def exact_of(wide: tuple[Any, ...]) -> tuple[list[torch.Tensor], ...] | None:
        wide_args = wide[0]
        wide_params = [a for a in wide_args if isinstance(a, torch.Tensor) and a.requires_grad]
        kept = _Tensors([a for a in wide_args if isinstance(a, torch.Tensor)])
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # (FX prints a failing graph's line)
                return _run(gm, wide_args, {}, wide_params, kept)
        except Exception:  # noqa: BLE001 - a graph with float32 constants in it: no twin
            return None

    return _judge(_Tensors(tensors), params, gm, compiled, (tuple(inputs), {}), exact_of)


def _judge(
    kept: Any,
    params: list[Any],
    reference: Callable[..., Any],
    variant: Callable[..., Any],
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    exact_of: Callable[[tuple[Any, ...]], Any] | None,
    copy_inputs: bool = False,
) -> str:
    args, kwargs = inputs
    # (``copy_inputs``: each run on its own copy of the inputs. A module's forward that writes
    # its input in place, an input normalised with ``x.sub_(...)``, otherwise wrote the caller's
    # tensors, and the step's own forward, after the check, ran on an input written twice more
    # (held out, session 39: losses 7e-2 off), the variant on what the reference wrote. A
    # captured graph's inputs, its parameters among them, are ``kept`` and put back instead.)
    fresh: Callable[[Any], Any] = _copied if copy_inputs else (lambda tree: tree)
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    grad_mode = torch.is_grad_enabled()

    def restore() -> None:
        # (a captured graph sets grad mode by calls, not a context: one that raised inside a
        # ``no_grad`` block, the float64 twin's, left gradients off for the step's own call)
        torch.set_grad_enabled(grad_mode)
        kept.restore()
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)

    exact = None
    try:
        run_args, run_kwargs = fresh((args, kwargs))
        want = _run(reference, run_args, run_kwargs, params, kept)
        restore()
        run_args, run_kwargs = fresh((args, kwargs))
        got = _run(variant, run_args, run_kwargs, params, kept)
        if exact_of is not None:
            restore()
            with _no_autocast():
                exact = exact_of(_doubled((args, kwargs)))
    finally:
        restore()
    groups = ("output", "buffer", "gradient")
    for i, what in enumerate(groups):
        a, b = want[i], got[i]
        if len(a) != len(b) or (exact is not None and len(exact[i]) != len(a)):
            return f"{what}s: {len(b)} against the model's own {len(a)}"
        why = _compare(what, a, b, _rtol(want[0])) if exact is None else _against(what, a, b, exact[i])
        if why:
            return why
    return ""


def _no_autocast() -> Any:
    return torch.autocast("cuda" if torch.cuda.is_available() else "cpu", enabled=False)


def _doubled(tree: Any) -> Any:
    leaves, spec = tree_flatten(tree)
    out = [
        v.detach().to(torch.complex128 if v.is_complex() else torch.float64).requires_grad_(v.requires_grad)
        if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
        else v
        for v in leaves
    ]
    return spec.unflatten(out)


def _comparable(v: torch.Tensor) -> torch.Tensor:
    """``v`` as the checks compare it: a sparse tensor (an ``nn.Embedding(sparse=True)``'s
    gradient) dense, a complex one (a Fourier layer's weights) as its real and imaginary parts."""
    if v.layout != torch.strided:
        v = v.to_dense()
    if v.is_complex():
        v = torch.view_as_real(v.resolve_conj())
    return v


def _copied(tree: Any) -> Any:
    """``tree`` with each tensor a copy of it, detached (a leaf that requires grad where it did);
    a tensor that appears twice is one copy (a language model's ``input_ids=x, labels=x``)."""
    leaves, spec = tree_flatten(tree)
    copies: dict[int, torch.Tensor] = {}
    out = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            if id(v) not in copies:
                copies[id(v)] = v.detach().clone().requires_grad_(v.requires_grad)
            v = copies[id(v)]
        out.append(v)
    return spec.unflatten(out)


def _detached(tree: Any) -> Any:
    """``tree`` with each tensor detached (a leaf that requires grad where it did): the checks'
    graphs end at the inputs, so the step's own graph (an RNN's earlier steps, a generator's
    output) is neither walked nor freed by their backward."""
    leaves, spec = tree_flatten(tree)
    out = [v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v for v in leaves]
    return spec.unflatten(out)


def _run(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    params: list[Any],
    kept: Any,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    out = fn(*args, **kwargs)
    outputs = [v for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
    buffers = kept.now()
    grads: list[torch.Tensor] = []
    diff = [v for v in outputs if v.requires_grad and v.is_floating_point()]
    if diff and params and torch.is_grad_enabled():
        g = torch.Generator(device="cpu").manual_seed(0)
        cotangents = [torch.randn(v.shape, generator=g).to(v.device, v.dtype) for v in diff]
        found = torch.autograd.grad(diff, params, cotangents, allow_unused=True)
        grads = [torch.zeros_like(p) if d is None else d.detach() for p, d in zip(params, found, strict=True)]
    return (
        [_comparable(v.detach()) for v in outputs],
        [_comparable(v) for v in buffers],
        [_comparable(v) for v in grads],
    )


def _rtol(outputs: list[torch.Tensor]) -> float:
    floats = [v.dtype for v in outputs if v.is_floating_point()]
    return max((RTOL.get(d, 5e-2) for d in floats), default=RTOL[torch.float32])


def _norm(v: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(v.double())) if v.numel() else 0.0


def _unlike(what: str, i: int, a: torch.Tensor, b: torch.Tensor) -> str:
    """What makes ``b`` unlike the model's own ``a`` before any tolerance: its shape or dtype, or
    (an integer tensor) any value."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what} {i}: {tuple(b.shape)} {b.dtype} against the model's own {tuple(a.shape)} {a.dtype}"
    if not a.is_floating_point() and not torch.equal(a, b.to(a.device)):
        return f"{what} {i}: integer values differ from the model's own"
    return ""


def _against(what: str, want: list[torch.Tensor], got: list[torch.Tensor], exact: list[torch.Tensor]) -> str:
    """Each tensor of the variant no further from float64's than ``ERROR_FACTOR`` times the model's
    own code is, or than ``FLOOR`` of its norm or its group's mean norm, whichever is larger.
    Integer tensors equal to the model's own."""
    norms = [_norm(t) for t in exact if t.is_floating_point()]
    mean = sum(norms) / len(norms) if norms else 0.0
    for i, (a, b, t) in enumerate(zip(want, got, exact, strict=True)):
        why = _unlike(what, i, a, b)
        if why:
            return why
        if not a.is_floating_point():
            continue
        t = t.to(a.device).double()
        own, off = _norm(a.double() - t), _norm(b.to(a.device).double() - t)
        if not math.isfinite(off) and math.isfinite(own):
            return f"{what} {i} {tuple(a.shape)}: not finite where the model's own is"
        if off > max(ERROR_FACTOR * own, FLOOR * max(_norm(t), mean)):
            return (
                f"{what} {i} {tuple(a.shape)}: {off:.3g} from float64's, the model's own code {own:.3g} "
                f"(norm {_norm(t):.3g})"
            )
    return ""


def _compare(what: str, want: list[torch.Tensor], got: list[torch.Tensor], rtol: float) -> str:
    """The group against the model's own, by ``_agreement.judge``."""
    norms: list[float] = []
    diffs: list[float] = []
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        why = _unlike(what, i, a, b)
        if why:
            return why
        if not a.is_floating_point():
            continue
        d = _norm(a.double() - b.to(a.device).double())
        if not math.isfinite(d) and math.isfinite(_norm(a)):
            return f"{what} {i} {tuple(a.shape)}: not finite where the model's own is"
        norms.append(_norm(a))
        diffs.append(d if math.isfinite(d) else 0.0)
    return judge(what, norms, diffs, rtol, "the model's own")


@contextlib.contextmanager
def left_as_found(model: nn.Module) -> Iterator[None]:
    """Run a forward of the wrapper's own (a cache probe, a capture, a layout check) and leave
    the model as it was: its buffers, its modules' plain attributes and their own lists and
    dicts (their items, shallow), and Python's and NumPy's global random streams
    (``_rng.host_random_states``; torch's are the caller's to fork). A forward may count its
    own calls (``self.calls += 1``, an annealing schedule read from it): held out in session 39,
    such a model's counter was one ahead of the run without the compiler after the probe step
    (the whole-step cache probe ran the forward once more), and its losses 4e-3 apart from
    there on."""
    kept = _Buffers(model)
    try:
        yield
    finally:
        kept.restore()


class ModuleState:
    """The modules' own Python state as it is now, to be put back: their plain attributes
    (numbers, strings, flags: a step counter a forward advances, the training mode) and their
    own lists and dicts (not PyTorch's ``_``-named ones; their items, shallow, put back in place:
    the user may hold the same object)."""

    def __init__(self, model: nn.Module) -> None:
        self.plain: list[tuple[nn.Module, dict[str, Any]]] = []
        # held out, session 39, a mixture-of-experts layer appends its load-balancing loss to
        # ``self.aux_losses``, which the loop sums into the loss and clears; each forward of the
        # wrapper's own left one more term there, summed into the next step's loss (losses
        # 1.5e-2 apart), and the check's, whose graphs it had freed, failed the compiled trials
        # ("backward through the graph a second time")
        self.containers: list[tuple[nn.Module, str, Any, Any]] = []
        for module in model.modules():
            self.plain.append((module, {k: v for k, v in vars(module).items() if isinstance(v, _PLAIN)}))
            self.containers += [
                (module, k, v, copy.copy(v))
                for k, v in vars(module).items()
                if not k.startswith("_") and type(v) in (list, dict)
            ]

    def restore(self) -> None:
        for module, attrs in self.plain:
            module.__dict__.update(attrs)
        for module, name, held, items in self.containers:
            module.__dict__[name] = held  # (the same object: the user may hold it too)
            if isinstance(held, list):
                held[:] = items
            else:
                held.clear()
                held.update(items)


class _Buffers:
    """The model's buffers as they were, put back after each run (in place, where the module
    still holds the same tensor; the tensor itself back where a forward replaced it), the
    modules' Python state (``ModuleState``), and Python's and NumPy's global random streams
    (each run draws what the step's own will)."""

    def __init__(self, model: nn.Module) -> None:
        self.kept: list[tuple[nn.Module, str, torch.Tensor, torch.Tensor]] = []
        self.python = ModuleState(model)
        # and Python's and NumPy's global random streams (a forward drawing a mask from them)
        self.host_random = host_random_states()
        for module in model.modules():
            for name, b in module._buffers.items():
                if b is not None:
                    self.kept.append((module, name, b, b.detach().clone()))

    def now(self) -> list[torch.Tensor]:
        return [
            v.detach().clone() if isinstance(v := m._buffers.get(n), torch.Tensor) else torch.empty(0)
            for m, n, _, _ in self.kept
        ]

    def restore(self) -> None:
        with torch.no_grad():
            for module, name, original, saved in self.kept:
                module._buffers[name] = original
                original.copy_(saved)
        self.python.restore()
        set_host_random_states(self.host_random)


_PLAIN = (bool, int, float, str, type(None))


class _Tensors:
    """A captured graph's input tensors as they were, put back (in place) after each run; what a
    run wrote is read from those that take no gradient (running statistics, a codebook: the
    parameters, which a forward does not write, are not copied again for each run)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.kept = [(t, t.detach().clone()) for t in tensors]

    def now(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t, _ in self.kept if not t.requires_grad]

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved in self.kept:
                t.copy_(saved)
