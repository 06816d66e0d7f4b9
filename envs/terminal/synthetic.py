"""Data stage of the terminal env: offline synthetic terminal tasks and their solved conversations.

Families a tiny policy can learn, each one to three tool calls: `create_file` (write one line to
a named file), `count_lines` (the line count of a file into count.txt), `uppercase` and
`sort_lines` (transform a file's lines into another file), `fix_bug` (one wrong line of a
Python function, found by reading the file, fixed so that its test passes). Every task carries
Harbor-style hidden tests (`test.sh` writing the reward) and a reference solution, both as the
Harbor loader would produce them, so one scoring path serves both.

`solved_conversations(num, seed)` gives example episodes in the env's exact format (messages
with tool calls, the tool results as the env words them, and the tools' schemas) for a policy's
SFT corpus.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envs.terminal import observations
from envs.terminal.task import TESTS_DIR, VERIFIER_DIR, TerminalTask, encode, prompt_text
from sandbox.sessions.types import ExecResult

DATA_SOURCE = "synthetic_terminal"
WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "maple",
    "ocean",
    "pixel",
    "lemon",
    "delta",
    "amber",
    "frost",
)
FILE_NAMES = ("notes.txt", "hello.txt", "greeting.txt", "message.txt", "todo.txt")
PHRASES = ("hello world", "good morning", "all tests pass", "the sky is blue", "done")


@dataclass(frozen=True)
class SolutionStep:
    """One tool call of the reference solution and the result the env answers it with."""

    name: str
    arguments: dict[str, Any]
    observation: str


@dataclass(frozen=True)
class SyntheticTask:
    task: TerminalTask
    steps: tuple[SolutionStep, ...]


def _reward_script(check: str) -> str:
    return (
        "#!/bin/bash\ncd /work\n"
        f"if {check}; then echo 1 > {VERIFIER_DIR}/reward.txt; else echo 0 > {VERIFIER_DIR}/reward.txt; fi\n"
    )


def _same_text_check(target: str) -> dict[str, str]:
    """Tests that pass when /work/`target` holds expected.txt's lines (trailing space ignored)."""
    check = (
        "import sys\n"
        "def lines(path):\n"
        "    with open(path) as handle:\n"
        "        return [line.rstrip() for line in handle.read().strip().splitlines()]\n"
        f"sys.exit(0 if lines('/work/{target}') == lines('{TESTS_DIR}/expected.txt') else 1)\n"
    )
    return {
        "check.py": encode(check.encode()),
        "test.sh": encode(_reward_script(f"python3 {TESTS_DIR}/check.py").encode()),
    }


def _ok() -> str:
    return observations.exec_observation(ExecResult(0, "", "", False, False, False))


def _solution_script(steps: tuple[SolutionStep, ...]) -> dict[str, str]:
    """solve.sh doing what the steps do, so the oracle episode and the conversation agree."""
    lines = ["#!/bin/bash", "cd /work"]
    for step in steps:
        if step.name == "bash":
            lines.append(step.arguments["command"])
        elif step.name == "write_file":
            lines.append(
                f"cat > {step.arguments['path']} <<'AGENTRL_EOF'\n{step.arguments['content']}AGENTRL_EOF"
            )
    return {"solve.sh": encode(("\n".join(lines) + "\n").encode())}


def _task(
    task_id: str, instruction: str, files: dict[str, bytes], tests: dict[str, str], steps: list[SolutionStep]
) -> SyntheticTask:
    solution = tuple(steps)
    task = TerminalTask(
        task_id=task_id,
        instruction=instruction,
        files={f"/work/{name}": encode(data) for name, data in files.items()},
        tests=tests,
        solution=_solution_script(solution),
        verifier_timeout_s=30.0,
    )
    return SyntheticTask(task, solution)


def create_file(rng: random.Random) -> SyntheticTask:
    name, phrase = rng.choice(FILE_NAMES), rng.choice(PHRASES)
    content = phrase + "\n"
    tests = _same_text_check(name) | {"expected.txt": encode(content.encode())}
    step = SolutionStep(
        "write_file", {"path": name, "content": content}, observations.write_observation(name, len(content))
    )
    return _task(
        "create_file", f"Create a file named {name} containing exactly the line: {phrase}", {}, tests, [step]
    )


def _words_file(rng: random.Random) -> list[str]:
    return rng.sample(WORDS, rng.randint(3, 7))


def count_lines(rng: random.Random) -> SyntheticTask:
    words = _words_file(rng)
    name = rng.choice(("data.txt", "words.txt", "list.txt"))
    tests = _same_text_check("count.txt") | {"expected.txt": encode(f"{len(words)}\n".encode())}
    step = SolutionStep("bash", {"command": f"wc -l < {name} > count.txt"}, _ok())
    instruction = f"Count the lines of {name} and write the number to count.txt."
    return _task("count_lines", instruction, {name: ("\n".join(words) + "\n").encode()}, tests, [step])


def uppercase(rng: random.Random) -> SyntheticTask:
    words = _words_file(rng)
    expected = "\n".join(word.upper() for word in words) + "\n"
    tests = _same_text_check("upper.txt") | {"expected.txt": encode(expected.encode())}
    step = SolutionStep("bash", {"command": "tr a-z A-Z < words.txt > upper.txt"}, _ok())
    instruction = "Write the lines of words.txt in upper case to upper.txt."
    return _task("uppercase", instruction, {"words.txt": ("\n".join(words) + "\n").encode()}, tests, [step])


def sort_lines(rng: random.Random) -> SyntheticTask:
    words = _words_file(rng)
    expected = "\n".join(sorted(words)) + "\n"
    tests = _same_text_check("sorted.txt") | {"expected.txt": encode(expected.encode())}
    step = SolutionStep("bash", {"command": "sort names.txt > sorted.txt"}, _ok())
    instruction = "Sort the lines of names.txt alphabetically and write them to sorted.txt."
    return _task("sort_lines", instruction, {"names.txt": ("\n".join(words) + "\n").encode()}, tests, [step])


# (function, description, right body, wrong body, cases)
BUGS = (
    ("add", "the sum of a and b", "a + b", "a - b", [(2, 3), (10, -4), (0, 7)]),
    ("multiply", "the product of a and b", "a * b", "a + b", [(2, 3), (4, 5), (-2, 6)]),
    ("maximum", "the larger of a and b", "max(a, b)", "min(a, b)", [(2, 3), (9, 1), (-5, -2)]),
    ("difference", "a minus b", "a - b", "b - a", [(5, 3), (1, 8), (0, 0)]),
)


def fix_bug(rng: random.Random) -> SyntheticTask:
    function, description, right, wrong, cases = rng.choice(BUGS)
    source = f"def {function}(a, b):\n    return {wrong}\n"
    fixed = f"def {function}(a, b):\n    return {right}\n"
    namespace: dict[str, Any] = {}
    exec(fixed, namespace)  # noqa: S102 - this module's own table
    asserts = "".join(f"assert {function}{args} == {namespace[function](*args)!r}\n" for args in cases)
    visible = f"from calc import {function}\n{asserts}print('ok')\n"
    hidden = f"import sys\nsys.path.insert(0, '/work')\nfrom calc import {function}\n{asserts}"
    tests = {
        "test_hidden.py": encode(hidden.encode()),
        "test.sh": encode(_reward_script(f"python3 {TESTS_DIR}/test_hidden.py").encode()),
    }
    steps = [
        SolutionStep("read_file", {"path": "calc.py"}, source),
        SolutionStep(
            "write_file",
            {"path": "calc.py", "content": fixed},
            observations.write_observation("calc.py", len(fixed)),
        ),
        SolutionStep(
            "bash",
            {"command": "python3 test_calc.py"},
            observations.exec_observation(ExecResult(0, "ok\n", "", False, False, False)),
        ),
    ]
    instruction = (
        f"The function {function} in calc.py should return {description}, but one line is wrong. "
        "Fix it so that `python3 test_calc.py` passes."
    )
    files = {"calc.py": source.encode(), "test_calc.py": visible.encode()}
    return _task("fix_bug", instruction, files, tests, steps)


FAMILIES: dict[str, Callable[[random.Random], SyntheticTask]] = {
    "create_file": create_file,
    "count_lines": count_lines,
    "uppercase": uppercase,
    "sort_lines": sort_lines,
    "fix_bug": fix_bug,
}
TASKS = tuple(FAMILIES)


def _check_tasks(tasks: tuple[str, ...] | list[str]) -> None:
    unknown = [name for name in tasks if name not in FAMILIES]
    if not tasks or unknown:
        raise ValueError(f"terminal task families must be some of {list(FAMILIES)}, got {list(tasks)!r}")


def make_tasks(
    num: int, seed: int, split: str = "train", tasks: tuple[str, ...] | list[str] = TASKS
) -> list[SyntheticTask]:
    _check_tasks(tasks)
    rng = random.Random(f"terminal-{split}-{seed}")
    return [FAMILIES[rng.choice(list(tasks))](rng) for _ in range(num)]


def generate(
    num_rows: int, seed: int, split: str = "train", tasks: tuple[str, ...] | list[str] = TASKS
) -> list[dict[str, Any]]:
    """`num_rows` rows in verl's layout; the same (seed, split, tasks) always gives the same rows."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(item.task.instruction)}],
            "reward_model": {"style": "rule", "ground_truth": item.task.model_dump_json()},
            "extra_info": {"index": index, "split": split, "task": item.task.task_id},
        }
        for index, item in enumerate(make_tasks(num_rows, seed, split, tasks))
    ]


def solved_messages(task: TerminalTask, steps: tuple[SolutionStep, ...]) -> list[dict[str, Any]]:
    """The episode the env would see if the agent made `steps`: the task's prompt, one tool call
    per assistant turn answered by the step's observation, then a final reply without a call."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt_text(task.instruction)}]
    for step in steps:
        call = {"type": "function", "function": {"name": step.name, "arguments": step.arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "name": step.name, "content": step.observation})
    messages.append({"role": "assistant", "content": "Done."})
    return messages


@functools.cache
def tool_schemas() -> tuple[dict[str, Any], ...]:
    """The tools' schemas, as the env declares them (building the env starts no sandbox)."""
    from envs.terminal.env import TerminalEnv

    return tuple(TerminalEnv().tools)


def solved_conversations(
    num: int, seed: int, tasks: tuple[str, ...] | list[str] = TASKS
) -> list[dict[str, Any]]:
    """Example solved episodes: {"messages": [...], "tools": [...]} in the env's exact format,
    drawn from split "sft"."""
    return [
        {"messages": solved_messages(item.task, item.steps), "tools": list(tool_schemas())}
        for item in make_tasks(num, seed, "sft", tasks)
    ]
