"""TRL- and verl-style reward functions set episode rewards; failures are env errors, not crashes."""

import copy
import sys
import textwrap
import warnings

import pytest

from agentrl.algorithms.advantages import compute_advantages
from agentrl.algorithms.config import AlgorithmConfig
from agentrl.rewards import RewardConfig, RewardFunctions, completion_messages, num_turns, solution_text
from agentrl.rewards.config import CustomRewardFunction
from agentrl.rollout.trajectory import Status, Trajectory, Turn
from agentrl.trainer.loop import _group_tensors

ROWS = {
    0: {
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"ground_truth": "2"},
        "data_source": "a",
    },
    1: {
        "prompt": [{"role": "user", "content": "2+2?"}],
        "reward_model": {"ground_truth": "4"},
        "data_source": "b",
    },
}


def trajectory(group_id, *texts, observation=(), status=Status.COMPLETED, policy_version=0):
    """Each turn samples [7, 8]; every reply but the last enters the response as [9] (mask 0)."""
    turns, response_ids, loss_mask = [], [], []
    for index, text in enumerate(texts):
        last = index == len(texts) - 1
        observation_ids = [] if last or not observation else [9]
        turns.append(Turn(text, [7, 8], list(observation), observation_ids, 0.5, "stop"))
        response_ids += [7, 8, *observation_ids]
        loss_mask += [1, 1] + [0] * len(observation_ids)
    return Trajectory(
        group_id, [1], response_ids=response_ids, loss_mask=loss_mask, turns=turns, reward=0.5,
        status=status, policy_version=policy_version,
    )  # fmt: skip


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def exact(completions, reward_model, **kwargs):
                return [float(c[-1]["content"] == r["ground_truth"]) for c, r in zip(completions, reward_model)]

            def only_b(completions, data_source, **kwargs):
                return [1.0 if source == "b" else None for source in data_source]

            def never(completions, **kwargs):
                return [None] * len(completions)

            def picky(completions, **kwargs):
                if any(c[-1]["content"] == "boom" for c in completions):
                    raise KeyError("boom")
                return [1.0] * len(completions)

            def seen(prompts, completions, completion_ids, **kwargs):
                seen.calls.append((prompts, completions, completion_ids, sorted(kwargs)))
                return [0.0] * len(completions)
            seen.calls = []

            def number_or_skip(completions, **kwargs):
                return [None if c[-1]["content"] == "skip" else float(c[-1]["content"]) for c in completions]

            def progress(completions, trainer_state, log_metric, log_extra, **kwargs):
                if any(c[-1]["content"] == "boom" for c in completions):
                    log_extra("why", ["a failed batch logs nothing"] * len(completions))
                    raise KeyError("boom")
                log_metric("progress/calls", len(completions))
                log_extra("why", [f"step {trainer_state.global_step}" for _ in completions])
                return [trainer_state.global_step / trainer_state.max_steps] * len(completions)

            async def async_length(completions, **kwargs):
                if any(c[-1]["content"] == "boom" for c in completions):
                    raise KeyError("boom")
                return [float(len(c[-1]["content"])) for c in completions]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_rewards", None)


def apply(trajectories, max_steps=0, **config):
    return RewardFunctions.from_config(RewardConfig(**config), max_steps).apply(trajectories, ROWS)


def test_weighted_sum_leaves_out_none_as_trl_nansum_does(reward_module):
    trajectories = [trajectory(0, "2"), trajectory(1, "5")]
    metrics = apply(trajectories, funcs=["my_rewards:exact", "my_rewards:only_b"], weights=[1.0, 0.25])
    assert [t.reward for t in trajectories] == [1.0, 0.25]
    assert metrics == {
        "reward/exact/mean": 0.5,
        "reward/exact/std": 0.5,
        "reward/only_b/mean": 1.0,
        "reward/only_b/std": 0.0,
    }
    assert trajectories[0].info["env_reward"] == 0.5


def test_a_sample_where_every_function_returns_none_is_marked_missing_with_one_warning(reward_module):
    functions = RewardFunctions.from_config(RewardConfig(funcs=["my_rewards:never"]))
    trajectories = [trajectory(0, "x"), trajectory(1, "y")]
    with pytest.warns(UserWarning, match="every reward function returned None.*left out of its group"):
        functions.apply(trajectories, ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        functions.apply([trajectory(0, "z")], ROWS)
    assert [(t.reward, t.reward_missing) for t in trajectories] == [(0.0, True), (0.0, True)]


def test_an_unscorable_sample_is_left_out_of_its_group_baseline_and_gets_advantage_zero(reward_module):
    # TRL 1.7 marks such a sample NaN: out of the group mean, advantage 0.
    trajectories = [trajectory(0, "1"), trajectory(0, "0"), trajectory(0, "skip")]
    with pytest.warns(UserWarning, match="every reward function returned None"):
        apply(trajectories, funcs=["my_rewards:number_or_skip"])
    config = AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=False)
    advantages = compute_advantages(config, *_group_tensors(trajectories))
    assert advantages.tolist() == [0.5, -0.5, 0.0]
    assert [t.reward_missing for t in trajectories] == [False, False, True]


def test_a_raising_function_is_an_env_error_for_the_samples_it_fails_on(reward_module):
    trajectories = [trajectory(0, "fine"), trajectory(1, "boom")]
    metrics = apply(trajectories, funcs=["my_rewards:picky"])
    assert [t.status for t in trajectories] == [Status.COMPLETED, Status.ENV_ERROR]
    assert trajectories[1].error == "reward function picky raised KeyError: 'boom'"
    assert (trajectories[0].reward, metrics["reward/picky/mean"]) == (1.0, 1.0)


def test_a_function_returning_the_wrong_length_is_an_env_error_naming_it(reward_module, tmp_path):
    (tmp_path / "bad_rewards.py").write_text("def short(completions, **kwargs):\n    return []\n")
    trajectories = [trajectory(0, "2")]
    apply(trajectories, funcs=["bad_rewards:short"])
    assert trajectories[0].status is Status.ENV_ERROR
    assert trajectories[0].error == (
        "reward function short raised ValueError: must return a list of 1 floats or None, got 0 values"
    )


def test_functions_receive_trl_arguments_and_row_columns(reward_module):
    import my_rewards

    apply(
        [trajectory(0, "call", "2", observation=[{"role": "tool", "content": "2"}])],
        funcs=["my_rewards:seen"],
    )
    prompts, completions, completion_ids, keywords = my_rewards.seen.calls[-1]
    assert prompts == [ROWS[0]["prompt"]]
    assert completions == [
        [
            {"role": "assistant", "content": "call"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "2"},
            {"role": "tool", "content": "2"},
        ]
    ]
    assert completion_ids == [[7, 8, 9, 7, 8]]  # as TRL's: the model's and the tool reply's tokens
    assert keywords == ["data_source", "log_extra", "log_metric", "reward_model", "trainer_state"]


def test_functions_get_trainer_state_and_log_metrics_and_extras_as_trl_passes_them(reward_module):
    trajectories = [trajectory(0, "a", policy_version=3), trajectory(1, "boom", policy_version=3)]
    metrics = apply(trajectories, max_steps=4, funcs=["my_rewards:progress"])
    assert [t.status for t in trajectories] == [Status.COMPLETED, Status.ENV_ERROR]
    assert trajectories[0].reward == 0.75
    assert trajectories[0].info["reward_extra"] == {"why": "step 3"}
    assert "reward_extra" not in trajectories[1].info  # the failed calls' logs are dropped
    assert metrics["progress/calls"] == 1.0  # only the call that succeeded (the retry of sample 0)


def test_async_trl_functions_are_awaited_and_a_failing_sample_is_found(reward_module):
    trajectories = [trajectory(0, "abc"), trajectory(1, "boom"), trajectory(1, "hello")]
    metrics = apply(trajectories, funcs=["my_rewards:async_length"])
    assert [t.status for t in trajectories] == [Status.COMPLETED, Status.ENV_ERROR, Status.COMPLETED]
    assert (trajectories[0].reward, trajectories[2].reward) == (3.0, 5.0)
    assert trajectories[1].error == "reward function async_length raised KeyError: 'boom'"
    assert metrics["reward/async_length/mean"] == 4.0


def test_error_trajectories_are_not_scored(reward_module):
    failed = trajectory(0, "2", status=Status.ENGINE_ERROR)
    assert apply([failed], funcs=["my_rewards:exact"]) == {}
    assert failed.reward == 0.5


def test_a_verl_compute_score_file_is_called_with_verl_arguments(tmp_path):
    path = tmp_path / "verl_score.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if data_source == 'b':\n"
        "        raise RuntimeError('no scorer for b')\n"
        "    return {'score': float(solution_str.endswith(ground_truth))}\n"
    )
    trajectories = [trajectory(0, "so 2"), trajectory(1, "4")]
    custom = CustomRewardFunction(path=str(path), name="compute_score")
    metrics = apply(trajectories, custom_reward_function=custom)
    assert (trajectories[0].reward, trajectories[1].status) == (1.0, Status.ENV_ERROR)
    assert trajectories[1].error == "reward function compute_score raised RuntimeError: no scorer for b"
    assert metrics == {"reward/compute_score/mean": 1.0, "reward/compute_score/std": 0.0}


def test_an_async_verl_compute_score_gets_reward_kwargs_and_the_agent_loops_extra_info(tmp_path):
    path = tmp_path / "verl_async.py"
    path.write_text(
        "seen = []\n"
        "async def compute_score(data_source, solution_str, ground_truth, extra_info, scale=1.0):\n"
        "    seen.append(extra_info)\n"
        "    return {'score': scale * extra_info['num_turns']}\n"
    )
    rows = {0: {**ROWS[0], "extra_info": {"index": 5}}}
    reply = [{"role": "user", "content": "try again"}]
    trajectories = [trajectory(0, "1", "2", observation=reply), trajectory(0, "2")]
    custom = CustomRewardFunction(path=str(path), reward_kwargs={"scale": 0.5})
    functions = RewardFunctions.from_config(RewardConfig(custom_reward_function=custom))
    original = copy.deepcopy(rows)
    functions.apply(trajectories, rows)
    assert [t.reward for t in trajectories] == [2.0, 1.0]  # verl's num_turns: 4 and 2, times scale
    seen = sys.modules["agentrl_custom_reward_verl_async"].seen
    assert seen[0] == {
        "index": 5,
        "raw_prompt": ROWS[0]["prompt"],
        "turn_scores": [0.5, 0.5],
        "num_turns": 4,
        "rollout_reward_scores": {},
    }
    assert rows == original  # the dataset row is not changed


def test_the_multi_turn_solution_string_joins_turns_and_replies():
    episode = trajectory(0, "call", "\\boxed{2}", observation=[{"role": "tool", "content": "2"}])
    assert solution_text(episode) == "call\n2\n\\boxed{2}\n2"
    assert completion_messages(trajectory(0, "hi")) == [{"role": "assistant", "content": "hi"}]
    assert (num_turns(episode), num_turns(trajectory(0, "hi"))) == (4, 2)


def test_the_example_files_score_math_replies():
    trajectories = [trajectory(0, "1 + 1 = 2. \\boxed{2}"), trajectory(1, "I am not sure.")]
    metrics = apply(
        trajectories, funcs=["examples.trl_reward:correct_answer", "examples.trl_reward:short_working"],
        weights=[1.0, 0.2],
    )  # fmt: skip
    assert [t.reward for t in trajectories] == [1.0 + 0.2 * (1 - 2 / 48), 0.0]
    assert metrics["reward/short_working/mean"] == 1 - 2 / 48
    verl = [trajectory(0, "\\boxed{2}"), trajectory(1, "\\boxed{5}"), trajectory(1, "no answer")]
    apply(verl, custom_reward_function={"path": "examples/verl_reward.py", "name": "compute_score"})
    assert [t.reward for t in verl] == [1.0, 0.1, 0.0]


def test_config_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="reward.weights has 1 values for 2 reward.funcs"):
        RewardConfig(funcs=["a:b", "c:d"], weights=[1.0])
    with pytest.raises(ValueError, match="not both"):
        RewardConfig(funcs=["a:b"], custom_reward_function={"path": "x.py"})
    with pytest.raises(ValueError, match="no such file"):
        RewardFunctions.from_config(RewardConfig(custom_reward_function={"path": str(tmp_path / "none.py")}))
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        RewardFunctions.from_config(RewardConfig(funcs=["examples.trl_reward:nothing"]))


def test_without_functions_the_env_reward_stands():
    episode = trajectory(0, "2")
    assert RewardFunctions.from_config(RewardConfig()).apply([episode], ROWS) == {}
    assert episode.reward == 0.5
