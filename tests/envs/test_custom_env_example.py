import warnings

from gymnasium.utils.env_checker import check_env

from agentrl.data import generated_rows
from agentrl.env import make
from agentrl.testing import check_env_contract
from examples.custom_env import WordArithmeticEnv, generate


def test_the_example_generator_is_deterministic_and_yields_valid_rows():
    rows = generated_rows("examples.custom_env:generate", num_rows=5, seed=1, split="train")
    assert rows == generate(5, seed=1, split="train")
    assert rows != generate(5, seed=2, split="train")
    assert all(row["prompt"][0]["content"].endswith("Put the final answer in \\boxed{}.") for row in rows)


def test_the_example_env_rewards_the_right_boxed_integer():
    row = {
        "data_source": "word_arithmetic",
        "prompt": [{"role": "user", "content": "Subtract 9 from 4. Put the final answer in \\boxed{}."}],
        "reward_model": {"ground_truth": "-5"},
    }
    env = make("examples.custom_env:WordArithmeticEnv")
    assert isinstance(env, WordArithmeticEnv)
    assert env.reset(options=row)[0] == row["prompt"]
    assert env.step("4 - 9 = \\boxed{-5}") == (
        [],
        1.0,
        True,
        False,
        {"correct": True, "extracted_answer": "-5"},
    )
    env.reset(options=row)
    assert env.step("\\boxed{5}")[1] == 0.0


def test_the_example_env_is_registered_by_id_and_passes_gymnasiums_env_checker():
    env = make("word_arithmetic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_the_example_env_passes_the_env_contract_kit():
    env = WordArithmeticEnv()
    check_env_contract(env, generate(num_rows=3, seed=0, split="train"))
