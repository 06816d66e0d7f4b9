"""Data stage (offline default policy): the synthetic SFT conversations the tiny policy learns from.

Four families, in exactly the formats of the built-in envs: math (boxed answers, with some
retries after "incorrect" feedback), tool calls (the calculator, and multi-hop search), short
Python functions (some fixed after the code env's failure feedback; `envs.tiny_policy.multi_turn`)
and terminal tasks (bash, write_file and read_file calls; `envs.tiny_policy.terminal_tasks`).
Math prompts come from the math env's own generator with split="sft", so they are drawn from a
different stream than the env's train and val rows.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any

from envs.math.env import FEEDBACK as RETRY_FEEDBACK
from envs.math.synthetic import MAX_DIFFICULTY, make_expression, make_row
from envs.tiny_policy.code_tasks import make_code_conversation
from envs.tiny_policy.multi_turn import SEARCH_TOOL, make_code_fix_conversation, make_search_conversation
from envs.tiny_policy.terminal_tasks import make_terminal_episode
from envs.tiny_policy.thinking import think_reply

SPLIT = "sft"
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
TOOL_QUESTIONS = (
    "What is {expression}? Put the final answer in \\boxed{{}}.",
    "Use the calculator to compute {expression}. Put the final answer in \\boxed{{}}.",
    "Compute {expression} with the calculator tool. Put the final answer in \\boxed{{}}.",
)


class Family(str, enum.Enum):
    """Which env family a conversation imitates."""

    MATH = "math"
    TOOL = "tool"
    CODE = "code"
    TERMINAL = "terminal"


DEFAULT_MATH_FRACTION = 0.7  # the rest is split evenly between tool calls, code and terminal tasks
# Share of single-attempt math replies that teach a plausible mistake. A teacher that is always
# right makes a policy that samples its one answer almost deterministically, so groups of
# rollouts rarely disagree and RL gets no signal; a noisy teacher leaves the policy uncertain
# between right and wrong answers, which RL can then sharpen.
DEFAULT_ANSWER_NOISE = 0.25
# Multi-turn skills: the share of code conversations that fix a first attempt from feedback, the
# share of those fixes that are still wrong (room for RL), and the share of tool conversations
# that search in several hops rather than calling the calculator once.
DEFAULT_CODE_FIX_FRACTION = 0.5
DEFAULT_CORRECTION_NOISE = 0.3
DEFAULT_SEARCH_FRACTION = 0.5
# Share of calculator episodes that also offer search, as the tool preset does: without them the
# policy never chose the calculator once both tools were on offer.
CALCULATOR_WITH_SEARCH_FRACTION = 0.5
# Share of terminal episodes that make one plausible mistake (trained on, like the math noise).
DEFAULT_TERMINAL_NOISE = 0.5


@dataclass(frozen=True)
class Conversation:
    """One SFT example: chat messages, the tools shown to the model, which turns carry loss."""

    family: Family
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    trained: tuple[bool, ...]  # [num_messages] True on assistant turns the model learns to write


def make_corpus(
    num_conversations: int,
    seed: int,
    math_fraction: float = DEFAULT_MATH_FRACTION,
    retry_fraction: float = 0.15,
    answer_noise: float = DEFAULT_ANSWER_NOISE,
    think: bool = False,
    terminal_noise: float = DEFAULT_TERMINAL_NOISE,
) -> list[Conversation]:
    """`num_conversations` conversations; the same arguments always give the same corpus.

    With `think`, math replies reason in `<think>` before answering (`envs.tiny_policy.thinking`).
    """
    if num_conversations < 1:
        raise ValueError(f"num_conversations must be >= 1, got {num_conversations}")
    shares = (math_fraction, retry_fraction, answer_noise, terminal_noise)
    if not all(0.0 <= value <= 1.0 for value in shares):
        raise ValueError(
            "math_fraction, retry_fraction, answer_noise and terminal_noise must be in [0, 1], "
            f"got {', '.join(map(str, shares))}"
        )
    rng = random.Random(f"{SPLIT}-{seed}")
    families = [Family.MATH, Family.TOOL, Family.CODE, Family.TERMINAL]
    weights = [math_fraction, *[(1 - math_fraction) / 3] * 3]
    corpus = []
    for index in range(num_conversations):
        family = rng.choices(families, weights)[0]
        if family is Family.MATH:
            retry = rng.random() < retry_fraction
            noisy = not retry and rng.random() < answer_noise
            corpus.append(make_math_conversation(rng, index, retry=retry, noisy=noisy, think=think))
        elif family is Family.TOOL and rng.random() < DEFAULT_SEARCH_FRACTION:
            messages = make_search_conversation(rng, num_hops=rng.choice((2, 3)))
            trained = tuple(message["role"] == "assistant" for message in messages)
            corpus.append(Conversation(Family.TOOL, messages, (CALCULATOR_TOOL, SEARCH_TOOL), trained))
        elif family is Family.TOOL:
            corpus.append(make_tool_conversation(rng))
        elif family is Family.TERMINAL:
            messages, tools = make_terminal_episode(rng, mistaken=rng.random() < terminal_noise)
            trained = tuple(message["role"] == "assistant" for message in messages)
            corpus.append(Conversation(Family.TERMINAL, messages, tools, trained))
        else:
            corpus.append(make_code_conversation_with_feedback(rng))
    return corpus


def make_code_conversation_with_feedback(rng: random.Random) -> Conversation:
    """One function written at once or, with DEFAULT_CODE_FIX_FRACTION, fixed after feedback."""
    if rng.random() < DEFAULT_CODE_FIX_FRACTION:
        fixed = make_code_fix_conversation(rng, still_wrong=rng.random() < DEFAULT_CORRECTION_NOISE)
        if fixed is not None:
            return Conversation(Family.CODE, fixed, None, (False, False, False, True))
    return Conversation(Family.CODE, make_code_conversation(rng), None, (False, True))


def solve(expression: str) -> int:
    """The value of an expression built from integers and + - * ( ) only."""
    return eval(expression, {"__builtins__": {}})  # trusted: generated here from integers


def working(expression: str, answer: int) -> str:
    """A very short worked answer: one intermediate step for a parenthesised expression."""
    if expression.startswith("("):
        inner, outer = expression[1:].split(")", 1)
        return f"{expression} = {solve(inner)}{outer} = {answer}. \\boxed{{{answer}}}"
    return f"{expression} = {answer}. \\boxed{{{answer}}}"


def wrong_answer(rng: random.Random, answer: int) -> int:
    """A plausible mistake: off by a small amount or by ten."""
    return answer + rng.choice([-10, -2, -1, 1, 2, 10])


def make_math_conversation(
    rng: random.Random, index: int, retry: bool, noisy: bool = False, think: bool = False
) -> Conversation:
    """A math-env episode; with `retry`, a wrong first answer (no loss on it) and a correct retry;
    with `noisy`, a single reply that states a plausible mistake (trained on); with `think`, every
    reply reasons in `<think>` first."""
    expression = make_expression(rng, rng.randint(1, MAX_DIFFICULTY))
    row = make_row(expression, index, SPLIT)
    answer = int(row["reward_model"]["ground_truth"])
    mistake = wrong_answer(rng, answer)
    if think:
        correct = {"role": "assistant", "content": think_reply(expression, answer)}
        wrong = {"role": "assistant", "content": think_reply(expression, mistake)}
    else:
        correct = {"role": "assistant", "content": working(expression, answer)}
        wrong = {"role": "assistant", "content": f"{expression} = {mistake}. \\boxed{{{mistake}}}"}
    if not retry:
        return Conversation(Family.MATH, (*row["prompt"], wrong if noisy else correct), None, (False, True))
    feedback = {"role": "user", "content": RETRY_FEEDBACK}
    return Conversation(
        Family.MATH, (*row["prompt"], wrong, feedback, correct), None, (False, False, False, True)
    )


def make_tool_expression(rng: random.Random) -> str:
    """Math-env expressions plus larger ones that only a calculator answers reliably."""
    if rng.random() < 0.6:
        return make_expression(rng, rng.randint(1, MAX_DIFFICULTY))
    return f"{rng.randint(10, 999)} {rng.choice('+-*')} {rng.randint(10, 999)}"


def make_tool_conversation(rng: random.Random) -> Conversation:
    """A calculator episode: question, tool call, tool result, boxed answer; some also offer
    search (CALCULATOR_WITH_SEARCH_FRACTION)."""
    expression = make_tool_expression(rng)
    value = solve(expression)
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    messages = (
        {"role": "user", "content": rng.choice(TOOL_QUESTIONS).format(expression=expression)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": str(value)},
        {"role": "assistant", "content": f"\\boxed{{{value}}}"},
    )
    tools = (
        (CALCULATOR_TOOL, SEARCH_TOOL)
        if rng.random() < CALCULATOR_WITH_SEARCH_FRACTION
        else (CALCULATOR_TOOL,)
    )
    return Conversation(Family.TOOL, messages, tools, (False, True, False, True))
