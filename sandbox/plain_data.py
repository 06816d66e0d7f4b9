"""Plain data across the jail's judge boundary: Python values as JSON text (copied into the jail; stdlib only).

Stage: inside the jail, on both sides of the boundary between the judge process (trusted, runs the
dataset's test code) and the program process (untrusted). Only exact builtin types cross: None,
bool, int, float, str, list, and tagged objects for tuple, dict, set, frozenset, bytes and
complex, so that a tuple comes back a tuple and `(8, 13) == candidate(123)` means what it says.
A subclass (an `int` whose `__eq__` is always true) or any other object is refused: what the
judge compares is always a value it built itself from JSON.
"""

import base64
import json

MAX_DEPTH = 100
MAX_TEXT_CHARS = 16 << 20  # per message; the reader refuses longer lines before parsing them
_SCALARS = (type(None), bool, int, float, str)
_SEQUENCES = {tuple: "tuple", set: "set", frozenset: "frozenset"}


class NotPlainData(TypeError):
    """The value holds something other than plain builtin data."""


def encode(value: object, depth: int = 0) -> object:
    """The JSON-ready form of `value`; raises NotPlainData for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)  # exact types: a subclass could carry its own __eq__
    if kind in _SCALARS:
        return value
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind in _SEQUENCES:
        return {"t": _SEQUENCES[kind], "v": [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"t": "bytes", "v": base64.b64encode(value).decode()}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    raise NotPlainData(f"{kind.__name__} is not plain data")


def decode(data: object) -> object:
    """The value `encode` made; raises ValueError (or TypeError for unhashable set items) on anything else."""
    if type(data) in _SCALARS:
        return data
    if type(data) is list:
        return [decode(item) for item in data]
    if type(data) is not dict or set(data) != {"t", "v"}:
        raise ValueError(f"not an encoded value: {str(data)[:100]}")
    tag, payload = data["t"], data["v"]
    if tag == "bytes" and type(payload) is str:
        return base64.b64decode(payload, validate=True)
    if type(payload) is not list:
        raise ValueError(f"tag {tag!r} needs a list, got {type(payload).__name__}")
    if tag == "tuple":
        return tuple(decode(item) for item in payload)
    if tag == "set":
        return {decode(item) for item in payload}
    if tag == "frozenset":
        return frozenset(decode(item) for item in payload)
    if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in payload):
        return {decode(key): decode(item) for key, item in payload}
    if tag == "complex" and len(payload) == 2 and all(type(part) in (int, float) for part in payload):
        return complex(*payload)
    raise ValueError(f"unknown tag {tag!r}")


def dumps_line(message: dict) -> bytes:
    """One message as a line of JSON (json never writes a raw newline inside a value)."""
    return json.dumps(message).encode() + b"\n"


def loads_line(line: bytes) -> dict:
    """One message read by `dumps_line`; ValueError for anything malformed (too deep included)."""
    if len(line) > MAX_TEXT_CHARS or not line.endswith(b"\n"):
        raise ValueError("a message is too long or was cut off")
    try:
        message = json.loads(line)
    except RecursionError:
        raise ValueError("a message is nested too deeply") from None
    if type(message) is not dict:
        raise ValueError(f"a message is a JSON object, got {type(message).__name__}")
    return message
