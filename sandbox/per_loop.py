"""One resource per event loop and key, started on first use and closed when its loop ends.

Stage: execution set-up, shared by the judge's runners (`sandbox.runners`) and the episode
session pools (`sandbox.sessions.shared`). Callers that use a sandbox now and then (an env's
step, a tool call, a reward function) must not own one: a warm pool per caller starts more jails
than it uses, and one a caller forgets to close leaks. They ask for the running loop's resource
instead. A guardian task per loop closes the loop's resources when it is cancelled, as
`asyncio.run` and `asyncio.Runner.close` do to the tasks left at shutdown, so the run's end,
Ctrl-C and an exception that ends the run all close them; their asyncio objects never outlive or
leave their loop. `close()` closes the running loop's resources earlier (a script's or a test's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Resource = TypeVar("Resource")


@dataclass
class _LoopEntry(Generic[Key, Resource]):
    guardian: asyncio.Task[None]
    resources: dict[Key, Resource] = field(default_factory=dict)
    starting: dict[Key, asyncio.Lock] = field(default_factory=dict)


class PerLoop(Generic[Key, Resource]):
    """The resources `start(key)` makes, one per running loop and key, closed by `stop(resource)`."""

    def __init__(
        self, start: Callable[[Key], Awaitable[Resource]], stop: Callable[[Resource], Awaitable[None]]
    ) -> None:
        self._start, self._stop = start, stop
        # Weak on the loop: a closed loop that is collected drops its entry.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopEntry[Key, Resource]] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self, key: Key) -> Resource:
        """The running loop's resource for `key`; raises what starting it raised, and the next call
        tries again."""
        loop = asyncio.get_running_loop()
        entry = self._loops.get(loop)
        if entry is None:
            entry = self._loops[loop] = _LoopEntry(guardian=loop.create_task(self._close_at_shutdown(loop)))
        async with entry.starting.setdefault(key, asyncio.Lock()):
            if key not in entry.resources:
                entry.resources[key] = await self._start(key)
        return entry.resources[key]

    async def close(self) -> None:
        """Close the running loop's resources now."""
        entry = self._loops.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            # Awaited, so that a loop closed right afterwards holds no pending task.
            entry.guardian.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.guardian
            await self._stop_all(entry)

    async def _close_at_shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await loop.create_future()  # never resolved: this task only ends by cancellation
        finally:
            entry = self._loops.get(loop)
            if entry is not None and entry.guardian is asyncio.current_task():
                self._loops.pop(loop, None)
                await self._stop_all(entry)

    async def _stop_all(self, entry: _LoopEntry[Key, Resource]) -> None:
        for resource in entry.resources.values():
            await self._stop(resource)
