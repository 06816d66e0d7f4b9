"""A complete custom environment: times-table questions answered in `\\boxed{}`.

Copy this file to start your own task. It has the three parts every env needs:
  1. `generate`: a dataset generator returning rows in verl's layout,
  2. `TimesTableEnv`: a `TextEnv` subclass (reset takes a row, step grades a reply),
  3. a registration, so `make("times_table")` builds it.

The questions use the wording the bundled tiny policy was trained on ("What is 7 * 8? Put the
final answer in \\boxed{}."), where it starts at about half right: a task a policy cannot answer
at all gives every sample of a group the same reward, and RL learns nothing from it.

Train on it (`configs/env/custom.yaml` sets the env id, the generator and a learning rate):
  python -m agentrl.train env=custom
Your own env is two overrides of that preset:
  python -m agentrl.train env=custom env.id=my_module:MyEnv data.generator=my_module:generate
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.data import task_of_row
from agentrl.env import Message, StepResult, TextEnv, register
from agentrl.rewards.answers import extract_boxed_answer

INSTRUCTION = "Put the final answer in \\boxed{}."


def make_row(rng: random.Random, index: int, split: str, max_factor: int = 12) -> dict[str, Any]:
    """One question `a * b` with factors in 2..max_factor, in verl's row layout."""
    a, b = rng.randint(2, max_factor), rng.randint(2, max_factor)
    return {
        "data_source": "times_table",
        "prompt": [{"role": "user", "content": f"What is {a} * {b}? {INSTRUCTION}"}],
        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
        "extra_info": {"index": index, "split": split},
    }


def generate(num_rows: int, seed: int, split: str = "train", max_factor: int = 12) -> list[dict[str, Any]]:
    """`num_rows` questions; the same (seed, split) always gives the same rows.

    Keyword arguments past `split` come from the config's `data.generator_kwargs`.
    """
    if max_factor < 2:
        raise ValueError(f"max_factor must be >= 2, got {max_factor}")
    rng = random.Random(f"{split}-{seed}")
    return [make_row(rng, index, split, max_factor) for index in range(num_rows)]


def boxed_integer(reply: str) -> int | None:
    """The integer in the reply's last `\\boxed{...}`, or None when there is none."""
    answer = extract_boxed_answer(reply)
    if answer is None or not answer.lstrip("-").isdigit():
        return None
    return int(answer)


class TimesTableEnv(TextEnv):
    """One reply per question: reward 1.0 when the last boxed integer is the product, else 0.0.

    `info["correct"]` (a bool) is what the trainer reports as accuracy (`val/accuracy`); other
    numbers in `info` are logged as `env/<key>/mean`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._answer: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)  # seeds self.np_random
        # Without a dataset row, draw a question from the seeded generator.
        row = options or make_row(random.Random(int(self.np_random.integers(2**31))), 0, "sample")
        messages, ground_truth = task_of_row(row, "TimesTableEnv.reset options")  # checked, copied
        self._answer = int(ground_truth)
        return messages, {}

    def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("call reset before step")
        answer = boxed_integer(action)
        correct = answer == self._answer
        self._answer = None  # single-turn: the episode is over
        info = {"correct": correct, "answered": float(answer is not None)}
        return [], float(correct), True, False, info


register("times_table", TimesTableEnv)
