"""Environment stage: the code env, a program in a fenced block judged by the project's sandbox.

`reset(options=row)` takes a row whose `reward_model.ground_truth` is a code task (see
`task.py`); without a row it draws a seeded synthetic task. Each `step` is one attempt: the
reply's program (its last fenced block tagged for the task's language, else its last untagged
one; `agentrl.parsing.code_blocks`) runs against the visible and hidden tests in one sandbox
request.
The episode ends when the visible tests pass or the turns are used up; only then is there a
reward, the hidden tests' score (fraction passed or all-or-nothing) plus an optional format
term. Before that, a failed attempt gets the first failing visible test as feedback, and a reply
without a code block gets format feedback.

A sandbox that fails (a SANDBOX_ERROR verdict, a server that stays unreachable after the
client's retries) raises `agentrl.env.InfraError`: an outage is never scored as the program's
failure. The env is async-native; sandbox runners are shared per event loop (`sandbox.runners`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.env import InfraError, Message, StepResult, TextEnv
from agentrl.env.task import Episode, check_choice, check_finite, check_int, check_int_range, start_task
from agentrl.parsing.code_blocks import extract_program
from envs.code_sandbox import synthetic
from envs.code_sandbox.feedback import failure_feedback, format_feedback
from envs.code_sandbox.task import DEFAULT_NUM_VISIBLE, CodeTask, parse_ground_truth
from sandbox.runners import RunnerSettings, SharedRunner, shared_runner
from sandbox.types import RunRequest, RunResponse, Test, Verdict

REWARD_MODES = ("fraction", "all_or_nothing")


@dataclass(frozen=True)
class Attempt:
    """One judged reply."""

    has_code: bool
    visible_passed: bool  # every visible test that ran passed (vacuously when none ran)
    hidden_pass_rate: float  # fraction of hidden tests passed; 0.0 without code
    feedback: str  # what the model is told if the episode goes on
    hidden_verdicts: list[str]  # each hidden test's verdict ("AC", "WA", "RE", ...); none without code


class CodeSandboxEnv(TextEnv):
    """Write a program; fix it from the visible tests' verdicts; be rewarded by the hidden ones.

    Args:
        max_turns: replies allowed per episode; keep `rollout.max_turns` at least this large.
        reward_mode: "fraction" of hidden tests passed, or "all_or_nothing".
        format_reward: added to the final reward when the final reply has a code block.
        backend: sandbox jail run in this process: "auto" (Docker if an engine answers, else
            bubblewrap), "docker" or "bwrap". Unused when `sandbox_url` is set.
        sandbox_url: judge on a running `python -m sandbox.server` instead, with the client's
            retries; `sandbox_token` is its bearer token.
        max_concurrency: sandbox requests in flight at once, shared by every env of the process.
        num_visible: for rows in verl's test-case layout, how many cases are also shown as feedback.
        synthetic_difficulty: difficulty of the task drawn when reset gets no row.
    """

    def __init__(
        self,
        max_turns: int = 1,
        reward_mode: Literal["fraction", "all_or_nothing"] = "fraction",
        format_reward: float = 0.0,
        backend: Literal["auto", "docker", "bwrap"] = "auto",
        sandbox_url: str | None = None,
        sandbox_token: str | None = None,
        max_concurrency: int | None = None,
        num_visible: int = DEFAULT_NUM_VISIBLE,
        synthetic_difficulty: int = 1,
    ) -> None:
        super().__init__()
        self.max_turns = check_int("max_turns", max_turns, minimum=1)
        self.reward_mode = check_choice("reward_mode", reward_mode, REWARD_MODES)
        self.format_reward = check_finite("format_reward", format_reward, example="0.1")
        self.num_visible = check_int("num_visible", num_visible, minimum=0)
        self.synthetic_difficulty = check_int_range(
            "synthetic_difficulty", synthetic_difficulty, 1, synthetic.MAX_DIFFICULTY
        )
        self.runner_settings = RunnerSettings(backend, sandbox_url, sandbox_token, max_concurrency)
        self._runner: SharedRunner | None = None
        self._task: CodeTask | None = None
        self._first_pass_rate = 0.0
        self._episode = Episode(self)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, ground_truth = start_task(self, seed, options, self._synthetic_row)
        self._task = parse_ground_truth(ground_truth, self.num_visible)
        self._first_pass_rate = 0.0
        try:
            self._runner = await shared_runner(self.runner_settings)
        except Exception as error:
            raise InfraError(f"the sandbox could not start: {type(error).__name__}: {error}") from error
        self._episode.begin()
        return messages, {"num_hidden_tests": len(self._task.hidden_tests)}

    async def astep(self, action: str) -> StepResult:
        num_turns = self._episode.next_turn()
        attempt = await self._judge(action, last_turn=num_turns >= self.max_turns)
        if num_turns == 1:
            self._first_pass_rate = attempt.hidden_pass_rate
        done = attempt.visible_passed or num_turns >= self.max_turns
        if done:
            self._episode.end()
        reward = self._reward(attempt) if done else 0.0
        observation = [] if done else [{"role": "user", "content": attempt.feedback}]
        info = {
            "correct": attempt.hidden_pass_rate == 1.0,
            "pass_rate_first_turn": self._first_pass_rate,
            "pass_rate_last_turn": attempt.hidden_pass_rate,
            "has_code_block": attempt.has_code,
            "hidden_verdicts": " ".join(attempt.hidden_verdicts),  # why a reward is what it is
            "num_turns": num_turns,
        }
        return observation, reward, done, False, info

    async def aclose(self) -> None:
        # The runner is the loop's, not the env's: it stays warm for the next episodes.
        self._runner = None
        self._episode.end()

    async def _judge(self, reply: str, last_turn: bool) -> Attempt:
        task = self._task
        assert task is not None and self._runner is not None
        code = extract_program(reply, task.language)
        if code is None:
            return Attempt(False, False, 0.0, format_feedback(task.language), [])
        # Visible tests only decide whether to go on and what to say; after the last turn neither
        # matters, so the sandbox runs the hidden tests alone.
        visible_tests = [] if last_turn else task.visible_tests
        tests = [*visible_tests, *task.hidden_tests]
        request = RunRequest(
            language=task.language,
            code=task.preamble + code,
            tests=tests,
            entry_point=task.entry_point,
            limits=task.limits,
        )
        response = await self._runner.run(request)
        if response.verdict == Verdict.SANDBOX_ERROR:
            raise InfraError(f"sandbox error: {response.sandbox_error}")
        return _attempt(task, visible_tests, response)

    def _reward(self, attempt: Attempt) -> float:
        score = attempt.hidden_pass_rate
        if self.reward_mode == "all_or_nothing":
            score = float(score == 1.0)
        return score + (self.format_reward if attempt.has_code else 0.0)

    def _synthetic_row(self, rng: random.Random) -> dict[str, Any]:
        return synthetic.make_row(rng, self.synthetic_difficulty, index=0, split="synthetic")


def _attempt(task: CodeTask, visible_tests: list[Test], response: RunResponse) -> Attempt:
    """Split one response over visible and hidden tests (the request listed visible ones first)."""
    num_visible = len(visible_tests)
    if response.verdict == Verdict.CE:  # compiled languages only: nothing ran, every test failed
        assert response.compile is not None, "a CE response carries the compiler's result"
        first = visible_tests[0] if visible_tests else task.hidden_tests[0]
        feedback = failure_feedback(first, response.compile, task.entry_point, task.language)
        return Attempt(True, False, 0.0, feedback, [Verdict.CE.value] * len(task.hidden_tests))
    visible, hidden = response.tests[:num_visible], response.tests[num_visible:]
    failing = next((i for i, result in enumerate(visible) if result.verdict != Verdict.AC), None)
    feedback = ""
    if failing is not None:
        feedback = failure_feedback(visible_tests[failing], visible[failing], task.entry_point, task.language)
    hidden_pass_rate = sum(result.verdict == Verdict.AC for result in hidden) / len(task.hidden_tests)
    return Attempt(
        True, failing is None, hidden_pass_rate, feedback, [result.verdict.value for result in hidden]
    )
