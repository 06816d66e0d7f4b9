"""Reward stage: the code pass-rate reward, programs judged in the project's sandbox.

A row's `reward_model.ground_truth` (a JSON string or object) holds the tests, in either of
the layouts the code_sandbox env reads: verl's `{"inputs", "outputs", "fn_name"?}` cases, or
`{"hidden_tests": [sandbox tests], "entry_point"?, "language"?, "limits"?, "preamble"?}`. The
program is the preamble (e.g. a HumanEval prompt's imports and helpers), then the final reply's
program, the block the code env would run (`agentrl.parsing.code_blocks`). Reward functions
are called synchronously, so the sandbox runs on the shared runner (`sandbox.runners`) of one
private event-loop thread per `CodePassRate`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.env.errors import InfraError
from agentrl.parsing.code_blocks import extract_program
from sandbox.runners import RunnerSettings, shared_runner
from sandbox.types import CallTest, Language, RunLimits, RunRequest, StdioTest, Test, Verdict


class _JudgedTests(BaseModel):
    """The part of a code task the reward needs; other keys (visible tests, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    language: Language = Language.PYTHON
    entry_point: str | None = None
    preamble: str = ""
    hidden_tests: list[Test] = Field(min_length=1)
    limits: RunLimits = Field(default_factory=RunLimits)


def judged_tests(ground_truth: Any) -> _JudgedTests:
    """The tests of one row's ground truth, in either supported layout."""
    value = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(value, dict) and "inputs" in value:
        function_name = value.get("fn_name")
        tests: list[Test] = [
            CallTest(args=case if isinstance(case, list) else [case], expected=expected)
            if function_name
            else StdioTest(stdin=str(case), expected_stdout=str(expected))
            for case, expected in zip(value["inputs"], value["outputs"], strict=True)
        ]
        return _JudgedTests(entry_point=function_name or None, hidden_tests=tests)
    return _JudgedTests.model_validate(value)


class CodePassRate:
    """TRL-style reward: fraction of tests passed by the final reply's program (0.0 without one)."""

    __name__ = "code_pass_rate"

    def __init__(self, backend: str = "auto", max_concurrency: int | None = None) -> None:
        self.backend = backend
        self.runner_settings = RunnerSettings(backend=backend, max_concurrency=max_concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def __call__(self, completions: list[Any], reward_model: list[dict], **kwargs: Any) -> list[float]:
        requests: list[RunRequest | None] = []
        for completion, truth in zip(completions, reward_model, strict=True):
            tests = judged_tests(truth["ground_truth"])
            text = completion if isinstance(completion, str) else _final_reply(completion)
            program = extract_program(text, tests.language)
            requests.append(
                RunRequest(
                    language=tests.language,
                    code=tests.preamble + program,
                    tests=tests.hidden_tests,
                    entry_point=tests.entry_point,
                    limits=tests.limits,
                )
                if program is not None
                else None
            )
        runnable = [request for request in requests if request is not None]
        responses = iter(self._submit(self._run_many(runnable)).result())
        scores = []
        for request in requests:
            if request is None:
                scores.append(0.0)
                continue
            response = next(responses)
            if response.verdict is Verdict.SANDBOX_ERROR:
                raise InfraError(f"the sandbox ({self.backend}) failed: {response.sandbox_error}")
            scores.append(response.num_passed / response.num_tests)
        return scores

    async def _run_many(self, requests: list[RunRequest]) -> list[Any]:
        runner = await shared_runner(self.runner_settings)
        return await runner.run_many(requests)

    def _submit(self, coroutine: Any) -> Future:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="code-pass-rate", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)


def _final_reply(completion: list[dict[str, Any]]) -> str:
    return next((m["content"] for m in reversed(completion) if m["role"] == "assistant"), "")
