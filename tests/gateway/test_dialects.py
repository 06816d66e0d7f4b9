"""Each dialect through its official client: a tool call out, the result back in, errors by the book."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import openai
import pytest

from agentrl.gateway import Gateway, TurnFormat
from agentrl.rollout.config import Sampling
from tests.gateway.conftest import BUDGETS, CALCULATOR, CALL, QUESTION
from tests.rollout.scripted import LOGPROB, ScriptedEngine


@pytest.fixture
async def gateway(tokenizer, template):
    engine = ScriptedEngine(tokenizer, [CALL, "\\boxed{12}"])
    async with Gateway(engine, TurnFormat(template)) as gateway:
        yield gateway


def session_url(gateway: Gateway) -> str:
    return gateway.base_url(gateway.open_session(BUDGETS, sampling=Sampling()))


async def test_openai_chat_returns_the_tool_call_then_takes_its_result_and_answers(gateway):
    client = openai.AsyncOpenAI(base_url=f"{session_url(gateway)}/v1", api_key=gateway.api_key, max_retries=0)
    first = await client.chat.completions.create(
        model="any", messages=[QUESTION], tools=[CALCULATOR], logprobs=True
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "calculator",
        {"expression": "3 * 4"},
    )
    assert [entry.logprob for entry in choice.logprobs.content] == [LOGPROB] * first.usage.completion_tokens
    messages = [QUESTION, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "12"}]  # fmt: skip
    second = await client.chat.completions.create(model="any", messages=messages, tools=[CALCULATOR])
    assert (second.choices[0].finish_reason, second.choices[0].message.content) == ("stop", "\\boxed{12}")


async def test_openai_chat_streams_the_same_reply_as_chunks(gateway):
    client = openai.AsyncOpenAI(base_url=f"{session_url(gateway)}/v1", api_key=gateway.api_key, max_retries=0)
    stream = await client.chat.completions.create(
        model="any",
        messages=[QUESTION],
        tools=[CALCULATOR],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    calls = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("calculator", {"expression": "3 * 4"})
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


async def test_anthropic_messages_returns_tool_use_and_streams_it_too(gateway):
    client = anthropic.AsyncAnthropic(base_url=session_url(gateway), api_key=gateway.api_key, max_retries=0)
    tool = {"name": "calculator", "description": CALCULATOR["function"]["description"],
            "input_schema": CALCULATOR["function"]["parameters"]}  # fmt: skip
    reply = await client.messages.create(model="any", max_tokens=64, messages=[QUESTION], tools=[tool])
    assert reply.stop_reason == "tool_use"
    [block] = reply.content
    assert (block.type, block.name, block.input) == ("tool_use", "calculator", {"expression": "3 * 4"})
    messages = [QUESTION, {"role": "assistant", "content": [block.model_dump()]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "12"}]}]  # fmt: skip
    async with client.messages.stream(model="any", max_tokens=64, messages=messages, tools=[tool]) as stream:
        final = await stream.get_final_message()
    assert (final.stop_reason, final.content[0].text) == ("end_turn", "\\boxed{12}")


async def test_openai_responses_returns_a_function_call_item_and_takes_its_output(gateway):
    client = openai.AsyncOpenAI(base_url=f"{session_url(gateway)}/v1", api_key=gateway.api_key, max_retries=0)
    tool = {"type": "function", **CALCULATOR["function"]}
    first = await client.responses.create(model="any", input=[QUESTION], tools=[tool])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("calculator", {"expression": "3 * 4"})
    items = [QUESTION, *[item.model_dump(exclude_none=True) for item in first.output],
             {"type": "function_call_output", "call_id": call.call_id, "output": "12"}]  # fmt: skip
    second = await client.responses.create(model="any", input=items, tools=[tool])
    assert second.output_text == "\\boxed{12}"


async def test_models_lists_the_one_policy(gateway):
    client = openai.AsyncOpenAI(base_url=f"{session_url(gateway)}/v1", api_key=gateway.api_key, max_retries=0)
    assert [model.id async for model in client.models.list()] == ["agentrl-policy"]


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("v1/chat/completions", {"model": "m"},
         {"error": {"message": "messages: is required", "type": "invalid_request_error", "param": "messages", "code": None}}),
        ("v1/chat/completions", {"model": "m", "messages": [QUESTION], "n": 2},
         {"error": {"message": "n=2 is not supported by this gateway; one completion per call (n=1)",
                    "type": "invalid_request_error", "param": "n", "code": None}}),
        ("v1/messages", {"model": "m", "messages": [QUESTION]},
         {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: is required"}}),
        ("v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
         {"type": "error", "error": {"type": "invalid_request_error",
                                     "message": "messages.0.role: Input should be 'user' or 'assistant'"}}),
        ("v1/responses", {"model": "m", "input": [QUESTION], "previous_response_id": "resp_1"},
         {"error": {"message": "previous_response_id='resp_1' is not supported by this gateway; send the whole "
                               "input each call", "type": "invalid_request_error", "param": "previous_response_id",
                    "code": None}}),
        ("v1/responses", {"model": "m", "input": [{"type": "function_call_output", "output": "1"}]},
         {"error": {"message": "input[0].call_id is required", "type": "invalid_request_error",
                    "param": "input[0].call_id", "code": None}}),
    ],
)  # fmt: skip
async def test_a_malformed_request_gets_its_dialects_400_naming_the_field(gateway, path, body, expected):
    headers = {"Authorization": f"Bearer {gateway.api_key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(f"{session_url(gateway)}/{path}", json=body) as response,
    ):
        assert (response.status, await response.json()) == (400, expected)


async def test_a_wrong_key_or_an_unknown_session_is_refused(gateway):
    url = session_url(gateway)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/messages", json={}, headers={"x-api-key": "guess"}) as response:
            assert response.status == 401
            assert (await response.json())["error"]["type"] == "authentication_error"
        unknown = url.rsplit("/", 1)[0] + "/not-a-session"
        headers = {"Authorization": f"Bearer {gateway.api_key}"}
        async with http.get(f"{unknown}/v1/models", headers=headers) as response:
            assert response.status == 404


def test_binding_beyond_loopback_needs_an_api_key(tokenizer, template):
    engine = ScriptedEngine(tokenizer, ["hi"])
    with pytest.raises(ValueError, match="give it an API key"):
        Gateway(engine, TurnFormat(template), host="0.0.0.0")
    assert Gateway(engine, TurnFormat(template), host="0.0.0.0", api_key="k").api_key == "k"
