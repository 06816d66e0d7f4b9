"""Data stage (tool_calling): offline synthetic tasks in verl's row layout, one family per tool.

- `arithmetic`: a product or sum of numbers too large to do reliably in one's head (calculator);
- `country`: the country a fictional person was born in (two searches: person -> city -> country);
- `population`: that country's population in millions (three searches);
- `program`: a sum over a range that is easiest to compute with a short program (python).

People in the lookup families are split between train (even positions) and the held-out
splits (odd positions), so held-out questions ask about people no training row mentions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from envs.tool_calling.retrieval import world

DATA_SOURCE = "synthetic_tool_calling"
INSTRUCTION = "Put the final answer in \\boxed{}."
TASKS = ("arithmetic", "country", "population", "program")
HELD_OUT_SPLITS = ("val", "test")


def generate(
    num_rows: int, seed: int, split: str = "train", tasks: Sequence[str] = ("arithmetic",)
) -> list[dict[str, Any]]:
    """`num_rows` rows cycling through `tasks`; the same arguments always give the same rows."""
    unknown = sorted(set(tasks) - set(TASKS))
    if not tasks or unknown:
        raise ValueError(f"tasks must be a non-empty list drawn from {list(TASKS)}, got {list(tasks)}")
    rng = random.Random(f"{split}-{seed}-{','.join(tasks)}")
    people = list(world().birth_city)[split in HELD_OUT_SPLITS :: 2]
    rows = []
    for index in range(num_rows):
        task = tasks[index % len(tasks)]
        question, answer = _TASK_MAKERS[task](rng, people)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": index, "split": split, "task": task},
            }
        )
    return rows


def _arithmetic(rng: random.Random, people: list[str]) -> tuple[str, str]:
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    operator = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[operator]
    return f"What is {a} {operator} {b}?", str(value)


def _country(rng: random.Random, people: list[str]) -> tuple[str, str]:
    person = rng.choice(people)
    facts = world()
    return f"In which country was {person} born?", facts.country_of[facts.birth_city[person]]


def _population(rng: random.Random, people: list[str]) -> tuple[str, str]:
    person = rng.choice(people)
    facts = world()
    country = facts.country_of[facts.birth_city[person]]
    question = f"What is the population, in millions, of the country where {person} was born?"
    return question, str(facts.population_millions[country])


def _program(rng: random.Random, people: list[str]) -> tuple[str, str]:
    low, high, power = rng.randint(1, 50), rng.randint(100, 2000), rng.randint(2, 3)
    total = sum(number**power for number in range(low, high + 1))
    name = {2: "squares", 3: "cubes"}[power]
    return f"What is the sum of the {name} of the integers from {low} to {high}?", str(total)


_TASK_MAKERS = {
    "arithmetic": _arithmetic,
    "country": _country,
    "population": _population,
    "program": _program,
}
