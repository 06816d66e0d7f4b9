"""Data stage: which dataset rows each training step uses, as a pure function of (seed, step).

Because the order is derived rather than stored, a run resumed at step k sees exactly the
batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import random
from typing import Any


class StepSampler:
    """Deterministic epoch-shuffled batches of `batch_size` rows; drops a ragged epoch tail."""

    def __init__(self, rows: list[dict[str, Any]], batch_size: int, seed: int, shuffle: bool) -> None:
        if len(rows) < batch_size:
            raise ValueError(
                f"the training set has {len(rows)} rows, fewer than data.train_batch_size={batch_size}"
            )
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.steps_per_epoch = len(rows) // batch_size

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def batch(self, step: int) -> tuple[list[dict[str, Any]], list[int]]:
        """The rows of training step `step` (0-based) and their indices in the dataset."""
        epoch, position = divmod(step, self.steps_per_epoch)
        start = position * self.batch_size
        row_ids = self._epoch_order(epoch)[start : start + self.batch_size]
        return [self.rows[i] for i in row_ids], row_ids
