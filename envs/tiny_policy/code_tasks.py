"""Data stage (offline default policy): templated "write a short Python function" tasks.

Each task has a few interchangeable function names; the answer is the function in a fenced
python block, the format the code env extracts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CodeTask:
    """One function to write: names to choose from, its parameters, what it does, its body."""

    names: tuple[str, ...]
    params: str
    description: str
    body: str  # indented body lines, joined by newlines


CODE_TASKS = (
    CodeTask(("add", "add_numbers", "sum_two"), "a, b", "returns the sum of a and b", "    return a + b"),
    CodeTask(("subtract", "difference"), "a, b", "returns a minus b", "    return a - b"),
    CodeTask(("multiply", "product_of_two"), "a, b", "returns the product of a and b", "    return a * b"),
    CodeTask(("square",), "x", "returns the square of x", "    return x * x"),
    CodeTask(("cube",), "x", "returns the cube of x", "    return x ** 3"),
    CodeTask(("is_even",), "n", "returns True if n is even and False otherwise", "    return n % 2 == 0"),
    CodeTask(("is_odd",), "n", "returns True if n is odd and False otherwise", "    return n % 2 == 1"),
    CodeTask(
        ("absolute", "abs_value"), "x", "returns the absolute value of x", "    return -x if x < 0 else x"
    ),
    CodeTask(
        ("max_of_two", "larger"), "a, b", "returns the larger of a and b", "    return a if a > b else b"
    ),
    CodeTask(
        ("min_of_two", "smaller"), "a, b", "returns the smaller of a and b", "    return a if a < b else b"
    ),
    CodeTask(
        ("list_sum", "sum_list", "total"),
        "nums",
        "returns the sum of the list nums",
        "    total = 0\n    for x in nums:\n        total += x\n    return total",
    ),
    CodeTask(
        ("list_max", "max_of_list", "largest"),
        "nums",
        "returns the largest number in the list nums",
        "    best = nums[0]\n    for x in nums:\n        if x > best:\n            best = x\n    return best",
    ),
    CodeTask(
        ("list_min", "min_of_list", "smallest"),
        "nums",
        "returns the smallest number in the list nums",
        "    best = nums[0]\n    for x in nums:\n        if x < best:\n            best = x\n    return best",
    ),
    CodeTask(
        ("average", "mean"),
        "nums",
        "returns the average of the list nums",
        "    return sum(nums) / len(nums)",
    ),
    CodeTask(
        ("product", "list_product"),
        "nums",
        "returns the product of the numbers in the list nums",
        "    result = 1\n    for x in nums:\n        result *= x\n    return result",
    ),
    CodeTask(("reverse_string", "reverse"), "s", "returns the string s reversed", "    return s[::-1]"),
    CodeTask(
        ("is_palindrome",),
        "s",
        "returns True if the string s reads the same backwards",
        "    return s == s[::-1]",
    ),
    CodeTask(
        ("count_vowels",),
        "s",
        "returns the number of vowels in the string s",
        '    return sum(1 for c in s.lower() if c in "aeiou")',
    ),
    CodeTask(
        ("count_words", "word_count"),
        "s",
        "returns the number of words in the string s",
        "    return len(s.split())",
    ),
    CodeTask(("to_upper", "shout"), "s", "returns the string s in upper case", "    return s.upper()"),
    CodeTask(
        ("factorial",),
        "n",
        "returns the factorial of n",
        "    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
    ),
    CodeTask(
        ("fibonacci", "fib"),
        "n",
        "returns the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1",
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    ),
    CodeTask(
        ("is_prime",),
        "n",
        "returns True if n is a prime number",
        "    if n < 2:\n        return False\n    for i in range(2, int(n ** 0.5) + 1):\n"
        "        if n % i == 0:\n            return False\n    return True",
    ),
    CodeTask(
        ("gcd",),
        "a, b",
        "returns the greatest common divisor of a and b",
        "    while b:\n        a, b = b, a % b\n    return abs(a)",
    ),
    CodeTask(
        ("power",),
        "base, exponent",
        "returns base raised to the power exponent",
        "    return base ** exponent",
    ),
    CodeTask(
        ("count_evens",),
        "nums",
        "returns how many numbers in the list nums are even",
        "    return sum(1 for x in nums if x % 2 == 0)",
    ),
    CodeTask(
        ("positives", "filter_positive"),
        "nums",
        "returns a list of the positive numbers in nums",
        "    return [x for x in nums if x > 0]",
    ),
    CodeTask(
        ("double_all", "doubled"),
        "nums",
        "returns a list with every number in nums doubled",
        "    return [2 * x for x in nums]",
    ),
    CodeTask(
        ("unique", "remove_duplicates"),
        "items",
        "returns the items without duplicates, in order",
        "    seen = []\n    for x in items:\n        if x not in seen:\n            seen.append(x)\n    return seen",
    ),
    CodeTask(
        ("count_occurrences", "count_of"),
        "items, target",
        "returns how many times target occurs in items",
        "    return sum(1 for x in items if x == target)",
    ),
    CodeTask(
        ("sum_digits", "digit_sum"),
        "n",
        "returns the sum of the decimal digits of n",
        "    return sum(int(d) for d in str(abs(n)))",
    ),
    CodeTask(
        ("celsius_to_fahrenheit",),
        "c",
        "converts the temperature c from Celsius to Fahrenheit",
        "    return c * 9 / 5 + 32",
    ),
    CodeTask(
        ("last_element", "last"),
        "items",
        "returns the last element of the list items",
        "    return items[-1]",
    ),
    CodeTask(
        ("sorted_copy", "sort_list"),
        "nums",
        "returns a sorted copy of the list nums",
        "    return sorted(nums)",
    ),
    CodeTask(
        ("repeat_string", "repeat"), "s, n", "returns the string s repeated n times", "    return s * n"
    ),
    CodeTask(
        ("string_length", "length"),
        "s",
        "returns the number of characters in the string s",
        "    return len(s)",
    ),
)
CODE_QUESTIONS = (
    "Write a Python function {signature} that {description}.",
    "Implement a Python function {signature} that {description}.",
)


def make_code_conversation(rng: random.Random) -> tuple[dict[str, Any], ...]:
    """A user asking for one function and the assistant answering with a fenced python block."""
    task = rng.choice(CODE_TASKS)
    signature = f"{rng.choice(task.names)}({task.params})"
    question = rng.choice(CODE_QUESTIONS).format(signature=signature, description=task.description)
    answer = f"```python\ndef {signature}:\n{task.body}\n```"
    return ({"role": "user", "content": question}, {"role": "assistant", "content": answer})
