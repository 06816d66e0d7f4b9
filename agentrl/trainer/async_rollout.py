"""Rollout stage, ahead of training: generate the next steps' groups while the current step trains.

With `rollout.mode=async` and `rollout.max_staleness=k`, the rollout of step j starts as soon as
the engine serves weights no older than version j - 1 - k (a sync run samples step j with
version j - 1 exactly). Every sampled token records the version that sampled it (an episode in
flight at a weight update samples its next turns from the new weights). Without partial rollouts, a
group holding a sample older than k versions when its step trains is dropped and generated again;
with `rollout.partial_rollout`, nothing is generated again and the bound holds per token: a token
older than k versions is masked out of the loss. The update's importance-sampling correction
(`algorithm.rollout_correction`) accounts for the gap token by token.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import torch

from agentrl.rollout.trajectory import Trajectory

RolloutFn = Callable[[int], Awaitable[tuple[list[Trajectory], dict[str, float]]]]


def oldest_version(trajectory: Trajectory) -> int:
    """The oldest weight version that sampled any token of the trajectory."""
    return min((turn.policy_version for turn in trajectory.turns), default=trajectory.policy_version)


def token_staleness(trajectory: Trajectory, step: int) -> list[int]:
    """Updates between the version that sampled each sampled token and the one step `step` trains
    (version step - 1), over the episode's samples in order; 0 is on-policy."""
    return [step - 1 - version for version in trajectory.sampled_versions()]


def staleness_metrics(trajectories: list[Trajectory], step: int) -> dict[str, float]:
    """`rollout/staleness/mean`, `/max`, `/off_policy_token_frac` and the fraction at each staleness,
    over the sampled tokens of the step's episodes."""
    staleness = [age for t in trajectories for age in token_staleness(t, step)]
    if not staleness:
        return {}
    counts = Counter(staleness)
    metrics = {f"rollout/staleness/{age}": count / len(staleness) for age, count in sorted(counts.items())}
    metrics["rollout/staleness/mean"] = sum(staleness) / len(staleness)
    metrics["rollout/staleness/max"] = float(max(staleness))
    metrics["rollout/staleness/off_policy_token_frac"] = 1 - counts[0] / len(staleness)
    return metrics


def fresh_token_mask(
    trajectories: list[Trajectory], shape: tuple[int, int], step: int, max_staleness: int
) -> torch.Tensor:  # [B, T] float32
    """1 on every token at most `max_staleness` versions old, 0 on older ones: the per-token bound of
    partial rollouts. Rows and positions follow `build_train_batch` (one row per sample, the response
    after the prompt) for trajectories without error status."""
    mask = torch.ones(shape, dtype=torch.float32)
    samples = [
        (sample, versions)
        for t in trajectories
        if not t.status.is_error
        for sample, versions in zip(t.samples(), t.token_versions_by_sample(), strict=True)
    ]  # fmt: skip
    if len(samples) != shape[0]:
        raise ValueError(f"{len(samples)} samples for a batch of {shape[0]} rows")
    for row, (sample, versions) in enumerate(samples):
        start = len(sample.prompt_ids)
        for offset, (sampled, version) in enumerate(zip(sample.loss_mask, versions, strict=True)):
            if sampled and step - 1 - version > max_staleness:
                mask[row, start + offset] = 0.0
    return mask


def too_stale_groups(trajectories: list[Trajectory], step: int, max_staleness: int) -> set[int]:
    """Group ids with a sample more than `max_staleness` versions older than step `step` trains."""
    return {t.group_id for t in trajectories if t.turns and step - 1 - oldest_version(t) > max_staleness}


class RolloutPrefetcher:
    """Runs `rollout(step)` for steps first..last in order, at most `max_staleness` steps ahead."""

    def __init__(
        self, rollout: RolloutFn, first_step: int, last_step: int, max_staleness: int, version: int
    ) -> None:
        self.rollout, self.max_staleness = rollout, max_staleness
        self.version = version
        self._version_changed = asyncio.Condition()
        loop = asyncio.get_running_loop()
        self._results = {step: loop.create_future() for step in range(first_step, last_step + 1)}
        self._task = asyncio.create_task(self._produce(first_step, last_step))

    async def _produce(self, first_step: int, last_step: int) -> None:
        for step in range(first_step, last_step + 1):
            async with self._version_changed:
                await self._version_changed.wait_for(
                    lambda step=step: self.version >= step - 1 - self.max_staleness
                )
            result = self._results[step]
            try:
                result.set_result(await self.rollout(step))
            except Exception as exc:  # noqa: BLE001  # handed to the training step that waits for this rollout
                result.set_exception(exc)
                return

    async def next(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """The groups generated for step `step` (waits until they are ready)."""
        result = await self._results[step]
        del self._results[step]
        return result

    async def weights_updated(self, version: int) -> None:
        """The engine now serves `version`: rollouts waiting for fresher weights may start."""
        async with self._version_changed:
            self.version = version
            self._version_changed.notify_all()

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
