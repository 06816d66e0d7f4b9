"""Environment stage: the tool_calling env, tools called in the chat template's format.

Each turn the model either calls tools (one or more calls in its family's format, parsed by the
run's renderer, `self.reply_parser`, as the rewards and `check_template` parse them; Hermes
`<tool_call>` blocks by default; each result comes back as a `tool` message and the episode
goes on) or answers (a reply with no tool call ends
the episode and its `\\boxed{}` answer is graded). Malformed calls, unknown tools, bad
arguments, tools that raise and tools that time out are all answered with a `tool` message
saying what went wrong, so the model can learn from them; only a tool whose backing service
is down raises `InfraError`.

`reset(options=row)` takes a row in verl's layout; without one it draws a seeded synthetic
task, so the env also runs on its own (and under gymnasium's env checker).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.env import Message, StepResult, TextEnv, load_object
from agentrl.env.task import Episode, check_int, start_task
from agentrl.parsing.tool_calls import MalformedCall, ToolCall
from agentrl.rewards.answers import AnswerGrader, Verdict, shared_grader
from envs.math.reward import extract_boxed_answer
from envs.tool_calling import synthetic
from envs.tool_calling.calculator import calculator
from envs.tool_calling.python_tool import make_python_tool
from envs.tool_calling.retrieval import search
from envs.tool_calling.tools import Tool, ToolOutcome

BUILTIN_TOOLS = ("calculator", "search", "python")
ToolSpec = str | Callable[..., Any] | Tool  # a built-in name, "module:function", a function or a Tool


class ToolCallingEnv(TextEnv):
    """Questions answered with tools, final answer in `\\boxed{}`, reward 1.0 when correct.

    Args:
        tools: built-in names ("calculator", "search", "python"), "module:function" references,
            functions or `Tool`s; their order is the order the chat template lists them in.
        tool_timeout_s: wall-clock limit on one call of any tool.
        sandbox_backend: where the `python` tool runs programs: "auto", "docker" or "bwrap".
        python_time_limit_s: CPU-time limit of one program of the `python` tool.
        max_calls_per_turn: calls executed from one reply; the rest get an error message.
        synthetic_tasks: task families drawn when reset gets no row (see envs.tool_calling.synthetic).
        grader: where numeric answers are compared; by default one child process shared per process.
    """

    def __init__(
        self,
        tools: Sequence[ToolSpec] = BUILTIN_TOOLS,
        tool_timeout_s: float = 10.0,
        sandbox_backend: str = "auto",
        python_time_limit_s: float = 5.0,
        max_calls_per_turn: int = 4,
        synthetic_tasks: Sequence[str] = synthetic.TASKS,
        grader: AnswerGrader | None = None,
    ) -> None:
        super().__init__()
        self.max_calls_per_turn = check_int("max_calls_per_turn", max_calls_per_turn, minimum=1)
        if not tools:
            raise ValueError(f"tools must name at least one tool, e.g. {list(BUILTIN_TOOLS)}; got {tools!r}")
        synthetic.generate(1, seed=0, tasks=synthetic_tasks)  # fails now, naming the bad task, not at reset
        python_tool = make_python_tool(sandbox_backend, python_time_limit_s)
        self._tools = {}
        for spec in tools:
            tool = _build_tool(spec, tool_timeout_s, python_tool)
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
            self._tools[tool.name] = tool
        self.tools = [tool.schema for tool in self._tools.values()]
        self.synthetic_tasks = tuple(synthetic_tasks)
        self._grader = grader
        self._ground_truth = ""
        self._episode = Episode(self)
        self._counts: dict[str, int] = {}

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, ground_truth = start_task(self, seed, options, self._synthetic_row)
        self._ground_truth = str(ground_truth)
        self._episode.begin()
        self._counts = {"num_tool_calls": 0, "num_tool_errors": 0} | {
            f"calls_{name}": 0 for name in self._tools
        }
        return messages, {"ground_truth": self._ground_truth}

    async def astep(self, action: str) -> StepResult:
        self._episode.next_turn()
        calls = self.reply_parser.parse(action).calls
        if not calls:
            self._episode.end()
            answer = extract_boxed_answer(action)
            correct = answer is not None and await self._is_correct(answer)
            return [], float(correct), True, False, self._info(correct, answer)
        executed = calls[: self.max_calls_per_turn]
        outcomes = await asyncio.gather(*(self._call(call) for call in executed))
        observation = [_tool_message(call, outcome) for call, outcome in zip(executed, outcomes, strict=True)]
        if len(calls) > len(executed):
            skipped = len(calls) - len(executed)
            self._count(None, ToolOutcome("", is_error=True))
            observation.append(
                {
                    "role": "tool",
                    "content": f"Error: at most {self.max_calls_per_turn} tool calls run per reply; "
                    f"the last {skipped} were not run.",
                }
            )
        return observation, 0.0, False, False, self._info(False, None)

    async def _call(self, call: ToolCall | MalformedCall) -> ToolOutcome:
        if isinstance(call, MalformedCall):
            outcome = ToolOutcome(call.message, is_error=True)
        elif call.name not in self._tools:
            available = ", ".join(self._tools)
            outcome = ToolOutcome(f"Error: unknown tool {call.name!r}; the tools are: {available}.", True)
        else:
            outcome = await self._tools[call.name].call(call.arguments)
        self._count(call, outcome)
        return outcome

    def _count(self, call: ToolCall | MalformedCall | None, outcome: ToolOutcome) -> None:
        self._counts["num_tool_calls"] += 1
        self._counts["num_tool_errors"] += outcome.is_error
        if isinstance(call, ToolCall) and call.name in self._tools:
            self._counts[f"calls_{call.name}"] += 1

    def _info(self, correct: bool, answer: str | None) -> dict[str, Any]:
        # Counts are cumulative, so the last step's info describes the whole episode.
        info: dict[str, Any] = {"correct": correct, "extracted_answer": answer, **self._counts}
        if self._counts["num_tool_calls"]:
            info["tool_error_rate"] = self._counts["num_tool_errors"] / self._counts["num_tool_calls"]
        return info

    async def _is_correct(self, answer: str) -> bool:
        return await is_correct_answer(answer, self._ground_truth, self._grader)

    def _synthetic_row(self, rng: random.Random) -> dict[str, Any]:
        seed = rng.randrange(2**31)
        task = self.synthetic_tasks[int(self.np_random.integers(len(self.synthetic_tasks)))]
        return synthetic.generate(1, seed=seed, split="synthetic", tasks=[task])[0]


def _build_tool(spec: ToolSpec, timeout_s: float, python_tool: Callable[..., Any]) -> Tool:
    if isinstance(spec, Tool):
        return spec
    if callable(spec):
        return Tool.from_function(spec, timeout_s)
    builtin = {"calculator": calculator, "search": search, "python": python_tool}
    if spec in builtin:
        return Tool.from_function(builtin[spec], timeout_s)
    if ":" in spec:
        return Tool.from_function(load_object(spec), timeout_s)
    raise ValueError(
        f"unknown tool {spec!r}: use a built-in name {list(BUILTIN_TOOLS)} or 'package.module:function'"
    )


async def is_correct_answer(answer: str, ground_truth: str, grader: AnswerGrader | None = None) -> bool:
    """The tool tasks' verdict: math equivalence for a numeric truth, else an exact match (a name).

    Agents that run these tasks themselves (examples/openai_agent.py) grade with it, so their
    reward is the env's.
    """
    if not _is_number(ground_truth):
        return _normalize(answer) == _normalize(ground_truth)
    grader = grader if grader is not None else shared_grader()
    verdict = await asyncio.to_thread(grader.grade, answer, ground_truth)
    return verdict is Verdict.CORRECT


def _tool_message(call: ToolCall | MalformedCall, outcome: ToolOutcome) -> Message:
    message: Message = {"role": "tool", "content": outcome.content}
    if isinstance(call, ToolCall):
        message["name"] = call.name
    return message


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _normalize(text: str) -> str:
    """Exact match up to case, surrounding space, runs of spaces and a trailing period."""
    return " ".join(text.split()).strip().rstrip(".").casefold()
