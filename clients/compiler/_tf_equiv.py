"""Does a TensorFlow step variant train as the plain step does? (issue 18, session 39)

PyTorch's compiled variants are checked against the model's own code (``_equiv``) since an
Inductor rewrite was seen to train otherwise, silently (session 37). ``AstraTF`` runs a model's
step under XLA, and over a recurrent model its own graph rewrites (hoisting, batching, the time
loop as a while loop) on Astra's initiative, for a user who asked for no compiler: the same class
of defect would change that user's training. A TF variant's step applies its gradients inside its
one function, so the check compares what the step *did*: from the same variables, the plain step
and the variant each run one step on the same batch, and what each wrote is compared (the loss,
and every variable's change).

What is compared, per variable, is its change over the step (after - before), so a small update
of a large weight is judged by the update, not hidden in the weight. Which changes:

* the optimiser's per-variable slots (Adam's moments, momentum, an accumulator) where it keeps
  any: each is a smooth function of the gradients, while Adam's *update* of a weight is nearly
  ``lr * sign(g)`` where a gradient is float noise (a bias before a batch norm), which two
  correct orders of float arithmetic set apart by ``2 lr``: the weights' own changes are not
  judged then;
* otherwise (plain SGD: the change is ``-lr g``) the trainable variables' changes;
* the non-trainable float variables (a batch norm's moving statistics) always;
* integer variables (the iteration count, a seed generator's state) must be equal.

Agreement within a group is judged as PyTorch's gradients are (``_agreement.judge``): each tensor
within 5% of its own norm or the group's mean norm (a change that is float noise is
judged against its group), and the group as a whole within the tolerance of its precision
(float32 1e-3). XLA's float order moves a float32 step's gradients by ~1e-6 relative; a miscompile
that matters is far beyond that.

The state is put back after each run: the variant's step runs first (it is the timed trial step),
its variables are read, the variables are put back, the plain step runs, and the plain step's
result is the one training keeps, whatever the verdict. The check costs one plain step and three
copies of the step's variables, once per variant in a process; a step whose variables exceed
``CHECK_BYTES`` is not checked (logged).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from ._agreement import judge
from ._tf_warm import _tf_variable

RTOL = {"float16": 5e-2, "bfloat16": 5e-2, "float32": 1e-3, "float64": 1e-6}
CHECK_BYTES = 1 << 30  # three copies of a larger step's variables are not made


class StepState:
    """The step's variables (the model's and the optimiser's, each once), copied, read and put
    back; ``kinds`` names the group each belongs to: ``"slot"`` (an optimiser's variable of more
    than one element), ``"trainable"``, ``"other"`` (the model's non-trainable ones and the
    optimiser's scalars)."""

    def __init__(self, model: Any, optimizer_variables: Sequence[Any], others: Sequence[Any] = ()) -> None:
        trainable = {id(_tf_variable(v)) for v in getattr(model, "trainable_variables", [])}
        opt = {id(_tf_variable(v)) for v in optimizer_variables}
        seen: set[int] = set()
        self.variables: list[Any] = []
        self.kinds: list[str] = []
        for v in list(getattr(model, "variables", [])) + list(optimizer_variables) + list(others):
            tv = _tf_variable(v)
            if tv is None or id(tv) in seen:
                continue
            seen.add(id(tv))
            self.variables.append(tv)
            if id(tv) in opt and int(np.prod(tv.shape)) > 1:
                self.kinds.append("slot")
            elif id(tv) in trainable:
                self.kinds.append("trainable")
            else:
                self.kinds.append("other")
        self.bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in self.variables)
        tvars = self.variables
        self._copy: Callable[[], Any] = tf.function(lambda: [tf.identity(v) for v in tvars])

    def copy(self) -> list[Any]:
        """The variables' values now (tensors, on the variables' device)."""
        return list(self._copy())

    def restore(self, kept: list[Any]) -> None:
        for v, value in zip(self.variables, kept, strict=True):
            v.assign(value)

    def read(self) -> list[np.ndarray]:
        return [np.asarray(t) for t in self.copy()]


def _norm(a: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64).ravel()))


def _judge_group(what: str, want: list[np.ndarray], got: list[np.ndarray], rtol: float) -> str:
    norms = [_norm(a) for a in want]
    diffs = [_norm(a.astype(np.float64) - b.astype(np.float64)) for a, b in zip(want, got, strict=True)]
    for i, (n, d) in enumerate(zip(norms, diffs, strict=True)):
        if not math.isfinite(d) and math.isfinite(n):
            return f"{what} {i}: not finite where the plain step's is"
    return judge(what, norms, [d if math.isfinite(d) else 0.0 for d in diffs], rtol, "the plain step's")


def _leaves(result: Any) -> list[np.ndarray]:
    """A step's result (a loss, or Keras' logs) as arrays, in a fixed order."""
    if isinstance(result, dict):
        result = [result[k] for k in sorted(result)]
    out = []
    for leaf in tf.nest.flatten(result):
        try:
            out.append(np.asarray(leaf, dtype=np.float64).reshape(-1))
        except (TypeError, ValueError):
            continue
    return out


def differs(
    kinds: list[str],
    before: list[np.ndarray],
    plain_after: list[np.ndarray],
    variant_after: list[np.ndarray],
    plain_result: Any,
    variant_result: Any,
) -> str:
    """Why the variant's step is not the plain step's, in a line ("" when it is)."""
    want_r, got_r = _leaves(plain_result), _leaves(variant_result)
    if len(want_r) != len(got_r):
        return "the step returns other values"
    floats = [
        str(b.dtype) for b in before if np.issubdtype(b.dtype, np.floating) or b.dtype.name == "bfloat16"
    ]
    rtol = max((RTOL.get(d, 5e-2) for d in floats), default=RTOL["float32"])
    for i, (a, b) in enumerate(zip(want_r, got_r, strict=True)):
        scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-6)
        if a.shape != b.shape or not np.all(np.isfinite(b) | ~np.isfinite(a)):
            return f"the step's result {i} differs in shape or is not finite"
        if float(np.max(np.abs(a - b), initial=0.0)) > max(rtol, 1e-4) * scale:
            return f"the step's result {i}: {a[:3].tolist()} (plain) against {b[:3].tolist()}"
    has_slots = "slot" in kinds
    groups: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for kind, b0, p, v in zip(kinds, before, plain_after, variant_after, strict=True):
        if not (np.issubdtype(b0.dtype, np.floating) or b0.dtype.name == "bfloat16"):
            if not np.array_equal(p, v):
                return f"an integer variable of shape {b0.shape} differs ({p.ravel()[:3]} against {v.ravel()[:3]})"
            continue
        if kind == "trainable" and has_slots:
            continue  # (judged through the optimiser's slots, above)
        want, got = groups.setdefault(kind, ([], []))
        want.append(p - b0)
        got.append(v - b0)
    for kind in sorted(groups):
        why = _judge_group(f"{kind} variable change", *groups[kind], rtol)
        if why:
            return why
    return ""
