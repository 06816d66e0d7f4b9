"""Environment stage (env=agent, subprocess=True): one episode's agent in a child process.

The parent starts `python -m agentrl.gateway.agent_process package.module:function` with the
session in OPENAI_BASE_URL / OPENAI_API_KEY / ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (and
AGENTRL_BASE_URL, the session's root) and the task row as JSON on stdin. The child calls the
function and posts a reward it returns to `<root>/reward`; a non-zero exit is the agent's
failure. The child runs in its own process group, killed whole when the episode times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import sys
import urllib.request
from typing import Any

STDERR_TAIL_CHARS = 2000  # of a failed child's stderr, in the episode's error


def client_environment(base_url: str, api_key: str) -> dict[str, str]:
    """The variables the OpenAI and Anthropic clients read, pointing at the session."""
    return {
        "AGENTRL_BASE_URL": base_url,
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
    }


async def run_agent_process(agent: str, base_url: str, api_key: str, row: dict[str, Any]) -> None:
    """Run the agent in a child process; RuntimeError with its stderr if it fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrl.gateway.agent_process", agent,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **client_environment(base_url, api_key)}, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = await process.communicate(json.dumps(row).encode())
    finally:
        if process.returncode is None:  # cancelled by the episode timeout
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    if process.returncode != 0:
        tail = stderr.decode(errors="replace")[-STDERR_TAIL_CHARS:].strip()
        raise RuntimeError(f"the agent process exited with status {process.returncode}: {tail}")


def main(argv: list[str]) -> int:
    from agentrl.env.registry import load_object

    if len(argv) != 1:
        print(
            "usage: python -m agentrl.gateway.agent_process package.module:function < row.json",
            file=sys.stderr,
        )
        return 2
    row = json.load(sys.stdin)
    base_url, api_key = os.environ["AGENTRL_BASE_URL"], os.environ["OPENAI_API_KEY"]
    reward = load_object(argv[0])(base_url, api_key, row)
    if inspect.isawaitable(reward):
        reward = asyncio.run(_wait(reward))
    if reward is not None:
        request = urllib.request.Request(
            f"{base_url}/reward", json.dumps({"reward": reward}).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        )  # fmt: skip
        urllib.request.urlopen(request, timeout=30).close()
    return 0


async def _wait(awaitable: Any) -> Any:
    return await awaitable


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
