"""Rollout stage, gpt-oss (the harmony format): channels instead of tags.

A completion is one or more assistant messages, each `<|channel|>CHANNEL<|message|>BODY` ended
by `<|end|>`, `<|call|>` or `<|return|>`, the later ones opened by `<|start|>assistant`. The
`analysis` channel is reasoning, `final` is the answer, and a `commentary` message addressed
`to=functions.NAME` (in its header, before or after the channel) is a call whose body is the
JSON arguments; commentary without a recipient is a preamble, shown as content. The sampled
turn stops on `<|call|>` or `<|return|>`; every other harmony token is markup the turn keeps.
The template renders a finished final message with `<|end|>` once the conversation goes on and
drops the analysis of earlier turns, so its history always rewrites.
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

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
CALL_SHAPE = (
    "a tool call must be <|channel|>commentary to=functions.<tool name><|message|><JSON object><|call|>"
)
_RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_.-]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_ENDING = re.compile("|".join(re.escape(token) for token in (END, CALL, RETURN)))


class HarmonyParser:
    """The messages of a harmony completion: analysis -> reasoning, final -> content, calls."""

    def parse(self, text: str) -> ParsedReply:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall | MalformedCall] = []
        for chunk in text.split(START):
            if not chunk.strip():
                continue
            header, has_body, rest = chunk.partition(MESSAGE)
            ending = _ENDING.search(rest)
            body = rest[: ending.start()] if ending else rest
            recipient = _RECIPIENT.search(header)
            channel = _CHANNEL.search(header)
            if not has_body:
                if header.strip() and header.strip() != "assistant":
                    content.append(header)  # text without harmony headers: shown as it is
                continue
            if recipient:
                # A turn's text ends where it stopped on <|call|> (the stop token is not text).
                if ending is not None and ending.group() != CALL:
                    message = f"Error: a call must end with {CALL}, not {ending.group()}."
                    calls.append(MalformedCall(Malformation.UNCLOSED, message))
                else:
                    calls.append(named_call(recipient.group(1), load_json(body, CALL_SHAPE), CALL_SHAPE))
            elif channel and channel.group(1) == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        return ParsedReply(
            "\n".join(part.strip() for part in content).strip(), tuple(calls), "\n".join(reasoning).strip()
        )


class GptOssRenderer(Renderer):
    """gpt-oss-20b and gpt-oss-120b."""

    name: ClassVar[str] = "gpt-oss"
    parser: ClassVar[ToolCallParser] = HarmonyParser()
    markup_tokens: ClassVar[tuple[str, ...]] = (START, CHANNEL, MESSAGE, CONSTRAIN, END)
    extra_stop_tokens: ClassVar[tuple[str, ...]] = (CALL, RETURN)

    def assistant_message(self, text: str) -> Message:
        reply = self.parse(text)
        return structured_message(reply, thinking=reply.reasoning)
