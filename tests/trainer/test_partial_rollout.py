"""Partial rollouts in training: staleness per token, the per-token bound and the correction."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from agentrl.algorithms.config import RolloutCorrectionConfig
from agentrl.algorithms.rollout_correction import rollout_correction
from agentrl.config_loader import load_config
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.trajectory import Trajectory, Turn
from agentrl.trainer.async_rollout import fresh_token_mask, staleness_metrics, too_stale_groups
from agentrl.trainer.batch import build_train_batch
from agentrl.trainer.components import build_trainer
from tests.rollout.scripted import GuessEnv
from tests.trainer.test_loop import VersionedScriptedEngine, records, scripted_trainer


def mixed_version_episode() -> Trajectory:
    """Turn 1 (2 tokens) sampled by version 3, an observation (1 token), turn 2 (2 tokens) by version 5."""
    return Trajectory(
        group_id=0,
        prompt_ids=[10, 11],
        response_ids=[20, 21, 30, 40, 41],
        loss_mask=[1, 1, 0, 1, 1],
        rollout_logprobs=[-1.0, -1.0, 0.0, -2.0, -2.0],
        token_versions=[3, 3, 0, 5, 5],
        turns=[
            Turn("a", [20, 21], [], [30], 0.0, "stop", policy_version=3),
            Turn("b", [40, 41], [], [], 1.0, "stop", policy_version=5),
        ],
        policy_version=5,
    )


def test_staleness_is_measured_over_tokens_not_over_the_oldest_turn():
    metrics = staleness_metrics([mixed_version_episode()], step=6)  # step 6 trains version 5

    assert metrics["rollout/staleness/mean"] == 1.0  # tokens aged 2, 2, 0, 0
    assert metrics["rollout/staleness/max"] == 2.0
    assert metrics["rollout/staleness/0"] == 0.5 and metrics["rollout/staleness/2"] == 0.5
    assert metrics["rollout/staleness/off_policy_token_frac"] == 0.5


def test_the_per_token_bound_masks_only_the_too_old_turn_where_regeneration_drops_the_group():
    episode = mixed_version_episode()
    batch = build_train_batch([episode], torch.tensor([1.0]), pad_token_id=0)

    fresh = fresh_token_mask([episode], tuple(batch.loss_mask.shape), step=6, max_staleness=1)

    # Row layout: 2 prompt tokens, then the response; only version 3's two tokens are > 1 update old.
    assert fresh.tolist() == [[1, 1, 0, 0, 1, 1, 1]]
    assert too_stale_groups([episode], step=6, max_staleness=1) == {0}  # without partial rollouts


def test_a_mixed_version_episode_is_corrected_token_by_token():
    episode = mixed_version_episode()
    batch = build_train_batch([episode], torch.tensor([1.0]), pad_token_id=0)
    # The trainer's policy (version 5) agrees with the engine on version 5's tokens and not on the
    # older turn's: only those are off-policy, and only they get an IS weight other than 1.
    old_logprobs = torch.tensor([[0.0, 0.0, -0.5, -0.7, 0.0, -2.0, -2.0]])
    fresh = fresh_token_mask([episode], tuple(batch.loss_mask.shape), step=6, max_staleness=2)
    assert fresh.tolist() == [[1.0] * 7]  # within the bound: nothing masked
    config = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)

    advantages, loss_mask, metrics = rollout_correction(
        config, old_logprobs, batch.rollout_logprobs, batch.advantages, batch.loss_mask * fresh
    )

    assert loss_mask.tolist() == [[0, 0, 1, 1, 0, 1, 1]]
    expected = [0.0, 0.0, math.exp(0.5), math.exp(0.3), 0.0, 1.0, 1.0]
    assert advantages[0].tolist() == pytest.approx(expected)
    assert metrics["rollout_corr/is_weight_max"] == pytest.approx(math.exp(0.5))


def test_partial_rollouts_need_async_mode():
    with pytest.raises(ValueError, match="rollout.partial_rollout=true .* set rollout.mode=async"):
        RolloutConfig(partial_rollout=True)
    assert RolloutConfig(partial_rollout=True, mode="async").partial_rollout


def test_an_async_run_with_partial_rollouts_regenerates_nothing_and_reports_token_staleness(tmp_path):
    config = load_config([
        "env=multiturn", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4",
        "rollout.max_new_tokens_per_turn=8", "data.val_size=2", "trainer.logger=[console]", "trainer.save_freq=0",
        "rollout.mode=async", "rollout.max_staleness=1", "rollout.partial_rollout=true",
        "algorithm.rollout_correction.rollout_is=token", "trainer.total_training_steps=3",
        "trainer.val_before_train=false", "trainer.test_freq=0", f"trainer.run_dir={tmp_path}",
        "trainer.device=cpu", "engine.device=cpu",
    ])  # fmt: skip
    asyncio.run(build_trainer(config, tmp_path).fit())

    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2, 3]
    assert [step["rollout/num_regenerated_groups"] for step in steps] == [0.0, 0.0, 0.0]
    assert steps[0]["rollout/staleness/max"] == 0.0
    assert all(step["rollout/staleness/max"] <= 1.0 for step in steps)
    assert all(step["rollout/staleness/masked_token_frac"] == 0.0 for step in steps)
    assert all("rollout/staleness/off_policy_token_frac" in step for step in steps)
    for step in (2, 3):
        for record in _records(tmp_path / f"rollouts/step_{step}.jsonl"):
            trajectory = Trajectory.from_json(record)
            assert len(trajectory.token_versions) == len(trajectory.response_ids)
            assert set(trajectory.sampled_versions()) <= {step - 2, step - 1}


class LaggingEngine(VersionedScriptedEngine):
    """Reports every other turn as sampled by weights two updates older than those it serves."""

    async def generate(self, prompt_ids, sampling):
        generation = await super().generate(prompt_ids, sampling)
        if self.num_calls % 2:
            return dataclasses.replace(generation, policy_version=max(self.version - 2, 0))
        return generation


def lagging_run(tmp_path: Path, *overrides: str) -> list[dict]:
    trainer, engine = scripted_trainer(
        tmp_path, "rollout.mode=async", "rollout.max_staleness=1", "rollout.max_turns=2",
        "trainer.total_training_steps=3", "trainer.val_before_train=false", "trainer.test_freq=0", *overrides,
        make_env=lambda: GuessEnv(attempts=2), rows=[{"target": "never"}] * 8,
    )  # fmt: skip
    trainer.parts.engine = LaggingEngine(engine.tokenizer)
    asyncio.run(trainer.fit())
    return records(tmp_path, "metrics.jsonl")


def test_tokens_beyond_the_bound_leave_the_loss_and_their_groups_are_not_generated_again(tmp_path):
    steps = lagging_run(tmp_path, "rollout.partial_rollout=true")

    assert [step["rollout/num_regenerated_groups"] for step in steps] == [0.0, 0.0, 0.0]
    assert steps[0]["rollout/staleness/masked_token_frac"] == 0.0
    # Step 3 trains version 2 on turns sampled by version 1, half of them reported as version 0: those
    # (every other turn, two tokens each) are 2 updates old and leave the loss; the rest stay.
    assert steps[2]["rollout/staleness/2"] == 0.5 and steps[2]["rollout/staleness/mean"] == 1.5
    assert steps[2]["rollout/staleness/masked_token_frac"] == 0.5


def test_without_partial_rollouts_the_same_lag_generates_groups_again(tmp_path):
    steps = lagging_run(tmp_path)

    assert steps[2]["rollout/num_regenerated_groups"] > 0
    assert "rollout/staleness/masked_token_frac" not in steps[2]
    assert steps[2]["rollout/staleness/off_policy_token_frac"] == steps[2]["rollout/staleness/2"]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
