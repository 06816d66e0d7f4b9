"""Environment stage: the math env, answer in `\\boxed{}`, graded by math_verify.

`reset(options=row)` takes a dataset row in verl's layout (`prompt` messages,
`reward_model.ground_truth`); without a row it draws a seeded synthetic arithmetic task so
the env also runs on its own (and under gymnasium's env checker). Each `step` is one
attempt. With `max_attempts > 1` a wrong attempt gets the feedback message and another try;
the episode terminates when an answer is correct or the attempts are used up.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import Message, StepResult, TextEnv
from agentrl.env.task import Episode, check_finite, check_int, check_int_range, start_task
from agentrl.rewards.answers import AnswerGrader, shared_grader
from envs.math import synthetic
from envs.math.reward import score_reply

# What a wrong attempt is told. The tiny policy learned to retry after exactly this text (its
# corpus imports it), so a change here means rebuilding the policy.
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
        self.max_attempts = check_int("max_attempts", max_attempts, minimum=1)
        self.format_reward = check_finite("format_reward", format_reward, example="0.1")
        self.synthetic_difficulty = check_int_range(
            "synthetic_difficulty", synthetic_difficulty, 1, synthetic.MAX_DIFFICULTY
        )
        self._grader = grader
        self._ground_truth = ""
        self._episode = Episode(self)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, ground_truth = start_task(self, seed, options, self._synthetic_row)
        self._ground_truth = str(ground_truth)
        self._episode.begin()
        return messages, {"ground_truth": self._ground_truth}

    def step(self, action: str) -> StepResult:
        num_attempts = self._episode.next_turn()
        grader = self._grader if self._grader is not None else shared_grader()
        score = score_reply(action, self._ground_truth, format_reward=self.format_reward, grader=grader)
        done = score.correct or num_attempts >= self.max_attempts
        if done:
            self._episode.end()
        observation = [] if done else [{"role": "user", "content": FEEDBACK}]
        info = {
            "correct": score.correct,
            "extracted_answer": score.extracted_answer,
            "verdict": None if score.verdict is None else score.verdict.value,
            "num_attempts": num_attempts,
        }
        return observation, score.reward, done, False, info

    def _synthetic_row(self, rng: random.Random) -> dict[str, Any]:
        expression = synthetic.make_expression(rng, self.synthetic_difficulty)
        return synthetic.make_row(expression, index=0, split="synthetic")
