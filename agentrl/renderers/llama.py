"""Rollout stage, the Llama 3.1/3.2/3.3 family: header turns, JSON tool calls.

A Llama 3 model calls a tool with a JSON object `{"name": ..., "parameters": {...}}` (the
template's instruction; "arguments" is accepted too), either as the whole reply or after the
`<|python_tag|>` token; several calls may be separated by `;`. A turn ends on `<|eot_id|>`, or
`<|eom_id|>` when the model waits for a tool result. The template renders a call from the
message's structured `tool_calls` (one per message) and trims every message's text.
"""

from __future__ import annotations

import json
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

PYTHON_TAG = "<|python_tag|>"
CALL_SHAPE = 'a tool call must be a JSON object {"name": <tool name>, "parameters": <JSON object>}'
_CALL_START = re.compile(r'\s*\{\s*"name"\s*:')


class Llama3JsonParser:
    """JSON calls after `<|python_tag|>`, or a reply that is nothing but a call object."""

    def parse(self, text: str) -> ParsedReply:
        content, tag, body = text.partition(PYTHON_TAG)
        if not tag:
            if not _CALL_START.match(text):  # prose (or JSON data that is not a call): all content
                return ParsedReply(text.strip(), ())
            content, body = "", text
        return ParsedReply(content.strip(), tuple(self._calls(body)))

    def _calls(self, body: str) -> list[ToolCall | MalformedCall]:
        calls: list[ToolCall | MalformedCall] = []
        decoder, position = json.JSONDecoder(), 0
        while True:
            while position < len(body) and body[position] in " \t\n;":
                position += 1
            if position == len(body):
                return calls
            try:
                value, position = decoder.raw_decode(body, position)
            except json.JSONDecodeError:
                calls.append(load_json(body[position:], CALL_SHAPE))  # the strict parser says why
                return calls
            if not isinstance(value, dict) or "name" not in value:
                calls.append(MalformedCall(Malformation.NOT_A_CALL, f"Error: {CALL_SHAPE}."))
                continue
            arguments = value.get("parameters", value.get("arguments"))
            if set(value) - {"name", "parameters", "arguments", "type"}:
                arguments = None
            calls.append(named_call(value["name"], arguments, CALL_SHAPE))


class Llama3Renderer(Renderer):
    """Llama 3.1, 3.2 and 3.3 Instruct with JSON ("custom") tools."""

    name: ClassVar[str] = "llama3"
    parser: ClassVar[ToolCallParser] = Llama3JsonParser()
    markup_tokens: ClassVar[tuple[str, ...]] = (PYTHON_TAG,)
    extra_stop_tokens: ClassVar[tuple[str, ...]] = ("<|eot_id|>", "<|eom_id|>")

    def assistant_message(self, text: str) -> Message:
        return structured_message(self.parse(text))
