"""Rollout stage, the DeepSeek-V3/R1 family: `<｜User｜>`/`<｜Assistant｜>` turns, `<think>`, tool tokens.

Calls sit between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each between
`<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`, in one of two forms:

- V3 / R1: `function<｜tool▁sep｜>NAME` then the arguments in a ```json fenced block;
- V3.1 and later: `NAME<｜tool▁sep｜>ARGUMENTS`.

R1's generation prompt opens the `<think>` block, so its completion holds only `</think>`; the
templates drop the reasoning of earlier turns (history rewrites). A turn ends on
`<｜end▁of▁sentence｜>`. The templates render calls from the message's `tool_calls`, with the
arguments as a JSON string, and V3.1's `thinking` variable turns reasoning on.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

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
from agentrl.renderers.reasoning import ThinkingParser
from agentrl.rollout.chat_template import Message

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
CALL_SHAPE = f"a tool call must be {CALL_BEGIN}<tool name>{SEP}<JSON object>{CALL_END}"
_FENCED = re.compile(r"\s*function\s*" + re.escape(SEP) + r"(.*?)\n```json\n(.*)\n```\s*", re.DOTALL)
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)


class DeepSeekCallParser:
    """The tool-call section of a DeepSeek reply (after its reasoning)."""

    def parse(self, text: str) -> ParsedReply:
        content, tag, section = text.partition(CALLS_BEGIN)
        if not tag:
            return ParsedReply(text.strip(), ())
        section, closed, after = section.partition(CALLS_END)
        calls: list[ToolCall | MalformedCall] = [self._call(body) for body in _CALL.findall(section)]
        if not closed or CALL_BEGIN in _CALL.sub("", section):
            message = f"Error: a tool call section or call is not closed by {CALLS_END} / {CALL_END}."
            calls.append(MalformedCall(Malformation.UNCLOSED, message))
        return ParsedReply((content + after).strip(), tuple(calls))

    def _call(self, body: str) -> ToolCall | MalformedCall:
        fenced = _FENCED.fullmatch(body)
        if fenced:
            return named_call(fenced.group(1).strip(), load_json(fenced.group(2), CALL_SHAPE), CALL_SHAPE)
        name, sep, arguments = body.partition(SEP)
        if not sep:
            return MalformedCall(Malformation.NO_HEADER, f"Error: {CALL_SHAPE}.")
        return named_call(name.strip(), load_json(arguments, CALL_SHAPE), CALL_SHAPE)


class DeepSeekRenderer(Renderer):
    """DeepSeek-V3, V3.1 and R1 (and the R1 distills, which use R1's template)."""

    name: ClassVar[str] = "deepseek"
    parser: ClassVar[ToolCallParser] = ThinkingParser(DeepSeekCallParser())
    markup_tokens: ClassVar[tuple[str, ...]] = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        # The templates concatenate a call's arguments as text: give them the JSON string.
        return super().render([_string_arguments(m) for m in messages], tools, generation_prompt)

    def assistant_message(self, text: str) -> Message:
        reply = self.parse(text)
        if not reply.well_formed:
            return {"role": "assistant", "content": text}  # the templates drop the reasoning themselves
        message = structured_message(reply)
        message["content"] = reply.content or None  # R1's template renders calls only without content
        return message


def _string_arguments(message: Message) -> Message:
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function", call)
        arguments = function["arguments"]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append({**call, "function": {**function, "arguments": text}})
    return {**message, "tool_calls": calls}


class DeepSeekThinkingRenderer(DeepSeekRenderer):
    """DeepSeek-V3.1 with thinking on (its template's `thinking` variable)."""

    name: ClassVar[str] = "deepseek_thinking"
    default_template_kwargs: ClassVar[dict[str, Any]] = {"thinking": True}
