"""Rollout stage, the Mistral family (tokenizer v3 and later): `[INST]` turns, `[TOOL_CALLS]`.

After the `[TOOL_CALLS]` token a v3 model (Mistral 7B v0.3, Nemo, Small 3.x) writes a JSON array
of `{"name", "arguments"}` objects; v11 and later (Magistral, Devstral, Small 3.2) write
`NAME[ARGS]{...}` per call, optionally `NAME[CALL_ID]ID[ARGS]{...}`, each after its own
`[TOOL_CALLS]`. Text before the first `[TOOL_CALLS]` is content. A turn ends on `</s>`. The
template renders calls from the message's structured `tool_calls` and needs 9-character call
ids; it moves the tool list and the system prompt to the latest user message, so a conversation
with a second user message rewrites history.
"""

from __future__ import annotations

import re
from typing import ClassVar

from agentrl.parsing.tool_calls import (
    Malformation,
    MalformedCall,
    ParsedReply,
    ToolCall,
    ToolCallParser,
    load_json,
    named_call,
)
from agentrl.renderers.base import Renderer, structured_message
from agentrl.rollout.chat_template import Message

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
CALL_SHAPE = (
    f'a tool call must be {TOOL_CALLS}[{{"name": <tool name>, "arguments": <JSON object>}}, ...] '
    f"or {TOOL_CALLS}<tool name>{ARGS}<JSON object>"
)
_NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\](.*)", re.DOTALL)


class MistralParser:
    """`[TOOL_CALLS]` followed by a JSON array (v3) or by `name[ARGS]{...}` calls (v11+)."""

    def parse(self, text: str) -> ParsedReply:
        content, tag, rest = text.partition(TOOL_CALLS)
        if not tag:
            return ParsedReply(text.strip(), ())
        calls: list[ToolCall | MalformedCall] = []
        for part in rest.split(TOOL_CALLS):
            calls += self._part(part)
        return ParsedReply(content.strip(), tuple(calls))

    def _part(self, part: str) -> list[ToolCall | MalformedCall]:
        if part.lstrip().startswith("["):
            value = load_json(part, CALL_SHAPE)
            if isinstance(value, MalformedCall):
                return [value]
            if not isinstance(value, list):
                return [MalformedCall(Malformation.NOT_A_CALL, f"Error: {CALL_SHAPE}.")]
            return [self._object(item) for item in value]
        named = _NAMED.fullmatch(part)
        if named is None:
            return [MalformedCall(Malformation.NO_HEADER, f"Error: {CALL_SHAPE}.")]
        return [named_call(named.group(1), load_json(named.group(2), CALL_SHAPE), CALL_SHAPE)]

    def _object(self, item: object) -> ToolCall | MalformedCall:
        if not isinstance(item, dict) or set(item) - {"name", "arguments", "id"}:
            return MalformedCall(Malformation.NOT_A_CALL, f"Error: {CALL_SHAPE}.")
        arguments = item.get("arguments")
        if isinstance(arguments, str):  # some v3 models write the arguments as a JSON string
            arguments = load_json(arguments, CALL_SHAPE)
        return named_call(item.get("name"), arguments, CALL_SHAPE)


class MistralRenderer(Renderer):
    """Mistral Instruct v0.3, Nemo, Small, Magistral, Devstral."""

    name: ClassVar[str] = "mistral"
    parser: ClassVar[ToolCallParser] = MistralParser()
    markup_tokens: ClassVar[tuple[str, ...]] = (TOOL_CALLS, ARGS, CALL_ID)
    needs_generation_prompt: ClassVar[bool] = False  # the answer follows [/INST] directly

    def assistant_message(self, text: str) -> Message:
        message = structured_message(self.parse(text))
        for index, call in enumerate(message.get("tool_calls", [])):
            call["id"] = _call_id(index)
        return message

    def render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        """The template needs an id on every call and on the tool result answering it; envs and
        OpenAI-style conversations often give none, so calls without one are numbered in order and
        each tool result takes the id of the call it answers (results follow their calls' order)."""
        return super().render(_with_call_ids(messages), tools, generation_prompt)


def _with_call_ids(messages: list[Message]) -> list[Message]:
    completed: list[Message] = []
    call_ids: list[str] = []
    answered = 0
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = [
                {**call, "id": call.get("id") or _call_id(i)} for i, call in enumerate(message["tool_calls"])
            ]
            message, call_ids, answered = {**message, "tool_calls": calls}, [call["id"] for call in calls], 0
        elif message["role"] == "tool" and not message.get("tool_call_id"):
            call_id = call_ids[answered] if answered < len(call_ids) else _call_id(answered)
            message, answered = {**message, "tool_call_id": call_id}, answered + 1
        completed.append(message)
    return completed


def _call_id(index: int) -> str:
    return f"call{index:05d}"  # the template requires 9 alphanumeric characters
