"""Output comparison on the host: program stdout against expected text, return values against JSON.

Nothing here runs inside the jail, and nothing calls methods of objects the program built:
return values arrive as JSON text and are parsed into plain Python values first.
"""

from __future__ import annotations

import math
import re
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
    if math.isinf(actual) or math.isinf(expected):
        return actual == expected
    difference = abs(actual - expected)
    return difference <= tolerance or difference <= tolerance * abs(expected)


# What a number looks like in expected output: ASCII only. float() alone also accepts other
# scripts' digits ("١٠"), full-width digits and underscores ("1_0"), none of which a checker
# that reads ASCII would take for 10.
FLOAT_EXACT_INT = 2**53
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)


def _parse_number(token: str) -> int | float | None:
    """An ASCII integer (exact, any size) or decimal number; None for anything else."""
    if _INTEGER.fullmatch(token):
        return int(token) if len(token) <= 4300 else None  # int()'s own bound on digits
    return float(token) if _NUMBER.fullmatch(token) else None


def as_float(value: float) -> float:
    """float(value), with integers beyond float's range as signed infinity instead of OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def numbers_match(actual: float, expected: float, tolerance: float | None) -> bool:
    """Equal, or within `tolerance` (if any). Two integers that a float cannot hold exactly
    compare exactly: as floats, 10**400 and 10**400 + 1 would both be infinity."""
    if actual == expected:
        return True
    if tolerance is None:
        return False
    if (
        isinstance(actual, int)
        and isinstance(expected, int)
        and max(abs(actual), abs(expected)) > FLOAT_EXACT_INT
    ):
        return False
    return numbers_close(as_float(actual), as_float(expected), tolerance)


def _tokens_match(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    actual_number, expected_number = _parse_number(actual), _parse_number(expected)
    if actual_number is None or expected_number is None:
        return False
    return numbers_match(actual_number, expected_number, tolerance)


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
        return MATCH if numbers_match(actual, expected, float_tolerance) else _differ(path, actual, expected)
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
