"""Episodes whose next context does not extend what was sampled continue as a new sample."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agentrl.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import RolloutConfig, TrajectoryMode
from agentrl.rollout.episode import Episode
from agentrl.rollout.trajectory import Status, Trajectory
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.rollout.renders import (
    CompactingEnv,
    assert_samples_are_renders,
    render_ids,
    think_stripping,
    turn_contexts,
)
from tests.rollout.scripted import GuessEnv, ScriptedEngine

OPENING = [{"role": "user", "content": "Guess the number."}]
THINKING_GUESSES = [
    "<think>\nsmall?\n</think>\n\n3",
    "<think>\nbigger\n</think>\n\n5",
    "<think>\nyes\n</think>\n\n7",
]
BUDGETS = Budgets(
    max_turns=4,
    max_new_tokens_per_turn=32,
    max_tokens_per_episode=512,
    step_timeout_s=5,
    episode_timeout_s=20,
)


def run(env, tokenizer, replies, mode=TrajectoryMode.AUTO, budgets=BUDGETS, target="7") -> Trajectory:
    budgets = dataclasses.replace(budgets, trajectory_mode=mode)
    engine = ScriptedEngine(tokenizer, replies)
    trajectory = asyncio.run(
        run_episode(
            env, engine, ChatTemplate(tokenizer), {"target": target},
            group_id=0, seed=1, sampling_seed=2, budgets=budgets, sampling=Sampling(),
        )
    )  # fmt: skip
    if trajectory.status.is_error:  # the turn that failed was not recorded
        return trajectory
    # The engine was shown exactly the live sample's tokens at every turn.
    sample_of_turn = [s for s in trajectory.samples() for _ in range(sum(_runs(s.loss_mask)))]
    for call, sample, turn in zip(engine.calls, sample_of_turn, trajectory.turns, strict=True):
        assert call == (sample.prompt_ids + sample.response_ids)[: len(call)]
        assert (sample.prompt_ids + sample.response_ids)[len(call) :][
            : len(turn.completion_ids)
        ] == turn.completion_ids
    return trajectory


def _runs(mask):
    return [1 for i, bit in enumerate(mask) if bit and (i == 0 or not mask[i - 1])]


def test_a_template_that_drops_earlier_reasoning_splits_and_every_sample_is_a_render(tokenizer):
    thinking = think_stripping(tokenizer)
    trajectory = run(GuessEnv(), thinking, THINKING_GUESSES)

    assert trajectory.status is Status.COMPLETED and len(trajectory.turns) == 3
    assert len(trajectory.samples()) == 3  # each new user turn strips the reasoning before it
    assert [turn.starts_new_sample for turn in trajectory.turns] == [True, True, False]
    assert trajectory.num_template_mismatches == 0
    assert_samples_are_renders(trajectory, thinking, turn_contexts(trajectory, OPENING))
    # The second sample's prompt shows the first guess without its reasoning.
    second_prompt = thinking.decode(trajectory.samples()[1].prompt_ids)
    assert "small?" not in second_prompt and "<|im_start|>assistant\n3<|im_end|>" in second_prompt


def test_an_appending_template_keeps_one_sample_per_episode(tokenizer):
    trajectory = run(GuessEnv(), tokenizer, THINKING_GUESSES)

    assert len(trajectory.turns) == 3
    assert trajectory.earlier_segments == [] and len(trajectory.samples()) == 1
    assert not any(turn.starts_new_sample for turn in trajectory.turns)
    assert_samples_are_renders(trajectory, tokenizer, turn_contexts(trajectory, OPENING))


def test_segments_mode_starts_a_sample_at_every_turn(tokenizer):
    trajectory = run(GuessEnv(), tokenizer, ["3", "5", "7"], mode=TrajectoryMode.SEGMENTS)

    samples = trajectory.samples()
    assert len(samples) == 3
    for sample, turn in zip(samples, trajectory.turns, strict=True):
        assert sample.response_ids == turn.completion_ids and sample.loss_mask == [1] * len(
            turn.completion_ids
        )
    assert_samples_are_renders(trajectory, tokenizer, turn_contexts(trajectory, OPENING))


def test_single_mode_never_splits_and_counts_the_best_effort_turns(tokenizer):
    thinking = think_stripping(tokenizer)
    trajectory = run(GuessEnv(), thinking, THINKING_GUESSES, mode=TrajectoryMode.SINGLE)

    assert len(trajectory.samples()) == 1 and trajectory.num_template_mismatches == 2
    with pytest.raises(AssertionError):  # what single mode trains is not what any render gives
        assert_samples_are_renders(trajectory, thinking, turn_contexts(trajectory, OPENING))


def test_an_env_that_rewrites_the_history_starts_a_sample_from_the_rewritten_render(tokenizer):
    env = CompactingEnv(num_steps=3, compact_at=2)
    trajectory = run(env, tokenizer, ["1", "2", "3"])

    assert [turn.starts_new_sample for turn in trajectory.turns] == [False, True, False]
    summary = [*CompactingEnv.OPENING, {"role": "assistant", "content": "(2 numbers said)"}]
    assert trajectory.prompt_ids == render_ids(tokenizer, [*summary, {"role": "user", "content": "Another."}])
    assert_samples_are_renders(
        trajectory, tokenizer, turn_contexts(trajectory, CompactingEnv.OPENING, {1: summary})
    )
    assert "history" not in trajectory.info  # the conversation is not a metric


def test_a_rewritten_history_that_is_not_messages_is_an_env_error(tokenizer):
    trajectory = run(CompactingEnv(history=[{"role": "narrator", "content": "x"}]), tokenizer, ["1", "2"])

    assert trajectory.status is Status.ENV_ERROR
    assert "info['history'] (the rewritten conversation) message 0 has role 'narrator'" in trajectory.error


def test_a_new_sample_that_does_not_fit_ends_the_episode_on_the_live_sample(tokenizer):
    thinking = think_stripping(tokenizer)
    first_prompt = render_ids(thinking, OPENING)
    first_turn = thinking.encode(THINKING_GUESSES[0], add_special_tokens=False) + [thinking.eos_token_id]
    # Room for the first turn and its observation, not for a second context of about the same size.
    budget = len(first_prompt) + len(first_turn) + 1
    trajectory = run(
        GuessEnv(),
        thinking,
        THINKING_GUESSES,
        budgets=dataclasses.replace(BUDGETS, max_tokens_per_episode=budget),
    )
    assert trajectory.status is Status.TRUNCATED_TOKENS
    assert "leaves no room under max_tokens_per_episode" in trajectory.info["truncation"]
    assert trajectory.samples()[0].prompt_ids == first_prompt
    assert trajectory.response_ids == first_turn and trajectory.earlier_segments == []


def test_the_total_token_cap_counts_every_sample(tokenizer):
    unlimited = run(GuessEnv(), tokenizer, ["3", "5", "7"], mode=TrajectoryMode.SEGMENTS)
    first_two = sum(len(s.prompt_ids) + len(s.response_ids) for s in unlimited.samples()[:2])
    budgets = dataclasses.replace(BUDGETS, max_total_tokens_per_episode=first_two + 5)
    trajectory = run(GuessEnv(), tokenizer, ["3", "5", "7"], mode=TrajectoryMode.SEGMENTS, budgets=budgets)

    assert trajectory.status is Status.TRUNCATED_TOKENS and len(trajectory.turns) == 2
    assert "max_total_tokens_per_episode" in trajectory.info["truncation"]
    assert sum(len(s.prompt_ids) + len(s.response_ids) for s in trajectory.samples()) <= first_two + 5


def test_samples_survive_the_json_round_trip(tokenizer):
    trajectory = run(GuessEnv(), think_stripping(tokenizer), THINKING_GUESSES)
    restored = Trajectory.from_json(trajectory.to_json())

    assert restored == trajectory and len(restored.samples()) == 3


def test_the_rollout_config_builds_the_trajectory_mode_and_the_total_cap():
    budgets = RolloutConfig(trajectory_mode="segments", max_total_tokens_per_episode=900).budgets()
    assert budgets.trajectory_mode is TrajectoryMode.SEGMENTS and budgets.max_total_tokens_per_episode == 900


def test_a_new_samples_prompt_reads_its_shared_start_from_the_engines_prefix_cache(tokenizer):
    """The tiny policy on the built-in engine: the sample after a compaction prefills only what changed."""
    block = 4

    async def episode_on_engine():
        config = EngineConfig(device="cpu", prefix_block_size=block)
        async with TransformersEngine.from_pretrained(DEFAULT_MODEL_PATH, config) as engine:
            episode = Episode(
                CompactingEnv(num_steps=3, compact_at=1), engine, ChatTemplate(tokenizer), {},
                group_id=0, seed=1, sampling_seed=2, budgets=dataclasses.replace(BUDGETS, max_new_tokens_per_turn=8),
                sampling=Sampling(),
            )  # fmt: skip
            await episode.reset()
            cached_per_turn, contexts = [], []
            while not episode.done:
                contexts.append(episode.trajectory.prompt_ids + episode.trajectory.response_ids)
                before = engine.stats.num_prefix_cached_tokens
                await episode.commit(await episode.generate())
                cached_per_turn.append(engine.stats.num_prefix_cached_tokens - before)
            return episode.trajectory, contexts, cached_per_turn

    trajectory, contexts, cached_per_turn = asyncio.run(episode_on_engine())
    assert [turn.starts_new_sample for turn in trajectory.turns] == [True, False, False]
    first_sample = trajectory.earlier_segments[0]
    seen = first_sample.prompt_ids + first_sample.response_ids
    shared = next(i for i, (a, b) in enumerate(zip(seen, contexts[1], strict=False)) if a != b)
    assert shared >= len(render_ids(tokenizer, CompactingEnv.OPENING))  # the opening and the assistant header
    assert cached_per_turn[0] == 0
    assert cached_per_turn[1] == shared // block * block
