"""What a training step must undo when a trial configuration fails in it (issue 18).

A trial runs the user's real training step: forward, backward and the optimiser step. A failure
in any of them (a compiled region whose backward raises, a compiled step that produces what the
optimiser cannot take) must not end the run nor leave the model half-updated. Before a guarded
step changes anything, :class:`StepSnapshot` keeps what the step may change:

* the random streams (CPU, and CUDA where present; Python's ``random`` and NumPy's global
  generator, which a forward's masks may be drawn from), at the step's start: the repeat draws
  the same dropout masks as a run without the compiler;
* the modules' own Python state (``_equiv.ModuleState``: their plain attributes and their own
  lists and dicts, shallow), at the step's start: an episode's log-probabilities a policy keeps
  (pytorch/examples' REINFORCE), a counter of steps taken;
* parameters, their gradients and the buffers (running statistics), at the model's first call
  in the step (nothing of the model changes before it, and the input's shapes are known there),
  and the input tensors of that call, which a forward may write in place;
* each optimiser's state and hyper-parameters, at its ``step`` (a global pre-step hook, for any
  optimiser over the model's parameters; one the step does not reach is not copied);
* a ``GradScaler`` stepping that optimiser (mixed precision's loop: scale, backward,
  ``scaler.step(opt)``, ``update``): its scale and growth tracker, and, on a rollback, its record
  of that optimiser back to "not unscaled yet". Without it a trial failing inside the optimiser's
  step left the scaler's record "unscaled", the repeat's ``scaler.step`` skipped unscaling, and
  the optimiser stepped on gradients still multiplied by the scale: silently wrong weights (issue
  18, session 31, found with a held-out mixed-precision loop).

:meth:`StepSnapshot.restore` puts all of it back, and may be called more than once (a repeat
that fails again is rolled back again).
"""

from __future__ import annotations

import copy
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ._equiv import ModuleState
from ._rng import host_random_states, set_host_random_states


def _clone(v: Any) -> Any:
    return v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)


def _scaler_stepping(opt: torch.optim.Optimizer) -> Any:
    """The ``GradScaler`` whose ``step`` calls ``opt.step`` now, found up the call stack (a few
    frames: the optimiser's hook wrapper, then the scaler's ``_maybe_opt_step`` and ``step``); a
    scaler keeps no registry of itself. None when the optimiser is stepped directly."""
    try:
        from torch.amp import GradScaler
    except ImportError:  # (a torch without it: nothing to keep)
        return None
    frame: Any = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, GradScaler) and id(opt) in getattr(owner, "_per_optimizer_states", {}):
            return owner
        frame = frame.f_back
    return None


class StepSnapshot:
    """The state one training step may change, kept so that the step can be rolled back."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.cpu_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.host_rng = host_random_states()  # Python's ``random`` and NumPy's global streams
        # The modules' own Python state, at the step's start: lists and dicts a step appends to
        # outside the forward (a policy's ``saved_log_probs``: held out, session 40, a repeat
        # appended onto the failed attempt's freed graphs and raised under every configuration),
        # plain attributes (a counter of steps taken, the training mode)
        self.python = ModuleState(model)
        self.params: list[tuple[nn.Parameter, torch.Tensor, torch.Tensor | None]] | None = None
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.optimizers: dict[
            int, tuple[torch.optim.Optimizer, dict[Any, dict[str, Any]], list[dict[str, Any]]]
        ] = {}
        # GradScalers stepping the optimisers: (scaler, its scale, its growth tracker), and the
        # (scaler, optimiser id) pairs whose record a rollback sets back to "not unscaled yet"
        self.scalers: dict[int, tuple[Any, Any, Any]] = {}
        # the model's input tensors at its first call: (tensor, its version then, a copy)
        self.inputs: list[tuple[torch.Tensor, int, torch.Tensor]] = []
        self.scaled: list[tuple[Any, int]] = []
        self.cost_s = 0.0  # time spent taking it (not the step's: it is subtracted from the step's time)
        # The optimisers are watched from the step's start, not from the model's first call: an
        # optimiser stepped with a closure (``LBFGS.step(closure)``) calls the model inside its
        # own step, after its pre-step hook has fired (issue 18, session 36: held out, LBFGS
        # over a conv net; a channels-last trial failing in the step was rolled back without
        # the optimiser's state, its evaluation counts and line-search history left as the
        # failed attempt made them).
        self._param_ids: set[int] = {id(p) for p in model.parameters()}
        self._hook: Any = register_optimizer_step_pre_hook(self._before_optimizer)

    @property
    def taken(self) -> bool:
        """Was the model's state kept (the model was called in this step)?"""
        return self.params is not None

    def take_model(self, inputs: Any = ()) -> None:
        """Keep the model's state, and ``inputs`` (the tensors its first call was given that
        take no gradient: the batch), which a forward may write in place (an input normalised
        with ``x.sub_(...)``): a rolled-back step's repeat gets them as the step did (held out,
        session 39)."""
        t0 = time.perf_counter()
        with torch.no_grad():
            seen: set[int] = set()
            for t in inputs:
                if (
                    isinstance(t, torch.Tensor)
                    and not t.requires_grad
                    and not t.is_inference()  # (keeps no version counter)
                    and id(t) not in seen
                ):
                    seen.add(id(t))
                    self.inputs.append((t, t._version, t.detach().clone()))
            self.params = [
                (p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
                for p in self.model.parameters()
            ]
            self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        self.cost_s += time.perf_counter() - t0

    def _before_optimizer(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if id(opt) in self.optimizers:
            return
        if not any(id(p) in self._param_ids for g in opt.param_groups for p in g["params"]):
            return  # another model's optimiser
        t0 = time.perf_counter()
        state = {p: {k: _clone(v) for k, v in st.items()} for p, st in opt.state.items()}
        groups = [{k: _clone(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        self.optimizers[id(opt)] = (opt, state, groups)
        scaler = _scaler_stepping(opt)
        if scaler is not None:
            # (its scale is as at the step's start: ``scale`` reads it, ``update`` comes after)
            if id(scaler) not in self.scalers:
                self.scalers[id(scaler)] = (
                    scaler,
                    _clone(getattr(scaler, "_scale", None)),
                    _clone(getattr(scaler, "_growth_tracker", None)),
                )
            self.scaled.append((scaler, id(opt)))
        self.cost_s += time.perf_counter() - t0

    def close(self) -> None:
        """Stop watching optimisers (the step is over)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def restore(self) -> None:
        """Put everything kept back as it was."""
        torch.random.set_rng_state(self.cpu_rng)
        self.python.restore()
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        set_host_random_states(self.host_rng)
        with torch.no_grad():
            for p, data, grad in self.params or ():
                p.copy_(data)
                p.grad = None if grad is None else grad.clone()
            for b, data in self.buffers:
                b.copy_(data)
            for t, version, data in self.inputs:
                if t._version != version:  # (written in place by the failed attempt)
                    t.copy_(data)
        for opt, state, groups in self.optimizers.values():
            opt.state.clear()
            for p, st in state.items():
                opt.state[p] = {k: _clone(v) for k, v in st.items()}
            for g, saved in zip(opt.param_groups, groups):
                g.update({k: _clone(v) for k, v in saved.items()})
        for scaler, scale, growth in self.scalers.values():
            for name, kept in (("_scale", scale), ("_growth_tracker", growth)):
                now = getattr(scaler, name, None)
                if isinstance(now, torch.Tensor) and isinstance(kept, torch.Tensor):
                    with torch.no_grad():
                        now.copy_(kept)
        if self.scaled:
            from torch.amp.grad_scaler import _refresh_per_optimizer_state

            for scaler, opt_id in self.scaled:
                scaler._per_optimizer_states[opt_id] = _refresh_per_optimizer_state()
