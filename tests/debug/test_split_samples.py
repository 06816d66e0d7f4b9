"""The debugger on episodes trained as several samples: the turn view marks the new sample, and
replay checks each sample against full renders of its own turns."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console
from transformers import AutoTokenizer

from agentrl.debug import display
from agentrl.debug.replay import check_render, sample_views
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.config import Budgets, Sampling
from agentrl.rollout.episode import Episode
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.rollout.renders import CompactingEnv, think_stripping
from tests.rollout.scripted import GuessEnv, ScriptedEngine

BUDGETS = Budgets(
    max_turns=4,
    max_new_tokens_per_turn=32,
    max_tokens_per_episode=512,
    step_timeout_s=5,
    episode_timeout_s=20,
)
GUESS_OPENING = [{"role": "user", "content": "Guess the number."}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


THINKING = ["<think>\nsmall?\n</think>\n\n3", "<think>\nyes\n</think>\n\n7"]


def turn_by_turn(env, template, replies, row):
    """The episode, and what the turn view printed after each turn."""

    async def play():
        episode = Episode(
            env, ScriptedEngine(template.tokenizer, replies), template, row,
            group_id=0, seed=0, sampling_seed=0, budgets=BUDGETS, sampling=Sampling(),
        )  # fmt: skip
        await episode.reset()
        views = []
        while not episode.done:
            start = len(episode.trajectory.response_ids)
            await episode.commit(await episode.generate())
            console = Console(width=200, record=True, file=io.StringIO())
            console.print(
                display.turn_view(
                    template, episode.trajectory, episode.messages, BUDGETS, episode.done, start
                )
            )
            views.append(console.export_text())
        return episode.trajectory, views

    return asyncio.run(play())


def test_the_turn_view_shows_the_turns_tokens_and_marks_the_new_sample(tokenizer):
    template = ChatTemplate(think_stripping(tokenizer))
    trajectory, views = turn_by_turn(GuessEnv(attempts=2), template, THINKING, {"target": "7"})

    assert len(trajectory.samples()) == 2
    assert "new sample: history rewritten" in views[0] and "new sample" not in views[1]
    first_turn_ids = trajectory.turns[0].completion_ids
    assert all(f" {token_id} " in views[0] for token_id in first_turn_ids)  # the closed sample's tokens


@pytest.mark.parametrize("case", ["template drops reasoning", "env compacts its history"])
def test_every_sample_of_a_split_episode_matches_a_full_render_of_its_turns(tokenizer, case):
    if case == "template drops reasoning":
        template, env, replies, row, opening = (
            ChatTemplate(think_stripping(tokenizer)), GuessEnv(attempts=2), THINKING, {"target": "7"}, GUESS_OPENING,
        )  # fmt: skip
    else:
        template, env, replies, row = ChatTemplate(tokenizer), CompactingEnv(), ["1", "2", "3"], {}
        opening = CompactingEnv.OPENING
    trajectory, _ = turn_by_turn(env, template, replies, row)

    views = sample_views(opening, trajectory)
    assert len(views) == len(trajectory.samples()) == 2
    for context, sample in views:
        assert check_render(template, context, None, sample).mismatch is None
    with pytest.raises(ValueError, match="has 2 samples: check each of sample_views"):
        check_render(template, opening, None, trajectory)
