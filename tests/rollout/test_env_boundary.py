"""Whatever an env does wrong at the boundary becomes a typed trajectory status, never a crash."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.env.base import TextEnv
from agentrl.env.errors import InfraError
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode, run_episode_with_retries
from agentrl.rollout.trajectory import Status
from tests.rollout.scripted import ScriptedEngine

BUDGETS = Budgets(max_turns=2, max_new_tokens_per_turn=8, max_tokens_per_episode=256, step_timeout_s=0.3,
                  episode_timeout_s=10)  # fmt: skip


class BoundaryEnv(TextEnv):
    """Answers each step with whatever `step_return` says; `reset_sleep_s` makes reset slow."""

    def __init__(
        self, step_return=None, reset_sleep_s: float = 0.0, step_raises: Exception | None = None
    ) -> None:
        super().__init__()
        self.step_return, self.reset_sleep_s, self.step_raises = step_return, reset_sleep_s, step_raises

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(self.reset_sleep_s)
        return [{"role": "user", "content": "Say something."}], {}

    def step(self, action):
        if self.step_raises is not None:
            raise self.step_raises
        return self.step_return


def run(env: TextEnv, tokenizer, template):
    engine = ScriptedEngine(tokenizer, ["hi"])
    return asyncio.run(
        run_episode(
            env,
            engine,
            template,
            {},
            group_id=0,
            seed=0,
            sampling_seed=0,
            budgets=BUDGETS,
            sampling=Sampling(),
        )
    )


def test_a_reset_slower_than_the_step_timeout_is_an_env_error_with_no_tokens(tokenizer, template):
    trajectory = run(BoundaryEnv(reset_sleep_s=1.0), tokenizer, template)
    assert trajectory.status is Status.ENV_ERROR
    assert trajectory.error == "env reset exceeded step_timeout_s=0.3"
    assert trajectory.prompt_ids == [] and trajectory.response_ids == []


@pytest.mark.parametrize(("step_return", "problem"), [
    ("You are wrong.", "step must return (observation, reward, terminated, truncated, info), got str"),
    (([], None, True, False, {}), "step's reward must be a finite number, got None"),
    (([], float("nan"), True, False, {}), "step's reward must be a finite number, got nan"),
    (("oops", 1.0, True, False, {}), "step's observation must be a list of {'role', 'content'} messages, got str"),
    (([{"role": "user", "content": 3}], 1.0, False, False, {}), "step's observation message 0 must have a str 'content', got int"),
    (([{"role": "robot", "content": "x"}], 1.0, False, False, {}), "step's observation message 0 has role 'robot'"),
    (([], 1.0, "yes", False, {}), "step's terminated must be a bool, got 'yes'"),
    (([], 1.0, True, False, None), "step's info must be a dict, got NoneType"),
])  # fmt: skip
def test_a_malformed_step_return_is_an_env_error_naming_the_problem(
    tokenizer, template, step_return, problem
):
    trajectory = run(BoundaryEnv(step_return), tokenizer, template)
    assert trajectory.status is Status.ENV_ERROR
    assert trajectory.error.startswith("env step returned a malformed value: " + problem)


def test_an_infra_error_is_a_sandbox_error_and_is_retried_with_the_same_task(tokenizer, template):
    built = []

    def make_env():
        built.append(BoundaryEnv(step_raises=InfraError("sandbox down")))
        return built[-1]

    trajectory = asyncio.run(
        run_episode_with_retries(
            make_env, 2, engine=ScriptedEngine(tokenizer, ["hi"]), template=template, row={}, group_id=5, seed=0,
            sampling_seed=0, budgets=BUDGETS, sampling=Sampling(),
        )
    )  # fmt: skip
    assert trajectory.status is Status.SANDBOX_ERROR
    assert trajectory.error == "env step: infrastructure failed: sandbox down"
    assert trajectory.num_infra_retries == 2 and len(built) == 3 and trajectory.group_id == 5


def test_a_chat_template_that_rejects_the_envs_messages_is_an_env_error(tokenizer, template):
    env = BoundaryEnv(([{"role": "tool", "content": "x"}], 0.0, False, False, {}))
    original = template.prompt_ids

    def broken(messages, tools):
        if any(message["role"] == "tool" for message in messages):
            raise TypeError("template cannot render a tool message here")
        return original(messages, tools)

    template.prompt_ids = broken
    try:
        trajectory = run(env, tokenizer, template)
    finally:
        template.prompt_ids = original
    assert trajectory.status is Status.ENV_ERROR
    assert "chat template failed on the env's messages: TypeError" in trajectory.error


HANGING_RUN = """
import asyncio, time
from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import Budgets, Sampling, run_episode
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from transformers import AutoTokenizer
from tests.rollout.scripted import ScriptedEngine

class Hangs(TextEnv):
    def __init__(self, hang):
        super().__init__()
        self.hang = hang
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "go"}], {}
    def step(self, action):
        if self.hang:
            time.sleep(3600)
        return [], 1.0, True, False, {}

async def main():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    template, engine = ChatTemplate(tokenizer), ScriptedEngine(tokenizer, ["hi"])
    budgets = Budgets(1, 8, 256, step_timeout_s=0.2, episode_timeout_s=5)
    def episode(hang):
        return run_episode(Hangs(hang), engine, template, {}, group_id=0, seed=0, sampling_seed=0,
                           budgets=budgets, sampling=Sampling())
    hung = await asyncio.gather(*(episode(True) for _ in range(32)))
    healthy = await asyncio.gather(*(episode(False) for _ in range(8)))
    print(sorted({t.status.value for t in hung}), sorted({t.status.value for t in healthy}))

asyncio.run(main())
"""


def test_hanging_sync_envs_do_not_starve_later_episodes_or_keep_the_process_alive():
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", HANGING_RUN], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['truncated_time'] ['completed']"
    assert time.monotonic() - started < 30  # the 32 hung threads did not keep the process alive
