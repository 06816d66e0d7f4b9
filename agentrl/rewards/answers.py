"""Reward stage: the final `\\boxed{...}` answer of a reply, and math equivalence by math-verify."""

from __future__ import annotations

import re
import threading

_BOXED = re.compile(r"\\boxed\s*\{")
MATH_VERIFY_TIMEOUT_S = 3  # math-verify's own per-parse / per-comparison limit (whole seconds)


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None if absent, unclosed or empty."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    index = start
    while index < len(text):
        character = text[index]
        if character == "\\" and text[index + 1 : index + 2] in ("{", "}"):
            index += 2  # an escaped brace (set notation) does not open or close a group
            continue
        depth += {"{": 1, "}": -1}.get(character, 0)
        if depth == 0:
            return text[start:index].strip() or None
        index += 1
    return None  # the last \boxed never closes, e.g. a reply cut off by the token budget


def math_equal(answer: str, ground_truth: str) -> bool:
    """Whether `answer` equals `ground_truth` mathematically (math-verify).

    math-verify bounds its work with `signal.alarm`, which only works in the main thread;
    elsewhere it runs without its time limit.
    """
    from math_verify import parse, verify

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(_as_latex(ground_truth), parsing_timeout=timeout)
    predicted = parse(_as_latex(answer), parsing_timeout=timeout)
    return bool(gold and predicted and verify(gold, predicted, timeout_seconds=timeout))


def _as_latex(text: str) -> str:
    return text if "$" in text or "\\boxed" in text else f"${text}$"
