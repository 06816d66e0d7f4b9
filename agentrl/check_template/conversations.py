"""Template pre-flight: the multi-turn conversations a chat template is checked on.

Each conversation is what an episode looks like from the template's side: opening messages,
then assistant turns (the text the model samples) each followed by the env's observation.
They cover what templates are known to mangle: reasoning blocks, leading and trailing
whitespace, system prompts, non-ASCII text, and (with tools) single and parallel tool calls
followed by tool results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 3 * (4 + 5)"}},
            "required": ["expression"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find a passage about a topic.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


@dataclass(frozen=True)
class Conversation:
    """A named conversation; assistant messages are turns the model samples."""

    name: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


def _user(content: str) -> Message:
    return {"role": "user", "content": content}


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _calls(*calls: dict[str, Any]) -> Message:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def _tool(name: str, content: str) -> Message:
    return {"role": "tool", "name": name, "content": content}


def chat_conversations() -> list[Conversation]:
    """Conversations without tools."""
    return [
        Conversation("single_turn", [_user("What is 2 + 2?"), _assistant("The answer is \\boxed{4}.")]),
        Conversation(
            "system_and_retry",
            [
                {"role": "system", "content": "You are a careful calculator."},
                _user("What is 47 - 18?"),
                _assistant("47 - 18 = \\boxed{31}"),
                _user("Your answer is incorrect. Try again."),
                _assistant("47 - 18 = \\boxed{29}"),
            ],
        ),
        Conversation(
            "reasoning",
            [
                _user("What is 3 + 4?"),
                _assistant("<think>\n3 plus 4 is 7.\n</think>\n\nThe answer is \\boxed{7}."),
                _user("And 5 * 6?"),
                _assistant("<think>\n5 times 6 is 30.\n</think>\n\n\\boxed{30}"),
            ],
        ),
        Conversation(
            "whitespace",
            [
                _user("Name a prime."),
                _assistant(" \\boxed{7}\n\n"),
                _user("Another one, π-adic please — ünïcode is fine."),
                _assistant("\n  \\boxed{11}  "),
            ],
        ),
    ]


def tool_conversations() -> list[Conversation]:
    """Conversations with tool calls and tool results (rendered with the tools' schemas)."""
    tools = [CALCULATOR, LOOKUP]
    return [
        Conversation(
            "tool_call",
            [
                _user("What is 12 * 34? Use the calculator."),
                _calls(_call("calculator", expression="12 * 34")),
                _tool("calculator", "408"),
                _assistant("The answer is \\boxed{408}."),
            ],
            tools,
        ),
        Conversation(
            "parallel_tool_calls",
            [
                {"role": "system", "content": "Answer with the tools."},
                _user("Who wrote Hamlet, and what is 2 ** 10?"),
                _calls(
                    _call("lookup", query="Hamlet author", top_k=1), _call("calculator", expression="2 ** 10")
                ),
                _tool("lookup", "Hamlet is a tragedy by William Shakespeare."),
                _tool("calculator", "1024"),
                _calls(_call("lookup", query="Shakespeare birth year", top_k=2)),
                _tool("lookup", "Shakespeare was born in 1564."),
                _assistant("Shakespeare (born 1564); 2 ** 10 = \\boxed{1024}."),
            ],
            tools,
        ),
    ]


def conversations(with_tools: bool) -> list[Conversation]:
    """The conversations a check runs over: always the chat ones, plus tool ones when asked."""
    return chat_conversations() + (tool_conversations() if with_tools else [])
