"""Output comparison on the host: program stdout against expected text, return values against JSON.

Nothing here runs inside the jail, and nothing calls methods of objects the program built:
return values arrive as JSON text and are parsed into plain Python values first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Comparison:
    """Whether two outputs match, and where they first differ when they do not."""

    ok: bool
    message: str = ""


MATCH = Comparison(ok=True)


def normalise_lines(text: str) -> list[str]:
    """Lines without trailing whitespace, without trailing blank lines."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def numbers_close(actual: float, expected: float, tolerance: float) -> bool:
    """Absolute or relative error within `tolerance` (the usual judge convention)."""
    if math.isnan(actual) or math.isnan(expected):
        return math.isnan(actual) and math.isnan(expected)
    difference = abs(actual - expected)
    return difference <= tolerance or difference <= tolerance * abs(expected)


def _parse_float(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _tokens_match(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    actual_number, expected_number = _parse_float(actual), _parse_float(expected)
    if actual_number is None or expected_number is None:
        return False
    return numbers_close(actual_number, expected_number, tolerance)


def _lines_match(actual: str, expected: str, tolerance: float | None) -> bool:
    if actual == expected:
        return True
    if tolerance is None:
        return False
    actual_tokens, expected_tokens = actual.split(), expected.split()
    return len(actual_tokens) == len(expected_tokens) and all(
        _tokens_match(a, e, tolerance) for a, e in zip(actual_tokens, expected_tokens)
    )


def compare_stdout(actual: str, expected: str, float_tolerance: float | None = None) -> Comparison:
    """Same lines after normalisation; with a tolerance, numeric tokens may differ by that much."""
    actual_lines, expected_lines = normalise_lines(actual), normalise_lines(expected)
    for number, (actual_line, expected_line) in enumerate(zip(actual_lines, expected_lines), start=1):
        if not _lines_match(actual_line, expected_line, float_tolerance):
            return Comparison(
                False, f"line {number}: expected {expected_line[:80]!r}, got {actual_line[:80]!r}"
            )
    if len(actual_lines) != len(expected_lines):
        return Comparison(False, f"expected {len(expected_lines)} lines, got {len(actual_lines)}")
    return MATCH


def compare_values(
    actual: Any, expected: Any, float_tolerance: float | None = None, path: str = "$"
) -> Comparison:
    """Structural equality of two JSON values; bools are not numbers; ints and floats compare by value."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        same = type(actual) is type(expected) and actual == expected
        return MATCH if same else _differ(path, actual, expected)
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        if actual == expected or (
            float_tolerance is not None and numbers_close(float(actual), float(expected), float_tolerance)
        ):
            return MATCH
        return _differ(path, actual, expected)
    if isinstance(expected, list) and isinstance(actual, list):
        if len(actual) != len(expected):
            return Comparison(False, f"{path}: expected {len(expected)} items, got {len(actual)}")
        for index, (a, e) in enumerate(zip(actual, expected)):
            result = compare_values(a, e, float_tolerance, f"{path}[{index}]")
            if not result.ok:
                return result
        return MATCH
    if isinstance(expected, dict) and isinstance(actual, dict):
        if actual.keys() != expected.keys():
            return Comparison(False, f"{path}: expected keys {sorted(expected)}, got {sorted(actual)}")
        for key in expected:
            result = compare_values(actual[key], expected[key], float_tolerance, f"{path}.{key}")
            if not result.ok:
                return result
        return MATCH
    same = type(actual) is type(expected) and actual == expected  # str or None
    return MATCH if same else _differ(path, actual, expected)


def _differ(path: str, actual: Any, expected: Any) -> Comparison:
    return Comparison(False, f"{path}: expected {_short(expected)}, got {_short(actual)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
