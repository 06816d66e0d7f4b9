"""A multi-turn custom environment: times-table questions with retries after feedback.

The rows are those of `examples/custom_env.py`; what changes is `step`. A wrong answer before
the last attempt continues the episode:

    step("6 * 9 = 45. \\boxed{45}") -> ([{"role": "user", "content": FEEDBACK}], 0.0, False, False, info)

The returned messages are the next observation: the chat template renders them after the
reply, and their tokens are masked out of the loss (the model did not write them). A right
answer, or the last attempt, ends the episode (`terminated=True`, no observation). The
trainer adds up the rewards of an episode's steps into the episode's reward, so the credit
1/attempt on the step that answers right is also the episode's: 1.0 on the first attempt,
0.5 on the second. `info` is merged over the steps, the last step's keys winning: its
`correct` (a bool) is the accuracy metric, and numbers such as `num_attempts` are logged as
`env/num_attempts/mean`.

Train it (`configs/env/multiturn.yaml`):
  python -m agentrl.train env=multiturn
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.data import task_of_row
from agentrl.env import Message, StepResult, TextEnv, register
from envs.math import FEEDBACK  # the retry message the bundled tiny policy was trained on
from examples.custom_env import boxed_integer, make_row


class TimesTableRetryEnv(TextEnv):
    """Up to `max_attempts` replies per question; a wrong reply before the last is told so.

    Args:
        max_attempts: replies allowed per episode (set `rollout.max_turns` at least as high).
    """

    def __init__(self, max_attempts: int = 2) -> None:
        super().__init__()
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self._answer: int | None = None
        self._num_attempts = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        row = options or make_row(random.Random(int(self.np_random.integers(2**31))), 0, "sample")
        messages, ground_truth = task_of_row(row, "TimesTableRetryEnv.reset options")
        self._answer = int(ground_truth)
        self._num_attempts = 0
        return messages, {}

    def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("call reset before step (and again after the episode ended)")
        self._num_attempts += 1
        correct = boxed_integer(action) == self._answer
        info = {
            "correct": correct,  # the last step's value is the episode's accuracy
            "num_attempts": self._num_attempts,
            "first_attempt_correct": float(correct and self._num_attempts == 1),
        }
        if correct or self._num_attempts == self.max_attempts:
            self._answer = None
            reward = 1.0 / self._num_attempts if correct else 0.0
            return [], reward, True, False, info
        # Continue: the feedback is the next observation, and this attempt earns nothing.
        return [{"role": "user", "content": FEEDBACK}], 0.0, False, False, info


register("times_table_retry", TimesTableRetryEnv)
