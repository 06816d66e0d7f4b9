"""Environment stage: the math env, answer in `\\boxed{}`, graded by math_verify.

`reset(options=row)` takes a dataset row in verl's layout (`prompt` messages,
`reward_model.ground_truth`); without a row it draws a seeded synthetic arithmetic task so
the env also runs on its own (and under gymnasium's env checker). Each `step` is one
attempt. With `max_attempts > 1` a wrong attempt gets the feedback message and another try;
the episode terminates when an answer is correct or the attempts are used up.
"""

from __future__ import annotations

import math
import random
from typing import Any

from agentrl.data import task_of_row
from agentrl.env import Message, StepResult, TextEnv
from envs.math import synthetic
from envs.math.grader import AnswerGrader, shared_grader
from envs.math.reward import score_reply

FEEDBACK = "Your answer is incorrect. Try again."


class MathEnv(TextEnv):
    """Single- or multi-attempt math problems with a boxed final answer.

    Args:
        max_attempts: replies allowed per episode; a wrong one before the last gets FEEDBACK.
        format_reward: added to a step's reward when its reply has a well-formed boxed answer.
        synthetic_difficulty: difficulty (1..3) of the arithmetic task drawn when reset gets no row.
        grader: where answers are compared; by default one child process shared per process.
    """

    def __init__(
        self,
        max_attempts: int = 1,
        format_reward: float = 0.0,
        synthetic_difficulty: int = 1,
        grader: AnswerGrader | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        if not isinstance(format_reward, (int, float)) or not math.isfinite(format_reward):
            raise ValueError(f"format_reward must be a finite number (e.g. 0.1), got {format_reward!r}")
        if synthetic_difficulty not in range(1, synthetic.MAX_DIFFICULTY + 1):
            raise ValueError(
                f"synthetic_difficulty must be 1..{synthetic.MAX_DIFFICULTY}, got {synthetic_difficulty!r}"
            )
        self.max_attempts = max_attempts
        self.format_reward = float(format_reward)
        self.synthetic_difficulty = synthetic_difficulty
        self._grader = grader
        self._ground_truth: str | None = None
        self._num_attempts = 0
        self._done = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        row = options if options else self._synthetic_row()
        messages, ground_truth = task_of_row(row, "MathEnv.reset options")
        self._ground_truth = str(ground_truth)
        self._num_attempts = 0
        self._done = False
        return messages, {"ground_truth": self._ground_truth}

    def step(self, action: str) -> StepResult:
        if self._ground_truth is None or self._done:
            raise RuntimeError(
                "MathEnv.step called before reset or after the episode ended; call reset first"
            )
        grader = self._grader if self._grader is not None else shared_grader()
        score = score_reply(action, self._ground_truth, format_reward=self.format_reward, grader=grader)
        self._num_attempts += 1
        self._done = score.correct or self._num_attempts >= self.max_attempts
        observation = [] if self._done else [{"role": "user", "content": FEEDBACK}]
        info = {
            "correct": score.correct,
            "extracted_answer": score.extracted_answer,
            "verdict": None if score.verdict is None else score.verdict.value,
            "num_attempts": self._num_attempts,
        }
        return observation, score.reward, self._done, False, info

    def _synthetic_row(self) -> dict[str, Any]:
        # Drawn from np_random so that reset(seed=s) always poses the same task.
        rng = random.Random(int(self.np_random.integers(2**63)))
        expression = synthetic.make_expression(rng, self.synthetic_difficulty)
        return synthetic.make_row(expression, index=0, split="synthetic")
