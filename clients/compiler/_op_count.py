"""The size of a training step, counted before anything compiles (issue 18, session 38).

Mechanism only. A whole-step Inductor compile grows with what it compiles: the ATen ops of the
step's forward and backward (AOTAutograd traces them, Inductor lowers and generates code for
them). The probe step (an eager step the run takes anyway) is counted op by op at the level
AOTAutograd sees (a ``TorchDispatchMode``: composite ops already decomposed, ``aten::linear``
as ``t`` and ``addmm``), from the model's forward to the optimiser's first step (or the step's
end): the forward, the loss and the backward, not the optimiser's update, which no whole-step
compile compiles. Where a trace was not taken (the cache ask is not worth it), the count still
says how large the graph is; how it prices a compile is the caller's (``_compile_costs``).
"""

from __future__ import annotations

import time
from typing import Any


def _counter() -> Any:
    """A ``TorchDispatchMode`` counting the ATen ops dispatched under it (``ops``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
        ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace == "aten":  # (not the profiler's record_function markers)
                self.ops += 1
            return func(*args, **(kwargs or {}))

    return _Counter()  # type: ignore[no-untyped-call]


class StepOpCounter:
    """Counts the ATen ops dispatched between :meth:`start` and :meth:`stop` (each at most once;
    a stop before a start, or a second stop, does nothing). ``forward_ops``: those counted up
    to :meth:`mark_forward` (the model's forward returned). ``cost_s``: the wall time the count
    added, estimated as ``ops`` times ``OP_US`` (the caller takes it off the step's time)."""

    # What counting adds to an op (µs): measured on the 2-core VM, torch 2.13 CPU, a model's
    # forward and backward with and without the mode (docs/compiler.md, "A compile priced by the
    # ops it compiles").
    OP_US = 6.0

    def __init__(self) -> None:
        self._mode: Any = None
        self.ops = 0
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
        self.forward_ops = self.forward_ops or mode.ops
        self.done = True
