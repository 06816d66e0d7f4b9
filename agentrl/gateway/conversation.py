"""Gateway stage: one model call in no particular dialect, between a dialect module and the session.

Each dialect (`openai_chat`, `anthropic_messages`, `openai_responses`) turns its request into a
`CallRequest` whose messages are in the chat template's form (`{"role", "content"}`, assistant
`tool_calls` as `{"id", "type": "function", "function": {"name", "arguments": <object>}}`, tool
results with the call's `name`), and turns the `CallReply` the session served back into its own
wire format. `fingerprint` identifies an assistant message across dialects, so the session can
tell a turn it served, sent back as the client got it, from one the client altered.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from agentrl.env.base import Message
from agentrl.gateway.turn_format import ParsedTurn


class RequestError(ValueError):
    """A request the gateway refuses: the dialect answers 400 with `param` named."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass(frozen=True)
class CallRequest:
    """What a client asked for, in the template's message form."""

    dialect: str  # "openai_chat", "anthropic_messages" or "openai_responses"
    model: str  # the name the client sent (recorded; the run's policy answers)
    messages: list[Message]
    tools: list[dict[str, Any]] | None  # OpenAI function schemas, as the template renders them
    max_tokens: int | None  # the client's cap; the rollout budgets cap it further
    temperature: float | None
    top_p: float | None
    parse_tool_calls: bool = True  # False for tool_choice "none": call blocks stay text
    stream: bool = False
    logprobs: bool = False


@dataclass(frozen=True)
class ServedCall:
    """A tool call as served: an id the client echoes back with its result."""

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class CallReply:
    """One served turn, ready for a dialect to answer with."""

    id: str
    model: str
    content: str
    reasoning: str | None
    calls: tuple[ServedCall, ...]
    finish_reason: str  # "stop", "length" or "special_token"
    num_prompt_tokens: int
    token_texts: list[str] = field(default_factory=list)  # [num_completion_tokens]
    logprobs: list[float] = field(default_factory=list)  # [num_completion_tokens]

    @property
    def num_completion_tokens(self) -> int:
        return len(self.logprobs)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @classmethod
    def of(cls, turn: ParsedTurn, model: str, num_prompt_tokens: int, finish_reason: str) -> CallReply:
        calls = tuple(ServedCall(f"call_{secrets.token_hex(12)}", c.name, c.arguments) for c in turn.calls)
        return cls(f"gen_{secrets.token_hex(12)}", model, turn.content, turn.reasoning, calls, finish_reason,
                   num_prompt_tokens)  # fmt: skip

    def message(self) -> Message:
        """The reply as an assistant message in template form (what a faithful client sends back)."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return message


def fingerprint(message: Message) -> str:
    """What identifies an assistant turn: its text and its calls (ids, reasoning and spacing aside)."""
    calls = [
        [call["function"]["name"], call["function"]["arguments"]] for call in message.get("tool_calls") or []
    ]
    return json.dumps([(message.get("content") or "").strip(), calls], sort_keys=True)


def parse_arguments(arguments: Any, param: str) -> dict[str, Any]:
    """A tool call's arguments from the wire: a JSON object, or a string holding one."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise RequestError(f"{param} is not valid JSON: {error}", param) from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{param} must be a JSON object, got {type(arguments).__name__}", param)
    return arguments
