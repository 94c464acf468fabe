"""Keras ``fit`` as people write it, under the microco scheduler: arrays, ``epochs=N``,
BatchNorm, Dropout, an accuracy metric, Keras' own shuffling; the scheduler callback is the
only addition.

    python -m microco.examples.keras_fit --epochs 6 --out result.json

Suspended, moved or restarted from a checkpoint mid-epoch, the job continues at the same
epoch and batch with the same running loss and accuracy, so its per-batch logs and the
``History`` that ``fit`` returns equal an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=640, help="training samples used (of the digits)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="extra time per mini-batch")
    p.add_argument("--out", help="write per-batch logs, History and a digest of the weights here (JSON)")
    args = p.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from microco.clients.scheduler import SchedulerCallback
    from microco.examples._digits import load_digits

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()

    x, y = load_digits()
    x, y = x[: args.samples], y[: args.samples]
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Dropout(0.2, seed=args.seed),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    batch_logs: dict = {"batches": []}
    cb = SchedulerCallback(extra_state=batch_logs)

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            # before ``cb`` in the callback list: this batch is in the checkpoint ``cb`` may take
            batch_logs["batches"].append([cb.step + 1, {k: float(v) for k, v in (logs or {}).items()}])
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000.0)

    cb.restore(model)
    hist = model.fit(
        x, y, epochs=args.epochs, batch_size=args.batch_size, callbacks=[Record(), cb], verbose=0
    )
    cb.finish()

    if args.out:
        digest = hashlib.sha256()
        for v in model.variables:
            digest.update(np.asarray(v.numpy()).tobytes())
        with open(args.out, "w") as f:
            json.dump(
                {
                    "batches": batch_logs["batches"],
                    "history": {k: [float(x) for x in v] for k, v in hist.history.items()},
                    "epochs": list(hist.epoch),
                    "params_sha256": digest.hexdigest(),
                    "restored_from_step": cb.context.restored_from_step,
                    "steps": cb.step,
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
