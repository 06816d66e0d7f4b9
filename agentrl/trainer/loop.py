"""The training loop: the one place that calls every stage of the dataflow in order.

sample tasks -> rollout groups -> advantages -> old/ref logprobs -> update -> weight sync ->
evaluation -> metrics -> checkpoint. Steps are numbered from 1; step 0 is the evaluation
before training. Step k's metrics line is written before its checkpoint, so every step a
checkpoint covers has its line, wherever a kill lands.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentrl.algorithms.advantages import compute_advantages, zero_spread_groups
from agentrl.algorithms.rollout_correction import rollout_correction
from agentrl.config import Config
from agentrl.data_mixture import MixtureSampler
from agentrl.engine.protocol import InferenceEngine
from agentrl.env.base import TextEnv
from agentrl.metrics import MetricsLogger, dump_trajectories, rollout_metrics
from agentrl.rewards.apply import RewardFunctions
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Sampling
from agentrl.rollout.groups import rollout_groups
from agentrl.rollout.trajectory import Status, Trajectory
from agentrl.trainer.async_rollout import (
    RolloutPrefetcher,
    fresh_token_mask,
    oldest_version,
    staleness_metrics,
    too_stale_groups,
)
from agentrl.trainer.batch import TrainBatch, build_train_batch
from agentrl.trainer.checkpoint import load_latest_checkpoint, rng_state, save_checkpoint
from agentrl.trainer.credit import token_advantages
from agentrl.trainer.data_order import StepSampler
from agentrl.trainer.distributed import all_gather_lists
from agentrl.trainer.env_mixture import EnvRoute, env_metrics, rollout_by_env
from agentrl.trainer.health import RunHealth
from agentrl.trainer.policy_worker import PolicyWorker

_T = TypeVar("_T")


@dataclass
class TrainerParts:
    """The live parts one run drives, built from the config by `components.build_trainer`."""

    run_dir: Path
    make_env: Callable[[], TextEnv]
    engine: InferenceEngine
    template: ChatTemplate
    pad_token_id: int
    actor: PolicyWorker
    reference: PolicyWorker | None  # only when actor.use_kl_loss
    sampler: StepSampler | MixtureSampler  # the rows of each step
    extra_sampler: StepSampler | MixtureSampler  # extra batches for dynamic sampling
    val_rows: list[dict[str, Any]]
    reward_functions: RewardFunctions  # configured reward functions (none: the env's reward stands)
    env_routes: dict[str, EnvRoute] = field(default_factory=dict)  # env.mixture's envs; empty: make_env


@dataclass
class StepTimer:
    """Wall-clock seconds per stage, reported as timing_s/<stage>."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        key = f"timing_s/{name}"
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class UnsavedStep:
    """A finished step (metrics line written) that no checkpoint holds yet."""

    step: int
    rng: dict[str, Any]  # the RNG states right after it, which a checkpoint of it must store


class Trainer:
    """Runs `config.trainer.total_training_steps` GRPO-family steps, resumable at any step."""

    def __init__(self, config: Config, parts: TrainerParts) -> None:
        self.config, self.parts = config, parts
        self.health = RunHealth(config.trainer.max_error_frac, config.trainer.max_error_steps)
        self.is_main = parts.actor.context.is_main  # the one rank that writes metrics and rollouts
        self.prefetcher: RolloutPrefetcher | None = None  # rollout.mode=async only
        self.unsaved: UnsavedStep | None = None  # the last finished step, when no checkpoint holds it
        self.update_started = 0  # the last step whose update began

    async def _rollout(
        self,
        rows: list[dict],
        row_ids: list[int],
        seed_step: int,
        sampling: Sampling,
        n: int,
        description: str,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Roll out groups and score them: the trajectories in row order, and reward-function metrics.

        Every rank rolls out its share of the groups and gets all of them back. Sampling seeds
        derive from (step, row, member), not from the rank, so any number of ranks produces the
        trajectories one process would. Configured reward functions then set each reward.
        """
        parts, rollout = self.parts, self.config.rollout
        rank, world_size = parts.actor.context.rank, parts.actor.context.world_size
        group_kwargs = {
            "engine": parts.engine, "template": parts.template, "n": n, "seed": self.config.trainer.seed,
            "sampling_seed": self.config.trainer.seed * 100_003 + seed_step, "sampling": sampling,
            "max_infra_retries": rollout.max_infra_retries, "description": description,
        }  # fmt: skip
        if parts.env_routes:  # several envs: each row's groups from its own env, with its budgets
            local = await rollout_by_env(
                parts.env_routes, rows[rank::world_size], row_ids[rank::world_size], **group_kwargs
            )
        else:
            local = await rollout_groups(
                rows[rank::world_size], row_ids[rank::world_size], parts.make_env, budgets=rollout.budgets(),
                **group_kwargs,
            )  # fmt: skip
        position = {row_id: index for index, row_id in enumerate(row_ids)}
        trajectories = sorted(all_gather_lists(local), key=lambda t: position[t.group_id])  # stable sort
        rows_by_id = dict(zip(row_ids, rows, strict=True))
        reward_metrics = parts.reward_functions.apply(trajectories, rows_by_id)
        if parts.env_routes:
            reward_metrics.update(env_metrics(trajectories, rows_by_id))
        return trajectories, reward_metrics

    async def _train_rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Rollout groups for step `step`; with dynamic sampling, keep only groups with reward spread.

        Dynamic sampling (DAPO) draws extra batches from a second deterministic order until
        `data.train_batch_size` groups with reward spread are kept or the round limit is hit.
        """
        filter_groups = self.config.algorithm.filter_groups
        wanted = self.config.data.train_batch_size
        num_rounds = filter_groups.max_num_gen_batches if filter_groups.enable else 1
        trajectories: list[Trajectory] = []
        metrics: dict[str, float] = {}
        for attempt in range(num_rounds):
            if attempt == 0:
                rows, row_ids = self.parts.sampler.batch(step - 1)
            else:
                rows, row_ids = self.parts.extra_sampler.batch((step - 1) * num_rounds + attempt)
            kept_ids = {t.group_id for t in trajectories}
            fresh = [
                (row, row_id) for row, row_id in zip(rows, row_ids, strict=True) if row_id not in kept_ids
            ]
            batch, reward_metrics = await self._rollout(
                [row for row, _ in fresh], [row_id for _, row_id in fresh],
                (step - 1) * 1000 + attempt, self.config.rollout.sampling(), self.config.rollout.n,
                f"step {step} rollout",
            )  # fmt: skip
            if attempt == 0:
                metrics = {**rollout_metrics(batch), **reward_metrics}
            trajectories += self._drop_zero_spread_groups(batch) if filter_groups.enable else batch
            if len({t.group_id for t in trajectories}) >= wanted:
                break
        kept_groups = list(dict.fromkeys(t.group_id for t in trajectories))[:wanted]
        metrics["rollout/num_gen_batches"] = float(attempt + 1)
        metrics["rollout/num_kept_groups"] = float(len(kept_groups))
        return [t for t in trajectories if t.group_id in set(kept_groups)], metrics

    async def evaluate(self, step: int) -> dict[str, float]:
        val = self.config.rollout.val_kwargs
        rows = self.parts.val_rows
        trajectories, reward_metrics = await self._rollout(
            rows, list(range(len(rows))), -1, val.sampling(), val.n, "eval"
        )
        metrics = {
            **rollout_metrics(trajectories, prefix="val/"),
            **{f"val/{k}": v for k, v in reward_metrics.items()},
        }
        metrics["val/num_problems"] = float(len(rows))
        if self.is_main:
            dump_trajectories(self.parts.run_dir / "rollouts" / f"val_step_{step}.jsonl", trajectories)
        return metrics

    def trains_on(self, trajectory: Trajectory) -> bool:
        """Errors, time truncations (unless kept by config) and empty responses never reach the loss."""
        if trajectory.status.is_error or not any(any(sample.loss_mask) for sample in trajectory.samples()):
            return False
        return not (trajectory.status is Status.TRUNCATED_TIME and self.config.rollout.exclude_time_truncated)

    async def train_step(self, step: int, timer: StepTimer) -> tuple[dict[str, float], list[Trajectory]]:
        """One step: its metrics, and its trajectories (advantages set on those trained on)."""
        parts, config = self.parts, self.config
        with timer.stage("rollout"):
            if self.prefetcher is None:
                trajectories, metrics = await self._train_rollout(step)
            else:
                trajectories, metrics = await self.prefetcher.next(step)
                if self.config.rollout.partial_rollout:  # bounded per token in _update instead
                    metrics["rollout/num_regenerated_groups"] = 0.0
                else:
                    trajectories = await self._regenerate_stale_groups(step, trajectories, metrics)
            metrics.update(staleness_metrics(trajectories, step))
        metrics["perf/rollout_tokens"] = float(
            sum(len(s.prompt_ids) + len(s.response_ids) for t in trajectories for s in t.samples())
        )
        trainable = [t for t in trajectories if self.trains_on(t)]
        metrics["rollout/excluded_frac"] = 1 - len(trainable) / len(trajectories) if trajectories else 0.0
        if trainable:
            advantages = compute_advantages(config.algorithm, *_group_tensors(trainable))
            for trajectory, advantage in zip(trainable, advantages.tolist(), strict=True):
                trajectory.advantage = advantage  # the episode's, also under turn credit
        if config.trainer.dump_rollouts and self.is_main:
            dump_trajectories(parts.run_dir / "rollouts" / f"step_{step}.jsonl", trajectories)
        if trainable:
            await self._update(step, trainable, advantages, metrics, timer)
        else:
            # Nothing to learn from (every episode failed, or dynamic sampling kept no group). The
            # weights are unchanged, but they are still served as version `step`: the next step's
            # rollout must sample the version it trains against.
            metrics["actor/skipped_update"] = 1.0
        with timer.stage("weight_sync"):
            await self._sync_weights(step)
        if self.prefetcher is not None:
            await self.prefetcher.weights_updated(step)
        return metrics, trajectories

    async def _update(
        self,
        step: int,
        trainable: list[Trajectory],
        advantages: torch.Tensor,  # [len(trainable)]
        metrics: dict[str, float],
        timer: StepTimer,
    ) -> None:
        """Old/ref logprobs, rollout correction and the optimizer update on the trainable episodes."""
        parts, config = self.parts, self.config
        self.update_started = step  # from here on the weights are no longer those of step - 1
        if self.prefetcher is None:
            assert all(oldest_version(t) == step - 1 for t in trainable), "sync rollout sampled stale weights"
        per_token = None
        if config.algorithm.adv_granularity == "turn":
            per_token = token_advantages(config.algorithm, trainable, *_group_tensors(trainable)[1:])
        batch = build_train_batch(trainable, advantages, parts.pad_token_id, token_advantages=per_token)
        if config.rollout.partial_rollout:
            self._mask_too_stale_tokens(step, trainable, batch, metrics)
        with timer.stage("old_logprob"):
            batch.old_logprobs, _ = await self._compute(parts.actor.compute_logprobs, batch)
        metrics.update(_logprob_gap(batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask))
        batch.advantages, batch.loss_mask, correction = rollout_correction(
            config.algorithm.rollout_correction, batch.old_logprobs, batch.rollout_logprobs, batch.advantages,
            batch.loss_mask,
        )  # fmt: skip
        metrics.update(correction)
        if parts.reference is not None:
            with timer.stage("ref"):
                batch.ref_logprobs, _ = await self._compute(parts.reference.compute_logprobs, batch)
        with timer.stage("update"):
            metrics.update(await self._compute(parts.actor.update, batch))

    def _mask_too_stale_tokens(
        self, step: int, trainable: list[Trajectory], batch: TrainBatch, metrics: dict[str, float]
    ) -> None:
        """Partial rollouts: tokens more than rollout.max_staleness versions old leave the loss."""
        shape = tuple(batch.loss_mask.shape)
        fresh = fresh_token_mask(trainable, shape, step, self.config.rollout.max_staleness)
        num_sampled = max(batch.loss_mask.sum().item(), 1)
        batch.loss_mask = batch.loss_mask * fresh
        batch.advantages = batch.advantages * fresh
        batch.rollout_logprobs = batch.rollout_logprobs * fresh
        metrics["rollout/staleness/masked_token_frac"] = 1 - batch.loss_mask.sum().item() / num_sampled

    async def _sync_weights(self, version: int) -> None:
        """Send the actor's weights to the engine; on a shared GPU as device tensors, without a host copy."""
        engine, actor = self.parts.engine, self.parts.actor
        engine_device = getattr(engine, "device", None)
        if (
            isinstance(engine_device, torch.device)
            and engine_device == actor.context.device
            and engine_device.type == "cuda"
        ):
            dtype = next(engine.model.parameters()).dtype
            state_dict = actor.full_state_dict(device=None, dtype=dtype)
        elif getattr(engine, "weight_sync", "disk") == "distributed":
            # Broadcast from this worker's device (NCCL on GPU), in the servers' dtype: no host copy.
            state_dict = actor.full_state_dict(device=None, dtype=engine.dtype)
        else:
            state_dict = actor.full_state_dict()
        await engine.update_weights(state_dict, version=version)

    async def _compute(self, function: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking trainer call; in async mode off the event loop, so rollouts keep going."""
        if self.prefetcher is None:
            return function(*args)
        return await asyncio.to_thread(function, *args)

    async def _regenerate_stale_groups(
        self, step: int, trajectories: list[Trajectory], metrics: dict[str, float]
    ) -> list[Trajectory]:
        """Groups holding a sample older than rollout.max_staleness versions, generated again now."""
        stale = too_stale_groups(trajectories, step, self.config.rollout.max_staleness)
        metrics["rollout/num_regenerated_groups"] = float(len(stale))
        if not stale:
            return trajectories
        order = list(dict.fromkeys(t.group_id for t in trajectories))
        row_ids = [group_id for group_id in order if group_id in stale]
        rows = [self.parts.sampler.rows[group_id] for group_id in row_ids]
        fresh, _ = await self._rollout(
            rows, row_ids, (step - 1) * 1000 + 999, self.config.rollout.sampling(), self.config.rollout.n,
            f"step {step} regenerate",
        )  # fmt: skip
        by_group = {group_id: [t for t in trajectories if t.group_id == group_id] for group_id in order}
        for group_id in row_ids:
            by_group[group_id] = [t for t in fresh if t.group_id == group_id]
        return [t for group_id in order for t in by_group[group_id]]

    def _due(self, step: int, every: int) -> bool:
        return (every > 0 and step % every == 0) or step == self.config.trainer.total_training_steps

    async def fit(self) -> dict[str, float]:
        """Train to total_training_steps; returns the last evaluation's metrics."""
        trainer, parts = self.config.trainer, self.parts
        last_step = 0
        if (
            trainer.resume == "auto"
            and (restored := load_latest_checkpoint(parts.run_dir, parts.actor)) is not None
        ):
            last_step = restored[0]
            print(f"resumed from {parts.run_dir} at step {last_step}", flush=True)
        # Also on a fresh run: a served engine may still hold another run's weights and version.
        await self._sync_weights(last_step)
        logger = MetricsLogger(parts.run_dir, self.config, resumed=last_step > 0, enabled=self.is_main)
        if self.config.rollout.mode == "async":
            if parts.actor.context.world_size > 1:
                raise ValueError(
                    "rollout.mode=async runs in one process; use rollout.mode=sync under torchrun"
                )
            self.prefetcher = RolloutPrefetcher(
                self._train_rollout, last_step + 1, trainer.total_training_steps,
                self.config.rollout.max_staleness, version=last_step,
            )  # fmt: skip
        logger.discard_after(last_step)
        final_metrics: dict[str, float] = {}
        try:
            if trainer.val_before_train and last_step == 0:
                final_metrics = await self.evaluate(0)
                logger.log(0, final_metrics)
            for step in range(last_step + 1, trainer.total_training_steps + 1):
                timer = StepTimer()
                with timer.stage("step"):
                    metrics, trajectories = await self.train_step(step, timer)
                    if self._due(step, trainer.test_freq):
                        with timer.stage("eval"):
                            final_metrics = await self.evaluate(step)
                        metrics.update(final_metrics)
                metrics.update(timer.seconds)
                metrics["perf/throughput"] = (
                    metrics["perf/rollout_tokens"] / timer.seconds["timing_s/rollout"]
                )
                logger.log(step, metrics)
                self.health.check(step, metrics, trajectories)
                self.unsaved = UnsavedStep(step, rng_state())
                if self._due(step, trainer.save_freq):
                    self._save(self.unsaved)
            self.health.finish()
            parts.actor.save_hf(parts.run_dir / "hf_model")
        except (asyncio.CancelledError, KeyboardInterrupt):
            self._save_on_interrupt()
            raise
        finally:
            if self.prefetcher is not None:
                await self.prefetcher.close()
            logger.close()
            await parts.engine.close()  # stops an engine server the run launched
        return final_metrics

    def _save(self, finished: UnsavedStep) -> None:
        save_checkpoint(
            self.parts.run_dir, finished.step, self.parts.actor, {"step": finished.step},
            keep=self.config.trainer.max_checkpoints_to_keep, rng=finished.rng,
        )  # fmt: skip
        self.unsaved = None

    def _save_on_interrupt(self) -> None:
        """Ctrl-C: checkpoint the last finished step, unless the next step's update has begun.

        One process only: under torchrun the ranks are interrupted at different points, and a
        save is collective, so the run keeps its periodic checkpoints.
        """
        finished = self.unsaved
        if finished is None or self.update_started > finished.step or self.parts.actor.context.world_size > 1:
            return
        print(f"interrupted: saving the checkpoint of step {finished.step}", file=sys.stderr, flush=True)
        self._save(finished)

    @staticmethod
    def _drop_zero_spread_groups(trajectories: list[Trajectory]) -> list[Trajectory]:
        flat = {int(g) for g in zero_spread_groups(*_group_tensors(trajectories))}
        return [t for t in trajectories if t.group_id not in flat]


def _group_tensors(trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rewards [N] (float64), group ids [N] and validity [N] (False for error statuses and for
    episodes no reward function could score)."""
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float64)
    group_ids = torch.tensor([t.group_id for t in trajectories])
    valid = torch.tensor([not t.status.is_error and not t.reward_missing for t in trajectories])
    return rewards, group_ids, valid


def _logprob_gap(
    trainer_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T]
) -> dict[str, float]:
    """How far the engine's sampled-token logprobs are from the trainer's on the same weights."""
    gap = (trainer_logprobs - rollout_logprobs)[loss_mask.bool()].abs()
    if gap.numel() == 0:
        return {}
    return {"rollout/logprob_diff_mean": gap.mean().item(), "rollout/logprob_diff_max": gap.max().item()}
