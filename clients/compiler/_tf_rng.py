"""TensorFlow: XLA draws other random numbers than the plain step, so a step that draws is not
offered XLA (unless the user allows it).

Keras 3's dropout, noise layers and recurrent dropout call TensorFlow's stateless random
operators with a seed tensor from the layer's ``SeedGenerator``. Under ``jit_compile`` those
operators run XLA's own implementation, which for one seed gives other numbers than
TensorFlow's kernels, whatever algorithm is named (Philox asked for by name: equal for a
constant seed, which TensorFlow folds before XLA sees it, different for a seed tensor). Found
(issue 18, session 29) with a Keras model nobody here wrote, ``Dropout(0.3)``, 20 steps: the
weights were 0.030 from the plain step's under XLA, and 0.026 apart when one step in three ran
under XLA: a trial alone moves the loss curve. With dropout 0: 6e-8.

So, by default, a step whose traced graph holds a random operator is run without XLA: the loss
curve is the one the user's plain step gives (PyTorch reaches the same end by compiling with
Inductor's ``fallback_random``, ``_rng``; XLA has no such switch).
``AstraTF(..., exact_random=False)`` offers XLA anyway: its masks differ from the plain step's,
as ``jit_compile=True`` on the user's own step would."""

from __future__ import annotations

from typing import Any


def _random_op(op_type: str) -> bool:
    return (
        "Random" in op_type or op_type.startswith("Rng") or op_type in ("Multinomial", "StatelessMultinomial")
    )


def draws_random(concrete: Any) -> bool:
    """Whether a traced step (a ``ConcreteFunction``) runs a random operator: in its graph or in
    any function it calls (loops, conditionals, nested ``tf.function``s)."""
    gdef = concrete.graph.as_graph_def()
    if any(_random_op(n.op) for n in gdef.node):
        return True
    return any(_random_op(n.op) for f in gdef.library.function for n in f.node_def)
