"""Data stage for several envs in one run (`env.mixture`): tagged rows and each step's shares.

Every row of a mixed run carries the name of its env in the column `env` (added where the rows
are loaded), so the rollout builds its episode from the right env and the metrics are split by
env wherever the row goes. Each step takes a fixed number of rows from every env, its share of
`data.train_batch_size` by weight (largest remainders), each env's rows in their own
deterministic epoch order: a resumed run sees the batches an uninterrupted one would.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl.trainer.data_order import StepSampler

ENV_COLUMN = "env"


def tag_rows(rows: list[dict[str, Any]], env_name: str, source: str) -> list[dict[str, Any]]:
    """The rows with their env's name in the `env` column; ValueError if a row names another env."""
    for index, row in enumerate(rows):
        if row.get(ENV_COLUMN, env_name) != env_name:
            raise ValueError(
                f"{source} row {index}: column '{ENV_COLUMN}' is {row[ENV_COLUMN]!r}, but the row belongs to "
                f"env.mixture.{env_name}; rename the column, which a mixed run uses to name each row's env"
            )
    return [{**row, ENV_COLUMN: env_name} for row in rows]


def step_shares(weights: dict[str, float], batch_size: int) -> dict[str, int]:
    """Rows per step of each env: batch_size split by weight, remainders to the largest fractions."""
    total = sum(weights.values())
    exact = {name: weight / total * batch_size for name, weight in weights.items()}
    shares = {name: math.floor(value) for name, value in exact.items()}
    by_fraction = sorted(weights, key=lambda name: exact[name] - shares[name], reverse=True)
    for name in by_fraction[: batch_size - sum(shares.values())]:
        shares[name] += 1
    empty = [name for name, share in shares.items() if share == 0]
    if empty:
        raise ValueError(
            f"data.train_batch_size={batch_size} split by weight gives env.mixture.{empty[0]} no row per step "
            f"(shares {shares}); raise data.train_batch_size or env.mixture.{empty[0]}.weight"
        )
    return shares


class MixtureSampler:
    """Each step's rows: every env's share, from that env's own `StepSampler`, in mixture order.

    `rows` is every training row (tagged), and row ids index it, as `StepSampler`'s do.
    """

    def __init__(
        self, rows: list[dict[str, Any]], weights: dict[str, float], batch_size: int, seed: int, shuffle: bool
    ) -> None:
        self.rows = rows
        self.shares = step_shares(weights, batch_size)
        self.row_ids = {
            name: [i for i, row in enumerate(rows) if row[ENV_COLUMN] == name] for name in weights
        }
        self.samplers = {}
        for index, name in enumerate(weights):
            env_rows = [rows[i] for i in self.row_ids[name]]
            if len(env_rows) < self.shares[name]:
                raise ValueError(
                    f"env.mixture.{name} has {len(env_rows)} training rows, fewer than its "
                    f"{self.shares[name]} rows per step"
                )
            self.samplers[name] = StepSampler(env_rows, self.shares[name], seed + 7919 * index, shuffle)

    def batch(self, step: int) -> tuple[list[dict[str, Any]], list[int]]:
        """The rows of training step `step` (0-based) and their indices in `rows`."""
        row_ids = []
        for name, sampler in self.samplers.items():
            _, local_ids = sampler.batch(step)
            row_ids += [self.row_ids[name][i] for i in local_ids]
        return [self.rows[i] for i in row_ids], row_ids
