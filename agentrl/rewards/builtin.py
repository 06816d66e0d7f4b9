"""Reward stage: ready-made reward functions with TRL's signature.

Name them in the config as `reward.funcs=[agentrl.rewards.builtin:boxed_format, ...]`. Each
takes the batch as TRL passes it (`completions` as message lists, dataset columns as keyword
lists) and returns one float or None ("not applicable") per sample.

- `boxed_format`: 1.0 when the last assistant turn ends on a well-formed `\\boxed{}` answer;
- `code_block_format`: 1.0 when the last assistant turn's program (the fenced block the code
  env would run) is Python that parses;
- `tool_call_format`: the fraction of the episode's tool calls that are well formed, as the
  run's renderer parses them (`agentrl.renderers.run_parser`; None for an episode without
  tool calls);
- `math_accuracy`: 1.0 when the boxed answer equals `reward_model.ground_truth` (math-verify in
  the grader processes the math env uses: an answer too costly to compare is wrong, not a hang);
- `code_pass_rate`: the fraction of a code task's tests the program passes in the sandbox.
"""

from __future__ import annotations

import ast
from typing import Any

from agentrl.parsing.code_blocks import extract_program
from agentrl.renderers.active import run_parser
from agentrl.rewards.answers import Verdict, extract_boxed_answer, shared_grader
from agentrl.rewards.code_tests import CodePassRate

Messages = list[dict[str, Any]]


def final_text(completion: Messages | str) -> str:
    """The last assistant turn of a conversational completion (or a plain-text completion)."""
    if isinstance(completion, str):
        return completion
    return next((m["content"] for m in reversed(completion) if m["role"] == "assistant"), "")


def boxed_format(completions: list[Messages], **kwargs: Any) -> list[float]:
    """1.0 when the final reply carries a closed, non-empty `\\boxed{...}` answer."""
    return [float(extract_boxed_answer(final_text(c)) is not None) for c in completions]


def code_block_format(completions: list[Messages], **kwargs: Any) -> list[float]:
    """1.0 when the final reply's program (see `agentrl.parsing.code_blocks`) is Python that parses."""
    return [float(_parses(final_text(c))) for c in completions]


def tool_call_format(completions: list[Messages], **kwargs: Any) -> list[float | None]:
    """Fraction of the episode's tool calls that are well formed; None without calls.

    Calls are read in the run's model family's format; calls inside reasoning do not count.
    """
    parser = run_parser()
    scores: list[float | None] = []
    for completion in completions:
        turns = [m["content"] for m in completion if m["role"] == "assistant"]
        replies = [parser.parse(text) for text in turns]
        num_calls = sum(len(reply.calls) for reply in replies)
        num_well_formed = sum(len(reply.well_formed) for reply in replies)
        scores.append(num_well_formed / num_calls if num_calls else None)
    return scores


def math_accuracy(completions: list[Messages], reward_model: list[dict], **kwargs: Any) -> list[float]:
    """1.0 when the final boxed answer equals the row's `reward_model.ground_truth` (math-verify)."""
    grader = shared_grader()
    scores = []
    for completion, truth in zip(completions, reward_model, strict=True):
        answer = extract_boxed_answer(final_text(completion))
        correct = answer is not None and grader.grade(answer, str(truth["ground_truth"])) is Verdict.CORRECT
        scores.append(float(correct))
    return scores


def _parses(text: str) -> bool:
    program = extract_program(text)
    if program is None:
        return False
    try:
        ast.parse(program)
    except SyntaxError:
        return False
    return True


code_pass_rate = CodePassRate(backend="auto")
