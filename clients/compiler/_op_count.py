"""The size of a training step, counted before anything compiles (issue 18, session 38).

Mechanism only. A whole-step Inductor compile grows with what it generates code for, and it
generates one kernel for identical work once (its code caches are keyed by the kernel's
source): sixteen time steps of one LSTM cell, or twelve identical blocks, compile hardly longer
than one. So the size counted is the number of *distinct* ATen ops of the step, an op and the
shapes of its tensor arguments, views and copies of layout left out (they generate no kernel
of their own). The probe step (an eager step the run takes anyway) is counted at the level
AOTAutograd sees (a ``TorchDispatchMode``: composite ops already decomposed, ``aten::linear``
as ``t`` and ``addmm``), from the model's forward to the optimiser's first step (or the step's
end): the forward, the loss and the backward, not the optimiser's update, which no whole-step
compile compiles. Measured on ten models (docs/compiler.md, "A compile priced by the distinct
ops it compiles"), this count predicted their cold compiles better than the ops in all (which
a time loop inflates) and than dynamo's FX nodes. How it prices a compile is the caller's
(``_compile_costs``).
"""

from __future__ import annotations

import time
from typing import Any

# Ops that generate no kernel of their own under Inductor (views, layout and allocation):
# not counted among the distinct ops (counted in ``ops``).
LAYOUT_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "t",
        "transpose",
        "permute",
        "expand",
        "detach",
        "alias",
        "reshape",
        "unsqueeze",
        "squeeze",
        "select",
        "slice",
        "as_strided",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "contiguous",
        "clone",
        "_to_copy",
        "empty",
        "empty_like",
        "zeros_like",
        "ones_like",
        "new_empty",
        "new_zeros",
        "new_empty_strided",
        "empty_strided",
        "zeros",
        "lift_fresh",
        "_reshape_alias",
        "numpy_T",
    }
)


def _counter() -> Any:
    """A ``TorchDispatchMode`` counting the ATen ops dispatched under it (``ops``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
        ops = 0
        seen: set[tuple[Any, ...]] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace == "aten":  # (not the profiler's record_function markers)
                self.ops += 1
                if func.overloadpacket.__name__ not in LAYOUT_OPS:
                    shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
                    self.seen.add((func, shapes))
            return func(*args, **(kwargs or {}))

    counter = _Counter()  # type: ignore[no-untyped-call]
    counter.seen = set()
    return counter


class StepOpCounter:
    """Counts the ATen ops dispatched between :meth:`start` and :meth:`stop` (each at most once;
    a stop before a start, or a second stop, does nothing): ``distinct``, the distinct ones (op
    and argument shapes, ``LAYOUT_OPS`` left out), the size a compile is priced by; ``ops``, all
    of them; ``forward_ops``: all of them up to :meth:`mark_forward` (the forward returned). ``cost_s``: the wall time the count
    added, estimated as ``ops`` times ``OP_US`` (the caller takes it off the step's time)."""

    # What counting adds to an op (µs): measured on the 2-core VM, torch 2.13 CPU, ten models'
    # forward and backward with and without the mode, CPU time: 6.8-37 µs, median 10 (load
    # 1.1-2.6; docs/compiler.md, "A compile priced by the distinct ops it compiles").
    OP_US = 10.0

    def __init__(self) -> None:
        self._mode: Any = None
        self.ops = 0
        self.distinct = 0
        self.forward_ops = 0
        self.started_at = 0.0
        self.done = False
        self.counted = False  # (the caller's: its cost taken off the step's time)

    @property
    def active(self) -> bool:
        return self._mode is not None

    @property
    def cost_s(self) -> float:
        return self.ops * self.OP_US / 1e6

    def start(self) -> None:
        if self._mode is None and not self.done:
            self._mode = _counter()
            self._mode.__enter__()
            self.started_at = time.perf_counter()

    def mark_forward(self) -> None:
        if self._mode is not None and not self.forward_ops:
            self.forward_ops = self._mode.ops

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        self.ops = mode.ops
        self.distinct = len(mode.seen)
        self.forward_ops = self.forward_ops or mode.ops
        self.done = True
