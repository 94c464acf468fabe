"""A Keras user's own ``model.fit`` three ways (issue 18, session 34): as Keras runs it by default
(``jit_compile="auto"``, resolved per host: XLA off on a CPU-only one), with
``jit_compile=True``, and through Astra (``attach_fit``, the in-process explorer on a fresh
record: a first run on this host). One contender, one model, one length per process, so that
each pays its own traces and compiles; a shell loop alternates them (see docs/benchmarks/compiler.md).

Models, built here and held out of the corpus: ``mobilenet``, ``keras.applications``'
MobileNetV3Small at 32x32, ``weights=None``, 10 classes; ``rnn``, ``keras.layers.RNN`` over a
gated cell written here (a custom ``Layer`` with ``state_size``), then a ``Dense`` head.

``python -m microco.benchmarks.compiler_fit --model mobilenet --steps 300 --mode astra``
prints one JSON line: the fit's wall and process CPU seconds, the last epoch's loss, what
``jit_compile`` resolved to, and for Astra its ``summary()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

BATCHES_PER_EPOCH = 50


def _mobilenet(keras: Any) -> tuple[Any, Any, Any]:
    import numpy as np

    model = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, size=(BATCHES_PER_EPOCH * 16, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=len(x))
    loss = keras.losses.SparseCategoricalCrossentropy()  # (the application ends in a softmax)
    return model, (x, y, 16), loss


def _rnn(keras: Any) -> tuple[Any, Any, Any]:
    import numpy as np

    class GatedCell(keras.layers.Layer):
        """h' = z * h + (1 - z) * tanh(x W + (r * h) U), z and r sigmoid gates of x and h."""

        def __init__(self, units: int, **kw: Any) -> None:
            super().__init__(**kw)
            self.units = units
            self.state_size = units

        def build(self, input_shape: Any) -> None:
            d, u = input_shape[-1], self.units
            self.w = self.add_weight(shape=(d, 3 * u), initializer="glorot_uniform", name="w")
            self.u = self.add_weight(shape=(u, 2 * u), initializer="orthogonal", name="u")
            self.uh = self.add_weight(shape=(u, u), initializer="orthogonal", name="uh")
            self.b = self.add_weight(shape=(3 * u,), initializer="zeros", name="b")

        def call(self, x: Any, states: Any) -> Any:
            ops = keras.ops
            h = states[0]
            xw = ops.matmul(x, self.w) + self.b
            u = self.units
            gates = ops.sigmoid(xw[:, : 2 * u] + ops.matmul(h, self.u))
            z, r = gates[:, :u], gates[:, u:]
            cand = ops.tanh(xw[:, 2 * u :] + ops.matmul(r * h, self.uh))
            new = z * h + (1.0 - z) * cand
            return new, [new]

    model = keras.Sequential([keras.Input((16, 8)), keras.layers.RNN(GatedCell(32)), keras.layers.Dense(4)])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES_PER_EPOCH * 32, 16, 8)).astype("float32")
    y = rng.integers(0, 4, size=len(x))
    return model, (x, y, 32), keras.losses.SparseCategoricalCrossentropy(from_logits=True)


MODELS = {"mobilenet": _mobilenet, "rnn": _rnn}


def run(model_name: str, steps: int, mode: str, threads: int = 1) -> dict[str, Any]:
    """One ``fit`` of ``steps`` steps (whole epochs of ``BATCHES_PER_EPOCH``) by one contender."""
    state = tempfile.mkdtemp(prefix="microco-fit-bench-")
    # a first run on this host: fresh records of tuned configurations and compile costs
    os.environ["MICROCO_COMPILER_STATE"] = os.path.join(state, "compiler_state.json")
    os.environ["MICROCO_COMPILE_COSTS"] = os.path.join(state, "compile_costs.json")
    os.environ["MICROCO_XLA_COST_FILE"] = os.path.join(state, "xla_compile_rate.json")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras

    keras.utils.set_random_seed(0)
    model, (x, y, batch), loss = MODELS[model_name](keras)
    kw: dict[str, Any] = {"jit_compile": True} if mode == "jit" else {}
    model.compile(keras.optimizers.Adam(1e-3), loss, metrics=["accuracy"], **kw)
    astra = None
    if mode == "astra":
        from microco.clients.compiler import attach_fit

        astra = attach_fit(model)
    epochs = max(1, steps // BATCHES_PER_EPOCH)
    t0, c0 = time.perf_counter(), time.process_time()
    hist = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out: dict[str, Any] = {
        "model": model_name,
        "steps": epochs * BATCHES_PER_EPOCH,
        "mode": mode,
        "fit_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "final_loss": hist.history["loss"][-1],
        "jit_compile": model.jit_compile,
    }
    if astra is not None:
        summary = astra.summary()
        out["jit_compile"] = summary["baseline"]["jit_compile"]
        out["astra"] = summary
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--mode", choices=("plain", "jit", "astra"), required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    print(json.dumps(run(a.model, a.steps, a.mode, a.threads)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
