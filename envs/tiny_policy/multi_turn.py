"""Data stage (offline default policy): conversations that need more than one turn to succeed.

Two skills, each in exactly the format its env produces:
- **fixing code from feedback** (the code env with `max_turns` > 1): a request whose function
  name belongs to a look-alike task, a first attempt that writes what the name suggests (no loss
  on it), the env's own failure message for the first visible test it fails
  (`envs.code_sandbox.feedback`, the judge's comparison text from `sandbox.compare`), then a
  corrected attempt that follows the description. Some corrections are still wrong (another
  look-alike's body), so that the policy is unsure and RL has fixes left to sharpen;
- **multi-hop search** (the tool env with the search tool): a question about a person's country
  (two lookups) or its population (three), answered by searching, reading the result, searching
  again with what it said, and boxing the answer. Only people of the train split are asked about.
"""

from __future__ import annotations

import json
import random
from typing import Any

from envs.code_sandbox.feedback import failure_feedback
from envs.code_sandbox.synthetic import ARGUMENTS, reference_function
from envs.tiny_policy.code_tasks import CODE_QUESTIONS, CODE_TASKS, CodeTask
from envs.tool_calling.retrieval import search, world
from envs.tool_calling.synthetic import INSTRUCTION
from envs.tool_calling.tools import Tool
from sandbox.compare import compare_values
from sandbox.types import CallTest, Language, TestResult, Verdict

SEARCH_TOOL: dict[str, Any] = Tool.from_function(search).schema  # as the tool env declares it
MAX_TEST_DRAWS = 50  # arguments tried for a test on which the two bodies differ


def look_alikes(task: CodeTask) -> list[CodeTask]:
    """Tasks with the same parameters, whose names the code env may give `task` (difficulty >= 2)."""
    return [other for other in CODE_TASKS if other.params == task.params and other is not task]


def make_code_fix_conversation(rng: random.Random, still_wrong: bool) -> tuple[dict[str, Any], ...] | None:
    """Question, wrong first attempt, the env's feedback, a corrected (or `still_wrong`) attempt.

    None when the drawn task has no look-alike or no drawn test tells the two bodies apart.
    """
    task = rng.choice(CODE_TASKS)
    others = look_alikes(task)
    if not others:
        return None
    named_after = rng.choice(others)
    name = rng.choice(named_after.names)
    signature = f"{name}({task.params})"
    test = _telling_test(task, named_after, rng)
    if test is None:
        return None
    wrong_value = json.loads(json.dumps(reference_function(named_after)(*test.args)))
    comparison = compare_values(wrong_value, json.loads(json.dumps(test.expected)))
    result = TestResult(verdict=Verdict.WA, message=comparison.message)
    feedback = failure_feedback(test, result, name, Language.PYTHON)
    corrected = (
        rng.choice([other for other in others if other is not named_after] or others) if still_wrong else task
    )
    return (
        {"role": "user", "content": rng.choice(CODE_QUESTIONS).format(signature=signature, description=task.description)},
        {"role": "assistant", "content": _python_block(signature, named_after.body)},
        {"role": "user", "content": feedback},
        {"role": "assistant", "content": _python_block(signature, corrected.body)},
    )  # fmt: skip


def make_search_conversation(rng: random.Random, num_hops: int) -> tuple[dict[str, Any], ...]:
    """A question needing `num_hops` searches (2: country, 3: population), each result read in turn."""
    if num_hops not in (2, 3):
        raise ValueError(f"num_hops must be 2 (country) or 3 (population), got {num_hops}")
    facts = world()
    person = rng.choice(list(facts.birth_city)[0::2])  # the train split's people (even positions)
    city = facts.birth_city[person]
    country = facts.country_of[city]
    if num_hops == 2:
        question, answer = f"In which country was {person} born?", country
        queries = [f"{person} born", f"{city} country"]
    else:
        question = f"What is the population, in millions, of the country where {person} was born?"
        answer = str(facts.population_millions[country])
        queries = [f"{person} born", f"{city} country", f"{country} population"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{question} {INSTRUCTION}"}]
    for query in queries:
        call = {"type": "function", "function": {"name": "search", "arguments": {"query": query}}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": search(query)})
    messages.append({"role": "assistant", "content": f"\\boxed{{{answer}}}"})
    return tuple(messages)


def _telling_test(task: CodeTask, other: CodeTask, rng: random.Random) -> CallTest | None:
    """A call test of `task` that `other`'s body fails, as the code env's visible test would be."""
    reference, wrong, arguments = (
        reference_function(task),
        reference_function(other),
        ARGUMENTS[task.names[0]],
    )
    for _ in range(MAX_TEST_DRAWS):
        args = arguments(rng)
        try:
            expected, got = reference(*args), wrong(*args)
        except (ArithmeticError, IndexError, ValueError):  # the look-alike's body raises here: a RE, not a WA
            continue
        if not compare_values(json.loads(json.dumps(got)), json.loads(json.dumps(expected))).ok:
            return CallTest(args=args, expected=expected)
    return None


def _python_block(signature: str, body: str) -> str:
    return f"```python\ndef {signature}:\n{body}\n```"
