"""The terminal env: tools in a session, hidden tests for the reward, Harbor folders, sandbox failures as InfraError."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from agentrl.env import InfraError, make
from agentrl.testing import check_env_contract
from envs.terminal.harbor import generate as harbor_rows
from envs.terminal.harbor import load_task
from envs.terminal.synthetic import FAMILIES, generate, make_tasks, solved_conversations, solved_messages
from envs.terminal.task import map_paths, prompt_text
from envs.tiny_policy.terminal_tasks import mistaken_steps

HARBOR_DIR = Path(__file__).parents[3] / "examples" / "harbor_tasks"


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def env(request):
    env = make("terminal", backend=request.param, num_warm=1, max_sessions=4, max_turns=4)
    yield env
    env.close()


def harbor_row() -> dict:
    return harbor_rows(1, seed=0, task_dir=str(HARBOR_DIR))[0]


def test_the_env_passes_the_contract(env):
    check_env_contract(env, generate(2, seed=5))


def replay(env, task, messages: list[dict]) -> float:
    """Step `env` through an example episode's calls, checking each tool message; its reward."""
    row = {
        "data_source": "t",
        "prompt": [messages[0]],
        "reward_model": {"ground_truth": task.model_dump_json()},
    }
    env.reset(seed=0, options=row)
    for assistant, tool in zip(messages[1:-1:2], messages[2:-1:2], strict=True):
        function = assistant["tool_calls"][0]["function"]
        observation = env.step(call(function["name"], function["arguments"]))[0]
        assert observation == [{"role": "tool", "content": tool["content"], "name": tool["name"]}]
    _, reward, terminated, truncated, _ = env.step(messages[-1]["content"])
    assert (terminated, truncated) == (True, False)
    return reward


def test_the_solved_conversations_replay_exactly_in_the_env(env):
    conversations = solved_conversations(5, seed=0)
    for conversation, item in zip(conversations, make_tasks(5, 0, "sft"), strict=True):
        assert replay(env, item.task, conversation["messages"]) == 1.0
    assert conversation["tools"] == env.tools


def test_the_tiny_policys_mistaken_episodes_replay_exactly_and_fail_every_family(env):
    rng = random.Random(0)
    for family, make_task in FAMILIES.items():
        item = make_task(rng)
        messages = solved_messages(item.task, mistaken_steps(item, rng))
        assert replay(env, item.task, messages) == 0.0, family


def test_the_harbor_example_scores_one_when_solved_and_zero_when_not(env):
    env.reset(seed=0, options=harbor_row())
    env.step(call("bash", {"command": "wc -w < poem.txt > out/count.txt && tac poem.txt > out/reversed.txt"}))
    assert env.step("Done.")[1:3] == (1.0, True)
    env.reset(seed=0, options=harbor_row())
    assert env.step("Done.")[1:3] == (0.0, True)


def test_the_tests_are_hidden_and_a_planted_reward_does_not_count(env):
    env.reset(seed=0, options=harbor_row())
    planted = "mkdir -p /tmp/harbor/logs/verifier && echo 1 > /tmp/harbor/logs/verifier/reward.txt; ls /tmp/harbor/tests"
    observation = env.step(call("bash", {"command": planted}))[0][0]["content"]
    assert "No such file or directory" in observation
    assert env.step("Done.")[1] == 0.0


def test_the_last_turn_runs_the_tests_and_truncates(env):
    env.reset(seed=0, options=harbor_row())
    for _ in range(3):
        assert env.step(call("bash", {"command": "true"}))[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step(call("bash", {"command": "true"}))
    assert (reward, terminated, truncated, info["tests_exit_code"]) == (0.0, False, True, 0)


def test_long_output_is_truncated_with_a_note_and_bad_calls_are_explained(env):
    env.reset(seed=0, options=harbor_row())
    observation = env.step(call("bash", {"command": "seq 1 3000"}))[0][0]["content"]
    assert observation.endswith("[output truncated: 11893 more characters not shown]")
    messages = env.step(call("rm", {"path": "x"}) + call("read_file", {"name": "x"}))[0]
    assert [message["content"] for message in messages] == [
        "Error: unknown tool 'rm'; the tools are: bash, write_file, read_file.",
        "Error: invalid arguments for read_file: 'path' is required; 'name' is not an argument.",
    ]
    env.step("Done.")


def test_a_session_that_fails_raises_infra_error():
    env = make("terminal", backend="bwrap", num_warm=0, session_ttl_s=1.0)
    try:
        env.reset(seed=0, options=harbor_row())
        time.sleep(2.5)  # the pool closes the session: its time-to-live passed
        with pytest.raises(InfraError, match="sandbox session failed"):
            env.step(call("bash", {"command": "true"}))
    finally:
        env.close()


def test_the_harbor_example_solution_passes_its_tests(env):
    # The oracle run of the example task: solve.sh in a fresh session, then the hidden tests.
    import asyncio

    from envs.terminal.scoring import run_solution, score, set_up
    from sandbox.sessions import SessionPool

    task = load_task(HARBOR_DIR / "word-count")

    async def oracle() -> float:
        async with await SessionPool.create(env.pool_settings) as pool:
            session = await pool.acquire()
            await set_up(session, task)
            assert await run_solution(session, task) == 0
            return (await score(session, task)).reward

    assert asyncio.run(oracle()) == 1.0


def test_harbor_paths_are_mapped_to_the_sessions():
    assert map_paths("cd /app && python3 /tests/t.py > /logs/verifier/reward.txt; ls /apps /x/app") == (
        "cd /work && python3 /tmp/harbor/tests/t.py > /tmp/harbor/logs/verifier/reward.txt; ls /apps /x/app"
    )


def test_the_loader_names_what_it_cannot_do(tmp_path):
    (tmp_path / "instruction.md").write_text("Do it.")
    with pytest.raises(ValueError, match="tests/test.sh is missing"):
        load_task(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "Dockerfile").write_text(
        "FROM debian\nWORKDIR /app\nCOPY --from=build /x /app\n"
    )
    with pytest.raises(ValueError, match="Dockerfile:3: only `COPY <source>... <destination>`"):
        load_task(tmp_path)
    (tmp_path / "environment" / "Dockerfile").write_text("FROM debian\nWORKDIR /srv\n")
    with pytest.raises(ValueError, match="WORKDIR /srv is not supported"):
        load_task(tmp_path)


def test_rows_pose_their_task_in_the_prompt():
    row = harbor_row()
    assert row["prompt"][0]["content"] == prompt_text(load_task(HARBOR_DIR / "word-count").instruction)
    assert generate(3, seed=1) == generate(3, seed=1) and generate(3, seed=1) != generate(3, seed=2)
