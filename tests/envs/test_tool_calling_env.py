"""The tool_calling env: every malformed call is answered with a tool message and the episode goes on."""

import asyncio
import json
import time
from typing import Annotated

import pytest
from pydantic import Field

from agentrl.env import InfraError, make
from agentrl.testing import answer_probes, check_env_contract, find_reward_hacks, play_sync, tool_call_probes
from envs.tiny_policy.corpus import CALCULATOR_TOOL
from envs.tool_calling import Tool, ToolCallingEnv
from envs.tool_calling.retrieval import world
from envs.tool_calling.synthetic import generate
from sandbox.executor import Executor

ROW = {
    "data_source": "test",
    "prompt": [{"role": "user", "content": "What is 123 * 456? Put the final answer in \\boxed{}."}],
    "reward_model": {"ground_truth": "56088"},
}


def call(name, arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def divide(numerator: int, denominator: int) -> float:
    """Divide two integers."""
    return numerator / denominator


def slow(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return "slept"


async def lookup(key: Annotated[str, Field(description="what to look up")]) -> str:
    """Look something up in a service that is down."""
    raise InfraError("lookup service unreachable")


def first_observation(env, reply):
    episode = play_sync(env, [reply], row=ROW)
    assert episode.steps[0].terminated is False  # the episode continues after any tool call
    return [message["content"] for message in episode.steps[0].observation]


@pytest.fixture
def env():
    return ToolCallingEnv(tools=["calculator", divide, Tool.from_function(slow, timeout_s=0.2), lookup])


def test_a_valid_call_returns_the_tool_result_as_a_tool_message(env):
    episode = play_sync(env, [call("calculator", {"expression": "123 * 456"})], row=ROW)
    assert episode.steps[0].observation == [{"role": "tool", "content": "56088", "name": "calculator"}]


def test_several_calls_in_one_reply_each_get_a_tool_message_in_order(env):
    reply = (
        call("calculator", {"expression": "1 + 1"})
        + "\n"
        + call("divide", {"numerator": 7, "denominator": 2})
    )
    assert first_observation(env, reply) == ["2", "3.5"]


def test_malformed_json_is_explained(env):
    assert first_observation(
        env, '<tool_call>\n{"name": "calculator", "arguments": {expression}}\n</tool_call>'
    ) == [
        (
            "Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes); "
            'a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}.'
        )
    ]


def test_json_that_is_not_a_call_object_is_explained(env):
    assert first_observation(env, '<tool_call>["calculator", "1 + 1"]</tool_call>') == [
        'Error: a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}.'
    ]


def test_nan_is_not_accepted_as_json(env):
    reply = '<tool_call>{"name": "divide", "arguments": {"numerator": NaN, "denominator": 1}}</tool_call>'
    assert first_observation(env, reply) == [
        (
            "Error: the tool call is not valid JSON (NaN is not a JSON value); "
            'a tool call must be a JSON object {"name": <tool name>, "arguments": <JSON object>}.'
        )
    ]


def test_an_unclosed_call_is_explained(env):
    assert first_observation(env, '<tool_call>\n{"name": "calculator"') == [
        "Error: a <tool_call> is not closed by </tool_call>."
    ]


def test_an_unknown_tool_is_named_with_the_available_ones(env):
    assert first_observation(env, call("wikipedia", {"query": "x"})) == [
        "Error: unknown tool 'wikipedia'; the tools are: calculator, divide, slow, lookup."
    ]


def test_a_missing_argument_is_named(env):
    assert first_observation(env, call("divide", {"numerator": 1})) == [
        "Error: invalid arguments for divide: 'denominator' is required."
    ]


def test_a_wrongly_typed_argument_is_named_with_the_value_given(env):
    assert first_observation(env, call("divide", {"numerator": "1", "denominator": 2})) == [
        "Error: invalid arguments for divide: 'numerator' should be a valid integer, got '1'."
    ]


def test_an_unexpected_argument_is_named(env):
    assert first_observation(env, call("calculator", {"expression": "1", "precision": 3})) == [
        "Error: invalid arguments for calculator: 'precision' is not an argument."
    ]


def test_a_tool_that_raises_reports_the_exception(env):
    assert first_observation(env, call("divide", {"numerator": 1, "denominator": 0})) == [
        "Error: divide failed: ZeroDivisionError: division by zero"
    ]


def test_a_tool_past_its_timeout_is_reported_and_abandoned(env):
    assert first_observation(env, call("slow", {"seconds": 5})) == ["Error: slow timed out after 0.2 s."]


def test_the_calculator_refuses_code(env):
    assert first_observation(env, call("calculator", {"expression": "__import__('os').getpid()"})) == [
        (
            "Error: calculator failed: FunctionNotDefined: Function '__import__' not defined, "
            "for expression '__import__('os').getpid()'."
        )
    ]


def test_a_tool_whose_service_is_down_raises_infra_error(env):
    with pytest.raises(InfraError, match="lookup service unreachable"):
        play_sync(env, [call("lookup", {"key": "x"})], row=ROW)


def test_calls_past_the_per_reply_limit_are_not_run():
    env = ToolCallingEnv(tools=["calculator"], max_calls_per_turn=2)
    reply = "".join(call("calculator", {"expression": f"{n} + 0"}) for n in range(4))
    assert first_observation(env, reply) == [
        "0",
        "1",
        "Error: at most 2 tool calls run per reply; the last 2 were not run.",
    ]


def test_a_reply_without_a_call_ends_the_episode_and_is_graded(env):
    episode = play_sync(env, [call("calculator", {"expression": "123 * 456"}), "\\boxed{56088}"], row=ROW)
    assert (episode.steps[-1].reward, episode.steps[-1].terminated) == (1.0, True)
    wrong = play_sync(env, ["\\boxed{56087}"], row=ROW)
    assert (wrong.steps[-1].reward, wrong.steps[-1].info["correct"]) == (0.0, False)


def test_the_final_info_counts_calls_errors_and_calls_by_tool(env):
    replies = [
        call("calculator", {"expression": "1"}) + call("nope", {}),
        call("divide", {}),
        "\\boxed{56088}",
    ]
    info = play_sync(env, replies, row=ROW).final_info
    assert info == {
        "correct": True,
        "extracted_answer": "56088",
        "num_tool_calls": 3,
        "num_tool_errors": 2,
        "calls_calculator": 1,
        "calls_divide": 1,
        "calls_slow": 0,
        "calls_lookup": 0,
        "tool_error_rate": 2 / 3,
    }


def test_text_answers_are_graded_by_exact_match_up_to_case():
    row = {**ROW, "reward_model": {"ground_truth": "Danren"}}
    env = ToolCallingEnv(tools=["search"])
    assert play_sync(env, ["\\boxed{danren.}"], row=row).total_reward == 1.0
    assert play_sync(env, ["\\boxed{Danre}"], row=row).total_reward == 0.0


def test_the_calculator_schema_is_the_one_the_tiny_policy_learned():
    assert ToolCallingEnv(tools=["calculator"]).tools == [CALCULATOR_TOOL]


def test_schemas_come_from_the_function_signature(env):
    assert env.tools[1] == {
        "type": "function",
        "function": {
            "name": "divide",
            "description": "Divide two integers.",
            "parameters": {
                "type": "object",
                "properties": {"numerator": {"type": "integer"}, "denominator": {"type": "integer"}},
                "required": ["numerator", "denominator"],
            },
        },
    }
    assert env.tools[3]["function"]["parameters"]["properties"] == {
        "key": {"description": "what to look up", "type": "string"}
    }


def test_a_country_question_needs_two_searches():
    row = generate(1, seed=0, split="val", tasks=["country"])[0]
    person = row["prompt"][0]["content"].removeprefix("In which country was ").split(" born?")[0]
    city = world().birth_city[person]
    env = ToolCallingEnv(tools=["search"])
    episode = play_sync(
        env,
        [call("search", {"query": person}), call("search", {"query": f"{city} country"}), "\\boxed{x}"],
        row=row,
    )
    assert f"{person} was born in {city}." in episode.steps[0].observation[0]["content"].splitlines()
    country = row["reward_model"]["ground_truth"]
    assert (
        episode.steps[1].observation[0]["content"].splitlines()[0]
        == f"{city} is a city in the country of {country}."
    )


def test_held_out_lookup_questions_ask_about_people_no_training_row_mentions():
    def people(split):
        rows = generate(200, seed=0, split=split, tasks=["country"])
        return {row["prompt"][0]["content"].split(" was ")[1].split(" born")[0] for row in rows}

    assert people("train") & people("val") == set()


def test_the_python_tool_runs_programs_in_the_sandbox():
    env = ToolCallingEnv(tools=["python"], sandbox_backend="bwrap", python_time_limit_s=2)
    printing = "import sys\nprint(sum(range(10)))\nprint('careful', file=sys.stderr)"
    assert first_observation(env, call("python", {"code": printing})) == ["45\ncareful"]
    assert first_observation(env, call("python", {"code": "raise SystemExit(3)"})) == ["(exit: RE, code 3)"]
    assert first_observation(env, call("python", {"code": "while True: pass"})) == [
        "Error: python timed out (the program ran past its 2 s CPU limit)."
    ]


@pytest.fixture
def live_executors(monkeypatch):
    """The sandbox executors created and not yet closed, whoever owns them."""
    live = set()
    create, close = Executor.create.__func__, Executor.close

    async def counted_create(cls, *args, **kwargs):
        executor = await create(cls, *args, **kwargs)
        live.add(executor)
        return executor

    async def counted_close(self):
        live.discard(self)
        await close(self)

    monkeypatch.setattr(Executor, "create", classmethod(counted_create))
    monkeypatch.setattr(Executor, "close", counted_close)
    return live


PRINT_ONE = call("python", {"code": "print(1)"})


def test_the_python_tool_of_closed_sync_envs_leaves_no_sandbox_executor_behind(live_executors):
    # Each env's sync API runs on an event loop of its own, which ends when the env closes.
    for _ in range(3):
        env = ToolCallingEnv(tools=["python"], sandbox_backend="bwrap")
        env.reset(options=ROW)
        assert env.step(PRINT_ONE)[0][0]["content"] == "1"
        assert env.step(PRINT_ONE)[0][0]["content"] == "1"
        assert len(live_executors) == 1  # one per loop, not one per call
        env.close()
    assert live_executors == set()


def test_the_python_tool_on_event_loops_that_ended_leaves_no_sandbox_executor_behind(live_executors):
    async def episode():
        env = ToolCallingEnv(tools=["python"], sandbox_backend="bwrap")
        await env.areset(options=ROW)
        observation, *_ = await env.astep(PRINT_ONE)
        return observation[0]["content"]

    for _ in range(4):
        assert asyncio.run(episode()) == "1"
    assert live_executors == set()


def test_the_env_passes_the_contract_and_resists_reward_hacking():
    env = make("tool_calling")
    rows = generate(4, seed=0, tasks=["arithmetic", "country", "population", "program"])
    check_env_contract(env, rows, actions=[call("calculator", {"expression": "2 * 3"}), "\\boxed{6}"])
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert find_reward_hacks(env, row, answer_probes(truth) + tool_call_probes(truth)) == []


def test_reset_without_a_row_poses_a_seeded_synthetic_task():
    env = ToolCallingEnv(tools=["calculator"], synthetic_tasks=["arithmetic"])
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    assert first == again and first[0]["content"].startswith("What is ")
