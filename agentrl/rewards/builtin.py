"""Reward stage: ready-made reward functions with TRL's signature.

Name them in the config as `reward.funcs=[agentrl.rewards.builtin:boxed_format, ...]`. Each
takes the batch as TRL passes it (`completions` as message lists, dataset columns as keyword
lists) and returns one float or None ("not applicable") per sample.

- `boxed_format`: 1.0 when the last assistant turn ends on a well-formed `\\boxed{}` answer;
- `code_block_format`: 1.0 when the last assistant turn has a fenced Python block that parses;
- `tool_call_format`: the fraction of the episode's tool calls that are well formed (None
  for an episode without tool calls);
- `math_accuracy`: 1.0 when the boxed answer equals `reward_model.ground_truth` (math-verify);
- `code_pass_rate`: the fraction of a code task's tests the program passes in the sandbox.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from agentrl.rewards.answers import extract_boxed_answer, math_equal
from agentrl.rewards.code_tests import CodePassRate
from agentrl.rewards.tool_calls import MalformedCall, parse_tool_calls

Messages = list[dict[str, Any]]
_PYTHON_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def final_text(completion: Messages | str) -> str:
    """The last assistant turn of a conversational completion (or a plain-text completion)."""
    if isinstance(completion, str):
        return completion
    return next((m["content"] for m in reversed(completion) if m["role"] == "assistant"), "")


def boxed_format(completions: list[Messages], **kwargs: Any) -> list[float]:
    """1.0 when the final reply carries a closed, non-empty `\\boxed{...}` answer."""
    return [float(extract_boxed_answer(final_text(c)) is not None) for c in completions]


def code_block_format(completions: list[Messages], **kwargs: Any) -> list[float]:
    """1.0 when the final reply has a fenced Python block that parses."""
    return [float(_parses(final_text(c))) for c in completions]


def tool_call_format(completions: list[Messages], **kwargs: Any) -> list[float | None]:
    """Fraction of the episode's `<tool_call>` blocks that are well formed; None without calls."""
    scores: list[float | None] = []
    for completion in completions:
        turns = [m["content"] for m in completion if m["role"] == "assistant"]
        calls = [call for text in turns for call in parse_tool_calls(text)]
        well_formed = sum(not isinstance(call, MalformedCall) for call in calls)
        scores.append(well_formed / len(calls) if calls else None)
    return scores


def math_accuracy(completions: list[Messages], reward_model: list[dict], **kwargs: Any) -> list[float]:
    """1.0 when the final boxed answer equals the row's `reward_model.ground_truth` (math-verify)."""
    scores = []
    for completion, truth in zip(completions, reward_model, strict=True):
        answer = extract_boxed_answer(final_text(completion))
        scores.append(float(answer is not None and math_equal(answer, str(truth["ground_truth"]))))
    return scores


def _parses(text: str) -> bool:
    blocks = _PYTHON_BLOCK.findall(text)
    if not blocks:
        return False
    try:
        ast.parse(blocks[-1])
    except SyntaxError:
        return False
    return True


code_pass_rate = CodePassRate(backend="auto")
