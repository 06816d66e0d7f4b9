"""A session's calls as samples: a faithful conversation joins one token stream, an altered one splits."""

from __future__ import annotations

import json

import openai
import pytest

from agentrl.gateway import Gateway, TurnFormat
from agentrl.rollout.config import Sampling
from agentrl.rollout.trajectory import Status
from tests.gateway.conftest import BUDGETS, CALCULATOR, CALL, QUESTION
from tests.rollout.scripted import LOGPROB, ScriptedEngine


async def two_calls(tokenizer, template, resend):
    """Call, send back `resend(assistant message)` with the tool result, call again: (engine, session)."""
    engine = ScriptedEngine(tokenizer, [CALL, "\\boxed{12}"])
    async with Gateway(engine, TurnFormat(template)) as gateway:
        session = gateway.open_session(BUDGETS, sampling=Sampling())
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.base_url(session)}/v1", api_key=gateway.api_key, max_retries=0
        )
        first = (
            await client.chat.completions.create(model="m", messages=[QUESTION], tools=[CALCULATOR])
        ).choices[0]
        call_id = first.message.tool_calls[0].id
        messages = [QUESTION, resend(first.message.model_dump(exclude_none=True)),
                    {"role": "tool", "tool_call_id": call_id, "content": "12"}]  # fmt: skip
        await client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])
    return engine, session


async def test_a_faithful_conversation_is_one_sample_whose_tokens_are_what_the_engine_saw(
    tokenizer, template
):
    engine, session = await two_calls(tokenizer, template, lambda message: message)
    trajectory = session.trajectory
    sampled = [
        tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        for text in (CALL, "\\boxed{12}")
    ]
    observation_ids = trajectory.turns[0].observation_ids
    assert trajectory.earlier_segments == []
    assert engine.calls[1] == trajectory.prompt_ids + sampled[0] + observation_ids
    assert trajectory.response_ids == sampled[0] + observation_ids + sampled[1]
    assert trajectory.loss_mask == [1] * len(sampled[0]) + [0] * len(observation_ids) + [1] * len(sampled[1])
    assert trajectory.rollout_logprobs == [LOGPROB] * len(sampled[0]) + [0.0] * len(observation_ids) + [
        LOGPROB
    ] * len(sampled[1])
    # The observation is the tool result as the template renders it, nothing sampled.
    assert (
        tokenizer.decode(observation_ids)
        == "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert [call.joined for call in session.record.calls] == [False, True]


def reserialised(message):
    """The call's arguments re-serialised with other spacing, as some harnesses do."""
    arguments = json.loads(message["tool_calls"][0]["function"]["arguments"])
    message["tool_calls"][0]["function"]["arguments"] = json.dumps(arguments, separators=(",", ":"))
    return message


async def test_re_serialised_arguments_are_still_the_turn_that_was_served(tokenizer, template):
    _, session = await two_calls(tokenizer, template, reserialised)
    assert session.trajectory.earlier_segments == []
    assert session.record.calls[1].altered_turns == []


def trimmed(message):
    """The harness drops the tool call and keeps a summary of the turn instead."""
    return {"role": "assistant", "content": "I used the calculator."}


async def test_an_altered_assistant_turn_starts_a_new_sample_and_only_sampled_tokens_are_trained(
    tokenizer, template
):
    engine, session = await two_calls(tokenizer, template, trimmed)
    trajectory = session.trajectory
    first, second = session.record.calls
    assert (second.joined, second.altered_turns) == (False, [1])
    assert (
        second.why_new_sample == "message 1: an assistant turn sent back altered (trimmed or re-serialised)"
    )
    [earlier] = trajectory.earlier_segments
    assert (earlier.prompt_ids, earlier.response_ids, earlier.loss_mask) == (
        first.prompt_ids,
        first.completion_ids,
        [1] * len(first.completion_ids),
    )
    # The new sample's prompt is the altered conversation as rendered (prompt, never trained).
    assert trajectory.prompt_ids == engine.calls[1] == second.prompt_ids
    assert "I used the calculator." in tokenizer.decode(trajectory.prompt_ids)
    assert (trajectory.response_ids, trajectory.loss_mask) == (
        second.completion_ids,
        [1] * len(second.completion_ids),
    )
    assert trajectory.turns[0].starts_new_sample
    for sample, call in zip(trajectory.samples(), session.record.calls, strict=True):
        assert [
            t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m
        ] == call.completion_ids


async def test_a_call_past_max_turns_is_refused_and_the_session_is_truncated(tokenizer, template):
    engine = ScriptedEngine(tokenizer, ["7"])
    async with Gateway(engine, TurnFormat(template)) as gateway:
        session = gateway.open_session(BUDGETS, sampling=Sampling())
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.base_url(session)}/v1", api_key=gateway.api_key, max_retries=0
        )
        messages = [QUESTION]
        for _ in range(BUDGETS.max_turns):
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "?"},
            ]
        with pytest.raises(openai.BadRequestError, match="max_turns=4"):
            await client.chat.completions.create(model="m", messages=messages)
    assert session.ending.status is Status.TRUNCATED_TURNS
    assert len(engine.calls) == BUDGETS.max_turns


async def test_max_tokens_is_capped_by_the_turn_budget_and_training_sampling_wins(tokenizer, template):
    engine = ScriptedEngine(tokenizer, ["x " * 100])
    asked, generate = [], engine.generate

    async def recording(prompt_ids, sampling):
        asked.append(sampling)
        return await generate(prompt_ids, sampling)

    engine.generate = recording
    async with Gateway(engine, TurnFormat(template)) as gateway:
        session = gateway.open_session(BUDGETS, sampling=Sampling(temperature=0.7))
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.base_url(session)}/v1", api_key=gateway.api_key, max_retries=0
        )
        reply = await client.chat.completions.create(
            model="m", messages=[QUESTION], max_tokens=10_000, temperature=0.1
        )
    assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == (
        "length",
        BUDGETS.max_new_tokens_per_turn,
    )
    assert (asked[0].max_new_tokens, asked[0].temperature) == (BUDGETS.max_new_tokens_per_turn, 0.7)
    assert session.record.calls[0].requested == {"max_tokens": 10_000, "temperature": 0.1, "top_p": None}


async def test_an_expired_session_answers_404(tokenizer, template):
    async with Gateway(ScriptedEngine(tokenizer, ["7"]), TurnFormat(template)) as gateway:
        session = gateway.open_session(BUDGETS, ttl_s=0.0)
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.base_url(session)}/v1", api_key=gateway.api_key, max_retries=0
        )
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="m", messages=[QUESTION])
    assert len(session.id) >= 43  # 32 random bytes, URL-safe
