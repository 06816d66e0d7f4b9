"""Environment stage: the terminal env, an agent working in one sandbox session per episode.

Each turn the model calls tools (`bash`, `write_file`, `read_file`; OpenAI function schemas,
called in the model family's format and parsed by the run's renderer, `self.reply_parser`, as
the tool_calling env parses them) and every result comes back as a `tool` message
(`envs.terminal.observations`). The session's files persist across turns. The episode ends when
the model replies without a tool call (it is done) or after `max_turns` replies (truncated);
then the task's hidden tests run in the session and their reward is the episode's
(`envs.terminal.scoring`). Malformed calls, unknown tools and bad arguments are answered with
an error message the model can learn from.

Sessions come from the event loop's shared pool (`sandbox.sessions.shared`) or, with
`sandbox_url`, from a running `python -m sandbox.server`. A sandbox that fails raises
`InfraError`: an outage is never scored as the agent's failure.
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Literal

from pydantic import Field

from agentrl.env import InfraError, Message, StepResult, TextEnv
from agentrl.env.task import Episode, check_int, start_task
from agentrl.parsing.tool_calls import MalformedCall, ToolCall
from envs.terminal import observations, synthetic
from envs.terminal.scoring import Score, TaskSetupError, score, set_up
from envs.terminal.task import TerminalTask
from envs.tool_calling.tools import Tool, ToolOutcome
from sandbox.backends.base import SandboxFailure
from sandbox.client import SandboxClient
from sandbox.sessions.pool import SessionPoolSettings
from sandbox.sessions.shared import shared_session_pool
from sandbox.sessions.types import Session, SessionLimits

TOOL_SLACK_S = 30.0  # a tool call's own limit beyond the command's (writing files, a busy pool)


class TerminalEnv(TextEnv):
    """Terminal tasks in a sandbox session; reward from the task's tests once the agent is done.

    Args:
        max_turns: replies allowed; the tests run after the last. Keep `rollout.max_turns` >= this.
        command_timeout_s: wall clock (and CPU time) of one `bash` call.
        max_observation_chars: each stream of a result is cut to this many characters, with a note.
        max_calls_per_turn: calls executed from one reply; the rest get an error message.
        backend: "auto" (Docker when an engine answers, else bubblewrap), "docker" or "bwrap".
        sandbox_url, sandbox_token: use sessions of a running `python -m sandbox.server` instead.
        num_warm, max_sessions, max_starting, session_ttl_s: the shared session pool (per process).
        memory_mb, max_processes, disk_mb: each session's limits.
        synthetic_tasks: task families drawn when reset gets no row (envs.terminal.synthetic).
    """

    def __init__(
        self,
        max_turns: int = 6,
        command_timeout_s: float = 10.0,
        max_observation_chars: int = observations.DEFAULT_MAX_CHARS,
        max_calls_per_turn: int = 4,
        backend: Literal["auto", "docker", "bwrap"] = "auto",
        sandbox_url: str | None = None,
        sandbox_token: str | None = None,
        num_warm: int = 2,
        max_sessions: int = 16,
        max_starting: int = 2,
        session_ttl_s: float = 1800.0,
        memory_mb: int = 512,
        max_processes: int = 64,
        disk_mb: int = 64,
        synthetic_tasks: tuple[str, ...] | list[str] = synthetic.TASKS,
    ) -> None:
        super().__init__()
        self.max_turns = check_int("max_turns", max_turns, minimum=1)
        self.max_calls_per_turn = check_int("max_calls_per_turn", max_calls_per_turn, minimum=1)
        self.max_observation_chars = check_int("max_observation_chars", max_observation_chars, minimum=100)
        limits = SessionLimits(
            memory_mb=memory_mb, max_processes=max_processes, disk_mb=disk_mb,
            default_timeout_s=command_timeout_s, max_timeout_s=max(command_timeout_s, 600.0),
        )  # fmt: skip
        self.pool_settings = SessionPoolSettings(
            backend=backend, limits=limits, num_warm=num_warm, max_sessions=max_sessions,
            max_starting=max_starting, ttl_s=session_ttl_s,
        )  # fmt: skip
        if sandbox_url is not None and not sandbox_url.startswith(("http://", "https://")):
            raise ValueError(
                f"sandbox_url must be an http:// or https:// URL of a sandbox server, got {sandbox_url!r}"
            )
        self.sandbox_url, self.sandbox_token = sandbox_url, sandbox_token
        synthetic.generate(1, seed=0, tasks=synthetic_tasks)  # fails now, naming a bad family
        self.synthetic_tasks = tuple(synthetic_tasks)
        self._tools = {tool.name: tool for tool in self._make_tools(command_timeout_s + TOOL_SLACK_S)}
        self.tools = [tool.schema for tool in self._tools.values()]
        self._client: SandboxClient | None = None
        self._session: Session | None = None
        self._task: TerminalTask | None = None
        self._episode = Episode(self)
        self._counts: dict[str, int] = {}

    def _make_tools(self, timeout_s: float) -> list[Tool]:
        async def bash(command: Annotated[str, Field(description="the shell command")]) -> str:
            """Run a bash command in the task's working directory (/work) and return its output."""
            assert self._task is not None
            result = await self._call_session(self._live_session().exec(self._task.command(command)))
            self._counts["num_commands"] += 1
            return observations.exec_observation(result, self.max_observation_chars)

        async def write_file(
            path: Annotated[str, Field(description="absolute, or relative to /work")],
            content: Annotated[str, Field(description="the file's full new content")],
        ) -> str:
            """Write a text file, replacing it if it exists, and make its parent directories."""
            data = content.encode()
            await self._call_session(self._live_session().write_file(path, data))
            return observations.write_observation(path, len(data))

        async def read_file(path: Annotated[str, Field(description="absolute, or relative to /work")]) -> str:
            """Read a text file."""
            content = await self._call_session(self._live_session().read_file(path))
            return observations.read_observation(path, content, self.max_observation_chars)

        return [Tool.from_function(function, timeout_s) for function in (bash, write_file, read_file)]

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, ground_truth = start_task(self, seed, options, self._synthetic_row)
        self._task = _parse_task(ground_truth)
        await self._close_session()
        self._session = await self._call_session(self._open_session())
        try:
            await self._call_session(set_up(self._session, self._task))
        except TaskSetupError as error:
            raise InfraError(str(error)) from error
        self._episode.begin()
        self._counts = {"num_tool_calls": 0, "num_tool_errors": 0, "num_commands": 0}
        return messages, {"task": self._task.task_id}

    async def astep(self, action: str) -> StepResult:
        num_turns = self._episode.next_turn()
        calls = self.reply_parser.parse(action).calls
        observation: list[Message] = []
        if calls:
            executed = calls[: self.max_calls_per_turn]
            for call in executed:  # in order: later commands see what earlier ones did
                observation.append(_tool_message(call, await self._call(call)))
            if len(calls) > len(executed):
                self._counts["num_tool_errors"] += 1
                observation.append(
                    {
                        "role": "tool",
                        "content": f"Error: at most {self.max_calls_per_turn} tool calls run per reply; the last {len(calls) - len(executed)} were not run.",
                    }
                )
        done, out_of_turns = not calls, num_turns >= self.max_turns
        if not (done or out_of_turns):
            return observation, 0.0, False, False, self._info(None)
        self._episode.end()
        assert self._session is not None and self._task is not None
        verdict = await self._call_session(score(self._session, self._task))
        await self._close_session()
        return [], verdict.reward, done, not done, self._info(verdict)

    async def aclose(self) -> None:
        self._episode.end()
        await self._close_session()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _call(self, call: ToolCall | MalformedCall) -> ToolOutcome:
        self._counts["num_tool_calls"] += 1
        if isinstance(call, MalformedCall):
            outcome = ToolOutcome(call.message, is_error=True)
        elif call.name not in self._tools:
            outcome = ToolOutcome(
                f"Error: unknown tool {call.name!r}; the tools are: {', '.join(self._tools)}.", True
            )
        else:
            outcome = await self._tools[call.name].call(call.arguments)
        self._counts["num_tool_errors"] += outcome.is_error
        return outcome

    async def _open_session(self) -> Session:
        if self.sandbox_url is not None:
            if self._client is None:
                self._client = SandboxClient(self.sandbox_url, token=self.sandbox_token)
            return await self._client.open_session()
        pool = await shared_session_pool(self.pool_settings)
        return await pool.acquire()

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                await session.close()
            except SandboxFailure:
                pass  # the pool reaps it by its time-to-live; the next start collects it

    def _live_session(self) -> Session:
        if self._session is None:
            raise InfraError("the episode's sandbox session is gone")
        return self._session

    async def _call_session(self, awaitable: Any) -> Any:
        """Await a session operation; the sandbox's failures become InfraError."""
        try:
            return await awaitable
        except SandboxFailure as error:
            raise InfraError(f"sandbox session failed: {error}") from error

    def _info(self, verdict: Score | None) -> dict[str, Any]:
        info: dict[str, Any] = {"correct": bool(verdict and verdict.reward >= 1.0), **self._counts}
        if verdict is not None:
            info |= {
                "tests_exit_code": verdict.tests_exit_code,
                "reward_found": verdict.reward_found,
                "tests_timed_out": verdict.tests_timed_out,
            }
        return info

    def _synthetic_row(self, rng: random.Random) -> dict[str, Any]:
        return synthetic.generate(
            1, seed=rng.randrange(2**31), split="synthetic", tasks=self.synthetic_tasks
        )[0]


def _parse_task(ground_truth: Any) -> TerminalTask:
    try:
        return (
            TerminalTask.model_validate_json(ground_truth)
            if isinstance(ground_truth, str)
            else TerminalTask.model_validate(ground_truth)
        )
    except ValueError as error:
        raise ValueError(
            f"TerminalEnv.reset options: reward_model.ground_truth is not a terminal task: {error}"
        ) from None


def _tool_message(call: ToolCall | MalformedCall, outcome: ToolOutcome) -> Message:
    message: Message = {"role": "tool", "content": outcome.content}
    if isinstance(call, ToolCall):
        message["name"] = call.name
    return message
