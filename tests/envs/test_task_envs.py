"""What the built-in envs share (agentrl.env.task): the step guard, the seeded task, settings errors."""

import re

import pytest

from envs.code_sandbox import CodeSandboxEnv
from envs.math import MathEnv
from envs.tool_calling import ToolCallingEnv

ENVS = {
    "math": lambda **settings: MathEnv(**settings),
    "code_sandbox": lambda **settings: CodeSandboxEnv(backend="bwrap", **settings),
    "tool_calling": lambda **settings: ToolCallingEnv(tools=["calculator"], **settings),
}
FINAL_REPLY = "No tool, no code: \\boxed{1}"  # ends an episode of each env at its first step


@pytest.mark.parametrize("name", ENVS)
def test_every_env_refuses_a_step_before_reset_and_after_the_episode_ended_in_the_same_words(name):
    env = ENVS[name]()
    refusal = re.escape(
        f"{type(env).__name__}.step called before reset or after the episode ended; call reset first"
    )
    with pytest.raises(RuntimeError, match=refusal):
        env.step(FINAL_REPLY)
    env.reset(seed=0)
    assert env.step(FINAL_REPLY)[2] is True
    with pytest.raises(RuntimeError, match=refusal):
        env.step(FINAL_REPLY)
    env.reset(seed=0)  # a new episode takes steps again
    assert env.step(FINAL_REPLY)[2] is True
    env.close()


@pytest.mark.parametrize("name", ENVS)
def test_every_env_poses_the_same_synthetic_task_for_the_same_seed_and_names_itself_in_row_errors(name):
    env = ENVS[name]()
    first, _ = env.reset(seed=11)
    assert env.reset(seed=11)[0] == first
    assert any(env.reset(seed=seed)[0] != first for seed in (12, 13, 14))
    with pytest.raises(ValueError, match=f"^{type(env).__name__}.reset options must be a dataset row"):
        env.reset(options={"prompt": "not messages"})
    env.close()


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("math", {"max_attempts": 1.5}, "max_attempts must be an integer >= 1, got 1.5"),
        ("code_sandbox", {"max_turns": 0}, "max_turns must be an integer >= 1, got 0"),
        ("code_sandbox", {"num_visible": -1}, "num_visible must be an integer >= 0, got -1"),
        (
            "code_sandbox",
            {"format_reward": "0.1"},
            "format_reward must be a finite number \\(e.g. 0.1\\), got '0.1'",
        ),
        ("tool_calling", {"max_calls_per_turn": 0}, "max_calls_per_turn must be an integer >= 1, got 0"),
    ],
)
def test_every_env_rejects_a_bad_setting_naming_it_and_its_value(name, settings, message):
    with pytest.raises(ValueError, match=message):
        ENVS[name](**settings)
