"""A sampled turn that contains the template's special tokens, through the agent loop's `Episode`.

The turn ends before its first special token other than a final end-of-turn token; the template
closes it (mask 0). Every trained token then equals a full render of the conversation, which
`agentrl.debug.replay.check_render` checks.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from transformers import AutoTokenizer

from agentrl.config_loader import load_config
from agentrl.debug.__main__ import build_setup
from agentrl.debug.replay import check_render, sample_views
from agentrl.env import make
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.episode import SPECIAL_TOKEN_FINISH, Episode
from agentrl.rollout.trajectory import Status
from agentrl.testing import SCRIPTED_LOGPROB, ScriptedEngine
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.math.synthetic import make_row

ROW = make_row("2 * 4", index=0, split="train")
BUDGETS = Budgets(
    max_turns=4,
    max_new_tokens_per_turn=32,
    max_tokens_per_episode=512,
    step_timeout_s=30,
    episode_timeout_s=60,
)
IM_START, IM_END = 1, 2  # the tiny policy's `<|im_start|>` and `<|im_end|>`


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH))


def play(template: ChatTemplate, replies: list[str]) -> tuple[Episode, ScriptedEngine]:
    engine = ScriptedEngine(template.tokenizer, replies)
    episode = Episode(
        make("math", max_attempts=2), engine, template, ROW,
        group_id=0, seed=0, sampling_seed=0, budgets=BUDGETS, sampling=Sampling(),
    )  # fmt: skip
    asyncio.run(episode.run())
    return episode, engine


def full_render(template: ChatTemplate, messages: list[dict]) -> list[int]:
    text = template.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return template.tokenizer.encode(text, add_special_tokens=False)


def test_a_turn_that_samples_im_start_before_its_stop_token_ends_there_and_the_template_closes_it(template):
    episode, engine = play(template, ["\\boxed{5}<|im_start|>user\nIt is 8.", "\\boxed{8}"])
    trajectory = episode.trajectory
    first, second = trajectory.turns
    boxed_5 = template.encode("\\boxed{5}")
    assert IM_START in template.tokenizer.encode("\\boxed{5}<|im_start|>user", add_special_tokens=False)
    assert (first.completion_ids, first.action_text, first.finish_reason) == (
        boxed_5, "\\boxed{5}", SPECIAL_TOKEN_FINISH,
    )  # fmt: skip
    conversation = [
        *ROW["prompt"],
        {"role": "assistant", "content": "\\boxed{5}"},
        {"role": "user", "content": "Your answer is incorrect. Try again."},
    ]
    # What the policy saw for turn two is the canonical render, `<|im_end|>\n` closing turn one included.
    assert engine.calls[1] == full_render(template, conversation)
    assert template.tokenizer.decode(first.observation_ids).startswith("<|im_end|>\n<|im_start|>user\n")
    assert trajectory.loss_mask == [1] * len(boxed_5) + [0] * len(first.observation_ids) + [1] * len(
        second.completion_ids
    )
    assert trajectory.rollout_logprobs[: len(boxed_5)] == [SCRIPTED_LOGPROB] * len(boxed_5)
    assert (trajectory.status, trajectory.reward, trajectory.num_template_mismatches) == (
        Status.COMPLETED,
        1.0,
        0,
    )
    check = check_render(template, ROW["prompt"], None, trajectory)
    assert (check.mismatch, check.resplits, check.num_unrecorded_tokens) == (None, [], 0)


def test_a_turn_that_opens_with_a_special_token_is_empty_and_still_closed_by_the_template(template):
    episode, engine = play(template, ["<|endoftext|>\\boxed{8}", "\\boxed{8}"])
    first = episode.trajectory.turns[0]
    assert (first.completion_ids, first.action_text, first.finish_reason) == ([], "", SPECIAL_TOKEN_FINISH)
    conversation = [
        *ROW["prompt"],
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Your answer is incorrect. Try again."},
    ]
    assert engine.calls[1] == full_render(template, conversation)
    assert episode.trajectory.num_template_mismatches == 0
    assert check_render(template, ROW["prompt"], None, episode.trajectory).mismatch is None


def test_the_end_of_turn_token_closes_a_turn_and_stays_a_trained_token(template):
    episode, _ = play(template, ["\\boxed{8}<|im_end|>more text"])
    turn = episode.trajectory.turns[0]
    assert turn.completion_ids == template.encode("\\boxed{8}") + [IM_END]
    assert (turn.finish_reason, episode.trajectory.reward) == ("stop", 1.0)
    assert template.end_of_turn_id == IM_END


def test_the_policy_sampling_im_start_at_temperature_2_5_stops_there_and_trains_a_full_render():
    """The tiny policy at temperature 2.5 samples `<|im_start|>` inside a turn (in valid UTF-8) within 100 seeds."""
    config = load_config(["env=math", "env.kwargs.max_attempts=2"])
    setup = build_setup(config, row=3, seed=0)
    hot = dataclasses.replace(setup.sampling, temperature=2.5)
    tokenizer = setup.template.tokenizer
    others = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special} - {IM_END}

    async def first_turn_with_a_special_token():
        for seed in range(100):
            episode = Episode(
                setup.make_env(), setup.engine, setup.template, setup.row,
                group_id=3, seed=3, sampling_seed=seed, budgets=setup.budgets, sampling=hot,
            )  # fmt: skip
            await episode.reset()
            generation = await episode.generate()
            if set(generation.completion_ids[:-1]) & others:
                raise AssertionError(f"seed {seed}: sampling went on past a special token: {generation}")
            # A sample with bytes that are not UTF-8 decodes lossily (U+FFFD), so no render can give
            # its tokens back; the render check below needs text that survives decoding.
            text = tokenizer.decode(generation.completion_ids[:-1])
            if generation.completion_ids[-1] in others and "\ufffd" not in text:
                await episode.commit(generation)
                return episode, generation
        raise AssertionError(
            "no seed in 0..99 sampled valid UTF-8 and then a special token other than <|im_end|>"
        )

    try:
        episode, generation = asyncio.run(first_turn_with_a_special_token())
    finally:
        asyncio.run(setup.engine.close())
    turn = episode.trajectory.turns[0]
    assert (
        turn.completion_ids == generation.completion_ids[:-1]
    )  # the engine stopped on it; the turn ends before it
    assert turn.finish_reason == SPECIAL_TOKEN_FINISH
    assert episode.trajectory.num_template_mismatches == 0
    opening = setup.row["prompt"]
    # Sampled tokens that are not the tokenizer's own split of their text end their sample (the next
    # context's render does not extend them): every sample is checked against its own renders.
    views = sample_views(opening, episode.trajectory)
    assert len(views) == len(episode.trajectory.samples())
    for context, sample in views:
        assert check_render(setup.template, context, None, sample).mismatch is None
