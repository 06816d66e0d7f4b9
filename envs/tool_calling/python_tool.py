"""Environment stage (tool_calling): the `python` tool, run in the project's sandbox.

The program runs once in a jail (`sandbox.executor.Executor`, backend named by the env's
kwargs) and the model reads what it printed. The executor is async, so a running program never
blocks the event loop that steps other episodes. A program that fails is the model's doing and
comes back as text; a sandbox that cannot run it (verdict SANDBOX_ERROR) raises `InfraError`.

The tool judges on the running event loop's shared runner (`sandbox.runners`): a warm Docker
pool or bwrap set-up serves every episode on the loop instead of one per episode, and it closes
when the loop ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from pydantic import Field

from agentrl.env import InfraError
from envs.tool_calling.tools import ToolTimeoutError
from sandbox.runners import RunnerSettings, shared_runner
from sandbox.types import Language, RunLimits, RunRequest, Verdict

OUTPUT_LIMIT_CHARS = 2000  # of stdout/stderr shown to the model; more only costs context


def make_python_tool(backend: str = "auto", time_limit_s: float = 5.0) -> Callable[[str], Awaitable[str]]:
    """The `python` tool function, running programs on `backend` for at most `time_limit_s` CPU seconds."""
    settings = RunnerSettings(backend=backend)  # a backend the sandbox does not know fails here

    async def python(
        code: Annotated[str, Field(description="a whole program that print()s the result")],
    ) -> str:
        """Run a Python 3 program; returns what it printed (stdout, then stderr if any)."""
        try:
            runner = await shared_runner(settings)
        except Exception as error:
            raise InfraError(f"the python sandbox ({backend}) could not start: {error}") from error
        request = RunRequest(language=Language.PYTHON, code=code, limits=RunLimits(time_s=time_limit_s))
        response = await runner.run(request)
        if response.verdict is Verdict.SANDBOX_ERROR:
            raise InfraError(f"the python sandbox ({backend}) failed: {response.sandbox_error}")
        if response.verdict is Verdict.TLE:
            raise ToolTimeoutError(f"the program ran past its {time_limit_s:g} s CPU limit")
        run = response.run
        parts = [text[-OUTPUT_LIMIT_CHARS:].rstrip("\n") for text in (run.stdout, run.stderr) if text.strip()]
        if response.verdict is not Verdict.AC:
            code = "" if run.exit_code is None else f", code {run.exit_code}"
            parts.append(f"(exit: {response.verdict.value}{code})")
        output = "\n".join(parts)
        return output or "(no output)"

    return python
