"""env=agent through the rollout's seam: rewards from the agent, and every way an agent fails, typed."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from agentrl.env.registry import make
from agentrl.rollout.agent_loop import run_episode_with_retries
from agentrl.rollout.config import Sampling
from agentrl.rollout.trajectory import Status
from tests.gateway.conftest import AGENT_ENV, BUDGETS
from tests.rollout.scripted import ScriptedEngine

ROW = {"prompt": [{"role": "user", "content": "Say 7."}], "reward_model": {"ground_truth": "7"}}


async def episode(tokenizer, template, agent, budgets=BUDGETS, retries=0, **kwargs):
    engine = ScriptedEngine(tokenizer, ["7"], fail_on_call=kwargs.pop("fail_on_call", None))
    return await run_episode_with_retries(
        functools.partial(make, AGENT_ENV, agent=f"tests.gateway.agents:{agent}", **kwargs), retries,
        engine=engine, template=template, row=ROW, group_id=3, seed=1, sampling_seed=2, budgets=budgets,
        sampling=Sampling(),
    )  # fmt: skip


@pytest.mark.parametrize("agent", ["answers", "answers_async"])
async def test_the_reward_is_what_the_agent_returns(tokenizer, template, agent):
    trajectory = await episode(tokenizer, template, agent)
    assert (trajectory.status, trajectory.reward, trajectory.group_id) == (Status.COMPLETED, 1.0, 3)
    assert trajectory.loss_mask == [1, 1] and trajectory.turns[0].action_text == "7"


async def test_a_reward_posted_to_the_session_counts_when_the_agent_returns_none(tokenizer, template):
    trajectory = await episode(tokenizer, template, "posts_reward")
    assert (trajectory.status, trajectory.reward) == (Status.COMPLETED, 0.5)


async def test_an_agent_run_as_a_subprocess_reports_its_reward_through_the_session(tokenizer, template):
    trajectory = await episode(tokenizer, template, "answers", subprocess=True)
    assert (trajectory.status, trajectory.reward) == (Status.COMPLETED, 1.0)


@pytest.mark.parametrize(
    ("agent", "kwargs", "error"),
    [
        ("raises", {}, 'the agent raised KeyError: "the agent\'s own bug"'),
        ("never_calls", {}, "the agent never called the model at its base_url"),
        ("gives_no_reward", {}, "the agent gave no reward"),
        ("raises", {"subprocess": True}, 'KeyError: "the agent\'s own bug"'),
    ],
)
async def test_a_failing_agent_is_an_agent_error_excluded_from_training_never_a_zero(
    tokenizer, template, agent, kwargs, error
):
    trajectory = await episode(tokenizer, template, agent, **kwargs)
    assert trajectory.status is Status.AGENT_ERROR and trajectory.status.is_error
    assert error in trajectory.error


async def test_no_reward_is_left_to_the_reward_functions_when_asked(tokenizer, template):
    trajectory = await episode(tokenizer, template, "gives_no_reward", reward_from_functions=True)
    assert (trajectory.status, trajectory.reward, len(trajectory.turns)) == (Status.COMPLETED, 0.0, 1)


async def test_an_agent_past_the_episode_timeout_is_truncated_time(tokenizer, template):
    trajectory = await episode(tokenizer, template, "hangs", budgets=replace(BUDGETS, episode_timeout_s=2))
    assert trajectory.status is Status.TRUNCATED_TIME
    assert trajectory.loss_mask == [1, 1]  # what it sampled before it hung is kept


async def test_an_agent_that_runs_past_the_turn_budget_ends_truncated_turns(tokenizer, template):
    trajectory = await episode(tokenizer, template, "loops_forever")
    assert (trajectory.status, len(trajectory.turns)) == (Status.TRUNCATED_TURNS, BUDGETS.max_turns)


async def test_a_call_that_does_not_extend_the_episode_starts_a_new_sample_and_says_why(tokenizer, template):
    trajectory = await episode(tokenizer, template, "rewrites_history")
    assert (trajectory.status, trajectory.reward, len(trajectory.earlier_segments)) == (
        Status.COMPLETED,
        1.0,
        1,
    )
    assert trajectory.info["gateway/num_samples"] == 2
    assert trajectory.info["gateway/new_samples"] == [
        "message 1: an assistant turn sent back altered (trimmed or re-serialised)"
    ]


async def test_an_engine_failure_is_an_engine_error_and_retried(tokenizer, template):
    failed = await episode(tokenizer, template, "answers", fail_on_call=1)
    assert (failed.status, failed.error) == (Status.ENGINE_ERROR, "engine: RuntimeError: engine exploded")
    retried = await episode(tokenizer, template, "answers", retries=1, fail_on_call=1)
    assert (retried.status, retried.reward, retried.num_infra_retries) == (Status.COMPLETED, 1.0, 1)


def test_a_bad_agent_reference_fails_when_the_env_is_built():
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        make(AGENT_ENV, agent="tests.gateway.agents:nope")
