"""Data stage of the code env: the typed task a row's `reward_model.ground_truth` describes.

A code row keeps verl's layout (`prompt`, `reward_model.ground_truth`, `data_source`), with the
ground truth a JSON string so that parquet stores it as one string column, as verl does. Two
ground-truth layouts are read:

- this env's own, `CodeTask` as JSON: `visible_tests` give the model feedback, `hidden_tests`
  give the reward; tests are `sandbox.types` tests (stdio, call, assert);
- verl's code layout, `{"inputs": [...], "outputs": [...], "fn_name"?: str}`, as verl's code
  reward passes it to SandboxFusion: stdin/stdout pairs, or call tests when `fn_name` is set.
  Every case is hidden and the first `num_visible` are also visible.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox.types import CallTest, Language, RunLimits, StdioTest, Test

DEFAULT_NUM_VISIBLE = 1  # verl-layout cases shown to the model as feedback


class CodeTask(BaseModel):
    """What a reply is judged against."""

    model_config = ConfigDict(extra="forbid")

    language: Language = Language.PYTHON
    entry_point: str | None = None  # the function call tests call
    preamble: str = ""  # code run before the reply's program, e.g. HumanEval's prompt without its stub
    visible_tests: list[Test] = Field(default_factory=list)  # feedback only
    hidden_tests: list[Test] = Field(min_length=1)  # the reward
    limits: RunLimits = Field(default_factory=RunLimits)

    @model_validator(mode="after")
    def _call_tests_need_an_entry_point(self) -> CodeTask:
        tests = [*self.visible_tests, *self.hidden_tests]
        if any(isinstance(test, CallTest) for test in tests) and not self.entry_point:
            raise ValueError("call tests need 'entry_point', the name of the function they call")
        return self


def parse_ground_truth(value: Any, num_visible: int = DEFAULT_NUM_VISIBLE) -> CodeTask:
    """The task of one row's ground truth (a JSON string or an already decoded object)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth is not valid JSON ({error.msg}): {value[:80]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004  # user input: ValueError project-wide
            "ground_truth must be a JSON object: a CodeTask (hidden_tests, ...) or verl's "
            f"{{'inputs', 'outputs'}}; got {type(value).__name__}"
        )
    if "inputs" in value or "outputs" in value:
        return from_verl_cases(value, num_visible)
    try:
        return CodeTask.model_validate(value)
    except ValidationError as error:
        raise ValueError(f"ground_truth is not a valid code task: {_first_error(error)}") from None


def from_verl_cases(cases: dict[str, Any], num_visible: int = DEFAULT_NUM_VISIBLE) -> CodeTask:
    """A task from verl's `{"inputs", "outputs", "fn_name"?}` test cases."""
    inputs, outputs, function_name = cases.get("inputs"), cases.get("outputs"), cases.get("fn_name")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or not inputs:
        raise ValueError(
            "verl test cases need non-empty lists 'inputs' and 'outputs', got "
            f"inputs={type(inputs).__name__}, outputs={type(outputs).__name__}"
        )
    if len(inputs) != len(outputs):
        raise ValueError(f"verl test cases have {len(inputs)} inputs but {len(outputs)} outputs")
    tests: list[Test]
    if function_name:
        # APPS-style call cases: each input is the argument list of one call.
        tests = [
            CallTest(args=case if isinstance(case, list) else [case], expected=expected)
            for case, expected in zip(inputs, outputs)
        ]
    else:
        tests = [
            StdioTest(stdin=str(case), expected_stdout=str(expected))
            for case, expected in zip(inputs, outputs)
        ]
    return CodeTask(entry_point=function_name or None, visible_tests=tests[:num_visible], hidden_tests=tests)


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"{location}: {first['msg']}"
