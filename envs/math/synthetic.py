"""Data stage for the math env: offline synthetic arithmetic tasks in verl's row layout."""

from __future__ import annotations

import random
from typing import Any

DATA_SOURCE = "synthetic_arithmetic"
INSTRUCTION = "Put the final answer in \\boxed{}."
MAX_DIFFICULTY = 3


def make_expression(rng: random.Random, difficulty: int) -> str:
    """An integer arithmetic expression; higher difficulty means larger numbers and more operators."""
    if difficulty == 1:
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        return f"{a} {rng.choice('+-')} {b}"
    if difficulty == 2:
        if rng.random() < 0.5:
            return f"{rng.randint(2, 12)} * {rng.randint(2, 12)}"
        return f"{rng.randint(10, 99)} {rng.choice('+-')} {rng.randint(10, 99)}"
    if difficulty == 3:
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
        return f"({a} {rng.choice('+-')} {b}) * {c}"
    raise ValueError(f"difficulty must be 1..{MAX_DIFFICULTY}, got {difficulty}")


def make_row(expression: str, index: int, split: str) -> dict[str, Any]:
    """A dataset row in verl's layout for one expression."""
    answer = eval(expression, {"__builtins__": {}})  # trusted: built from integers and + - * ( )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"What is {expression}? {INSTRUCTION}"}],
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"index": index, "split": split, "expression": expression},
    }


def generate(num_rows: int, difficulty: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """`num_rows` arithmetic rows; the same (seed, difficulty) always gives the same rows."""
    rng = random.Random(f"{split}-{difficulty}-{seed}")
    return [make_row(make_expression(rng, difficulty), i, split) for i in range(num_rows)]
