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

    Where the model holds code compiled by dynamo (``redraw=False``) no mode is pushed (dynamo
    guards on the mode stack: the user's compiled module would be compiled again for the probe
    step alone), and its draws cannot be redrawn: there any advance of the default generators
    over the step counts as a draw that may follow the layout (``found``). Measured (session 36):
    a user's ``torch.compile`` of a conv net with ``F.dropout`` over its maps, channels-last
    tried, left the eager run's losses by 5.5e-4 (0 with the dropout at 0)."""

    COMPILED = "a random draw inside compiled code (not redrawn)"

    def __init__(self, redraw: bool = True) -> None:
        from torch.overrides import TorchFunctionMode

        watch = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                return watch._call(func, args, kwargs or {})

        self._mode = _Mode()
        self.redraws = redraw
        self._names: dict[Any, bool] = {}
        self._states: list[Any] = []
        self.found = ""
        self.cost_s = 0.0
        self.active = False

    def start(self) -> None:
        if not self.active:
            if self.redraws:
                self._mode.__enter__()  # type: ignore[no-untyped-call]
            else:
                self._states = _generator_states()
            self.active = True

    def stop(self) -> None:
        if self.active:
            self.active = False
            if self.redraws:
                self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            elif not self.found and not _same_states(self._states, _generator_states()):
                self.found = self.COMPILED

    def _random(self, func: Any) -> bool:
        known = self._names.get(func)
        if known is None:
            known = self._names[func] = random_name((getattr(func, "__name__", None) or str(func)).lower())
        return known

    def _call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.found or not self._random(func):
            return func(*args, **kwargs)
        leaves = _flat(args, kwargs)
        if not any(_feature_maps(t) for t in leaves):
            return func(*args, **kwargs)
        import time

        started = time.perf_counter()
        try:
            again = self._prepare(leaves, args, kwargs)
        except Exception:  # noqa: BLE001 - a draw it cannot repeat is counted as following the layout
            again = None
        self.cost_s += time.perf_counter() - started
        out = func(*args, **kwargs)  # the step's own draw
        started = time.perf_counter()
        try:
            self._compare(func, out, again)
        except Exception:  # noqa: BLE001 - (as above)
            self.found = self._name(func)
        self.cost_s += time.perf_counter() - started
        return out

    @staticmethod
    def _name(func: Any) -> str:
        return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)

    @staticmethod
    def _prepare(leaves: list[Any], args: Any, kwargs: dict[str, Any]) -> Any:
        """The generator and its state before the draw, and the call's arguments with each
        feature map a channels-last copy (copied before the draw: an in-place draw overwrites
        its tensor)."""
        import torch
        from torch.utils._pytree import tree_map

        gen = kwargs.get("generator")
        if gen is None:
            devices = {t.device for t in leaves if isinstance(t, torch.Tensor)}
            if len(devices) != 1:
                return None
            (device,) = devices
            if device.type == "cpu":
                gen = torch.default_generator
            elif device.type == "cuda":
                gen = torch.cuda.default_generators[device.index or 0]
            else:
                return None
        with torch.no_grad():
            copied = tree_map(
                lambda t: t.clone(memory_format=torch.channels_last) if _feature_maps(t) else t,
                (args, kwargs),
            )
        return gen, gen.get_state(), copied

    def _compare(self, func: Any, out: Any, again: Any) -> None:
        import torch

        if again is None:
            self.found = self._name(func)
            return
        gen, before, (args, kwargs) = again
        after = gen.get_state()
        try:
            gen.set_state(before)
            with torch.no_grad():
                redrawn = func(*args, **kwargs)
        finally:
            gen.set_state(after)
        mine = [t for t in _flat(out, {}) if isinstance(t, torch.Tensor)]
        theirs = [t for t in _flat(redrawn, {}) if isinstance(t, torch.Tensor)]
        same = len(mine) == len(theirs) and all(
            a.shape == b.shape and torch.equal(a.detach(), b.detach())
            for a, b in zip(mine, theirs, strict=True)
        )
        if not same:
            self.found = self._name(func)


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
