"""What XLA gains on a TensorFlow step against what the step's profile expects (issue 18, session 41).

The TensorFlow wrapper expects of XLA, before it was measured on a graph here, a share of each
step from the plain step's profile (``_tf_profile``: its span's share in products and in
convolutions; ``AstraTF._expected_share``). This benchmark holds that rule against measurements
on models the project did not write: ``keras.applications`` models at 32x32 (weights=None), and
small Keras stacks of one kind of work each (3x3 convolutions; dense GELU layers; a ``GRU``;
a ``MultiHeadAttention`` block). Per model: the plain ``tf.function`` step and the same step under
``jit_compile=True``, alternated step by step (``--pairs`` pairs, medians of wall time), one
intra-op thread; the first call of each (trace, and XLA's compile); the profile's shares over
three plain steps; and the share the rule expects XLA to save against the share it saved.

``python -m microco.benchmarks.compiler_xla_mix [--models effb0,resnet50,...] [--pairs 15] --json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MODELS = ("effb0", "resnet50", "densenet121", "convstack", "mlp", "gru", "attention")


def _model(name: str) -> tuple[Any, Any]:
    """(model, batch input) for ``name``, seeded."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    image = (32, 32, 3)
    apps: dict[str, Callable[..., Any]] = {
        "effb0": keras.applications.EfficientNetB0,
        "resnet50": keras.applications.ResNet50,
        "densenet121": keras.applications.DenseNet121,
    }
    if name in apps:
        return apps[name](weights=None, input_shape=image, classes=10), tf.random.stateless_normal(
            (8, *image), (1, 2)
        )
    if name == "convstack":
        convs = [keras.layers.Conv2D(32, 3, padding="same", activation="relu") for _ in range(4)]
        head = [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input(image), *convs, *head]), tf.random.stateless_normal(
            (8, *image), (1, 2)
        )
    if name == "mlp":
        dense = [keras.layers.Dense(64, activation="gelu") for _ in range(6)]
        return keras.Sequential(
            [keras.Input((64,)), *dense, keras.layers.Dense(10)]
        ), tf.random.stateless_normal((8, 64), (1, 2))
    if name == "gru":
        layers = [keras.layers.GRU(32), keras.layers.Dense(10)]
        return keras.Sequential([keras.Input((16, 16)), *layers]), tf.random.stateless_normal(
            (8, 16, 16), (1, 2)
        )
    if name == "attention":
        inp = keras.Input((16, 32))
        h = keras.layers.MultiHeadAttention(4, 8)(inp, inp)
        h = keras.layers.LayerNormalization()(h + inp)
        out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
        return keras.Model(inp, out), tf.random.stateless_normal((8, 16, 32), (1, 2))
    raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")


def _step(model: Any, jit: bool) -> Any:
    import keras
    import tensorflow as tf

    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)

    @tf.function(jit_compile=jit)
    def train_step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def measure(name: str, pairs: int) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    from microco.clients.compiler import AstraTF, StepsProfiler

    model, x = _model(name)
    y = tf.constant(np.arange(int(x.shape[0])) % 10)
    plain, xla = _step(model, False), _step(model, True)
    first = {}
    for label, fn in (("plain", plain), ("xla", xla)):
        t0 = time.perf_counter()
        fn(x, y).numpy()
        first[label] = round(time.perf_counter() - t0, 3)
    for _ in range(3):
        plain(x, y).numpy(), xla(x, y).numpy()
    prof = StepsProfiler()
    for _ in range(AstraTF.PROFILED_STEPS):
        prof.run(lambda: plain(x, y).numpy())
    concrete = plain.get_concrete_function(x, y)
    profile = prof.read(concrete.name.decode() if isinstance(concrete.name, bytes) else str(concrete.name))
    times: dict[str, list[float]] = {"plain": [], "xla": []}
    for i in range(pairs):
        order = (("plain", plain), ("xla", xla)) if i % 2 == 0 else (("xla", xla), ("plain", plain))
        for label, fn in order:
            t0 = time.perf_counter()
            fn(x, y).numpy()
            times[label].append((time.perf_counter() - t0) * 1e3)
    plain_ms, xla_ms = statistics.median(times["plain"]), statistics.median(times["xla"])
    gain = plain_ms / xla_ms
    out: dict[str, Any] = {
        "name": name,
        "plain_ms": round(plain_ms, 3),
        "xla_ms": round(xla_ms, 3),
        "xla_gain": round(gain, 3),
        "saved_share": round(1.0 - 1.0 / gain, 3),
        "first_call_s": first,
        "pairs": pairs,
    }
    if profile is not None:
        unfused = AstraTF._unfused_share(profile)
        out.update(
            library_share=round(profile.library_share, 3),
            convolution_share=round(profile.convolution_share, 3),
            expected_share=round(AstraTF.GAIN_RULE.expected_share(unfused), 3),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m microco.benchmarks.compiler_xla_mix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument("--pairs", type=int, default=15, help="plain/XLA step pairs, alternated (default 15)")
    ap.add_argument("--json", action="store_true", help="compact JSON (the output is JSON either way)")
    args = ap.parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        print(f"[compiler_xla_mix] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, args.pairs))
    print(json.dumps({"models": rows}, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
