"""Data stage of the code env: offline synthetic "write a Python function" tasks.

Tasks are the tiny policy's code tasks (`CODE_TASKS`), asked in the words it was trained on:
"Write a Python function add(a, b) that returns the sum of a and b." Each row holds one visible
test (feedback) and `NUM_HIDDEN_TESTS` hidden ones (reward), all function-call tests whose
expected values come from the task's reference body.

Difficulty is how much the function's name can be trusted:
1. the name fits the description (the policy's training format; it solves nearly all of them);
2. half the tasks borrow the name of another task with the same parameters, e.g.
   "Write a Python function multiply(a, b) that returns the sum of a and b";
3. every task that can borrows a name.
A policy that writes the body its name suggests fails the borrowed-name tasks; reading the
description is what RL has to teach.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from typing import Any

from envs.code_sandbox.task import CodeTask as JudgedTask
from envs.tiny_policy.code_tasks import CODE_QUESTIONS, CODE_TASKS, CodeTask
from sandbox.types import CallTest, RunLimits

DATA_SOURCE = "synthetic_code"
MAX_DIFFICULTY = 3
BORROWED_NAME_PROBABILITY = {1: 0.0, 2: 0.5, 3: 1.0}
NUM_HIDDEN_TESTS = 2
# Generous for one-line functions on a loaded 2-core machine, short enough that a program that
# sleeps or loops forever costs only a few seconds of wall clock.
TEST_LIMITS = RunLimits(time_s=5.0, memory_mb=256)

Arguments = Callable[[random.Random], list[Any]]


def _int(low: int, high: int) -> Arguments:
    return lambda rng: [rng.randint(low, high)]


def _two_ints(low: int, high: int) -> Arguments:
    return lambda rng: [rng.randint(low, high), rng.randint(low, high)]


def _int_list(rng: random.Random, min_length: int = 1, low: int = -9, high: int = 9) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(min_length, 6))]


def _word(rng: random.Random) -> str:
    if rng.random() < 0.3:  # palindromes, so that is_palindrome's answers are not always False
        half = "".join(rng.choices("abcdemnorst", k=rng.randint(1, 3)))
        return half + half[::-1][rng.randint(0, 1) :]
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 8)))


# Arguments of one call, by the task's first name; inputs stay inside each function's domain.
ARGUMENTS: dict[str, Arguments] = {
    "add": _two_ints(-50, 50),
    "subtract": _two_ints(-50, 50),
    "multiply": _two_ints(-12, 12),
    "square": _int(-20, 20),
    "cube": _int(-9, 9),
    "is_even": _int(-50, 50),
    "is_odd": _int(-50, 50),
    "absolute": _int(-50, 50),
    "max_of_two": _two_ints(-50, 50),
    "min_of_two": _two_ints(-50, 50),
    "list_sum": lambda rng: [_int_list(rng, 0)],
    "list_max": lambda rng: [_int_list(rng)],
    "list_min": lambda rng: [_int_list(rng)],
    "average": lambda rng: [_int_list(rng)],
    "product": lambda rng: [_int_list(rng, 0, -5, 5)],
    "reverse_string": lambda rng: [_word(rng)],
    "is_palindrome": lambda rng: [_word(rng)],
    "count_vowels": lambda rng: [_word(rng)],
    "count_words": lambda rng: [" ".join(_word(rng) for _ in range(rng.randint(0, 5)))],
    "to_upper": lambda rng: [_word(rng)],
    "factorial": _int(0, 10),
    "fibonacci": _int(0, 20),
    "is_prime": _int(0, 60),
    "gcd": _two_ints(1, 60),
    "power": lambda rng: [rng.randint(-5, 5), rng.randint(0, 5)],
    "count_evens": lambda rng: [_int_list(rng, 0)],
    "positives": lambda rng: [_int_list(rng, 0)],
    "double_all": lambda rng: [_int_list(rng, 0)],
    "unique": lambda rng: [_int_list(rng, 0, 0, 4)],
    "count_occurrences": lambda rng: [_int_list(rng, 0, 0, 4), rng.randint(0, 4)],
    "sum_digits": _int(-999, 999),
    "celsius_to_fahrenheit": _int(-40, 100),
    "last_element": lambda rng: [_int_list(rng)],
    "sorted_copy": lambda rng: [_int_list(rng, 0)],
    "repeat_string": lambda rng: [_word(rng), rng.randint(0, 4)],
    "string_length": lambda rng: [_word(rng)],
}


def reference_function(task: CodeTask) -> Callable[..., Any]:
    """The task's reference body as a function (trusted: the bodies are this project's own table)."""
    namespace: dict[str, Any] = {}
    exec(f"def reference({task.params}):\n{task.body}\n", namespace)  # noqa: S102
    return namespace["reference"]


def make_tests(task: CodeTask, rng: random.Random, num_tests: int) -> list[CallTest]:
    """`num_tests` call tests on distinct arguments where the task's domain has that many."""
    reference, arguments = reference_function(task), ARGUMENTS[task.names[0]]
    tests: list[CallTest] = []
    for _ in range(50 * num_tests):  # small domains (cube of -9..9) may repeat a draw
        args = arguments(rng)
        if all(test.args != args for test in tests):
            tests.append(CallTest(args=args, expected=reference(*args)))
        if len(tests) == num_tests:
            break
    return tests


def function_name(task: CodeTask, rng: random.Random, difficulty: int) -> str:
    """The task's own name, or with the difficulty's probability one of a look-alike task."""
    look_alikes = [other for other in CODE_TASKS if other.params == task.params and other is not task]
    if look_alikes and rng.random() < BORROWED_NAME_PROBABILITY[difficulty]:
        return rng.choice(rng.choice(look_alikes).names)
    return rng.choice(task.names)


def make_row(rng: random.Random, difficulty: int, index: int, split: str) -> dict[str, Any]:
    """One row in verl's layout: the question as the prompt, a CodeTask as the ground truth."""
    task = rng.choice(CODE_TASKS)
    name = function_name(task, rng, difficulty)
    signature = f"{name}({task.params})"
    question = rng.choice(CODE_QUESTIONS).format(signature=signature, description=task.description)
    visible, *hidden = make_tests(task, rng, 1 + NUM_HIDDEN_TESTS)
    judged = JudgedTask(entry_point=name, visible_tests=[visible], hidden_tests=hidden, limits=TEST_LIMITS)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": judged.model_dump_json()},
        "extra_info": {
            "index": index,
            "split": split,
            "task": task.names[0],
            "borrowed_name": name not in task.names,
        },
    }


def generate(num_rows: int, seed: int, split: str = "train", difficulty: int = 2) -> list[dict[str, Any]]:
    """`num_rows` code rows; the same (seed, split, difficulty) always gives the same rows."""
    if difficulty not in BORROWED_NAME_PROBABILITY:
        raise ValueError(f"difficulty must be 1..{MAX_DIFFICULTY}, got {difficulty!r}")
    rng = random.Random(f"code-{split}-{difficulty}-{seed}")
    return [make_row(rng, difficulty, index, split) for index in range(num_rows)]
