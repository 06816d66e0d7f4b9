"""Data stage: dataset rows in verl's layout, from files or from a generator function.

A row is a dict with
  `prompt`        list of {"role", "content"} messages the episode opens with,
  `reward_model`  dict with at least `ground_truth` (what the env grades against),
  `data_source`   str naming where the row came from,
  `extra_info`    optional dict (or null) of anything else.
Every row is validated (by the pydantic model `Row`) where it enters, so a bad file fails before training starts with an
error naming the file, the row index (0-based, in file order) and the column.
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.env.registry import load_object
from agentrl.run_files import PathSetting

SUPPORTED_SUFFIXES = (".parquet", ".jsonl")
MESSAGES_EXPECTED = 'a non-empty list of {"role", "content"} messages'


class DataSource(BaseModel):
    """Where rows come from: files in verl's layout, or a generator function."""

    model_config = ConfigDict(extra="forbid")

    train_files: list[PathSetting] = Field(
        default_factory=list, description="parquet/jsonl in verl's row layout"
    )
    val_files: list[PathSetting] = Field(
        default_factory=list,
        description="held-out rows; with train_files and no val_files, val_size rows are held out of them",
    )
    generator: str | None = Field(
        None, description="'module:function' that makes rows when no files are given"
    )
    generator_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra kwargs for the generator"
    )
    train_size: int = Field(2048, gt=0, description="rows to generate for training (generator only)")
    val_size: int = Field(
        200, gt=0, description="held-out rows: generated, or split off train_files when no val_files"
    )

    @property
    def has_a_source(self) -> bool:
        return bool(self.train_files) or self.generator is not None

    @model_validator(mode="after")
    def _one_source(self) -> DataSource:
        if self.train_files and self.generator is not None:
            raise ValueError(
                "data.train_files and data.generator are both set; choose one (data.generator=null "
                "to train on the files)"
            )
        return self

    def check_has_a_source(self, prefix: str = "data") -> None:
        """ValueError naming the keys to set when neither files nor a generator are given."""
        if not self.has_a_source:
            raise ValueError(f"set {prefix}.train_files=[...] or {prefix}.generator=module:function")


class DataConfig(DataSource):
    """Where the training and held-out rows come from, and how many prompts one step takes.

    With `env.mixture`, each env brings its own sources and these stay unset.
    """

    train_batch_size: int = Field(16, gt=0, description="prompts (groups) per training step")
    shuffle: bool = Field(True, description="reshuffle training rows every epoch")


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a `.parquet` or `.jsonl` file, validated."""
    path = Path(path)
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(
            f"{path}: unsupported dataset format {path.suffix!r}; use one of {SUPPORTED_SUFFIXES}"
        )
    if not path.is_file():
        raise ValueError(f"{path}: no such dataset file")
    rows = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
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


class PromptMessage(BaseModel):
    """One opening chat message; extra keys (name, tool_calls, ...) pass through."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str


class RewardModel(BaseModel):
    """What the env grades against: verl's `reward_model` column."""

    model_config = ConfigDict(extra="allow")

    ground_truth: Any = Field(description="the answer the env grades against; never null")

    @field_validator("ground_truth")
    @classmethod
    def _present(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("is missing; it holds the answer the env grades against")
        return value


class Row(BaseModel):
    """One dataset row in verl's layout; extra columns pass through to the env."""

    model_config = ConfigDict(extra="allow", strict=True)

    prompt: list[PromptMessage] = Field(min_length=1, description=MESSAGES_EXPECTED)
    reward_model: RewardModel
    data_source: str
    extra_info: dict[str, Any] | None = None


def validate_rows(rows: list[Any], source: str) -> None:
    """Raise ValueError naming `source`, the row index and the column of the first bad row."""
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(  # noqa: TRY004  # user input: ValueError project-wide
                f"{source} row {index}: must be an object with columns prompt, reward_model, "
                f"data_source; got {type(row).__name__}"
            )
        try:
            Row.model_validate(row)
        except ValidationError as error:
            raise ValueError(f"{source} row {index}: {_first_problem(error)}") from None


def task_of_row(row: Any, reader: str) -> tuple[list[dict[str, Any]], Any]:
    """A row's opening messages (a copy the caller may change) and its ground truth, for an env's reset.

    Rows reach `reset(options=row)` from anywhere (the trainer, tests, the debugger), so they are
    checked here too; `reader` starts each error (e.g. "MathEnv.reset options").
    """
    prompt = row.get("prompt") if isinstance(row, dict) else None
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"{reader} must be a dataset row whose 'prompt' is {MESSAGES_EXPECTED}, got {type(prompt).__name__}"
        )
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise ValueError(
            f"{reader} must be a dataset row with 'reward_model': {{'ground_truth': ...}}, "
            f"got reward_model={reward_model!r}"
        )
    return copy.deepcopy(prompt), reward_model["ground_truth"]


def _first_problem(error: ValidationError) -> str:
    item = error.errors()[0]
    column = ".".join(str(part) for part in item["loc"])
    if item["type"] == "missing":
        return f"column '{column}' is missing"
    if item["type"] == "value_error":  # our own validators phrase the whole problem
        return f"column '{column}' {item['msg'].removeprefix('Value error, ')}"
    got = item.get("input")
    described = "an empty list" if got == [] else type(got).__name__
    return f"column '{column}': {item['msg']}, got {described}"


def _read_parquet(path: Path) -> list[Any]:
    from pyarrow import parquet  # only a parquet dataset pays for importing pyarrow

    return parquet.read_table(path).to_pylist()


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
