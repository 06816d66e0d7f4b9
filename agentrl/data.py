"""Data stage: dataset rows in verl's layout, from files or from a generator function.

A row is a dict with
  `prompt`        list of {"role", "content"} messages the episode opens with,
  `reward_model`  dict with at least `ground_truth` (what the env grades against),
  `data_source`   str naming where the row came from,
  `extra_info`    optional dict (or null) of anything else.
Every row is validated where it enters, so a bad file fails before training starts with an
error naming the file, the row index (0-based, in file order) and the column.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from pyarrow import parquet

from agentrl.env.registry import load_object

SUPPORTED_SUFFIXES = (".parquet", ".jsonl")
MESSAGES_EXPECTED = 'a list of {"role", "content"} messages'


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a `.parquet` or `.jsonl` file, validated."""
    path = Path(path)
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(
            f"{path}: unsupported dataset format {path.suffix!r}; use one of {SUPPORTED_SUFFIXES}"
        )
    if not path.is_file():
        raise ValueError(f"{path}: no such dataset file")
    rows = parquet.read_table(path).to_pylist() if path.suffix == ".parquet" else _read_jsonl(path)
    validate_rows(rows, source=path.name)
    return rows


def generated_rows(
    generator: str, num_rows: int, seed: int, split: str = "train", **kwargs: Any
) -> list[dict[str, Any]]:
    """`num_rows` rows from the function `"package.module:function"`, validated.

    The function is called as `function(num_rows=..., seed=..., split=..., **kwargs)` and must
    return a list of rows, e.g. `envs.math.synthetic:generate` with `difficulty=1`.
    """
    function = load_object(generator)
    # Bad user input raises ValueError project-wide, type mismatches included (hence the noqa).
    if not callable(function):
        raise ValueError(f"generator {generator!r} is not a function")  # noqa: TRY004
    arguments = {"num_rows": num_rows, "seed": seed, "split": split, **kwargs}
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as error:
        raise ValueError(
            f"generator {generator!r} cannot be called with {sorted(arguments)}: {error}; it must accept "
            "num_rows, seed, split and the extra data kwargs"
        ) from None
    rows = function(**arguments)
    if not isinstance(rows, list):
        got = type(rows).__name__
        raise ValueError(f"generator {generator!r} must return a list of rows, got {got}")  # noqa: TRY004
    if len(rows) != num_rows:
        raise ValueError(f"generator {generator!r} returned {len(rows)} rows, expected num_rows={num_rows}")
    validate_rows(rows, source=f"generator {generator!r}")
    return rows


def validate_rows(rows: list[Any], source: str) -> None:
    """Raise ValueError naming `source`, the row index and the column of the first bad row."""
    for index, row in enumerate(rows):
        problem = _row_problem(row)
        if problem is not None:
            raise ValueError(f"{source} row {index}: {problem}")


def _row_problem(row: Any) -> str | None:
    if not isinstance(row, dict):
        return f"must be an object with columns prompt, reward_model, data_source; got {type(row).__name__}"
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        got = "an empty list" if prompt == [] else _type_name(prompt)
        return f"column 'prompt' must be {MESSAGES_EXPECTED}, got {got}"
    for position, message in enumerate(prompt):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            return f"column 'prompt' message {position} must be a dict with a str 'role', got {message!r}"
        if not isinstance(message.get("content"), str):
            got = _type_name(message.get("content"))
            return f"column 'prompt' message {position} must have a str 'content', got {got}"
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict):
        got = _type_name(reward_model)
        return f"column 'reward_model' must be an object with a 'ground_truth' field, got {got}"
    if reward_model.get("ground_truth") is None:
        return "column 'reward_model.ground_truth' is missing; it holds the answer the env grades against"
    if not isinstance(row.get("data_source"), str):
        return (
            f"column 'data_source' must be a str naming the dataset, got {_type_name(row.get('data_source'))}"
        )
    if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
        return f"column 'extra_info' must be an object or null, got {_type_name(row['extra_info'])}"
    return None


def _type_name(value: Any) -> str:
    return "nothing (column missing)" if value is None else type(value).__name__


def _read_jsonl(path: Path) -> list[Any]:
    rows = []
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue  # blank lines (e.g. a trailing newline) are not rows
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path.name} row {len(rows)} (line {line_number}): invalid JSON ({error.msg}); "
                    "each line must be one JSON object"
                ) from None
    return rows
