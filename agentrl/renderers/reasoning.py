"""Parsing stage: a reply's `<think>` reasoning block, split off before its tool calls are parsed.

Qwen3, DeepSeek-R1/V3.1 and GLM-4.5 write their reasoning first, between `<think>` and
`</think>`. Where the generation prompt already opened the block (DeepSeek-R1 ends its prompt
with `<think>\\n`), the completion holds only the closing tag. A block never closed is all
reasoning: the model was cut off while thinking, so nothing in it is a call or an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentrl.parsing.tool_calls import ParsedReply, ToolCallParser

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, rest) of `text`; reasoning is "" when the reply has no block."""
    stripped = text.lstrip()
    if stripped.startswith(OPEN):
        body = stripped[len(OPEN) :]
        if CLOSE not in body:
            return body.strip(), ""
        reasoning, _, rest = body.partition(CLOSE)
        return reasoning.strip(), rest
    if CLOSE in text and OPEN not in text.partition(CLOSE)[0]:  # the prompt opened the block
        reasoning, _, rest = text.partition(CLOSE)
        return reasoning.strip(), rest
    return "", text


@dataclass(frozen=True)
class ThinkingParser:
    """A `<think>` block first, then `calls` parses the rest (calls inside the block do not count)."""

    calls: ToolCallParser

    def parse(self, text: str) -> ParsedReply:
        reasoning, rest = split_reasoning(text)
        return replace(self.calls.parse(rest), reasoning=reasoning)
