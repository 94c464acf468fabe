"""tf.data integration: ``quiver_tf_dataset(loader, epoch)`` is a ``tf.data.Dataset`` of
(index, bytes) mini-batches chosen with substitutable hits; map/decode as usual.

TensorFlow is imported lazily by ``microco.clients.cache``.
"""

from __future__ import annotations

from typing import Any

from ._loader import QuiverLoader


def quiver_tf_dataset(loader: QuiverLoader, epoch: int = 0) -> Any:
    """A ``tf.data.Dataset`` yielding ``(indices: int64[B], samples: string[B])`` per batch
    of ``epoch``; every sample exactly once."""
    import tensorflow as tf

    def gen() -> Any:
        yield from loader.epoch(epoch)

    return tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec(shape=(None,), dtype=tf.int64),
            tf.TensorSpec(shape=(None,), dtype=tf.string),
        ),
    )
