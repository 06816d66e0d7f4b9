"""The training loop: the one place that calls every stage of the dataflow in order.

sample tasks -> rollout groups -> rewards -> advantages -> old/ref logprobs -> update ->
weight sync -> metrics -> checkpoint.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from agentrl.algorithms.advantages import compute_advantages, zero_spread_groups
from agentrl.config import Config
from agentrl.metrics import MetricsLogger, dump_trajectories, rollout_metrics
from agentrl.rollout.agent_loop import Sampling
from agentrl.rollout.groups import rollout_groups
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.checkpoint import load_latest_checkpoint, save_checkpoint
from agentrl.trainer.components import Components


@dataclass
class StepTimer:
    """Wall-clock seconds per stage, reported as timing_s/<stage>."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        yield
        self.seconds[f"timing_s/{name}"] = (
            self.seconds.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start
        )


class Trainer:
    """Runs `config.trainer.total_training_steps` GRPO-family steps, resumable at any step."""

    def __init__(self, config: Config, components: Components) -> None:
        self.config, self.c = config, components
        self.logger = MetricsLogger(
            components.run_dir,
            config.trainer.logger,
            config.trainer.project_name,
            config.trainer.experiment_name,
            config.model_dump(mode="json"),
        )

    async def _rollout(
        self, rows, row_ids, step: int, sampling: Sampling, n: int, desc: str
    ) -> list[Trajectory]:
        return await rollout_groups(
            rows, row_ids, self.c.make_env, self.c.engine, self.c.template,
            n=n, seed=self.config.trainer.seed, sampling_seed=self.config.trainer.seed * 100_003 + step,
            budgets=self.c.budgets, sampling=sampling, description=desc,
        )  # fmt: skip

    async def _train_rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Rollout groups for this step; with dynamic sampling, keep only groups with reward spread.

        Dynamic sampling (DAPO) draws extra batches from a second deterministic order until
        `data.train_batch_size` groups with reward spread are kept or the round limit is hit.
        """
        rollout, filter_groups = self.config.rollout, self.config.algorithm.filter_groups
        wanted = self.config.data.train_batch_size
        num_rounds = filter_groups.max_num_gen_batches if filter_groups.enable else 1
        trajectories: list[Trajectory] = []
        metrics: dict[str, float] = {}
        for attempt in range(num_rounds):
            if attempt == 0:
                rows, row_ids = self.c.sampler.batch(step)
            else:
                rows, row_ids = self.c.extra_sampler.batch(step * num_rounds + attempt)
            kept_ids = {t.group_id for t in trajectories}
            fresh = [
                (row, row_id) for row, row_id in zip(rows, row_ids, strict=True) if row_id not in kept_ids
            ]
            batch = await self._rollout(
                [row for row, _ in fresh], [row_id for _, row_id in fresh],
                step * 1000 + attempt, self.c.train_sampling, rollout.n, f"step {step} rollout",
            )  # fmt: skip
            if attempt == 0:
                metrics = rollout_metrics(batch)
            trajectories += _drop_zero_spread_groups(batch) if filter_groups.enable else batch
            if len({t.group_id for t in trajectories}) >= wanted:
                break
        metrics["rollout/num_gen_batches"] = float(attempt + 1)
        kept_groups = set(list(dict.fromkeys(t.group_id for t in trajectories))[:wanted])
        return [t for t in trajectories if t.group_id in kept_groups], metrics

    async def evaluate(self, step: int) -> dict[str, float]:
        val = self.config.rollout.val_kwargs
        sampling = Sampling(temperature=val.temperature, top_p=val.top_p)
        rows = self.c.val_rows
        trajectories = await self._rollout(rows, list(range(len(rows))), -1, sampling, val.n, "eval")
        metrics = rollout_metrics(trajectories, prefix="val/")
        metrics["val/num_problems"] = float(len(rows))
        dump_trajectories(self.c.run_dir / "rollouts" / f"val_step_{step}.jsonl", trajectories)
        return metrics

    async def train_step(self, step: int, timer: StepTimer) -> dict[str, float]:
        c, config = self.c, self.config
        with timer.stage("rollout"):
            trajectories, metrics = await self._train_rollout(step)
        num_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
        metrics["perf/rollout_tokens"] = float(num_tokens)
        if config.trainer.dump_rollouts:
            dump_trajectories(c.run_dir / "rollouts" / f"step_{step}.jsonl", trajectories)
        if all(t.status.is_error for t in trajectories):
            # Nothing to learn from (every episode failed, or dynamic sampling kept no group).
            metrics["actor/skipped_update"] = 1.0
            return metrics
        advantages = compute_advantages(config.algorithm, *_group_tensors(trajectories))
        batch = build_train_batch(trajectories, advantages, c.pad_token_id)
        with timer.stage("old_logprob"):
            batch.old_logprobs, _ = c.actor.compute_logprobs(batch)
        if c.reference is not None:
            with timer.stage("ref"):
                batch.ref_logprobs, _ = c.reference.compute_logprobs(batch)
        with timer.stage("update"):
            metrics.update(c.actor.update(batch))
        with timer.stage("weight_sync"):
            await c.engine.update_weights(c.actor.full_state_dict(), version=step + 1)
        return metrics

    async def fit(self) -> dict[str, float]:
        """Train to total_training_steps; returns the last evaluation's metrics."""
        trainer, c = self.config.trainer, self.c
        start_step = 0
        if trainer.resume == "auto" and (restored := load_latest_checkpoint(c.run_dir, c.actor)) is not None:
            start_step = restored[0]
            await c.engine.update_weights(c.actor.full_state_dict(), version=start_step)
            print(f"resumed from {c.run_dir} at step {start_step}", flush=True)
        self.logger.discard_after(start_step if start_step else None)
        final_metrics: dict[str, float] = {}
        if trainer.val_before_train and start_step == 0:
            final_metrics = await self.evaluate(0)
            self.logger.log(0, final_metrics)
        for step in range(start_step, trainer.total_training_steps):
            timer = StepTimer()
            with timer.stage("step"):
                metrics = await self.train_step(step, timer)
                done = step + 1
                if (
                    trainer.test_freq and done % trainer.test_freq == 0
                ) or done == trainer.total_training_steps:
                    with timer.stage("eval"):
                        final_metrics = await self.evaluate(done)
                    metrics.update(final_metrics)
                if (
                    trainer.save_freq and done % trainer.save_freq == 0
                ) or done == trainer.total_training_steps:
                    with timer.stage("save_checkpoint"):
                        save_checkpoint(
                            c.run_dir, done, c.actor, {"step": done}, keep=trainer.max_checkpoints_to_keep
                        )
            metrics.update(timer.seconds)
            metrics["perf/throughput"] = metrics["perf/rollout_tokens"] / timer.seconds["timing_s/rollout"]
            self.logger.log(done, metrics)
        c.actor.save_hf(c.run_dir / "hf_model")
        self.logger.close()
        return final_metrics


def _group_tensors(trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rewards [N], group ids [N] and validity [N] (False for error statuses) of the trajectories."""
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    group_ids = torch.tensor([t.group_id for t in trajectories])
    valid = torch.tensor([not t.status.is_error for t in trajectories])
    return rewards, group_ids, valid


def _drop_zero_spread_groups(trajectories: list[Trajectory]) -> list[Trajectory]:
    flat = {int(g) for g in zero_spread_groups(*_group_tensors(trajectories))}
    return [t for t in trajectories if t.group_id not in flat]
