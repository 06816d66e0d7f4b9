"""Environment stage: the one class a user subclasses to define a multi-turn text task.

The action is the assistant's text; the observation is a list of chat messages
(`{"role": "user" | "tool", "content": ...}`). The task (a dataset row) arrives through
`reset(options=row)`. I/O-bound environments override the async pair `areset`/`astep`;
a sync-only environment still works because the async defaults run the sync methods in a
thread, so they never block the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.env.spaces import ChatMessages, Text

Message = dict[str, Any]  # {"role": str, "content": str, optional "tool_calls"/"name"/...}
StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


class TextEnv(gym.Env):
    """A Gymnasium env whose actions are assistant text and observations are chat messages.

    Subclasses implement `reset` and `step` (sync) or `areset` and `astep` (async), or both.
    `tools` lists OpenAI-style function schemas the chat template renders for the model.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: list[dict[str, Any]] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.action_space = Text()
        self.observation_space = ChatMessages()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async reset; by default runs `reset` in a worker thread."""
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        """Async step; by default runs `step` in a worker thread."""
        return await asyncio.to_thread(self.step, action)

    async def aclose(self) -> None:
        """Release resources held by the env (sandbox sessions, HTTP clients)."""
        await asyncio.to_thread(self.close)
