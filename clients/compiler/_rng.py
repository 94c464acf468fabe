"""Compiled code that draws the same random numbers as the eager step.

Inductor compiles a random operator (dropout's mask, ``rand``, ``bernoulli``) to its own
generator (a Philox stream seeded from the global one) unless ``fallback_random`` is set, so a
step compiled by it draws other numbers than the eager step, and advances the global generator
differently: from the first compiled trial on, every dropout mask of the run differs from the
run without the compiler. Seen (issue 18, session 29) with Hugging Face GPT-2 and BERT at their
default dropout (0.1), a user's loop with gradient clipping and a warm-up schedule: after 20
steps the weights were 0.012-0.016 from the eager run's wherever a trial had compiled (equal to
3e-6 with dropout 0). The corpus models all set their dropout to 0, so the benchmark never saw
it.

A graph that draws random numbers is compiled with ``fallback_random``: its random operators
stay eager's ATen calls, in the graph's order, drawing from the global generator as the eager
step does (the weights then agreed to 3e-7-3e-6). The setting is part of Inductor's cache key, so
it is applied only to graphs that draw (a graph without randomness keeps the key a plain
``torch.compile`` of it has); its cost is that those operators are not fused (a dropout's mask
is one more kernel). The decision is the graph's own, so the background compile worker, running
the same wrapper code on the same graph, fills the cache under the same key."""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

# Names of operators (Torch and ATen level, as FX targets print) that draw random numbers.
_RANDOM_NAMES = (
    "dropout",
    "rand",  # rand, randn, randint, rand_like, randperm, randn_like
    "bernoulli",
    "multinomial",
    "normal",
    "uniform",
    "poisson",
    "exponential",
    "cauchy",
    "geometric",
    "log_normal",
    "rrelu",
)


def random_name(name: str) -> bool:
    """Is ``name`` (lower case) the name of an operator that draws random numbers?"""
    return any(r in name for r in _RANDOM_NAMES) and "normalize" not in name  # (F.normalize)


def _target_name(node: Any) -> str:
    target = node.target
    if node.op == "call_module":
        try:
            return type(node.graph.owning_module.get_submodule(target)).__name__.lower()
        except Exception:  # noqa: BLE001 - an unreadable module is not known to draw
            return str(target).lower()
    return (getattr(target, "__name__", None) or str(target)).lower()


def _sdpa_dropout(node: Any) -> bool:
    p = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
    return not isinstance(p, (int, float)) or p > 0


def _idle_dropout(node: Any, name: str) -> bool:
    """A dropout that surely draws nothing: its probability a constant 0, or not training
    (``F.dropout(x, p, training, inplace)`` and ATen's ``dropout``/``native_dropout(x, p,
    train)`` as dynamo and AOTAutograd write them; an ``nn.Dropout`` module). x-transformers
    keeps ``nn.Dropout(0.)`` in every layer: read as drawing, each of its steps was compiled under
    ``fallback_random``, another cache key than a plain ``torch.compile`` of the same step, whose
    compile an ask then could not find (issue 18, session 29)."""
    if "dropout" not in name:
        return False
    if node.op == "call_module":
        try:
            mod = node.graph.owning_module.get_submodule(node.target)
        except Exception:  # noqa: BLE001 - an unreadable module is not known to be idle
            return False
        p, training = getattr(mod, "p", None), getattr(mod, "training", True)
    else:
        args = node.args
        p = node.kwargs.get("p", args[1] if len(args) > 1 else None)
        training = node.kwargs.get("training", node.kwargs.get("train", args[2] if len(args) > 2 else True))
    if isinstance(training, bool) and not training:
        return True
    return isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0


def draws_random(gm: Any) -> bool:
    """Whether the FX graph ``gm`` has an operator that draws random numbers (dropout, rand,
    bernoulli, ...; scaled dot-product attention with a dropout probability above 0; not a
    dropout of probability 0 or outside training)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        name = _target_name(node)
        if "scaled_dot_product" in name:
            if _sdpa_dropout(node):
                return True
            continue
        if _idle_dropout(node, name):
            continue
        if random_name(name):
            return True
    return False


def layout_dependent_draw(mod: Any, args: Any) -> bool:
    """Whether the module call ``mod(*args)`` draws a mask whose elements depend on its input's
    memory layout: a dropout module (``nn.Dropout``, ``Dropout2d``, ``AlphaDropout`` ...) in
    training with a probability above 0, over a tensor of four or more dimensions whose channels
    and spatial positions both number more than one. The mask is drawn in the tensor's storage
    order, so under channels-last the same generator state drops other elements: held out
    (diffusers' ``UNet2DModel``, whose ResNet blocks apply ``nn.Dropout`` to feature maps, issue
    18, session 35) a channels-last trial moved the loss from the eager run's by 0.7% from its
    first step on, with no float difference behind it (2e-7 with the dropout at 0). A ``[B, C]``
    classifier input (torchvision's MobileNetV3) or a ``[B, 1, 1, 1]`` drop-path mask has one
    order in either layout."""
    from torch import nn

    if not isinstance(mod, nn.modules.dropout._DropoutNd) or not mod.training or not mod.p:
        return False
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) >= 4 and shape[1] > 1 and math.prod(shape[2:]) > 1:
            return True
    return False


@contextlib.contextmanager
def faithful_random(on: bool) -> Iterator[None]:
    """Inductor's ``fallback_random`` set while a graph that draws is compiled (``on``)."""
    if not on:
        yield
        return
    from torch._inductor import config

    with config.patch(fallback_random=True):
        yield


def _feature_maps(t: Any) -> bool:
    """A tensor whose storage order differs between the contiguous and the channels-last
    layouts: four dimensions, more than one channel and more than one spatial position."""
    import torch

    return isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1


def _flat(args: Any, kwargs: dict[str, Any]) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return list(tree_leaves((args, kwargs)))


class LayoutDrawWatch:
    """Watches the probe step's random draws (a ``TorchFunctionMode`` over it) for one whose
    numbers follow its input's memory layout: a dropout called as a function (``F.dropout``
    inside a ``forward``), a hand-written mask (``torch.rand_like(h) < p``,
    ``torch.empty_like(h).bernoulli_(p)``), as much as the ``nn.Dropout`` modules
    ``layout_dependent_draw`` sees by their hooks.

    Which draws follow the layout is not listed here but asked of PyTorch, draw by draw: a
    random call (``random_name``) with a feature-map argument (``_feature_maps``) is drawn
    again, at the generator state it started from, over channels-last copies of its tensor
    arguments; where the two draws differ, the channels-last trial would draw other numbers
    than the eager run (``found`` names the call). The generator is then put back where the
    real draw left it, so the step's own numbers are the eager run's. Measured with torch 2.13
    (session 36): ``F.dropout``, ``F.alpha_dropout``, ``torch.rand_like`` and a ``bernoulli_``
    over a map's shape differ; ``F.dropout2d`` and ``F.feature_alpha_dropout`` (one draw per
    channel), ``torch.bernoulli(probabilities)``, a drop-path mask ``[B, 1, 1, 1]`` and
    ``torch.rand(shape)`` draw the same. A draw into a fresh contiguous tensor
    (``h.new_empty(h.shape).bernoulli_(p)``) is counted as following the layout (the watch
    sees the draw, not where its tensor came from): a channels-last trial is then not offered,
    never offered wrongly. ``cost_s`` is the redraws' time, taken off the probe step's.

    That answer is a guess about the channels-last run: it redraws over a channels-last copy of
    any four-dimensional tensor, though under channels-last only what flows from the
    convolutions changes layout (attention probabilities ``[B, heads, N, N]`` out of a matrix
    product stay contiguous), and it looks at nothing of fewer dimensions (tokens flattened from
    a channels-last map change layout too). So the watch also keeps every draw's layout
    (``seen``: by call and shapes) and which of them the guess counted (``suspects``), and the
    probe's end judges them against a channels-last forward (``layout_forward_check``).

    Where the model holds code compiled by dynamo (``redraw=False``) no mode is pushed (dynamo
    guards on the mode stack: the user's compiled module would be compiled again for the probe
    step alone), and its draws cannot be redrawn: there any advance of the default generators
    over the step counts as a draw that may follow the layout (``found``). Measured (session 36):
    a user's ``torch.compile`` of a conv net with ``F.dropout`` over its maps, channels-last
    tried, left the eager run's losses by 5.5e-4 (0 with the dropout at 0)."""

    COMPILED = "a random draw inside compiled code (not redrawn)"

    def __init__(self, redraw: bool = True) -> None:
        self._mode = _Mode(self._call)
        self.redraws = redraw
        self._names: dict[Any, bool] = {}
        self._states: list[Any] = []
        self.found = ""
        # every random call of the step that drew over a tensor of two or more dimensions: (its
        # name, its tensors' shapes) -> their strides (None: seen with two layouts); and those of
        # them whose redraw over channels-last copies differed (``found`` is the first)
        self.seen: dict[tuple[str, tuple[tuple[int, ...], ...]], tuple[tuple[int, ...], ...] | None] = {}
        self.suspects: set[tuple[str, tuple[tuple[int, ...], ...]]] = set()
        self.cost_s = 0.0
        self.active = False

    def start(self) -> None:
        if not self.active:
            if self.redraws:
                self._mode.__enter__()
            else:
                self._states = _generator_states()
            self.active = True

    def stop(self) -> None:
        if self.active:
            self.active = False
            if self.redraws:
                self._mode.__exit__(None, None, None)
            elif not self.found and not _same_states(self._states, _generator_states()):
                self.found = self.COMPILED

    def _random(self, func: Any) -> bool:
        known = self._names.get(func)
        if known is None:
            known = self._names[func] = random_name((getattr(func, "__name__", None) or str(func)).lower())
        return known

    def _call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if not self._random(func):
            return func(*args, **kwargs)
        import time

        import torch

        leaves = _flat(args, kwargs)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if not any(t.dim() >= 2 for t in tensors):
            return func(*args, **kwargs)  # (an explicit shape, a scalar: one order in any layout)
        started = time.perf_counter()
        maps = any(_feature_maps(t) for t in leaves)
        try:
            gen = _generator(tensors, kwargs)
            before = gen.get_state() if gen is not None else None
            copied = _laid_out(args, kwargs, None) if maps and gen is not None else None
        except Exception:  # noqa: BLE001 - a draw it cannot repeat is counted as following the layout
            gen = before = copied = None
        self.cost_s += time.perf_counter() - started
        out = func(*args, **kwargs)  # the step's own draw
        started = time.perf_counter()
        try:
            after = gen.get_state() if gen is not None else None
            drew = before is None or after is None or not torch.equal(before, after)
            if drew:
                self._record(func, tensors)
            if maps and drew and not _same_draw(func, out, gen, before, after, copied):
                self.suspects.add(_key(func, tensors))
                self.found = self.found or self._name(func)
        except Exception:  # noqa: BLE001 - (as above)
            self.suspects.add(_key(func, tensors))
            self.found = self.found or self._name(func)
        self.cost_s += time.perf_counter() - started
        return out

    def _record(self, func: Any, tensors: list[Any]) -> None:
        """The draw's tensors' strides, by its call and shapes (None: seen with two layouts)."""
        key, strides = _key(func, tensors), tuple(t.stride() for t in tensors)
        if key in self.seen and self.seen[key] != strides:
            self.seen[key] = None
        else:
            self.seen[key] = strides

    @staticmethod
    def _name(func: Any) -> str:
        return _name(func)


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)


def _key(func: Any, tensors: list[Any]) -> tuple[str, tuple[tuple[int, ...], ...]]:
    return _name(func), tuple(tuple(t.shape) for t in tensors)


def _generator(tensors: list[Any], kwargs: dict[str, Any]) -> Any:
    """The generator a call over ``tensors`` draws from: its own, or its device's default (None
    where its tensors are on several devices or one without a default generator here)."""
    import torch

    gen = kwargs.get("generator")
    if gen is not None:
        return gen
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    (device,) = devices
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return None


def _laid_out(args: Any, kwargs: dict[str, Any], strides: Any) -> tuple[Any, dict[str, Any]]:
    """Copies of the call's tensor arguments (copied before the draw: an in-place draw
    overwrites its tensor): each feature map channels-last (``strides`` None), or each tensor
    with the strides given, in the order of its leaves."""
    import torch
    from torch.utils._pytree import tree_map

    order = iter(strides or ())

    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if strides is None:
            return t.clone(memory_format=torch.channels_last) if _feature_maps(t) else t
        out = torch.empty_strided(t.shape, next(order), dtype=t.dtype, device=t.device)
        return out.copy_(t)

    with torch.no_grad():
        return tree_map(copy, (args, kwargs))  # type: ignore[no-any-return]


def _same_draw(func: Any, out: Any, gen: Any, before: Any, after: Any, copied: Any) -> bool:
    """Does ``func`` over the ``copied`` arguments, drawn again from ``before``, give ``out``?
    The generator is left at ``after`` (where the real draw left it)."""
    import torch

    if gen is None or before is None or copied is None:
        return False
    args, kwargs = copied
    try:
        gen.set_state(before)
        with torch.no_grad():
            redrawn = func(*args, **kwargs)
    finally:
        gen.set_state(after)
    mine = [t for t in _flat(out, {}) if isinstance(t, torch.Tensor)]
    theirs = [t for t in _flat(redrawn, {}) if isinstance(t, torch.Tensor)]
    return len(mine) == len(theirs) and all(
        a.shape == b.shape and torch.equal(a.detach(), b.detach()) for a, b in zip(mine, theirs, strict=True)
    )


class _Mode:
    """A ``TorchFunctionMode`` calling ``on_call(func, args, kwargs)`` for every torch call."""

    def __new__(cls, on_call: Any) -> Any:
        from torch.overrides import TorchFunctionMode

        class _Calls(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                return on_call(func, args, kwargs or {})

        return _Calls()


class _LayoutCheck:
    """Each draw of a forward run under the other layout against the probe step's (``seen``)."""

    def __init__(self, watch: LayoutDrawWatch) -> None:
        self.seen = watch.seen
        self.met: set[tuple[str, tuple[tuple[int, ...], ...]]] = set()
        self.found = ""

    def call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.found or not random_name(_name(func).lower()):
            return func(*args, **kwargs)
        import torch

        tensors = [t for t in _flat(args, kwargs) if isinstance(t, torch.Tensor)]
        if not any(t.dim() >= 2 for t in tensors):
            return func(*args, **kwargs)
        key = _key(func, tensors)
        self.met.add(key)
        eager = self.seen.get(key, ())
        if eager == tuple(t.stride() for t in tensors):
            return func(*args, **kwargs)  # laid out as the eager step's: the same numbers
        gen = _generator(tensors, kwargs)
        if gen is None:
            self.found = _name(func)
            return func(*args, **kwargs)
        before = gen.get_state()
        copied = _laid_out(args, kwargs, eager) if eager else None
        out = func(*args, **kwargs)
        after = gen.get_state()
        if torch.equal(before, after):
            return out  # nothing drawn
        if not eager:
            # a draw the probe step did not make over these shapes, or made over two layouts
            self.found = f"{_name(func)} (not as the probe step drew)"
        elif not _same_draw(func, out, gen, before, after, copied):
            self.found = _name(func)
        return out


def layout_forward_check(model: Any, args: Any, kwargs: dict[str, Any], watch: LayoutDrawWatch) -> str:
    """Does the model's forward under channels-last draw the probe step's numbers?

    The forward runs once more on the probe step's inputs with the model's four-dimensional
    parameters and buffers channels-last (copies, through ``functional_call``: the model's own
    tensors, running statistics included, are not touched), under a mode that compares each
    random call with the probe step's call of the same name and shapes (``watch.seen``): laid
    out as there, it draws the same numbers; laid out otherwise, it is drawn again over copies
    laid out as the eager step's were, at the same generator state, and PyTorch's two answers
    compared. Attention probabilities ``[B, heads, N, N]`` come out of a matrix product laid out
    contiguously in either layout and pass; a dropout over a convolution's output does not, nor
    over tokens a channels-last map was flattened into (``h.flatten(2).transpose(1, 2)`` is
    contiguous there, a transposed view in the eager step). A draw the forward makes that the
    probe step did not (another name or shapes, or the probe saw two layouts) fails the check,
    and so does a suspect of the probe step (``watch.suspects``) the forward does not make (a
    draw outside the model's forward, in the user's loss, is not run here). The generators are
    put back as they were. Returns "" where every draw is the eager step's, else the first call
    that is not; raises where the forward cannot run so (the caller keeps its conservative
    answer)."""
    import torch
    from torch.func import functional_call

    check = _LayoutCheck(watch)
    states = _generator_states()
    with torch.no_grad():
        tensors = {
            n: t.detach().clone(memory_format=torch.channels_last) if t.dim() == 4 else t.detach()
            for n, t in model.named_parameters()
        }
        tensors.update(
            {
                n: b.detach().clone(memory_format=torch.channels_last) if b.dim() == 4 else b.detach().clone()
                for n, b in model.named_buffers()
            }
        )
    mode = _Mode(check.call)
    try:
        with mode:
            functional_call(model, tensors, tuple(args), dict(kwargs))
    finally:
        _set_generator_states(states)
    if check.found:
        return check.found
    missed = sorted(watch.suspects - check.met)
    return f"{missed[0][0]} (outside the model's forward)" if missed else ""


def _set_generator_states(states: list[Any]) -> None:
    import torch

    torch.default_generator.set_state(states[0])
    for i, state in enumerate(states[1:]):
        torch.cuda.set_rng_state(state, i)


def _generator_states() -> list[Any]:
    """The default generators' states: the CPU's, and each CUDA device's where CUDA is up."""
    import torch

    states = [torch.default_generator.get_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states += [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return states


def _same_states(a: list[Any], b: list[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def host_random_states() -> tuple[Any, Any]:
    """The process's other global random streams, those a ``forward`` may draw from outside
    torch: Python's ``random`` (a LayerDrop decided by ``random.random()``) and NumPy's global
    generator (Hugging Face's SpecAugment, ``_compute_mask_indices``, draws its masks with
    ``np.random``); NumPy's None where NumPy was never imported. Held out in session 39: the
    probe step's own forwards advanced both, and a run's masks and dropped layers were not the
    run without the compiler's (losses 3e-2 and 7e-2 apart after 30 steps); a rolled-back step's
    repeat drew on from where the failed attempt left them."""
    np = sys.modules.get("numpy")
    return random.getstate(), (np.random.get_state() if np is not None else None)


def set_host_random_states(states: tuple[Any, Any]) -> None:
    """Put back what :func:`host_random_states` read."""
    py, np_state = states
    random.setstate(py)
    np = sys.modules.get("numpy")
    if np_state is not None and np is not None:
        np.random.set_state(np_state)
