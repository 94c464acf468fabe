"""tf.data integration: ``quiver_tf_dataset(loader)`` is a ``tf.data.Dataset`` of (index, bytes)
mini-batches chosen with substitutable hits; map/decode as usual.

Each pass over the dataset is the loader's next epoch (``first_epoch``, then the one after, ...),
so ``model.fit(ds, epochs=N)`` trains on N epochs of N orders, as a ``DataLoader`` whose sampler's
epoch is set each time does. Until session 33 the dataset was one epoch's (``epoch=0`` by
default), and every pass of a ``fit`` replayed that epoch's order (held out: the way Keras users
write it). ``epoch=K`` still gives that one epoch at every pass.

TensorFlow is imported lazily by ``microco.clients.cache``.
"""

from __future__ import annotations

import itertools
from typing import Any

from ._loader import QuiverLoader


def quiver_tf_dataset(loader: QuiverLoader, epoch: int | None = None, *, first_epoch: int = 0) -> Any:
    """A ``tf.data.Dataset`` yielding ``(indices: int64[B], samples: string[B])`` per batch; every
    sample exactly once a pass. ``epoch``: that epoch at every pass; None (the default): each
    pass the next epoch from ``first_epoch`` (a job resumed at epoch K passes ``first_epoch=K``,
    as ``fit``'s ``initial_epoch``)."""
    import tensorflow as tf

    passes = itertools.count(first_epoch)

    def gen() -> Any:
        yield from loader.epoch(epoch if epoch is not None else next(passes))

    return tf.data.Dataset.from_generator(
        gen,
        output_signature=(
            tf.TensorSpec(shape=(None,), dtype=tf.int64),
            tf.TensorSpec(shape=(None,), dtype=tf.string),
        ),
    )
