from __future__ import annotations

import asyncio

from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode
from agentrl.rollout.groups import rollout_groups
from agentrl.rollout.trajectory import Status
from tests.rollout.scripted import LOGPROB, GuessEnv, ScriptedEngine

BUDGETS = Budgets(
    max_turns=4,
    max_new_tokens_per_turn=16,
    max_tokens_per_episode=512,
    step_timeout_s=5,
    episode_timeout_s=20,
)


def episode(env, engine, template, budgets=BUDGETS, target="7"):
    return asyncio.run(
        run_episode(
            env, engine, template, {"target": target},
            group_id=0, seed=1, sampling_seed=2, budgets=budgets, sampling=Sampling(),
        )
    )  # fmt: skip


def test_multi_turn_tokens_are_the_sampled_tokens_plus_masked_template_deltas(tokenizer, template):
    engine = ScriptedEngine(tokenizer, ["3", "7"])
    trajectory = episode(GuessEnv(), engine, template)

    first, second = (tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in "37")
    conversation = [
        {"role": "user", "content": "Guess the number."},
        {"role": "assistant", "content": "3"},
        {"role": "user", "content": "Wrong, try again."},
    ]
    expected_context = tokenizer.encode(
        tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    observation_ids = trajectory.turns[0].observation_ids
    assert trajectory.status is Status.COMPLETED
    assert trajectory.reward == 1.0
    assert trajectory.response_ids == first + observation_ids + second
    assert trajectory.loss_mask == [1] * len(first) + [0] * len(observation_ids) + [1] * len(second)
    assert trajectory.rollout_logprobs == [LOGPROB] * len(first) + [0.0] * len(observation_ids) + [
        LOGPROB
    ] * len(second)
    # What the engine saw for turn two is exactly the canonical rendering of the conversation.
    assert engine.calls[1] == expected_context == trajectory.prompt_ids + first + observation_ids
    assert trajectory.num_template_mismatches == 0
    assert trajectory.policy_version == 3


def test_the_turn_budget_truncates_with_its_own_status(tokenizer, template):
    trajectory = episode(GuessEnv(attempts=10), ScriptedEngine(tokenizer, ["1"]), template)
    assert trajectory.status is Status.TRUNCATED_TURNS
    assert len(trajectory.turns) == 4
    assert trajectory.loss_mask[-1] == 1  # the dangling last observation is not kept


def test_the_episode_token_budget_truncates(tokenizer, template):
    prompt_length = len(template.prompt_ids([{"role": "user", "content": "Guess the number."}], None))
    budgets = Budgets(4, 16, prompt_length + 3, 5, 20)
    trajectory = episode(GuessEnv(), ScriptedEngine(tokenizer, ["123456789"]), template, budgets)
    assert trajectory.status is Status.TRUNCATED_TOKENS
    assert len(trajectory.prompt_ids) + len(trajectory.response_ids) == prompt_length + 3


def test_a_slow_env_step_truncates_by_time(tokenizer, template):
    budgets = Budgets(4, 16, 512, step_timeout_s=0.2, episode_timeout_s=20)
    trajectory = episode(GuessEnv(step_sleep_s=1.0), ScriptedEngine(tokenizer, ["7"]), template, budgets)
    assert trajectory.status is Status.TRUNCATED_TIME
    assert "step_timeout_s" in trajectory.info["truncation"]


def test_the_episode_timeout_keeps_the_turns_completed_so_far(tokenizer, template):
    budgets = Budgets(10, 16, 512, step_timeout_s=5, episode_timeout_s=0.5)
    trajectory = episode(
        GuessEnv(attempts=10, step_sleep_s=0.2), ScriptedEngine(tokenizer, ["1"]), template, budgets
    )
    assert trajectory.status is Status.TRUNCATED_TIME
    assert 1 <= len(trajectory.turns) < 10
    assert len(trajectory.response_ids) == len(trajectory.loss_mask) == len(trajectory.rollout_logprobs)


def test_an_engine_failure_is_an_engine_error_trajectory(tokenizer, template):
    trajectory = episode(GuessEnv(), ScriptedEngine(tokenizer, ["3"], fail_on_call=2), template)
    assert trajectory.status is Status.ENGINE_ERROR
    assert "engine exploded" in trajectory.error
    assert len(trajectory.turns) == 1


def test_an_env_that_raises_on_one_member_of_a_group_does_not_stop_the_others(tokenizer, template):
    made = []

    def make_env():
        made.append(GuessEnv(raise_on_step=len(made) == 1))
        return made[-1]

    trajectories = asyncio.run(
        rollout_groups(
            [{"target": "7"}], [5], make_env, ScriptedEngine(tokenizer, ["7"]), template,
            n=3, seed=10, sampling_seed=0, budgets=BUDGETS, sampling=Sampling(),
        )
    )  # fmt: skip
    assert [t.status for t in trajectories] == [Status.COMPLETED, Status.ENV_ERROR, Status.COMPLETED]
    assert "broken env" in trajectories[1].error
    assert [t.group_id for t in trajectories] == [5, 5, 5]
