"""A complete custom environment: arithmetic asked in words, answered in `\\boxed{}`.

Copy this file to start your own task. It has the three parts every env needs:
  1. `generate`: a dataset generator returning rows in verl's layout,
  2. `WordArithmeticEnv`: a `TextEnv` subclass (reset takes a row, step grades a reply),
  3. a registration, so `make("word_arithmetic")` builds it.

Train on it without registering anything:
  python -m agentrl.train env=custom env.id=examples.custom_env:WordArithmeticEnv \\
      data.generator=examples.custom_env:generate
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.data import task_of_row
from agentrl.env import Message, StepResult, TextEnv, register
from envs.math.reward import extract_boxed_answer

TEMPLATES = {  # operator -> wordings of "a op b"
    "+": ["Add {a} and {b}.", "What is the sum of {a} and {b}?", "Increase {a} by {b}."],
    "-": ["Subtract {b} from {a}.", "What is {a} minus {b}?", "Decrease {a} by {b}."],
    "*": ["Multiply {a} by {b}.", "What is the product of {a} and {b}?"],
}


def make_row(rng: random.Random, index: int, split: str) -> dict[str, Any]:
    """One word problem with an integer answer, in verl's row layout."""
    operator = rng.choice(sorted(TEMPLATES))
    a, b = (
        (rng.randint(2, 12), rng.randint(2, 12))
        if operator == "*"
        else (rng.randint(0, 50), rng.randint(0, 50))
    )
    answer = {"+": a + b, "-": a - b, "*": a * b}[operator]
    question = rng.choice(TEMPLATES[operator]).format(a=a, b=b)
    return {
        "data_source": "word_arithmetic",
        "prompt": [{"role": "user", "content": f"{question} Put the final answer in \\boxed{{}}."}],
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"index": index, "split": split},
    }


def generate(num_rows: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """`num_rows` word problems; the same (seed, split) always gives the same rows."""
    rng = random.Random(f"{split}-{seed}")
    return [make_row(rng, index, split) for index in range(num_rows)]


class WordArithmeticEnv(TextEnv):
    """One reply per problem: reward 1.0 when the last boxed answer equals the integer answer."""

    def __init__(self) -> None:
        super().__init__()
        self._answer: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)  # seeds self.np_random
        # Without a dataset row, draw a problem from the seeded generator.
        row = options or make_row(random.Random(int(self.np_random.integers(2**31))), 0, "sample")
        messages, ground_truth = task_of_row(row, "WordArithmeticEnv.reset options")  # checked, copied
        self._answer = int(ground_truth)
        return messages, {}

    def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("call reset before step")
        extracted = extract_boxed_answer(action)
        correct = extracted is not None and extracted.lstrip("-").isdigit() and int(extracted) == self._answer
        self._answer = None  # single-turn: the episode is over
        info = {"correct": correct, "extracted_answer": extracted}
        return [], float(correct), True, False, info


register("word_arithmetic", WordArithmeticEnv)
