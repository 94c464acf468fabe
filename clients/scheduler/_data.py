"""Data position as a function of the step, so a checkpoint needs only the step to resume
reading exactly where it stopped (mid-epoch included)."""

from __future__ import annotations

from typing import Any


class StepBatches:
    """Sample indices of every mini-batch of an endless, per-epoch shuffled stream.

    ``indices(step)`` is a pure function of ``(seed, step)``: epoch ``step // batches_per_epoch``
    uses the permutation drawn from ``(seed, epoch)``; the last partial batch of an epoch is
    dropped so every step has the same size.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0) -> None:
        if num_samples < batch_size or batch_size <= 0:
            raise ValueError(f"need 0 < batch_size ({batch_size}) <= num_samples ({num_samples})")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.batches_per_epoch = num_samples // batch_size
        self._epoch: int | None = None
        self._perm: Any = None

    def epoch_of(self, step: int) -> int:
        return step // self.batches_per_epoch

    def indices(self, step: int) -> Any:
        import numpy as np

        epoch, pos = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._epoch = epoch
        return self._perm[pos * self.batch_size : (pos + 1) * self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"num_samples": self.num_samples, "batch_size": self.batch_size, "seed": self.seed}
