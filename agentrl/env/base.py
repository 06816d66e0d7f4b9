"""Environment stage: the one class a user subclasses to define a multi-turn text task.

The action is the assistant's text; the observation is a list of chat messages
(`{"role": "user" | "tool", "content": ...}`). The task (a dataset row) arrives through
`reset(options=row)`. I/O-bound environments override the async pair `areset`/`astep`;
a sync-only environment still works because the async defaults run the sync methods in a
thread (a daemon thread per call, so a hung call is abandoned rather than starving later
ones) and never block the event loop. An async-only environment still works through
`reset`/`step` (e.g. under `gymnasium.utils.env_checker.check_env`), which then run the
coroutines on a private event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import gymnasium as gym

from agentrl.env.spaces import ChatMessages, Text
from agentrl.env.threads import run_in_daemon_thread
from agentrl.parsing.tool_calls import HermesToolCallParser, ToolCallParser

Message = dict[str, Any]  # {"role": str, "content": str, optional "tool_calls"/"name"/...}
StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]

_T = TypeVar("_T")


class TextEnv(gym.Env):
    """A Gymnasium env whose actions are assistant text and observations are chat messages.

    Subclasses implement `reset` and `step` (sync) or `areset` and `astep` (async), or both.
    A sync `reset` starts with `super().reset(seed=seed)`; an async `areset` starts with
    `self.seed_rng(seed)`; either way `self.np_random` is then seeded as Gymnasium expects.
    `tools` lists OpenAI-style function schemas the chat template renders for the model;
    `reply_parser` parses the tool calls of the model's replies in its family's format.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: list[dict[str, Any]] | None = None
    reply_parser: ToolCallParser = HermesToolCallParser()  # until the framework hands the run's one
    _sync_runner: asyncio.Runner | None = None  # the sync bridge's event loop, from its first call
    _env_loop: Any = None  # the agent loop's env loop its coroutines run on (agentrl.env.calls)

    def __init__(self) -> None:
        super().__init__()
        self.action_space = Text()
        self.observation_space = ChatMessages()

    def use_reply_parser(self, parser: ToolCallParser) -> None:
        """Parse the model's replies with `parser` (`self.reply_parser.parse(action)`).

        The framework calls this right after building the env, with the parser of the run's
        renderer (`agentrl.renderers`), so an env reads tool calls in the format the policy writes.
        """
        self.reply_parser = parser

    def seed_rng(self, seed: int | None) -> None:
        """Reseed `self.np_random` when `seed` is given, exactly as `gymnasium.Env.reset` does."""
        gym.Env.reset(self, seed=seed)

    # -- sync API: native for sync envs, a bridge onto the coroutines for async-only envs --

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode. Runs `areset` for an env that only implements the async pair."""
        if type(self).reset is not TextEnv.reset:
            # Reached through `super().reset(seed=seed)` from a subclass's own reset: seed only.
            self.seed_rng(seed)
            return None  # type: ignore[return-value]  # gymnasium.Env.reset returns nothing too
        self._require_override("areset", "reset")
        return self._run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> StepResult:
        """Answer one assistant turn. Runs `astep` for an env that only implements the async pair."""
        self._require_override("astep", "step")
        return self._run_sync(self.astep(action))

    def close(self) -> None:
        """Release resources; runs `aclose` for an env that overrides only the async variant."""
        if type(self).aclose is not TextEnv.aclose and type(self).close is TextEnv.close:
            self._run_sync(self.aclose())
        if self._sync_runner is not None:
            # Ended as `asyncio.run` ends its loop: the tasks left are cancelled and run their
            # cleanup first, so what they guard (e.g. the loop's shared sandbox runner) closes.
            self._sync_runner.close()
            self._sync_runner = None

    # -- async API: what the agent loop awaits --

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async reset; by default runs `reset` in a worker thread."""
        self._require_override("reset", "areset")
        return await run_in_daemon_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: str) -> StepResult:
        """Async step; by default runs `step` in a worker thread."""
        self._require_override("step", "astep")
        return await run_in_daemon_thread(self.step, action)

    async def aclose(self) -> None:
        """Release resources held by the env (sandbox sessions, HTTP clients).

        By default runs an overridden `close` in a worker thread.
        """
        if type(self).close is not TextEnv.close:
            await run_in_daemon_thread(self.close)

    # -- helpers --

    def _require_override(self, name: str, caller: str) -> None:
        if getattr(type(self), name) is getattr(TextEnv, name):
            raise NotImplementedError(
                f"{type(self).__name__}.{caller} needs {type(self).__name__} to implement "
                f"`{name}`: a TextEnv implements reset/step, areset/astep, or both"
            )

    def _run_sync(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run an env coroutine to completion from sync code on the env's own event loop.

        One loop per env, kept across calls, so resources an async env opens in `areset`
        (HTTP sessions, sandbox clients) stay bound to the loop that later steps use.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coroutine.close()
            raise RuntimeError(
                f"{type(self).__name__} implements only the async API and an event loop is "
                "running in this thread: use `await env.areset(...)` / `await env.astep(...)`"
            )
        if self._sync_runner is None:
            self._sync_runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        return self._sync_runner.run(coroutine)
