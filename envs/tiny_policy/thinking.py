"""Data stage (offline thinking policy): short `<think>` reasoning before a math answer.

The thinking variant of the tiny policy (`python -m envs.tiny_policy.build --variant think`)
learns to work an expression out in small steps inside `<think>...</think>` and then answer in
`\\boxed{}`, in the layout of Qwen3-style replies:

    <think>
    40 + 30 = 70. 7 + 5 = 12. 70 + 12 = 82.
    </think>

    \\boxed{82}

Its chat template (`THINK_CHAT_TEMPLATE`) drops the reasoning of assistant turns before the last
user message, as Qwen3's does, so a retry after "incorrect" feedback is rendered without the
first attempt's reasoning: the history-rewriting case that training splits into samples.
Steps split two-digit sums and products by tens and ones, which a model of a million
parameters can carry out where it cannot add two-digit numbers in one token.
"""

from __future__ import annotations

import re

_SIMPLE = re.compile(r"^(-?\d+) ([+*-]) (-?\d+)$")
_PARENTHESISED = re.compile(r"^\((\d+) ([+-]) (\d+)\) \* (\d+)$")


def reasoning_steps(expression: str) -> list[str]:
    """The worked steps for a math-env expression, each "a op b = c.", ending on its value."""
    parenthesised = _PARENTHESISED.match(expression)
    if parenthesised:
        a, op, b, c = parenthesised.groups()
        inner = _binary(int(a), op, int(b))
        return [*_steps(int(a), op, int(b)), *_steps(inner, "*", int(c))]
    simple = _SIMPLE.match(expression)
    if simple is None:
        raise ValueError(f"no reasoning steps for {expression!r}: expected 'a op b' or '(a op b) * c'")
    a, op, b = simple.groups()
    return _steps(int(a), op, int(b))


def think_reply(expression: str, shown_answer: int) -> str:
    """A reply that reasons to `shown_answer` (a wrong one makes the last step's result wrong)."""
    steps = reasoning_steps(expression)
    last = steps[-1]
    steps[-1] = last[: last.rindex("= ") + 2] + f"{shown_answer}."
    return f"<think>\n{' '.join(steps)}\n</think>\n\n\\boxed{{{shown_answer}}}"


def _binary(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _steps(a: int, op: str, b: int) -> list[str]:
    """One step, or three where b has tens and ones: a op tens, then ones, then the whole."""
    result = _binary(a, op, b)
    tens, ones = divmod(abs(b), 10)
    if b < 10 or ones == 0 or a < 0:
        return [f"{a} {op} {b} = {result}."]
    if op == "*":  # a * b = a * tens0 + a * ones
        high, low = a * tens * 10, a * ones
        return [f"{a} * {tens * 10} = {high}.", f"{a} * {ones} = {low}.", f"{high} + {low} = {result}."]
    partial = _binary(a, op, tens * 10)
    return [f"{a} {op} {tens * 10} = {partial}.", f"{partial} {op} {ones} = {result}."]
