"""A small Keras model on scikit-learn's digits that runs under the microco scheduler.

    python -m microco.examples.keras_digits --steps 200 --out result.json

The scheduler's Keras callback reports every batch and obeys suspend / resume /
checkpoint-and-move at batch ends; the data is a function of the step, so a restarted job
continues mid-epoch exactly where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="mini-batches to train")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-sleep-ms",
        type=float,
        default=0.0,
        help="extra time per mini-batch, to stand in for a bigger model",
    )
    p.add_argument("--out", help="write losses and a digest of the final parameters here (JSON)")
    args = p.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from microco.clients.scheduler import SchedulerCallback, StepBatches
    from microco.examples._digits import load_digits

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()

    x, y = load_digits()
    batches = StepBatches(len(x), args.batch_size, seed=args.seed)

    class Digits(keras.Model):
        # train_step returns the batch's own loss (Keras' default logs a running mean).
        def train_step(self, data):
            xb, yb = data
            with tf.GradientTape() as tape:
                pred = self(xb, training=True)
                loss = self.compute_loss(x=xb, y=yb, y_pred=pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return {"loss": loss}

    inputs = keras.Input((64,))
    h = keras.layers.Dense(args.hidden, activation="relu")(inputs)
    h = keras.layers.Dropout(0.1, seed=args.seed)(h)
    model = Digits(inputs, keras.layers.Dense(10)(h))
    model.compile(
        optimizer=keras.optimizers.Adam(args.lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

    history: dict = {"losses": []}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            history["losses"].append(float(logs["loss"]))
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000.0)

    cb = SchedulerCallback(extra_state=history)
    start = cb.restore(model)

    def stream():
        step = start
        while True:
            idx = batches.indices(step)
            yield x[idx], y[idx]
            step += 1

    if start < args.steps:
        # Record runs before the scheduler callback so a checkpoint includes this batch's loss.
        model.fit(
            stream(),
            steps_per_epoch=args.steps - start,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[Record(), cb],
        )
    cb.finish()

    if args.out:
        digest = hashlib.sha256()
        for v in model.weights:
            digest.update(np.asarray(v.numpy()).tobytes())
        with open(args.out, "w") as f:
            json.dump(
                {
                    "losses": history["losses"],
                    "params_sha256": digest.hexdigest(),
                    "restored_from_step": cb.context.restored_from_step,
                    "steps": args.steps,
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
