"""Parsing JSON that a jailed program produced, with its size and nesting bounded first.

`json.loads` recurses once per nesting level and raises RecursionError (not ValueError) near
Python's recursion limit, and the host compares parsed values recursively too. So the nesting
depth is measured on the raw text, which takes one pass and no recursion, before parsing.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100  # deeper return values are a wrong answer, never a crash of the judge
MAX_BYTES = 64 << 20
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPENERS, _CLOSERS = b"[{", b"]}"
_BRACKETS = _OPENERS + _CLOSERS
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in _BRACKETS)


class JsonTooLarge(ValueError):
    """The text is larger, or nested deeper, than the judge parses."""


def nesting_depth(text: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings ignored)."""
    brackets = text.translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:  # fast path: too few brackets to be deep
        return len(brackets)
    brackets = _STRING.sub(b"", text).translate(None, _NOT_BRACKETS)
    steps = (1 if byte in _OPENERS else -1 for byte in brackets)
    return max(accumulate(steps, initial=0))


def loads(text: bytes | str, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """`json.loads` after checking size and depth; raises ValueError (JsonTooLarge for the bounds)."""
    data = text.encode() if isinstance(text, str) else text
    if len(data) > max_bytes:
        raise JsonTooLarge(f"{len(data)} bytes of JSON, more than the {max_bytes} the judge parses")
    if (depth := nesting_depth(data)) > max_depth:
        raise JsonTooLarge(f"JSON nested {depth} deep, deeper than the {max_depth} the judge compares")
    return json.loads(data)
