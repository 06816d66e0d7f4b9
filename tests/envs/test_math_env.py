import warnings

import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.env import make
from envs.math import FEEDBACK, MathEnv

ROW = {
    "data_source": "hand_written",
    "prompt": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is half of one? Put the final answer in \\boxed{}."},
    ],
    "reward_model": {"style": "rule", "ground_truth": "0.5"},
}


def test_reset_opens_with_a_copy_of_the_rows_prompt():
    env = MathEnv()
    messages, info = env.reset(options=ROW)
    assert messages == ROW["prompt"]
    assert messages[0] is not ROW["prompt"][0]
    assert info == {"ground_truth": "0.5"}


def test_a_single_attempt_episode_ends_after_one_reply_with_its_reward_and_answer():
    env = MathEnv()
    env.reset(options=ROW)
    assert env.step("Half is \\boxed{\\frac{1}{2}}.") == (
        [],
        1.0,
        True,
        False,
        {"correct": True, "extracted_answer": "\\frac{1}{2}", "verdict": "correct", "num_attempts": 1},
    )
    env.reset(options=ROW)
    assert env.step("I think 0.5") == (
        [],
        0.0,
        True,
        False,
        {"correct": False, "extracted_answer": None, "verdict": None, "num_attempts": 1},
    )


def test_a_wrong_answer_gets_feedback_and_another_attempt_until_correct():
    env = MathEnv(max_attempts=3, format_reward=0.1)
    env.reset(options=ROW)
    observation, reward, terminated, truncated, info = env.step("\\boxed{2}")
    assert observation == [{"role": "user", "content": "Your answer is incorrect. Try again."}]
    assert observation[0]["content"] == FEEDBACK
    assert (reward, terminated, truncated, info["correct"], info["num_attempts"]) == (
        0.1,
        False,
        False,
        False,
        1,
    )
    observation, reward, terminated, truncated, info = env.step("\\boxed{1/2}")
    assert (observation, reward, terminated, truncated, info["correct"]) == ([], 1.1, True, False, True)
    assert info["num_attempts"] == 2


def test_the_episode_terminates_when_the_attempts_are_used_up():
    env = MathEnv(max_attempts=2)
    env.reset(options=ROW)
    assert env.step("\\boxed{1}")[:4] == ([{"role": "user", "content": FEEDBACK}], 0.0, False, False)
    assert env.step("\\boxed{2}")[:4] == ([], 0.0, True, False)
    with pytest.raises(RuntimeError, match="call reset first"):
        env.step("\\boxed{0.5}")


async def test_the_async_api_grades_replies_from_inside_an_event_loop():
    env = MathEnv(max_attempts=2)
    await env.areset(options=ROW)
    observation, reward, terminated, _, _ = await env.astep("\\boxed{3}")
    assert (observation[0]["content"], reward, terminated) == (FEEDBACK, 0.0, False)
    observation, reward, terminated, _, info = await env.astep("\\boxed{.5}")
    assert (observation, reward, terminated, info["extracted_answer"]) == ([], 1.0, True, ".5")


def test_without_a_row_reset_draws_the_same_synthetic_task_for_the_same_seed():
    env = MathEnv(synthetic_difficulty=2)
    first, info = env.reset(seed=7)
    assert env.reset(seed=7)[0] == first
    assert env.reset(seed=8)[0] != first
    assert first[0]["content"].endswith("Put the final answer in \\boxed{}.")
    env.reset(seed=7)
    assert env.step(f"\\boxed{{{info['ground_truth']}}}")[1] == 1.0


def test_the_multi_attempt_math_env_passes_gymnasiums_env_checker():
    env = make("math", max_attempts=2, format_reward=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "What is 2+2?", "reward_model": {"ground_truth": "4"}}, "got str"),
        ({"prompt": [{"role": "user", "content": "2+2?"}]}, "reward_model=None"),
        (
            {"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"style": "rule"}},
            "ground_truth",
        ),
    ],
)
def test_reset_rejects_a_row_without_prompt_messages_or_ground_truth(row, message):
    with pytest.raises(ValueError, match=message):
        MathEnv().reset(options=row)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1, got 0"),
        ({"format_reward": float("nan")}, "format_reward must be a finite number"),
        ({"synthetic_difficulty": 4}, "synthetic_difficulty must be 1..3, got 4"),
    ],
)
def test_invalid_settings_are_rejected_with_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MathEnv(**kwargs)


def test_math_env_passes_the_env_contract_and_resists_answer_probes():
    from agentrl.env import make
    from agentrl.testing import answer_probes, check_env_contract, find_reward_hacks
    from envs.math.synthetic import generate as generate_rows

    env = make("math")
    rows = generate_rows(3, difficulty=1, seed=0)
    check_env_contract(env, rows)
    for row in rows:
        assert find_reward_hacks(env, row, answer_probes(row["reward_model"]["ground_truth"])) == []
