"""The optimiser's implementation, a variable of the training step (issue 18).

PyTorch's built-in optimisers compute one update rule in up to three implementations, chosen by
the ``foreach`` and ``fused`` flags of each parameter group: a Python loop over the parameters
(``foreach=False``, the default on the CPU), the ``torch._foreach_*`` ops over all parameters at
once (``foreach=True``) and one fused kernel per device and dtype (``fused=True``: SGD, Adam,
AdamW and Adagrad, on the CPU too since torch 2.4). PyTorch documents them as implementation
choices of the same algorithm ("we want to give the fused impl bake-in time": torch/optim/sgd.py)
whose results agree to floating-point rounding. On a CPU the loop launches a few kernels per
parameter from Python; the other two launch a few in all: a saving paid for by no compile.

:class:`StepOptimizers` finds the optimisers a step reaches (a global pre-step hook during the
probe step, as the step guard finds them), says which implementations all of them can run
(:meth:`~StepOptimizers.choices`), and sets the flags a configuration asks for around each step
only, putting the user's flags back after it (:meth:`~StepOptimizers.apply`,
:meth:`~StepOptimizers.restore`). An optimiser whose user set ``foreach`` or ``fused`` (to
anything but the default ``None``) is left as the user built it: no variable is offered.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

# The variable's name in the exploration space, and its choices.
OPTIMIZER = "optimizer"
LOOP, FOREACH, FUSED = "loop", "foreach", "fused"

# What each implementation sets in a parameter group (the other flag stays the user's None,
# which the functional optimisers read as False once one of the two is given).
_FLAGS = {FOREACH: "foreach", FUSED: "fused"}


def _default_impl(params: list[torch.Tensor]) -> str | None:
    """What an optimiser built with the default flags runs over ``params`` (PyTorch's own rule:
    the foreach ops on accelerators, the loop elsewhere); None where torch does not say."""
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
    except ImportError:  # pragma: no cover - a torch without the rule: leave the optimiser alone
        return None
    _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return FOREACH if foreach else LOOP


def implementations(opt: torch.optim.Optimizer, sparse_grads: bool = False) -> tuple[str, ...]:
    """The implementations ``opt`` can run its update with, the one it runs as built first;
    () where it is to be left alone: its user chose ``foreach`` or ``fused``, it is
    ``differentiable``, or it has no such flags (LBFGS, a user's own optimiser class).
    ``sparse_grads``: a step of it was seen updating a sparse gradient (an
    ``nn.Embedding(sparse=True)``); the fused kernels refuse one, as they do a gradient sparse now."""
    groups = opt.param_groups
    if not groups or any("foreach" not in g for g in groups):
        return ()
    if any(g.get("foreach") is not None or g.get("fused") is not None for g in groups):
        return ()  # the user's explicit choice
    if any(g.get("differentiable") for g in groups):
        return ()
    params = [p for g in groups for p in g["params"]]
    base = _default_impl(params)
    if base is None or not params:
        return ()
    out = [base] + ([FOREACH] if base != FOREACH else [])
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        fused_devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover
        fused_devices = set()
    # (a sparse gradient: "`_fused_sgd` does not support sparse gradients"; held out, session
    # 40: a text classifier over ``EmbeddingBag(sparse=True)`` with SGD was offered the fused
    # update, whose trial failed, and under ``with astra.step()`` its mini-batch was skipped)
    sparse_grads = sparse_grads or any(p.grad is not None and p.grad.is_sparse for p in params)
    if (
        not sparse_grads
        and all("fused" in g for g in groups)
        and all(p.device.type in fused_devices and torch.is_floating_point(p) for p in params)
    ):
        out.append(FUSED)
    return tuple(out)


class StepOptimizers:
    """The optimisers a model's training step reaches, and their implementation for one step."""

    def __init__(self, model: nn.Module) -> None:
        self._param_ids = {id(p) for p in model.parameters()}
        self._found: list[weakref.ref[torch.optim.Optimizer]] = []
        self._hooks: list[Any] = []
        # What the optimisers' steps took while watched (ms, wall): the most a change of their
        # implementation can act on.
        self.step_ms = 0.0
        self._started: dict[int, float] = {}
        # (group, foreach, fused) as the user left them before the step; () between steps
        self._saved: list[tuple[dict[str, Any], Any, Any]] = []
        # ids of the optimisers seen stepping a sparse gradient (the fused kernels refuse one)
        self._sparse: set[int] = set()
        # optimisers first seen stepping after the probe step (``keep_finding``): their state
        # follows the layout too, nothing else is done to them
        self._late: list[weakref.ref[torch.optim.Optimizer]] = []
        self._finder: Any = None

    # -- finding them (the probe step)
    def watch(self) -> None:
        """Note each optimiser over the model's parameters whose ``step`` runs from now on, and
        time its steps."""
        if not self._hooks:
            self._hooks = [
                register_optimizer_step_pre_hook(self._seen),
                register_optimizer_step_post_hook(self._done),
            ]

    def stop(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._started.clear()

    def _seen(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not any(r() is opt for r in self._found):
            if not any(id(p) in self._param_ids for g in opt.param_groups for p in g["params"]):
                return  # another model's optimiser
            self._found.append(weakref.ref(opt))
        if any(p.grad is not None and p.grad.is_sparse for g in opt.param_groups for p in g["params"]):
            self._sparse.add(id(opt))
        self._started[id(opt)] = time.perf_counter()

    def _done(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        t0 = self._started.pop(id(opt), None)
        if t0 is not None:
            self.step_ms += (time.perf_counter() - t0) * 1e3

    def keep_finding(self) -> None:
        """From now on (after the probe step), note each optimiser over the model's parameters
        that steps and was not found by the probe: one whose first step came later (a loop that
        accumulates gradients over micro-batches, one per training step here, steps its
        optimiser every k-th). Only :meth:`follow_layouts` acts on them."""
        if self._finder is None:
            # (a global hook: it holds this object weakly and goes with it, as a run that ends
            # before its exploration does never calls ``stop_finding``; held out, session 39:
            # one hook per wrapper made, each run at every optimiser step of the process)
            me = weakref.ref(self)

            def seen(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                found = me()
                if found is not None:
                    found._late_seen(opt, args, kwargs)

            self._finder = register_optimizer_step_pre_hook(seen)
            weakref.finalize(self, self._finder.remove)

    def stop_finding(self) -> None:
        if self._finder is not None:
            self._finder.remove()
            self._finder = None

    def _late_seen(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if any(r() is opt for r in self._found) or any(r() is opt for r in self._late):
            return
        if any(id(p) in self._param_ids for g in opt.param_groups for p in g["params"]):
            self._late.append(weakref.ref(opt))

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (r() for r in self._found) if o is not None]

    def choices(self) -> tuple[str, ...]:
        """The implementations every optimiser found can run, the one they run as built first;
        () when there is nothing to choose (none found, one left to its user, or one choice)."""
        opts = self.optimizers
        if not opts:
            return ()
        each = [implementations(o, id(o) in self._sparse) for o in opts]
        if any(not c for c in each) or len({c[0] for c in each}) != 1:
            return ()
        common = tuple(c for c in each[0] if all(c in other for other in each[1:]))
        return common if len(common) > 1 else ()

    def follow_layouts(self) -> int:
        """Lay out each optimiser's per-parameter state (``exp_avg``, ``momentum_buffer`` ...) as
        its parameter is laid out now (``Module.to`` moves the gradients itself); returns how many
        tensors moved. Called where the model's memory format changes (a channels-last trial, and back):
        the state, made by ``zeros_like`` when the parameter had its former layout, keeps it.
        The loop and ``foreach`` updates pair elements by index, whatever the strides, but the
        fused kernels pair them by position in memory: held out (issue 18, session 36: Hugging
        Face's ResNet and ConvNeXt from small configs, AdamW), a fused trial after a
        channels-last commit updated each weight from another element's moments, and the loss
        left the eager run's by 0.5-4% within two steps (checked alone: a fused AdamW step on a
        ``[8, 4, 3, 3]`` weight made channels-last after its first step is 4e-3 off the
        ``foreach`` step, which is exact). Only the layout moves, never a value."""
        moved = 0
        late = [o for o in (r() for r in self._late) if o is not None]
        for opt in self.optimizers + late:
            for g in opt.param_groups:
                for p in g["params"]:
                    state = opt.state.get(p)
                    for k, v in list((state or {}).items()):
                        if _relaid(v, p):
                            state[k] = torch.empty_like(p, dtype=v.dtype).copy_(v)  # type: ignore[index]
                            moved += 1
        return moved

    # -- one step
    def apply(self, choice: str | None) -> None:
        """Run this step's optimiser updates with ``choice`` (None, or the optimisers' own
        implementation: nothing is changed). The user's flags are kept for :meth:`restore`."""
        self._saved = []
        flag = _FLAGS.get(choice or "")
        if flag is None:
            return
        for opt in self.optimizers:
            for g in opt.param_groups:
                if g.get(flag) is True:
                    continue  # already runs it (as built on an accelerator: foreach)
                self._saved.append((g, g.get("foreach"), g.get("fused")))
                g[flag] = True

    @property
    def active(self) -> bool:
        """Does this step run another implementation than the user's?"""
        return bool(self._saved)

    def restore(self) -> None:
        """Put back the flags :meth:`apply` changed, as the user left them. Idempotent within a
        step (the step guard's rollback restores the groups as they were at the optimiser's
        step, flags included, and this runs again after it)."""
        for g, foreach, fused in self._saved:
            g["foreach"] = foreach
            if "fused" in g or fused is not None:
                g["fused"] = fused


def _relaid(v: Any, p: torch.Tensor) -> bool:
    """Is ``v`` a tensor of ``p``'s shape and device laid out otherwise (other strides)?"""
    return (
        isinstance(v, torch.Tensor)
        and not v.is_sparse
        and v.shape == p.shape
        and v.device == p.device
        and v.dim() > 1
        and v.stride() != p.stride()
    )
