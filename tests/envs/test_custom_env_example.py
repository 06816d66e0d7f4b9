import asyncio
import warnings

import pytest
from gymnasium.utils.env_checker import check_env
from transformers import AutoTokenizer

import envs.math
from agentrl.data import generated_rows
from agentrl.env import make
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Status
from agentrl.testing import ScriptedEngine, check_env_contract, play_sync
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from examples import multiturn_env
from examples.custom_env import TimesTableEnv, generate
from examples.multiturn_env import FEEDBACK, TimesTableRetryEnv

ROW = {
    "data_source": "times_table",
    "prompt": [{"role": "user", "content": "What is 6 * 9? Put the final answer in \\boxed{}."}],
    "reward_model": {"ground_truth": "54"},
}
RETRY = [{"role": "user", "content": "Your answer is incorrect. Try again."}]


def test_the_example_generator_is_deterministic_and_asks_in_the_tiny_policys_format():
    rows = generated_rows("examples.custom_env:generate", num_rows=5, seed=1, split="train")
    assert rows == generate(5, seed=1, split="train")
    assert rows != generate(5, seed=2, split="train")
    assert rows != generate(5, seed=1, split="val")
    for row in rows:
        a, b = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split(" * ")
        assert row["prompt"][0]["content"] == f"What is {a} * {b}? Put the final answer in \\boxed{{}}."
        assert row["reward_model"]["ground_truth"] == str(int(a) * int(b))
        assert 2 <= int(a) <= 12 and 2 <= int(b) <= 12


def test_the_generator_takes_its_range_from_the_data_kwargs():
    rows = generated_rows("examples.custom_env:generate", num_rows=20, seed=0, max_factor=3)
    assert {row["reward_model"]["ground_truth"] for row in rows} <= {"4", "6", "9"}
    with pytest.raises(ValueError, match="max_factor must be >= 2, got 1"):
        generate(1, seed=0, max_factor=1)


def test_the_example_env_rewards_the_right_boxed_integer():
    env = make("examples.custom_env:TimesTableEnv")
    assert isinstance(env, TimesTableEnv)
    assert env.reset(options=ROW)[0] == ROW["prompt"]
    assert env.step("6 * 9 = 54. \\boxed{54}") == ([], 1.0, True, False, {"correct": True, "answered": 1.0})
    env.reset(options=ROW)
    assert env.step("\\boxed{56} or \\boxed{54}")[1] == 1.0  # the last boxed answer counts
    env.reset(options=ROW)
    assert env.step("\\boxed{45}") == ([], 0.0, True, False, {"correct": False, "answered": 1.0})
    env.reset(options=ROW)
    assert env.step("54") == ([], 0.0, True, False, {"correct": False, "answered": 0.0})
    env.reset(options=ROW)
    assert env.step("\\boxed{54.0}")[1] == 0.0  # not an integer


@pytest.mark.parametrize("env_id", ["times_table", "times_table_retry"])
def test_the_examples_are_registered_by_id_and_pass_gymnasiums_env_checker(env_id):
    env = make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("env", [TimesTableEnv(), TimesTableRetryEnv(), TimesTableRetryEnv(max_attempts=3)])
def test_the_examples_pass_the_env_contract_kit(env):
    check_env_contract(env, generate(num_rows=3, seed=0, split="train"))


def test_the_multi_turn_example_retries_with_the_math_envs_feedback():
    assert multiturn_env.FEEDBACK is envs.math.FEEDBACK  # one home for the text the policy knows
    episode = play_sync(TimesTableRetryEnv(), ["\\boxed{45}", "\\boxed{54}"], row=ROW)
    wrong, right = episode.steps
    assert (wrong.observation, wrong.reward, wrong.terminated, wrong.truncated) == (RETRY, 0.0, False, False)
    assert wrong.info == {"correct": False, "num_attempts": 1, "first_attempt_correct": 0.0}
    assert (right.observation, right.reward, right.terminated, right.truncated) == ([], 0.5, True, False)
    assert right.info == {"correct": True, "num_attempts": 2, "first_attempt_correct": 0.0}
    assert episode.total_reward == 0.5


def test_the_multi_turn_example_pays_one_over_the_attempt_that_answers_right():
    first = play_sync(TimesTableRetryEnv(), ["\\boxed{54}"], row=ROW)
    assert first.total_reward == 1.0 and first.done
    assert first.final_info == {"correct": True, "num_attempts": 1, "first_attempt_correct": 1.0}
    third = play_sync(
        TimesTableRetryEnv(max_attempts=3), ["\\boxed{1}", "\\boxed{2}", "\\boxed{54}"], row=ROW
    )
    assert [step.reward for step in third.steps] == [0.0, 0.0, 1 / 3]
    assert [step.observation for step in third.steps] == [RETRY, RETRY, []]
    never = play_sync(TimesTableRetryEnv(), ["\\boxed{1}", "\\boxed{2}"], row=ROW)
    assert never.done and never.total_reward == 0.0 and never.final_info["correct"] is False
    with pytest.raises(ValueError, match="max_attempts must be an integer >= 1, got 0"):
        TimesTableRetryEnv(max_attempts=0)


def test_the_multi_turn_example_masks_the_feedback_and_sums_its_step_rewards_in_the_agent_loop():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    budgets = Budgets(
        max_turns=2,
        max_new_tokens_per_turn=32,
        max_tokens_per_episode=160,
        step_timeout_s=5,
        episode_timeout_s=20,
    )
    replies = ["\\boxed{45}", "\\boxed{54}"]  # wrong, then right
    trajectory = asyncio.run(
        run_episode(
            TimesTableRetryEnv(), ScriptedEngine(tokenizer, replies), ChatTemplate(tokenizer),
            ROW, group_id=0, seed=1, sampling_seed=2, budgets=budgets, sampling=Sampling(),
        )
    )  # fmt: skip
    first, second = (
        tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in replies
    )
    feedback_ids = trajectory.turns[0].observation_ids
    assert trajectory.status is Status.COMPLETED
    assert tokenizer.decode(feedback_ids).count(FEEDBACK) == 1
    assert trajectory.response_ids == first + feedback_ids + second
    assert trajectory.loss_mask == [1] * len(first) + [0] * len(feedback_ids) + [1] * len(second)
    assert [turn.reward for turn in trajectory.turns] == [0.0, 0.5]
    assert trajectory.reward == 0.5
    assert trajectory.info == {"correct": True, "num_attempts": 2, "first_attempt_correct": 0.0}
