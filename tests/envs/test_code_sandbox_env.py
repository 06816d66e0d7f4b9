import asyncio
import json
import socket
import warnings

import pytest
import pytest_asyncio
from gymnasium.utils.env_checker import check_env

from agentrl.env import InfraError, make
from agentrl.testing import check_env_contract
from envs.code_sandbox import CodeSandboxEnv
from envs.code_sandbox.synthetic import generate
from envs.code_sandbox.task import CodeTask
from sandbox import runners
from sandbox.types import AssertTest, CallTest, RunLimits

# Async tests share one loop, so they share one warm sandbox runner as training episodes do.
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", autouse=True)
async def close_sandboxes():
    yield
    await runners.close_all()


def row(
    task: CodeTask, question: str = "Write a Python function add(a, b) that returns the sum of a and b."
) -> dict:
    return {
        "data_source": "hand_written",
        "prompt": [{"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": task.model_dump_json()},
    }


ADD = CodeTask(
    entry_point="add",
    visible_tests=[CallTest(args=[1, 2], expected=3)],
    hidden_tests=[
        CallTest(args=[2, 2], expected=4),
        CallTest(args=[0, 0], expected=0),
        CallTest(args=[-1, 5], expected=4),
    ],
    limits=RunLimits(time_s=10.0, memory_mb=256),  # generous: these tests run on a busy machine
)
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "Here:\n```python\ndef add(a, b):\n    return a * b\n```"  # 2*2 == 2+2 and 0*0 == 0+0


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_a_right_function_ends_the_episode_with_the_hidden_tests_reward(backend):
    env = CodeSandboxEnv(backend=backend, max_turns=2)
    messages, info = await env.areset(options=row(ADD))
    assert (messages, info) == (row(ADD)["prompt"], {"num_hidden_tests": 3})
    assert await env.astep(RIGHT) == (
        [],
        1.0,
        True,
        False,
        {
            "correct": True,
            "pass_rate_first_turn": 1.0,
            "pass_rate_last_turn": 1.0,
            "has_code_block": True,
            "hidden_verdicts": "AC AC AC",
            "num_turns": 1,
        },
    )
    await env.aclose()


ROOT = CodeTask(
    entry_point="root",
    hidden_tests=[
        AssertTest(code="def check(candidate):\n    assert abs(candidate(4.0) - 2.0) < 1e-9\n\ncheck(root)\n")
    ],
    limits=RunLimits(time_s=10.0, memory_mb=256),
)


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_wrong_code_that_shadows_a_builtin_the_assert_test_uses_gets_no_reward(backend):
    env = CodeSandboxEnv(backend=backend, max_turns=1)
    question = "Write a Python function root(x) that returns the square root of x."
    await env.areset(options=row(ROOT, question))
    wrong = "```python\ndef root(x):\n    return 0.0\n\ndef abs(x):\n    return 0\n```"
    assert (await env.astep(wrong))[1:3] == (0.0, True)
    await env.areset(options=row(ROOT, question))
    assert (await env.astep("```python\ndef root(x):\n    return x ** 0.5\n```"))[1:3] == (1.0, True)
    await env.aclose()


@module_loop
async def test_a_failed_visible_test_is_reported_with_its_call_and_the_expected_value_then_fixed():
    env = CodeSandboxEnv(backend="bwrap", max_turns=2)
    await env.areset(options=row(ADD))
    observation, reward, terminated, truncated, info = await env.astep(WRONG)
    assert observation == [
        {
            "role": "user",
            "content": "Your code failed a test: wrong answer.\n"
            "Call: add(1, 2)\n"
            "Expected: 3\n"
            "Judge: $: expected 3, got 2\n"
            "Fix the code and reply with the complete corrected solution in one ```python block.",
        }
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert (info["pass_rate_first_turn"], info["correct"]) == (2 / 3, False)
    observation, reward, terminated, _, info = await env.astep(RIGHT)
    assert (observation, reward, terminated) == ([], 1.0, True)
    assert (info["pass_rate_first_turn"], info["pass_rate_last_turn"], info["num_turns"]) == (2 / 3, 1.0, 2)
    await env.aclose()


@module_loop
async def test_the_last_turn_is_rewarded_with_the_fraction_or_all_or_nothing_of_the_hidden_tests():
    fraction = CodeSandboxEnv(backend="bwrap", reward_mode="fraction", format_reward=0.1)
    await fraction.areset(options=row(ADD))
    _, reward, terminated, _, info = await fraction.astep(WRONG)
    assert (reward, terminated, info["correct"]) == (pytest.approx(2 / 3 + 0.1), True, False)
    strict = CodeSandboxEnv(backend="bwrap", reward_mode="all_or_nothing", format_reward=0.1)
    await strict.areset(options=row(ADD))
    assert (await strict.astep(WRONG))[1] == pytest.approx(0.1)
    await strict.areset(options=row(ADD))
    assert (await strict.astep(RIGHT))[1] == pytest.approx(1.1)
    await fraction.aclose()
    await strict.aclose()


@module_loop
async def test_a_reply_without_a_code_block_gets_format_feedback_and_no_reward():
    env = CodeSandboxEnv(backend="bwrap", max_turns=2, format_reward=0.5)
    await env.areset(options=row(ADD))
    observation, reward, terminated, _, info = await env.astep("def add(a, b): return a + b")
    assert observation == [
        {
            "role": "user",
            "content": "Your reply has no code block. Reply with the complete solution in one fenced ```python block.",
        }
    ]
    assert (reward, terminated, info["has_code_block"]) == (0.0, False, False)
    assert (await env.astep("```python\ndef add(a, b):\n    return a + b"))[1:3] == (
        0.0,
        True,
    )  # never closed
    await env.aclose()


@module_loop
async def test_a_runtime_error_is_reported_with_the_end_of_its_traceback():
    env = CodeSandboxEnv(backend="bwrap", max_turns=2)
    await env.areset(options=row(ADD))
    observation, *_ = await env.astep("```python\ndef add(a, b):\n    return a / 0\n```")
    feedback = observation[0]["content"]
    assert feedback.startswith("Your code failed a test: runtime error.\nCall: add(1, 2)\nExpected: 3\n")
    assert "ZeroDivisionError: division by zero" in feedback
    await env.aclose()


@module_loop
async def test_a_stdin_program_in_verls_test_case_layout_shows_the_input_expected_and_actual_output():
    cases = {"inputs": ["1 2\n", "5 5\n", "0 7\n"], "outputs": ["3\n", "10\n", "7\n"]}
    task_row = {
        "data_source": "apps",
        "prompt": [{"role": "user", "content": "Read two integers and print their sum."}],
        "reward_model": {"style": "rule", "ground_truth": json.dumps(cases)},
    }
    env = CodeSandboxEnv(backend="bwrap", max_turns=2)
    _, info = await env.areset(options=task_row)
    assert info == {"num_hidden_tests": 3}
    observation, *_ = await env.astep("```python\na, b = map(int, input().split())\nprint(a - b)\n```")
    assert observation[0]["content"] == (
        "Your code failed a test: wrong answer.\nInput (stdin):\n1 2\n\nExpected: 3\n\nGot: -1\n\n"
        "Fix the code and reply with the complete corrected solution in one ```python block."
    )
    _, reward, terminated, _, _ = await env.astep(
        "```py\na, b = map(int, input().split())\nprint(a + b)\n```"
    )
    assert (reward, terminated) == (1.0, True)
    await env.aclose()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@module_loop
async def test_an_unreachable_sandbox_server_raises_infra_error_instead_of_scoring_zero():
    env = CodeSandboxEnv(sandbox_url=f"http://127.0.0.1:{_closed_port()}")
    await env.areset(options=row(ADD))
    with pytest.raises(InfraError, match="sandbox error: sandbox client: gave up after 5 attempts"):
        await env.astep(RIGHT)
    await env.aclose()


@module_loop
async def test_envs_of_one_loop_share_one_runner_and_its_concurrency_bound():
    first = CodeSandboxEnv(backend="bwrap", max_concurrency=1)
    second = CodeSandboxEnv(backend="bwrap", max_concurrency=1)
    other = CodeSandboxEnv(backend="bwrap", max_concurrency=2)
    for env in (first, second, other):
        await env.areset(options=row(ADD))
    assert first._runner is second._runner and first._runner is not other._runner
    assert (first._runner.max_concurrency, other._runner.max_concurrency) == (1, 2)
    shared = first._runner
    for env in (first, second, other):
        await env.aclose()
    assert shared.is_open  # kept warm for the next episodes
    with pytest.raises(RuntimeError, match="call reset first"):
        await first.astep(RIGHT)  # a closed env's episode is over
    await runners.close_all()
    assert not shared.is_open


def test_a_loop_that_ends_closes_its_runners_and_an_env_reused_on_a_new_loop_leases_again():
    env = CodeSandboxEnv(backend="docker")

    async def episode():
        await env.areset(options=row(ADD))
        return env._runner, await env.astep(RIGHT)

    first_runner, first_step = asyncio.run(episode())
    assert not first_runner.is_open  # asyncio.run's shutdown closed it; the env never called aclose
    second_runner, second_step = asyncio.run(episode())
    assert second_runner is not first_runner and not second_runner.is_open
    assert first_step[1] == second_step[1] == 1.0


def test_the_code_env_passes_gymnasiums_env_checker_through_the_sync_bridge():
    env = make("code_sandbox", backend="bwrap", max_turns=2, format_reward=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_without_a_row_reset_draws_the_same_synthetic_task_for_the_same_seed():
    env = CodeSandboxEnv(backend="bwrap", synthetic_difficulty=2)
    first, _ = env.reset(seed=7)
    assert env.reset(seed=7)[0] == first
    assert env.reset(seed=8)[0] != first
    assert first[0]["content"].startswith(("Write a Python function", "Implement a Python function"))
    env.close()


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("{not json", "ground_truth is not valid JSON"),
        (json.dumps({"hidden_tests": []}), "hidden_tests: List should have at least 1 item"),
        (
            json.dumps({"hidden_tests": [{"kind": "call", "args": [1], "expected": 1}]}),
            "call tests need 'entry_point'",
        ),
        (json.dumps({"inputs": ["1"], "outputs": []}), "1 inputs but 0 outputs"),
    ],
)
def test_reset_rejects_a_malformed_ground_truth_naming_what_is_wrong(ground_truth, message):
    bad = {"prompt": [{"role": "user", "content": "?"}], "reward_model": {"ground_truth": ground_truth}}
    with pytest.raises(ValueError, match=message):
        CodeSandboxEnv(backend="bwrap").reset(options=bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_turns": 0}, "max_turns must be an integer >= 1, got 0"),
        (
            {"reward_mode": "binary"},
            "reward_mode must be one of \\['fraction', 'all_or_nothing'\\], got 'binary'",
        ),
        ({"backend": "podman"}, "backend must be one of \\['auto', 'docker', 'bwrap'\\], got 'podman'"),
        ({"sandbox_url": "localhost:8090"}, "sandbox_url must be an http:// or https:// URL"),
        ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1"),
        ({"synthetic_difficulty": 4}, "synthetic_difficulty must be 1..3, got 4"),
    ],
)
def test_invalid_settings_are_rejected_with_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CodeSandboxEnv(**kwargs)


def test_the_code_env_keeps_the_agentrl_env_contract_on_synthetic_rows():
    env = CodeSandboxEnv(backend="bwrap", max_turns=2)
    rows = generate(2, seed=0, split="test", difficulty=1)
    check_env_contract(env, rows, actions=("Let me think.", "```python\ndef f(x):\n    return x\n```"))
    env.close()
